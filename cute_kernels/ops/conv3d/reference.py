"""conv3d's float64 reference, its per-element error scale, and the vendor baseline (cuDNN)."""

from __future__ import annotations

import functools

import torch

from .problem import NO_PADS, as_4d


def padded(volume: torch.Tensor, pads: tuple) -> torch.Tensor:
    """``volume`` with ``pads`` (d_lo, d_hi, h_lo, h_hi, w_lo, w_hi) zeros around its last three dims."""
    if pads == NO_PADS:
        return volume
    d_lo, d_hi, h_lo, h_hi, w_lo, w_hi = pads
    return torch.nn.functional.pad(volume, (w_lo, w_hi, h_lo, h_hi, d_lo, d_hi))


def _tap_sum(volume: torch.Tensor, kernel: torch.Tensor, term) -> torch.Tensor:
    """sum over taps (d, r, c) of term(volume window shifted by the tap, kernel[d, r, c]), in float64: the
    window of tap (d, r, c) is volume[..., d:d+OD, r:r+OH, c:c+OW]. One pass per tap, no im2col buffer."""
    kd, kh, kw = kernel.shape
    od, oh, ow = (volume.shape[-3] - kd + 1, volume.shape[-2] - kh + 1, volume.shape[-1] - kw + 1)
    v64 = volume.to(torch.float64)
    k64 = kernel.to(torch.float64).cpu().tolist()
    acc = torch.zeros((*volume.shape[:-3], od, oh, ow), dtype=torch.float64, device=volume.device)
    for d in range(kd):
        for r in range(kh):
            for c in range(kw):
                acc += term(v64[..., d:d + od, r:r + oh, c:c + ow], k64[d][r][c])
    return acc


def conv3d_reference(volume: torch.Tensor, kernel: torch.Tensor, pads: tuple = NO_PADS) -> torch.Tensor:
    """3-D cross-correlation in float64 over the last three dims of ``volume`` (any leading dims), zero-padded
    by ``pads``."""
    return _tap_sum(padded(volume, pads), kernel, lambda window, k: window * k)


def conv3d_scale(volume: torch.Tensor, kernel: torch.Tensor, pads: tuple = NO_PADS) -> torch.Tensor:
    """Per-element error scale of an FP32 conv3d output: a dot product of T = KD*KH*KW terms, so as for
    gemm_scale, sqrt(T) * (sqrt(sum of squared terms) + |sum of terms|). A sequential FP32 sum errs by a
    fraction of an eps of this; a lost tap (~1/T of it) or TF32 rounding does not."""
    taps = kernel.numel()
    volume = padded(volume, pads)
    squares = _tap_sum(volume, kernel, lambda window, k: (window * k) ** 2)
    scale = taps ** 0.5 * (squares.sqrt() + conv3d_reference(volume, kernel).abs())
    return scale.clamp_min(torch.finfo(torch.float64).tiny)


def cudnn_fp32(benchmark: bool | None = None):
    """cuDNN on with TF32 off for the block, the caller's determinism settings kept (``cudnn.flags`` would
    reset whatever it is not given), and its benchmark setting unless ``benchmark`` says otherwise."""
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=True, benchmark=cudnn.benchmark if benchmark is None else benchmark,
                       benchmark_limit=cudnn.benchmark_limit, deterministic=cudnn.deterministic, allow_tf32=False)


def _conv3d_call(volume: torch.Tensor, kernel: torch.Tensor, pads: tuple):
    """torch's convolution of ``volume`` (4-D or 3-D) by ``kernel`` as model code calls it, (N, 1, D, H, W)
    out, to run under ``cudnn_fp32``: conv2d where the depth is one plane and one tap with no padding along
    it, conv1d where the height is too (cuDNN picks its algorithms by rank), else conv3d. Symmetric padding
    goes to cuDNN's own; other padding (an even kernel's "same") is a padded copy first, on every call, as
    torch's "same" makes one."""
    n, d, h, w = as_4d(volume).shape
    kd, kh, kw = kernel.shape
    flat_d = d == 1 and kd == 1 and pads[0:2] == (0, 0)
    rank = (1 if h == 1 and kh == 1 and pads[2:4] == (0, 0) else 2) if flat_d else 3
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[rank]
    weight = kernel.reshape(1, 1, *kernel.shape[3 - rank:])
    out_shape = lambda o: o.reshape(o.shape[0], 1, *(1,) * (3 - rank), *o.shape[2:])  # noqa: E731

    def lower(v):  # (N, D, H, W) -> (N, 1, *the rank's spatial dims)
        return v.reshape(v.shape[0], 1, *v.shape[4 - rank:])

    if pads[0::2] == pads[1::2]:
        source, padding = lower(as_4d(volume)), tuple(pads[0::2])[3 - rank:]
        return lambda: out_shape(conv(source, weight, padding=padding))
    return lambda: out_shape(conv(lower(as_4d(padded(volume, pads))), weight))


def torch_conv3d(volume: torch.Tensor, kernel: torch.Tensor, pads: tuple = NO_PADS, *,
                 tuned: bool = False) -> torch.Tensor:
    """torch's (cuDNN's) FP32 answer, TF32 off: the error our kernel is allowed twice of. ``tuned``: on
    cuDNN's autotuned algorithm (its fastest for the shape, chosen on the first call), the report's baseline."""
    with cudnn_fp32(benchmark=True if tuned else None):
        o = _conv3d_call(volume, kernel, pads)().squeeze(1)
    return o if volume.dim() == 4 else o[0]


def eager_torch_conv3d(volume: torch.Tensor, kernel: torch.Tensor, pads: tuple = NO_PADS):
    """The report's wall figure: torch's calls back to back, cuDNN's tuned FP32 settings made once around them."""
    return _conv3d_call(volume, kernel, pads), functools.partial(cudnn_fp32, benchmark=True)
