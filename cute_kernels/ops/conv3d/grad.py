"""The gradients of the convolutions: the volume's is a convolution of the output's gradient with the flipped
kernel (our forward kernel, padded so the result has the volume's shape); the kernel's is a correlation of
the padded volume with the output's gradient, whose "kernel" is as large as the output, so it has its own
CUDA kernel (``conv3d.cu``: conv3d_kernel_grad, each CTA's sums added on the host in a fixed order)."""

from __future__ import annotations

import ctypes

import torch

from ...runtime import checks, nvrtc
from ...runtime.device import current_stream_handle, on_device
from ...runtime.workspace import stream_buffer
from .entry import SOURCE

GRAD_TILE = (16, 32)  # output rows x columns per CTA
GRAD_ROW_TILE = (1, 512)  # one output row (a signal): a row of the tile's width
GRAD_THREADS = 256
GRAD_CHUNK = 8  # output planes per CTA


class Conv3dGradArgs(ctypes.Structure):
    """conv3d.cu's ``conv3d::GradArgs``, field for field (natural C alignment on both sides: 104 bytes)."""

    _fields_ = [
        ("volume", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
        ("partials", ctypes.c_void_p),
        ("stride_n", ctypes.c_int64),
        ("stride_d", ctypes.c_int64),
        ("stride_h", ctypes.c_int64),
        ("depth", ctypes.c_int32),
        ("height", ctypes.c_int32),
        ("width", ctypes.c_int32),
        ("out_depth", ctypes.c_int32),
        ("out_height", ctypes.c_int32),
        ("out_width", ctypes.c_int32),
        ("tiles_w", ctypes.c_int32),
        ("tiles_h", ctypes.c_int32),
        ("chunks_d", ctypes.c_int32),
        ("chunk_depth", ctypes.c_int32),
        ("pad_d", ctypes.c_int32),
        ("pad_h", ctypes.c_int32),
        ("pad_w", ctypes.c_int32),
    ]


def grad_tile(out_height: int) -> tuple[int, int]:
    return GRAD_ROW_TILE if out_height == 1 else GRAD_TILE


def grad_name_expression(ksides: tuple, tile: tuple = GRAD_TILE) -> str:
    kd, kh, kw = ksides
    return f"conv3d::conv3d_kernel_grad<{kd}, {kh}, {kw}, {tile[0]}, {tile[1]}, {GRAD_THREADS}>"


def _sizes(name: str, values, count: int, least: int) -> tuple:
    """``values``: ``count`` ints >= ``least`` (as ``checks.integer`` takes them: NumPy integers, and the
    SymInts of torch.compile's traced backward)."""
    sizes = tuple(checks.integer(v) for v in values) if isinstance(values, (list, tuple)) else ()
    if len(sizes) != count or any(v is None for v in sizes):
        raise TypeError(f"{name}: expected {count} ints, got {values!r}")
    if any(v < least for v in sizes):
        raise ValueError(f"{name}: expected {count} ints >= {least}, got {list(sizes)}")
    return sizes


def check_kernel_grad_args(volume, grad, kernel_sides, pads) -> tuple:
    """The kernel-gradient op's arguments are a conv3d's: ``volume`` (N, D, H, W) and ``grad`` (N, OD, OH,
    OW) float32, the output's gradient of a kernel of ``kernel_sides`` over the volume padded by ``pads``
    (before and after each of D, H, W), both on one CUDA device; returns the kernel's sides. The custom op
    checks them before any launch (its callers are ours, but torch.ops.cute_kernels.conv3d_kernel_grad is
    anyone's)."""
    for name, t in (("volume", volume), ("grad", grad)):
        checks.tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a (N, D, H, W) tensor, got {t.dim()}-D with shape {tuple(t.shape)}")
        checks.dtype_in(name, t, (torch.float32,))
    ksides = _sizes("kernel_sides", kernel_sides, 3, 1)
    pads = _sizes("pads", pads, 6, 0)
    padded = tuple(side + pads[2 * i] + pads[2 * i + 1] for i, side in enumerate(volume.shape[1:]))
    if any(k > side for k, side in zip(ksides, padded)):
        raise ValueError(f"kernel_sides: {ksides} is larger than the padded volume's (D, H, W) = {padded}")
    expected = (volume.shape[0], *(side - k + 1 for side, k in zip(padded, ksides)))
    if tuple(grad.shape) != expected:
        raise ValueError(f"grad: expected shape {expected} (the output of a {ksides} kernel over the padded "
                         f"volume), got {tuple(grad.shape)}")
    checks.cuda_tensor("volume", volume)
    checks.cuda_tensor("grad", grad)
    checks.same_device(volume=volume, grad=grad)
    return ksides


def kernel_grad(volume: torch.Tensor, grad: torch.Tensor, ksides: tuple, pads: tuple) -> torch.Tensor:
    """dK of a conv3d of ``volume`` (N, D, H, W; unit stride along W) zero-padded by ``pads`` with a
    kernel of ``ksides``, from the output's gradient ``grad`` (N, OD, OH, OW)."""
    grad = grad.contiguous()
    n, od, oh, ow = grad.shape
    taps = ksides[0] * ksides[1] * ksides[2]
    if volume.stride(-1) != 1 and volume.shape[-1] > 1:
        volume = volume.contiguous()
    tile = grad_tile(oh)
    tiles_w, tiles_h, chunks = -(-ow // tile[1]), -(-oh // tile[0]), -(-od // GRAD_CHUNK)
    ctas = tiles_w * tiles_h * chunks * n
    if ctas == 0:
        return torch.zeros(ksides, dtype=torch.float32, device=volume.device)
    index = volume.device.index
    partials = None

    def run():
        nonlocal partials
        stream = current_stream_handle(index)
        partials = stream_buffer("partials", index, stream, ctas * taps, per_thread=True)[:ctas * taps].view(ctas, taps)
        kernel = nvrtc.kernel_for(SOURCE, grad_name_expression(ksides, tile), index)
        sn, sd, sh, _ = volume.stride()
        args = Conv3dGradArgs(volume.data_ptr(), grad.data_ptr(), partials.data_ptr(), sn, sd, sh,
                              *volume.shape[1:], od, oh, ow, tiles_w, tiles_h, chunks, GRAD_CHUNK,
                              pads[0], pads[2], pads[4])
        nvrtc.PackedLaunch(kernel, (ctas, 1, 1), (GRAD_THREADS, 1, 1), (args,)).launch(stream)

    on_device(index, run)
    return partials.sum(0).reshape(ksides)  # a fixed order: the same bits every time


def input_grad_padding(ksides: tuple, pads: tuple) -> tuple[tuple, tuple]:
    """How the output's gradient is cropped and padded so that its correlation with the flipped kernel has
    the volume's shape: per dim, ((crop before, crop after), (pad before, pad after)). A forward pad p next
    to a kernel side k becomes k - 1 - p zeros, or a crop of p - (k - 1) where p > k - 1."""
    crops, padding = [], []
    for k, lo, hi in zip(ksides, pads[0::2], pads[1::2]):
        before, after = k - 1 - lo, k - 1 - hi
        crops.append((max(0, -before), max(0, -after)))
        padding.append((max(0, before), max(0, after)))
    return tuple(crops), tuple(padding)
