"""GPU probe: several GEMM configs on a few shapes, each against cuBLAS in the same interleaved loop.

The question it answers is "which variant and config should the op's default pick for this shape?": every
``--config`` runs through the public op (``ck.hgemm`` / ``ck.sgemm`` with ``config=``; ``default`` is the
op's own choice, staging and all, labelled for a 16-bit row-major ``b`` with the entry and config it runs),
is checked with the oracle, and is timed against ``torch.matmul`` with
``tools.bench.interleaved_times`` (GPU time alone, medians), rotating input sets as the benchmark does
(``bench.cold_input_sets`` / ``bench.input_rotation``: every call, whichever side makes it, takes the next
set, so L2 holds none of its operands). Configs the variant does not support are reported, not timed.
``--weight`` makes every ``b`` the transpose of a row-major (N, K) weight (``x @ w.t()``, ``F.linear``'s
layout: the GEMV variant's). A shape ``BxMxNxK`` is a batch of B products (``torch.bmm``'s), a (B, M, K)
``a`` times a (B, K, N) ``b`` (or (B, N, K) weights transposed with ``--weight``).
``--pitch P`` lays every operand's rows P-element aligned (views of wider buffers): whether a row length that
is not a multiple of 128 bytes (1000^3 fp16: 2000-byte rows) is what a shape's time pays for.
``swap`` times the op's default on the transposed problem (``b.t() @ a.t()``, the (N, M) result copied into
``out`` transposed): the candidate routing for skinny N; ``swap_rows`` the same with ``b.t()`` copied
row-major first (the GEMV variant's ``x @ w.t()`` layout, w = a), the copy timed.

    PYTHONPATH=. python scripts/probes/gemm_configs.py --shape 3072x3072x3072 --shape 1000x1000x1000:bfloat16 \\
        --config default --config sm90:tile_n=192,num_stages=4 --config sm80 --config simt:split_k=4

Config specs: ``default``, ``swap``, ``swap_rows``; or ``VARIANT[:field=value,...]`` with VARIANT one of sm90 (HgemmSm90Config),
sm80 (HgemmConfig), gemv (GemvConfig), simt (the SGEMM's GemmConfig), tf32x3 (Tf32x3GemmConfig); the fields not named keep the
variant's heuristic choice for the shape. The op follows the shape's dtype (float32: sgemm).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics

import torch

import cute_kernels as ck
from cute_kernels.ops.gemm import gemv, hgemm_sm80, hgemm_sm90, reference, sgemm, sgemm_tf32x3
from cute_kernels.ops.gemm import hgemm as hgemm_op
from cute_kernels.ops.gemm.zoo import contiguous_problem
from cute_kernels.tools.bench import cold_input_sets, input_rotation, interleaved_times

_VARIANTS = {"sm90": hgemm_sm90, "sm80": hgemm_sm80, "gemv": gemv, "simt": sgemm, "tf32x3": sgemm_tf32x3}


def _value(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def config_for(spec: str, problem):
    """(label, config or None for the op's default, why it cannot run or None)."""
    if spec == "default" and problem.dtype != "float32" and problem.b_major == "n":
        entry = hgemm_op.default_variant(problem)  # what the op runs: the entry's tuned or heuristic config
        return f"default: {entry.variant} {entry.choose_config(problem, 0).short()}", None, None
    if spec in ("default", "swap", "swap_rows"):
        return spec, None, None
    variant, _, fields = spec.partition(":")
    if variant not in _VARIANTS:
        return spec, None, f"unknown variant {variant!r}: one of {sorted(_VARIANTS)}"
    module = _VARIANTS[variant]
    base = module.default_config(problem)
    changes = dict((k, _value(v)) for k, v in (f.split("=") for f in fields.split(",") if f))
    try:
        config = dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as exc:  # a value the config refuses, or a field it lacks
        return spec, None, str(exc)
    why = module.why_unsupported(config, problem)
    return f"{variant} {config.short()}", config, why


def probe_shape(m: int, n: int, k: int, dtype_name: str, specs: list[str], reps: int, weight: bool = False,
                batch: int = 1, pitch: int = 1):
    dtype = getattr(torch, dtype_name)
    op = ck.sgemm if dtype == torch.float32 else ck.hgemm
    problem = dataclasses.replace(contiguous_problem(m, n, k, dtype_name), batch=batch)
    if weight:
        problem = dataclasses.replace(problem, b_major="k", b_align=problem.a_align)
    sets = cold_input_sets(batch * dtype.itemsize * (m * k + k * n + m * n))
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    lead = (batch,) if batch > 1 else ()

    def operand(rows, cols):
        wide = -(-cols // pitch) * pitch  # rows laid at a multiple of pitch elements, the view cols wide
        return torch.randn(*lead, rows, wide, generator=g, device="cuda").to(dtype)[..., :cols]

    inputs = [(operand(m, k), operand(n, k).transpose(-1, -2) if weight else operand(k, n)) for _ in range(sets)]
    out_pitch = -(-n // pitch) * pitch
    outs = [torch.empty(*lead, m, out_pitch, device="cuda", dtype=dtype)[..., :n] for _ in range(sets)]
    refs = [torch.empty(*lead, m, n, device="cuda", dtype=dtype) for _ in range(sets)]

    def swapped(i, rows=False):  # rows: b^T copied row-major first, the GEMV variant's x @ w.t() (w = a)
        a, b = inputs[i]
        x = b.transpose(-1, -2).contiguous() if rows else b.transpose(-1, -2)
        outs[i].copy_(op(x, a.transpose(-1, -2)).transpose(-1, -2))

    rows = []
    for spec in specs:
        label, config, why = config_for(spec, problem)
        if why is not None:
            rows.append((label, None, None, f"unsupported: {why}"[:90]))
            continue
        if spec in ("swap", "swap_rows"):
            ours = functools.partial(swapped, rows=spec == "swap_rows")
        else:
            def ours(i, config=config):
                op(*inputs[i], out=outs[i], config=config)
        a, b = inputs[0]
        outs[0].fill_(float("nan"))  # a config that writes nothing must not pass on the last one's result
        ours(0)
        torch.matmul(a, b, out=refs[0])
        ok = bool(reference.gemm_verdict(outs[0], a, b, baseline=refs[0]))
        rotate = input_rotation(sets)
        times = interleaved_times({
            "ours": rotate(ours),
            "cublas": rotate(lambda i: torch.matmul(*inputs[i], out=refs[i])),
        }, reps=reps)
        rows.append((label, statistics.median(times["ours"]), statistics.median(times["cublas"]), ok))
    return rows


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS's FP32 baseline is FFMA, as the report's
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True,
                        help="MxNxK[:dtype] or BxMxNxK[:dtype] for a batch (default float16)")
    parser.add_argument("--config", action="append", required=True)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--weight", action="store_true", help="b = w.t() for a row-major (N, K) w")
    parser.add_argument("--pitch", type=int, default=1,
                        help="lay each operand's rows at a multiple of this many elements (views of wider buffers)")
    args = parser.parse_args()
    print("| shape | config | ours (us) | cuBLAS (us) | speed-up | verified |\n| --- | --- | --- | --- | --- | --- |")
    failed = False
    for shape in args.shape:
        dims, _, dtype_name = shape.partition(":")
        sizes = [int(x) for x in dims.split("x")]
        batch, (m, n, k) = (sizes[0], sizes[1:]) if len(sizes) == 4 else (1, sizes)
        dtype_name = dtype_name or "float16"
        # The SGEMM takes the op-level specs, gemv, simt and tf32x3 configs; the HGEMM every other spec.
        fp32 = dtype_name == "float32"
        specs = [s for s in args.config if s.startswith(("simt", "tf32x3")) == fp32 or s.startswith("gemv")
                 or s in ("default", "swap")]
        for label, us, base, ok in probe_shape(m, n, k, dtype_name, specs, args.reps, args.weight, batch,
                                                  args.pitch):
            if us is None:
                print(f"| {dims} {dtype_name} | {label} | - | - | - | {ok} |", flush=True)
                continue
            failed |= ok is not True
            print(f"| {dims} {dtype_name} | {label} | {us:.1f} | {base:.1f} | {base / us:.2f}x | {ok} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
