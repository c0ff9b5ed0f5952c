"""GPU probe for conv3d's variant choice (issue 26): the ``direct`` kernel (every tap unrolled, sides up to
15) against the ``tiled`` one (the kernel walked in shared-memory blocks) on large kernels, the tiled
variant with its default config and with each candidate, and torch's convolution (cuDNN, TF32 off), all
interleaved (``tools.bench.interleaved_times``, medians). Each result is checked against the float64
reference first (``runtime.oracle``, allowed twice torch's error).

    PYTHONPATH=. python scripts/probes/conv_variants.py [--reps 10] [--sweep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.ops.conv3d import tiled  # noqa: E402
from cute_kernels.ops.conv3d.reference import conv3d_reference, torch_conv3d  # noqa: E402
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

# (volume shape, kernel shape): 3-D kernels from 7^3 up, where the unrolled kernel's code outgrows the
# instruction cache, and the 2-D and 1-D ones the direct kernel is chosen for today.
CASES = [
    ((64, 64, 64), (7, 7, 7)), ((128, 128, 128), (9, 9, 9)), ((64, 64, 64), (11, 11, 11)),
    ((64, 64, 64), (13, 13, 13)), ((64, 64, 64), (15, 15, 15)), ((96, 96, 96), (5, 9, 15)),
    ((1, 3072, 3072), (1, 15, 15)), ((1, 1, 1 << 24), (1, 1, 15)), ((1, 1, 1 << 24), (1, 1, 7)),
    ((1, 1, 1 << 20), (1, 1, 3)), ((64, 1, 1, 16384), (1, 1, 7)), ((1, 1, 1_500_000), (1, 1, 2047)),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--sweep", action="store_true", help="time every tiled candidate too")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for vshape, kshape in CASES:
        volume = torch.randn(vshape, device="cuda", generator=gen)
        kernel = torch.randn(kshape, device="cuda", generator=gen)
        ref, theirs = conv3d_reference(volume, kernel), torch_conv3d(volume, kernel)
        fns = {"torch": lambda _r: torch_conv3d(volume, kernel),
               "direct": lambda _r: ck.conv3d(volume, kernel, variant="direct"),
               "tiled": lambda _r: ck.conv3d(volume, kernel, variant="tiled")}
        if args.sweep:
            for config in tiled.candidates():
                fns[f"tiled {config}"] = (lambda c: lambda _r: ck.conv3d(volume, kernel, config=c))(config)
        checked = {}
        for name, fn in list(fns.items()):
            if name == "torch":
                continue
            try:
                verdict = oracle.compare(fn(0), ref, theirs)
            except (ValueError, TypeError) as error:  # a config this shape does not support
                del fns[name]
                checked[name] = f"refused: {str(error)[:80]}"
                continue
            checked[name] = "ok" if verdict else f"WRONG {verdict.detail}"
        times = bench.interleaved_times(fns, reps=args.reps)
        medians = {name: statistics.median(t) for name, t in times.items()}
        flops = 2 * ref.numel() * kernel.numel()
        print(f"## volume {vshape} kernel {kshape}: torch {medians['torch']:.1f} us", flush=True)
        for name, us in sorted(medians.items(), key=lambda kv: kv[1]):
            if name != "torch":
                print(f"  {name}: {us:.1f} us ({medians['torch'] / us:.2f}x torch, {flops / us / 1e6:.1f} TFLOP/s) "
                      f"{checked[name]}", flush=True)
        for name, why in checked.items():
            if why.startswith("refused"):
                print(f"  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
