"""GPU probe for the Hopper 3xTF32 SGEMM (``ops/gemm/sgemm_sm90.py``, registry entry ``sgemm/tf32x3_wgmma``):
checked by the SGEMM's oracle on each shape, then timed against cuBLAS's float32 GEMM (TF32 off) and the
sm80-style 3xTF32 kernel on mma.sync (``ck.sgemm`` with its default ``Tf32x3GemmConfig``) in one interleaved loop (``tools.bench.interleaved_times``, input sets
rotated as the benchmark does). A Markdown table goes to stdout.

    PYTHONPATH=. python3 scripts/probes/sgemm_sm90_probe.py [--shape 4096x4096x4096 ...] [--reps 20]
        [--weight] [--a-transposed] [--batch B] [--tile 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.ops.gemm import reference, sgemm_sm90  # noqa: E402
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools.bench import cold_input_sets, input_rotation, interleaved_times  # noqa: E402

SHAPES = ("2048x2048x2048", "4096x4096x4096", "8192x8192x8192", "8192x6144x4096", "3072x3072x3072",
          "1024x1024x1024", "128x4096x4096", "4096x128x4096")


def verdict(out, a, b) -> str:
    ref = torch.matmul(a.double(), b.double())
    theirs = torch.matmul(a, b)
    for i in range(a.shape[0]) if a.dim() == 3 else (None,):
        pick = (lambda t: t[i]) if i is not None else (lambda t: t)
        v = oracle.compare(pick(out), pick(ref), pick(theirs), scale=reference.gemm_scale(pick(a), pick(b)))
        if not v:
            return f"FAILED{'' if i is None else f' (product {i})'}: {v.detail}"
    return "ok"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="MxNxK (repeatable; default: the probe's list)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--weight", action="store_true", help="b as w.t() of a row-major (N, K) weight")
    parser.add_argument("--a-transposed", action="store_true", help="a as x.t() of a row-major (K, M) matrix")
    parser.add_argument("--batch", type=int, default=0, help="batches of this many products (torch.bmm's)")
    parser.add_argument("--tile", type=int, default=128, choices=sgemm_sm90.TILES, help="the CTA tile")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| shape | check | sm90 3xTF32 (us) | TFLOP/s | sm80-style 3xTF32 (us) | cuBLAS FP32 (us) | vs cuBLAS | "
          "vs sm80-style |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shape or SHAPES:
        m, n, k = (int(x) for x in shape.split("x"))
        lead = (args.batch,) if args.batch else ()
        sets = cold_input_sets(4 * max(args.batch, 1) * (m * k + k * n + m * n))
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        inputs = [(torch.randn(*lead, k, m, generator=g, device="cuda").mT if args.a_transposed
                   else torch.randn(*lead, m, k, generator=g, device="cuda"),
                   torch.randn(*lead, n, k, generator=g, device="cuda").mT if args.weight
                   else torch.randn(*lead, k, n, generator=g, device="cuda")) for _ in range(sets)]
        outs = [torch.empty(*lead, m, n, device="cuda") for _ in range(sets)]
        try:
            launch = sgemm_sm90.prepare_for(*inputs[0], outs[0], config=sgemm_sm90.Sm90Tf32x3Config(tile=args.tile))
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"| {shape} | {type(exc).__name__}: {exc} | | | | | | |", flush=True)
            continue
        launch(*inputs[0], None, outs[0], 1.0, 0.0)
        torch.cuda.synchronize()
        check = verdict(outs[0], *inputs[0])
        if check != "ok":
            print(f"| {shape} | {check} | | | | | | |", flush=True)
            continue
        rotate = input_rotation(sets)
        fns = {"sm90": rotate(lambda i: launch(*inputs[i], None, outs[i], 1.0, 0.0)),
               "ck": rotate(lambda i: ck.sgemm(*inputs[i], out=outs[i], config=ck.Tf32x3GemmConfig())),
               "cublas": rotate(lambda i: torch.matmul(*inputs[i], out=outs[i]))}
        times = {name: statistics.median(t) for name, t in interleaved_times(fns, reps=args.reps).items()}
        tflops = 2 * max(args.batch, 1) * m * n * k / times["sm90"] / 1e6
        label = f"{args.batch}x{shape}" if args.batch else shape
        print(f"| {label} | ok | {times['sm90']:.1f} | {tflops:.1f} | {times['ck']:.1f} | {times['cublas']:.1f} | "
              f"{times['cublas'] / times['sm90']:.2f}x | {times['ck'] / times['sm90']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
