"""2-D and 1-D valid cross-correlation as front ends over the conv3d entries: an image is a volume of
depth 1 and a signal a volume of depth and height 1, so the same kernels, configs and tuned tables run
them, through views (no copy). The checks here name the 2-D and 1-D arguments; what passes them is a
valid conv3d call.
"""

from __future__ import annotations

import torch

from ...runtime import checks
from ...runtime.plans import CallPlans
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


# By call structure (runtime.plans): a structure seen before was checked here; what its calls may still
# differ in (which memory out overlaps, whether it may be written) conv3d's own plan checks on every call.
_PLANS = {2: CallPlans("conv2d"), 1: CallPlans("conv1d")}


def _as_volume(t: torch.Tensor, rank: int) -> torch.Tensor:
    """The (..., 1[, 1], sides) view conv3d takes of a rank-``rank`` image/signal, kernel or result."""
    for _ in range(3 - rank):
        t = t.unsqueeze(-rank - 1)
    return t


def _planar(x, kernel, out, config, variant, rank: int) -> torch.Tensor:
    _PLANS[rank].plan((x, kernel, out, config, variant), check_planar_args, x, kernel, out, rank)
    result = conv3d(_as_volume(x, rank), _as_volume(kernel, rank), out=None if out is None else _as_volume(out, rank),
                    config=config, variant=variant)
    return out if out is not None else result.view(result.shape[:-3] + result.shape[-rank:])


def conv2d(image: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None, config=None,
           variant: str | None = None) -> torch.Tensor:
    """Valid 2-D cross-correlation of ``image`` (H, W) or (N, H, W) with ``kernel`` (KH, KW), like
    ``torch.nn.functional.conv2d`` with one channel: float32, FP32 arithmetic, kernel sides 1..7, none
    longer than the image's. Runs on conv3d's kernels (``config``: a Conv3dConfig) as a volume of depth 1.
    ``out``: a contiguous float32 tensor of the result's shape, not overlapping the inputs."""
    return _planar(image, kernel, out, config, variant, 2)


def conv1d(signal: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None, config=None,
           variant: str | None = None) -> torch.Tensor:
    """Valid 1-D cross-correlation of ``signal`` (W,) or (N, W) with ``kernel`` (KW,), like
    ``torch.nn.functional.conv1d`` with one channel: float32, FP32 arithmetic, 1..7 taps, no more than the
    signal's length. Runs on conv3d's kernels as a volume of depth and height 1. ``out``: a contiguous
    float32 tensor of the result's shape, not overlapping the inputs."""
    return _planar(signal, kernel, out, config, variant, 1)
