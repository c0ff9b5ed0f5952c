"""Skinny-N products, D = A @ B with N <= 128 columns (the zoo's 4096x16x4096 and 4096x128x4096 sit at
0.86-0.88x cuBLAS on their own route): whether computing the transposed product, D^T = B^T @ A^T, where
the skinny side is M and the GEMV and small-M tiles serve it, is faster. Each way is checked against
float64 first, then everything is timed in one interleaved loop (GPU time, medians, input sets rotated so
that L2 holds none of a call's inputs), and the kernels each launches are listed (profiler).

    PYTHONPATH=. python scripts/probes/gemm_skinny_n.py [--dtype float16] [--shape 4096x16x4096 ...]

Ways: ``op`` ck.hgemm(a, b) as the op routes it; ``swapped`` ck.hgemm(b.t(), a.t()).t(), the same
product as a transposed view (b.t() is an M-major A, which the GEMV variant does not take);
``swapped+copy`` that view made row-major (what a row-major result would cost); ``rows+copies``
ck.hgemm(b.t().contiguous(), a.t()).t().contiguous(), B^T copied to rows first so that up to 16 columns
reach the GEMV variant (a as the transposed weight it reads in place), as the op's SwappedLaunch does for
few rows; ``cuBLAS`` torch.mm(a, b).
"""

from __future__ import annotations

import torch
from gemm_probe_common import checked_ways_times, cold_operand_sets, problem_dims, shape_probe_args

import cute_kernels as ck

SHAPES = ["4096x16x4096", "4096x128x4096", "4096x64x4096", "8192x32x8192", "4096x8x4096"]


def kernels_of(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> int:
    args, dtype = shape_probe_args(__doc__.splitlines()[0], "the zoo's skinny N")
    print("| shape | way | us | vs cuBLAS | verified | kernels |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in args.shape or SHAPES:
        m, n, k = problem_dims(shape)
        sets = cold_operand_sets(dtype, ((m, k), (k, n)), m * n)
        ways = {"op": lambda a, b: ck.hgemm(a, b), "swapped": lambda a, b: ck.hgemm(b.t(), a.t()).t(),
                "swapped+copy": lambda a, b: ck.hgemm(b.t(), a.t()).t().contiguous(),
                "rows+copies": lambda a, b: ck.hgemm(b.t().contiguous(), a.t()).t().contiguous(),
                "cuBLAS": lambda a, b: torch.mm(a, b)}
        a, b = sets[0]
        verdicts, medians = checked_ways_times(ways, sets, a.double() @ b.double(), torch.mm(a, b), args.reps)
        base = medians["cuBLAS"]
        for name, fn in ways.items():
            us = medians.get(name, float("nan"))
            launched = ", ".join(kernels_of(lambda: fn(a, b)))
            print(f"| {shape} {args.dtype} | {name} | {us:.1f} | {base / us:.2f}x | {bool(verdicts[name])} "
                  f"{verdicts[name].detail} | {launched} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
