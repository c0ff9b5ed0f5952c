"""GPU probe for the GEMMs of real models (issue 24): batched products against ``torch.bmm``, the four
layouts (NN, NT, TN, TT: column-major operands as transposed views) against ``torch.matmul`` on the same
views (cuBLAS), and a linear layer's forward + backward against ``F.linear``'s. GPU time per call from
``tools.bench.interleaved_times`` (ours and torch's alternating, medians), and eager wall time per call
back to back (host dispatch included). Each case is checked first against float64 (``reference.gemm_verdict``, at
most twice torch's error; the scale is ``reference.gemm_scale``'s).

    PYTHONPATH=. python scripts/probes/gemm_models.py [--reps 20] [--only batched,layouts,linear]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.ops.gemm import reference  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

BATCHED = [  # (batch, M, N, K, dtype)
    (32, 256, 256, 256, torch.float32),
    (32, 256, 256, 256, torch.float16),
    (64, 1024, 128, 1024, torch.float16),
    (8, 4096, 4096, 128, torch.float16),
]
LAYOUT_SIZES = [(4096, torch.float16), (4096, torch.bfloat16), (8192, torch.float16), (8192, torch.bfloat16),
                (4096, torch.float32)]


def _op(dtype):
    return ck.sgemm if dtype == torch.float32 else ck.hgemm


def _rand(shape, dtype, gen, transposed=False):
    if transposed:
        shape = (*shape[:-2], shape[-1], shape[-2])
    t = torch.randn(shape, device="cuda", generator=gen, dtype=torch.float32).to(dtype)
    return t.transpose(-1, -2) if transposed else t


def _checked(ours, a, b) -> str:
    verdict = reference.gemm_verdict(ours, a, b, baseline=torch.matmul(a, b))
    return "yes" if verdict else f"NO: {verdict.detail}"


def _row(label, ours_fn, torch_fn, reps, checked):
    times = bench.interleaved_times({"ours": lambda _r: ours_fn(), "torch": lambda _r: torch_fn()}, reps=reps)
    ours_us, torch_us = statistics.median(times["ours"]), statistics.median(times["torch"])
    wall_ours = bench.wall_us_per_call(ours_fn, calls=50)
    wall_torch = bench.wall_us_per_call(torch_fn, calls=50)
    line = (f"| {label} | {ours_us:.1f} | {torch_us:.1f} | {torch_us / ours_us:.2f}x | {wall_ours:.1f} | "
            f"{wall_torch:.1f} | {wall_torch / wall_ours:.2f}x | {checked} |")
    print(line, flush=True)
    return line


def batched(reps, gen):
    for batch, m, n, k, dtype in BATCHED:
        a, b = _rand((batch, m, k), dtype, gen), _rand((batch, k, n), dtype, gen)
        op = _op(dtype)
        yield _row(f"bmm {batch}x{m}x{n}x{k} {str(dtype)[6:]}", lambda: op(a, b), lambda: torch.bmm(a, b), reps,
                   _checked(op(a, b), a, b))


def layouts(reps, gen):
    for size, dtype in LAYOUT_SIZES:
        op = _op(dtype)
        for layout in ("NN", "NT", "TN", "TT"):
            a = _rand((size, size), dtype, gen, layout[0] == "T")
            b = _rand((size, size), dtype, gen, layout[1] == "T")
            yield _row(f"{layout} {size}^3 {str(dtype)[6:]}", lambda: op(a, b), lambda: torch.matmul(a, b),
                       max(5, reps // (4 if size > 4096 or dtype == torch.float32 else 1)), _checked(op(a, b), a, b))


# (M, N) of x (M, 4096) @ w.t() with w (N, 4096): decode rows (the GEMV variant takes M <= 8, the swapped
# GEMM 16) against a square weight and an MLP's up projection.
DECODE = [(m, n) for n in (4096, 14336) for m in (1, 2, 4, 8, 16)]
SIMT = ck.GemvConfig(tensor_cores=False)  # the 16-bit rows also timed on the FP32-FMA kernel


def decode(reps, gen):
    """F.linear in a decode step: x (M, 4096) @ w.t(). A model's weights come from DRAM, so the timed calls
    take the next weight of a rotation with every call (``bench.input_rotation``; > 150 MB in all, 4 at
    least) so that L2 (50 MB) holds none of the one a call reads."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for m, n in DECODE:
            x = _rand((m, 4096), dtype, gen)
            sets = max(4, -(-150_000_000 // (n * 4096 * x.element_size())))
            ws = [_rand((n, 4096), dtype, gen) for _ in range(sets)]
            op = _op(dtype)
            rotate = bench.input_rotation(sets)  # every call takes the next weight, whichever function makes it
            fns = {"ours": rotate(lambda i: op(x, ws[i].t())), "torch": rotate(lambda i: F.linear(x, ws[i]))}
            if dtype != torch.float32 and m <= 8:
                fns["simt"] = rotate(lambda i: op(x, ws[i].t(), config=SIMT))
            times = bench.interleaved_times(fns, reps=reps)
            ours_us, torch_us = statistics.median(times["ours"]), statistics.median(times["torch"])
            simt = f" (FP32-FMA GEMV {statistics.median(times['simt']):.1f})" if "simt" in times else ""
            wall_ours = bench.wall_us_per_call(lambda: op(x, ws[0].t()), calls=50)
            wall_torch = bench.wall_us_per_call(lambda: F.linear(x, ws[0]), calls=50)
            gbs = n * 4096 * x.element_size() / ours_us / 1e3
            line = (f"| decode x {m}x4096 @ w.t(), w {n}x4096, {str(dtype)[6:]} | {ours_us:.1f} ({gbs:.0f} GB/s){simt} | "
                    f"{torch_us:.1f} | {torch_us / ours_us:.2f}x | {wall_ours:.1f} | {wall_torch:.1f} | "
                    f"{wall_torch / wall_ours:.2f}x | {_checked(op(x, ws[0].t()), x, ws[0].t())} |")
            print(line, flush=True)
            yield line
            del ws


def linear(reps, gen):
    dtype = torch.bfloat16
    x = _rand((8192, 4096), dtype, gen)
    w = _rand((4096, 4096), dtype, gen).requires_grad_()
    x.requires_grad_()
    g = _rand((8192, 4096), dtype, gen)

    def ours():
        y = ck.hgemm(x, w.t())
        return torch.autograd.grad(y, (x, w), g)

    def theirs():
        y = F.linear(x, w)
        return torch.autograd.grad(y, (x, w), g)

    dx, dw = ours()
    tx, tw = theirs()
    with torch.no_grad():
        ok = [_checked(dx, g, w.detach()), _checked(dw.t(), x.detach().t(), g)]
    checked = "yes" if all(v == "yes" for v in ok) else "; ".join(ok)
    del tx, tw
    yield _row("linear fwd+bwd x 8192x4096, w 4096x4096 bf16", ours, theirs, reps, checked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--only", default="batched,layouts,decode,linear")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    lines = ["| case | ours GPU (us) | torch GPU (us) | speed-up | ours wall (us) | torch wall (us) | wall speed-up "
             "| checked |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for part in args.only.split(","):
        lines += list({"batched": batched, "layouts": layouts, "decode": decode, "linear": linear}[part](args.reps, gen))
    bench.report("\n".join(lines) + "\n", "gemm_models.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
