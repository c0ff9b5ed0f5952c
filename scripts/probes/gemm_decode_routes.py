"""Decode rows times a transposed weight, x (M, K) @ w.t() with 17-64 rows, by the op's route (on sm_90 the
Hopper kernel reading x and w.t() as they lie: hgemm.SWAP_SM90_MAX_ROWS) against its transpose with
copies (x^T copied row-major, out^T written to a fresh tensor and copied back: ``ck.hgemm(w,
x.t().contiguous()).t().contiguous()`` through the public op, the route the swap takes where the Hopper
kernel cannot read the call) and against cuBLAS. Each way is checked against float64 first; GPU time from
one interleaved loop (medians, input sets rotated so that L2 holds none of a call's inputs), then eager
wall per call, back to back.

    PYTHONPATH=. python scripts/probes/gemm_decode_routes.py [--dtype bfloat16] [--shape 24x4096x4096 ...]
"""

from __future__ import annotations

import torch
from gemm_probe_common import checked_ways_times, cold_operand_sets, problem_dims, shape_probe_args

import cute_kernels as ck
from cute_kernels.tools.bench import interleaved_walls

# Decode rows under the swap's bound of 1024^3 of work (rows a multiple of 8, so that the transposed route's
# fresh x^T copy is TMA-aligned and both routes can run on the Hopper kernel).
SHAPES = ["24x4096x4096", "32x4096x4096", "40x3072x4096", "48x2048x4096", "64x2048x4096", "32x1024x4096",
          "64x1024x4096", "56x4096x1024", "64x4096x512"]


def main() -> int:
    args, dtype = shape_probe_args(__doc__.splitlines()[0], "decode rows under the swap's bound")
    print("| shape | the op (us) | transposed with copies (us) | cuBLAS (us) | op vs cuBLAS | copies vs cuBLAS "
          "| wall op / copies / cuBLAS (us) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shape or SHAPES:
        m, n, k = problem_dims(shape)
        sets = cold_operand_sets(dtype, ((m, k), (n, k)), m * n)  # x and the weight w (w.t() is b)
        ways = {"op": lambda x, w: ck.hgemm(x, w.t()),
                "copies": lambda x, w: ck.hgemm(w, x.t().contiguous()).t().contiguous(),
                "cuBLAS": lambda x, w: torch.mm(x, w.t())}
        x, w = sets[0]
        verdicts, us = checked_ways_times(ways, sets, x.double() @ w.double().t(), torch.mm(x, w.t()), args.reps)
        if not all(verdicts.values()):
            print(f"| {shape} | not verified: {({k: v.detail for k, v in verdicts.items() if not v})} |")
            continue
        walls = interleaved_walls([lambda fn=fn: fn(x, w) for fn in ways.values()], calls=200, device="cuda")
        print(f"| {shape} {args.dtype} | {us['op']:.1f} | {us['copies']:.1f} | {us['cuBLAS']:.1f} "
              f"| {us['cuBLAS'] / us['op']:.2f}x | {us['cuBLAS'] / us['copies']:.2f}x "
              f"| {' / '.join(f'{wall:.1f}' for wall in walls)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
