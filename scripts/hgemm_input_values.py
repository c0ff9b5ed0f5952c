"""Does the input data move the HGEMM race? Times ``ck.hgemm`` (its default variant and config) against
``torch.matmul`` (cuBLAS) at 8192^3 and 4096^3, fp16 and bf16, on randn inputs and on small integers in
[-2, 2] (the inputs of CUTLASS's Hopper example, whose 894 TFLOP/s issue 9 quotes): tensor-core power, and
so the clock, depends on how many bits toggle. Both kernels see the same inputs, interleaved rep by rep
(``bench.interleaved_times``, GPU time alone, medians); warm L2, as a fixed pair of inputs is.

    PYTHONPATH=. python scripts/hgemm_input_values.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys


def main() -> int:
    import torch

    import cute_kernels as ck
    from cute_kernels import testing
    from cute_kernels.bench import interleaved_times

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| size | dtype | inputs | ours (us) | cuBLAS (us) | ours TFLOP/s | cuBLAS TFLOP/s | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in (8192, 4096):
        for dtype in (torch.float16, torch.bfloat16):
            gen = torch.Generator(device="cuda").manual_seed(size)
            draws = {
                "randn": lambda: torch.randn(size, size, generator=gen, device="cuda"),
                "integers in [-2, 2]": lambda: torch.randint(-2, 3, (size, size), generator=gen, device="cuda").float(),
            }
            for kind, draw in draws.items():
                a, b = draw().to(dtype), draw().to(dtype)
                out, theirs = torch.empty_like(a), torch.empty_like(a)
                times = interleaved_times({"ours": lambda r: ck.hgemm(a, b, out=out),
                                           "cublas": lambda r: torch.matmul(a, b, out=theirs)}, reps=args.reps)
                verdict = testing.gemm_verdict(out, a, b, baseline=theirs)
                if not verdict:
                    print(f"{size} {dtype} {kind}: WRONG: {verdict.detail}")
                    return 1
                ours, cublas = statistics.median(times["ours"]), statistics.median(times["cublas"])
                flops = 2.0 * size**3
                print(f"| {size}^3 | {str(dtype)[6:]} | {kind} | {ours:.1f} | {cublas:.1f} | {flops / ours / 1e6:.0f} "
                      f"| {flops / cublas / 1e6:.0f} | {cublas / ours:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
