"""GPU probe of two everyday cases the shape zoo's per-entry timing does not see: misaligned HGEMMs, which
the op runs on aligned copies (``ops.gemm.op.StagedLaunch``: the copies and the Hopper kernel together),
and grouped-query attention against SDPA with ``enable_gqa=True`` (FlashAttention-2 and cuDNN backends).

Each row times the public op (``ck.hgemm`` / ``ck.attention``) against torch on the same tensors with
``tools.bench.interleaved_times`` (GPU time alone, alternating, median), after checking the op's output with
the oracle. Writes a Markdown table to stdout and, when ``$OUT`` is set, to ``$OUT/everyday_probe.md``.

    PYTHONPATH=. python scripts/probes/everyday_probe.py [--reps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

import cute_kernels as ck
from cute_kernels.ops.attention import spec as aspec
from cute_kernels.ops.gemm import reference
from cute_kernels.runtime import oracle
from cute_kernels.tools.bench import interleaved_times

# (m, n, k, element offset of every operand's base): K or N odd, or bases off 16 bytes.
GEMM_SHAPES = [(2047, 2049, 1023, 0), (2048, 2048, 2047, 0), (4096, 4096, 4095, 0), (4096, 4096, 4096, 1)]
# (batch, q heads, kv heads, sequence, head dim, causal)
GQA_SHAPES = [(1, 32, 8, 1024, 128, False), (1, 32, 8, 8192, 128, False), (1, 32, 8, 8192, 128, True),
              (4, 32, 4, 2048, 64, False)]


def _median_ratio(ours, theirs, reps):
    times = interleaved_times({"ours": lambda r: ours(), "theirs": lambda r: theirs()}, reps=reps)
    us, base = statistics.median(times["ours"]), statistics.median(times["theirs"])
    return us, base


def gemm_rows(reps):
    for m, n, k, off in GEMM_SHAPES:
        for dtype in (torch.float16, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(m + n + k)

            def mat(r, c):
                return torch.randn(r, c + off, generator=g, device="cuda").to(dtype)[:, off:]

            a, b = mat(m, k), mat(k, n)
            out, ref = mat(m, n), mat(m, n)
            ck.hgemm(a, b, out=out)
            torch.matmul(a, b, out=ref)
            verdict = reference.gemm_verdict(out, a, b, baseline=ref)
            us, base = _median_ratio(lambda: ck.hgemm(a, b, out=out), lambda: torch.matmul(a, b, out=ref), reps)
            yield (f"hgemm {m}x{n}x{k} offset {off} {str(dtype)[6:]}", us, "cuBLAS (torch.matmul)", base, bool(verdict))


def attention_rows(reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, hkv, s, d, causal in GQA_SHAPES:
        for dtype in (torch.float16, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(s + h)
            q = torch.randn(b, h, s, d, generator=g, device="cuda").to(dtype)
            k, v = (torch.randn(b, hkv, s, d, generator=g, device="cuda").to(dtype) for _ in range(2))
            out = ck.attention(q, k, v, causal=causal)
            ref, mag = aspec.reference_and_scale(q[:, :2], k[:, :1], v[:, :1], None, causal) if s <= 2048 else (None, None)
            ok = True
            if ref is not None:
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    same = torch.nn.functional.scaled_dot_product_attention(q[:, :2], k[:, :1], v[:, :1],
                                                                            is_causal=causal, enable_gqa=True)
                ok = bool(oracle.compare(out[:, :2], ref, same, scale=mag, floor=2 * torch.finfo(dtype).eps))
            for name, backend in (("SDPA flash, enable_gqa", SDPBackend.FLASH_ATTENTION),
                                  ("SDPA cuDNN, enable_gqa", SDPBackend.CUDNN_ATTENTION)):
                def theirs(backend=backend):
                    with sdpa_kernel([backend]):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                                enable_gqa=True)
                try:
                    theirs()
                except RuntimeError as exc:  # a backend that refuses the shape is reported as such
                    yield (f"attention B{b} H{h}/{hkv} S{s} d{d}{' causal' if causal else ''} {str(dtype)[6:]}",
                           float("nan"), name, float("nan"), f"refused: {exc}"[:60])
                    continue
                us, base = _median_ratio(lambda: ck.attention(q, k, v, causal=causal, out=out), theirs, reps)
                yield (f"attention B{b} H{h}/{hkv} S{s} d{d}{' causal' if causal else ''} {str(dtype)[6:]}",
                       us, name, base, ok)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    lines = [f"# everyday probe on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", "",
             "| case | ours (us) | baseline | baseline (us) | speed-up | verified |", "| --- | --- | --- | --- | --- | --- |"]
    path = os.path.join(os.environ["OUT"], "everyday_probe.md") if os.environ.get("OUT") else None
    print("\n".join(lines), flush=True)
    rows = []
    for part in (gemm_rows, attention_rows):  # each row printed (and the file rewritten) as it is measured
        for case, us, name, base, ok in part(args.reps):
            rows.append(ok)
            lines.append(f"| {case} | {us:.1f} | {name} | {base:.1f} | {base / us:.2f}x | {ok} |")
            print(lines[-1], flush=True)
            if path:
                with open(path, "w") as f:
                    f.write("\n".join(lines) + "\n")
    return 0 if all(ok is True or str(ok).startswith("refused") for ok in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
