"""2-D and 1-D valid cross-correlation as front ends over the conv3d entries: an image is a volume of
depth 1 and a signal a volume of depth and height 1, so the same kernels, configs and tuned tables run
them, through views (no copy). The checks here name the 2-D and 1-D arguments; what passes them is a
valid conv3d call.
"""

from __future__ import annotations

import torch

from ...runtime import checks
from .op import conv3d
from .problem import COORD_MARGIN, MAX_KERNEL_SIDE

__all__ = ["conv2d", "conv1d", "check_planar_args"]

_LAYOUTS = {2: ("image", "(H, W) or (N, H, W)", "(KH, KW)"), 1: ("signal", "(W,) or (N, W)", "(KW,)")}


def check_planar_args(x, kernel, out, rank: int) -> tuple:
    """The checks of ``conv2d`` (rank 2) or ``conv1d`` (rank 1), in the order the op makes them, naming
    ``image``/``signal``, ``kernel`` and ``out``; returns the result's shape."""
    name, shapes, kernel_shape = _LAYOUTS[rank]
    checks.tensor(name, x)
    checks.tensor("kernel", kernel)
    if x.dim() not in (rank, rank + 1):
        raise ValueError(f"{name}: expected a {shapes} tensor, got {x.dim()}-D with shape {tuple(x.shape)}")
    if kernel.dim() != rank:
        raise ValueError(f"kernel: expected a {kernel_shape} tensor, got {kernel.dim()}-D with shape "
                         f"{tuple(kernel.shape)}")
    checks.dtype_in(name, x, (torch.float32,))
    checks.dtype_in("kernel", kernel, (torch.float32,))
    ksides, sides = tuple(kernel.shape), tuple(x.shape[-rank:])
    if not all(1 <= s <= MAX_KERNEL_SIDE for s in ksides):
        raise ValueError(f"kernel: expected each side in 1..{MAX_KERNEL_SIDE}, got shape {ksides}")
    if min(sides) == 0:
        raise ValueError(f"{name}: expected non-empty sides, got shape {tuple(x.shape)}")
    if any(k > s for k, s in zip(ksides, sides)):
        raise ValueError(f"kernel: shape {ksides} is larger than the {name}'s {sides} along some side")
    if max(sides) > checks.INT32_MAX - COORD_MARGIN:
        raise ValueError(f"{name}: sides {sides} past 2^31 - 1 - {COORD_MARGIN} do not fit the kernel's 32-bit "
                         f"coordinates")
    out_shape = (*x.shape[:-rank], *(s - k + 1 for s, k in zip(sides, ksides)))
    if out is not None:
        checks.output("out", out, shape=out_shape, dtype=torch.float32, device=x.device,
                      inputs={name: x, "kernel": kernel})
    checks.cuda_tensor(name, x)
    checks.cuda_tensor("kernel", kernel)
    checks.same_device(**{name: x, "kernel": kernel})
    return out_shape


def conv2d(image: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None, config=None,
           variant: str | None = None) -> torch.Tensor:
    """Valid 2-D cross-correlation of ``image`` (H, W) or (N, H, W) with ``kernel`` (KH, KW), like
    ``torch.nn.functional.conv2d`` with one channel: float32, FP32 arithmetic, kernel sides 1..7, none
    longer than the image's. Runs on conv3d's kernels (``config``: a Conv3dConfig) as a volume of depth 1.
    ``out``: a contiguous float32 tensor of the result's shape, not overlapping the inputs."""
    check_planar_args(image, kernel, out, 2)
    result = conv3d(image.unsqueeze(-3), kernel.unsqueeze(0), out=None if out is None else out.unsqueeze(-3),
                    config=config, variant=variant)
    return out if out is not None else result.squeeze(-3)


def conv1d(signal: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None, config=None,
           variant: str | None = None) -> torch.Tensor:
    """Valid 1-D cross-correlation of ``signal`` (W,) or (N, W) with ``kernel`` (KW,), like
    ``torch.nn.functional.conv1d`` with one channel: float32, FP32 arithmetic, 1..7 taps, no more than the
    signal's length. Runs on conv3d's kernels as a volume of depth and height 1. ``out``: a contiguous
    float32 tensor of the result's shape, not overlapping the inputs."""
    check_planar_args(signal, kernel, out, 1)
    as_volume = (lambda t: t.unsqueeze(-2).unsqueeze(-2))  # (..., W) -> (..., 1, 1, W)
    result = conv3d(as_volume(signal), kernel.reshape(1, 1, -1), out=None if out is None else as_volume(out),
                    config=config, variant=variant)
    return out if out is not None else result.squeeze(-2).squeeze(-2)
