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

import argparse
import statistics

import torch

import cute_kernels as ck
from cute_kernels.runtime import oracle
from cute_kernels.tools.bench import cold_input_sets, input_rotation, interleaved_times

SHAPES = ["4096x16x4096", "4096x128x4096", "4096x64x4096", "8192x32x8192", "4096x8x4096"]


def kernels_of(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--shape", action="append", help="MxNxK (repeatable; default: the zoo's skinny N)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print("| shape | way | us | vs cuBLAS | verified | kernels |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in args.shape or SHAPES:
        m, n, k = (int(s) for s in shape.split("x"))
        copies = cold_input_sets((m * k + k * n + m * n) * dtype.itemsize)
        sets = [(torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype))
                for _ in range(copies)]
        ways = {"op": lambda a, b: ck.hgemm(a, b), "swapped": lambda a, b: ck.hgemm(b.t(), a.t()).t(),
                "swapped+copy": lambda a, b: ck.hgemm(b.t(), a.t()).t().contiguous(),
                "rows+copies": lambda a, b: ck.hgemm(b.t().contiguous(), a.t()).t().contiguous(),
                "cuBLAS": lambda a, b: torch.mm(a, b)}
        a, b = sets[0]
        ref = a.double() @ b.double()
        cublas = torch.mm(a, b)
        verdicts = {name: oracle.compare(fn(a, b), ref, cublas) for name, fn in ways.items()}
        rotate = input_rotation(copies)
        times = interleaved_times({name: rotate(lambda i, fn=fn: fn(*sets[i])) for name, fn in ways.items()
                                   if verdicts[name]}, reps=args.reps, device="cuda")
        base = statistics.median(times["cuBLAS"])
        for name, fn in ways.items():
            us = statistics.median(times[name]) if name in times else float("nan")
            launched = ", ".join(kernels_of(lambda: fn(a, b)))
            print(f"| {shape} {args.dtype} | {name} | {us:.1f} | {base / us:.2f}x | {bool(verdicts[name])} "
                  f"{verdicts[name].detail} | {launched} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
