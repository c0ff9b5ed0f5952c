"""2-D and 1-D cross-correlation as front ends over the conv3d entries: an image is a volume of
depth 1 and a signal a volume of depth and height 1, so the same kernels, configs and tuned tables run
them, through views (no copy). The checks here name the 2-D and 1-D arguments; what passes them is a
valid conv3d call.
"""

from __future__ import annotations

import torch

from ...runtime import checks
from ...runtime.plans import CallPlans
from .op import run_conv3d
from .problem import COORD_MARGIN, conv_pads

__all__ = ["conv2d", "conv1d", "check_planar_args"]

_LAYOUTS = {2: ("image", "(H, W) or (N, H, W)", "(KH, KW)"), 1: ("signal", "(W,) or (N, W)", "(KW,)")}


def check_planar_args(x, kernel, out, rank: int, padding="valid") -> tuple:
    """The checks of ``conv2d`` (rank 2) or ``conv1d`` (rank 1), in the order the op makes them, naming
    ``image``/``signal``, ``kernel``, ``padding`` and ``out``; returns the result's shape."""
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
    if min(ksides) < 1:
        raise ValueError(f"kernel: expected sides of at least 1, got shape {ksides}")
    pads = conv_pads(padding, ksides, rank)[6 - 2 * rank:]
    if min(sides) == 0:
        raise ValueError(f"{name}: expected non-empty sides, got shape {tuple(x.shape)}")
    padded = tuple(s + pads[2 * i] + pads[2 * i + 1] for i, s in enumerate(sides))
    if any(k > s for k, s in zip(ksides, padded)):
        what = f"{name}'s" if padded == sides else f"padded {name}'s"
        raise ValueError(f"kernel: shape {ksides} is larger than the {what} {padded} along some side")
    if max(padded) > checks.INT32_MAX - COORD_MARGIN:
        raise ValueError(f"{name}: {'sides' if padded == sides else 'padded sides'} {padded} past 2^31 - 1 - {COORD_MARGIN} do not fit the kernel's "
                         f"32-bit coordinates")
    out_shape = (*x.shape[:-rank], *(s - k + 1 for s, k in zip(padded, ksides)))
    if out is not None:
        checks.output("out", out, shape=out_shape, dtype=torch.float32, device=x.device,
                      inputs={name: x, "kernel": kernel})
    checks.cuda_tensor(name, x)
    checks.cuda_tensor("kernel", kernel)
    checks.same_device(**{name: x, "kernel": kernel})
    return out_shape


# By call structure (runtime.plans): a structure seen before was checked here and its padding worked out;
# what its calls may still differ in (which memory out overlaps, whether it may be written) conv3d's own plan
# checks on every call.
_PLANS = {2: CallPlans("conv2d"), 1: CallPlans("conv1d")}


def _as_volume(t: torch.Tensor, rank: int) -> torch.Tensor:
    """The (..., 1[, 1], sides) view conv3d takes of a rank-``rank`` image/signal, kernel or result."""
    for _ in range(3 - rank):
        t = t.unsqueeze(-rank - 1)
    return t


def volume_padding(padding, ksides: tuple, rank: int):
    """A rank-``rank`` call's ``padding`` as conv3d's: the names as they are, sizes (checked) as one size per
    dim of the three, or (before, after) pairs where a side differs; none in the dims the call lacks."""
    if isinstance(padding, str):
        return padding
    pads = conv_pads(padding, ksides, rank)
    if pads[0::2] == pads[1::2]:  # one size per dim: the form whose repr (conv3d's plan key) is cheapest
        return pads[0::2]
    return tuple(zip(pads[0::2], pads[1::2]))


def _checked_volume_padding(x, kernel, out, rank: int, padding):
    """A structure's plan: its checks, then its padding as conv3d's (worked out once, not per call)."""
    check_planar_args(x, kernel, out, rank, padding)
    return volume_padding(padding, tuple(kernel.shape), rank)


def _planar(x, kernel, out, config, variant, rank: int, padding) -> torch.Tensor:
    pads = _PLANS[rank].plan((x, kernel, out, config, variant, repr(padding)), _checked_volume_padding, x, kernel,
                             out, rank, padding)
    result = run_conv3d(_as_volume(x, rank), _as_volume(kernel, rank), pads,
                        None if out is None else _as_volume(out, rank), config, variant, _LAYOUTS[rank][0])
    return out if out is not None else result.view(result.shape[:-3] + result.shape[-rank:])


def conv2d(image: torch.Tensor, kernel: torch.Tensor, *, padding="valid", out: torch.Tensor | None = None,
           config=None, variant: str | None = None) -> torch.Tensor:
    """2-D cross-correlation of ``image`` (H, W) or (N, H, W) with ``kernel`` (KH, KW), like
    ``torch.nn.functional.conv2d`` with one channel: float32, FP32 arithmetic, any kernel sides, none
    longer than the padded image's; ``padding`` as ``conv3d``'s (``"valid"``, ``"same"``, an int, or a
    tuple (ph, pw)). Runs on conv3d's kernels (``config``: a Conv3dConfig) as a volume of depth 1.
    ``out``: a contiguous float32 tensor of the result's shape, not overlapping the inputs."""
    return _planar(image, kernel, out, config, variant, 2, padding)


def conv1d(signal: torch.Tensor, kernel: torch.Tensor, *, padding="valid", out: torch.Tensor | None = None,
           config=None, variant: str | None = None) -> torch.Tensor:
    """1-D cross-correlation of ``signal`` (W,) or (N, W) with ``kernel`` (KW,), like
    ``torch.nn.functional.conv1d`` with one channel: float32, FP32 arithmetic, any number of taps, no more than the
    padded signal's length; ``padding`` as ``conv3d``'s (``"valid"``, ``"same"``, an int, or a 1-tuple).
    Runs on conv3d's kernels as a volume of depth and height 1. ``out``: a contiguous float32 tensor of the
    result's shape, not overlapping the inputs."""
    return _planar(signal, kernel, out, config, variant, 1, padding)
