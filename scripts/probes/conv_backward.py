"""GPU probe for the convolutions' backward (issue 26): both gradients of ``ck.conv3d``/``conv2d``/``conv1d``
against torch's autograd through ``F.conv*d`` (cuDNN, TF32 off in the forward and the backward), GPU time of the backward alone (the forward
and its saved tensors made once per input set), interleaved with ``tools.bench.interleaved_times``, medians.
Each case is first checked against autograd in float64 (``runtime.oracle``: at most twice torch's error).

    PYTHONPATH=. python scripts/probes/conv_backward.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.runtime import oracle  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

# (label, input shape, kernel shape, padding): the backward target first, then everyday ones.
CASES = [
    ("256x128x128 with 5^3", (256, 128, 128), (5, 5, 5), "valid"),
    ("128^3 with 3^3, same", (128, 128, 128), (3, 3, 3), "same"),
    ("2048^2 with 7^2, same", (2048, 2048), (7, 7), "same"),
    ("2^22 samples with 15 taps", (1 << 22,), (15,), "same"),
]
OPS = {3: (ck.conv3d, torch.nn.functional.conv3d), 2: (ck.conv2d, torch.nn.functional.conv2d),
       1: (ck.conv1d, torch.nn.functional.conv1d)}


def torch_conv(fn, x, k, padding):
    # cuDNN's autotuner on (its fastest algorithm, chosen on the first call), TF32 off: the report's baseline.
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
        return fn(x[None, None], k[None, None], padding=padding)[0, 0]


def torch_grad(y, inputs, grad, **kwargs):
    """autograd through torch's convolution with its backward's convolutions in FP32 too (TF32 off), autotuned."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
        return torch.autograd.grad(y, inputs, grad, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    lines = ["| case | ours (us) | torch (us) | speed-up | checked |", "| --- | --- | --- | --- | --- |"]
    for label, shape, kshape, padding in CASES:
        ours_fn, torch_fn = OPS[len(kshape)]
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(shape, device="cuda", generator=gen, requires_grad=True)
        k = torch.randn(kshape, device="cuda", generator=gen, requires_grad=True)
        y_ours, y_torch = ours_fn(x, k, padding=padding), torch_conv(torch_fn, x, k, padding)
        grad = torch.randn(y_ours.shape, device="cuda", generator=gen)
        ours = torch.autograd.grad(y_ours, (x, k), grad, retain_graph=True)
        x64, k64 = x.detach().double().requires_grad_(), k.detach().double().requires_grad_()
        exact = torch_grad(torch_conv(torch_fn, x64, k64, padding), (x64, k64), grad.double())
        theirs = torch_grad(y_torch, (x, k), grad, retain_graph=True)
        verdicts = [oracle.compare(m, e, t) for m, e, t in zip(ours, exact, theirs)]
        checked = all(verdicts)
        times = bench.interleaved_times({
            "ours": lambda _r: torch.autograd.grad(y_ours, (x, k), grad, retain_graph=True),
            "torch": lambda _r: torch_grad(y_torch, (x, k), grad, retain_graph=True),
        }, reps=args.reps)
        ours_us, torch_us = statistics.median(times["ours"]), statistics.median(times["torch"])
        detail = "yes" if checked else "NO: " + "; ".join(v.detail for v in verdicts if not v)
        lines.append(f"| {label} | {ours_us:.1f} | {torch_us:.1f} | {torch_us / ours_us:.2f}x | {detail} |")
        print(lines[-1], flush=True)
    bench.report("\n".join(lines) + "\n", "conv_backward.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
