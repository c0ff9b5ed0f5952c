"""conv3d's ``direct`` variant: the register-blocked kernel of ``legacy_cuda/conv3d.cu`` (compiled with
NVRTC), its launch, and its registry entry."""

from __future__ import annotations

import ctypes

import torch

from cute_kernels.runtime import nvrtc
from cute_kernels.runtime.nvrtc import checked_compile

from ...registry import KernelSpec, log2_floor, register
from ...runtime.device import current_stream_handle
from .config import Conv3dConfig, candidates, default_config
from .config import grid_shape, why_unsupported
from .problem import Conv3dProblem, as_4d
from .entry import SOURCE, shared_spec_fields


def name_expression(config: Conv3dConfig, problem: Conv3dProblem) -> str:
    return (f"conv3d::conv3d_kernel<{problem.kd}, {problem.kh}, {problem.kw}, {config.tile_h}, {config.tile_w}, "
            f"{config.thread_h}, {config.thread_w}, {config.stages}, {problem.in_vec}, {problem.out_vec}>")


compile = checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001


class Conv3dArgs(ctypes.Structure):
    """conv3d.cu's ``conv3d::Args``, field for field (natural C alignment on both sides: 104 bytes)."""

    _fields_ = [
        ("volume", ctypes.c_void_p),
        ("weights", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
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


# (config's template fields, kernel sides, vector widths, device) -> (kernel, threads, shared bytes). One entry
# per compiled kernel and device, a finite set (every part of the key is a template argument), so unbounded.
_plans: dict[tuple, tuple] = {}


def _plan(config: Conv3dConfig, problem: Conv3dProblem, device: int) -> tuple:
    key = (config.compile_key(), problem.kd, problem.kh, problem.kw, problem.in_vec, problem.out_vec, device)
    plan = _plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        plan = _plans[key] = (kernel, config.threads, config.shared_bytes(problem.kd, problem.kh, problem.kw))
    return plan


class Conv3dLaunch:
    """The direct kernel's launch for every call of one structure: ``launch(volume, kernel, out)`` writes
    this call's three pointers into the packed ``Conv3dArgs`` and enqueues it on torch's current stream.
    The tensors are those the kernel reads as they are (unit stride along W, a contiguous kernel and
    output): a 3-D volume or output shares its pointer with its 4-D view."""

    def __init__(self, packed, args: Conv3dArgs, device_index: int):
        self.packed, self.args, self.device_index = packed, args, device_index

    def __call__(self, volume, kernel, out) -> None:
        a = self.args
        stream = current_stream_handle(self.device_index)
        with self.packed.lock:
            a.volume, a.weights, a.out = volume.data_ptr(), kernel.data_ptr(), out.data_ptr()
            self.packed.launch(stream)


def prepare(config: Conv3dConfig, problem: Conv3dProblem, inputs: dict, out: torch.Tensor) -> Conv3dLaunch:
    """The launch for calls with the strides of ``inputs["volume"]`` (unit stride along W) and a
    contiguous kernel and ``out``, on their device: the kernel loaded, the grid sized, the arguments packed.
    Nothing is checked here: the op and the tests check."""
    volume = as_4d(inputs["volume"])
    device = volume.device.index
    function, threads, shared_bytes = _plan(config, problem, device)
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    sn, sd, sh, _ = volume.stride()
    args = Conv3dArgs(0, 0, 0, sn, sd, sh, problem.depth, problem.height, problem.width,
                      problem.out_depth, problem.out_height, problem.out_width, tiles_w, tiles_h, chunks, config.depth,
                      problem.pads[0], problem.pads[2], problem.pads[4])
    packed = nvrtc.PackedLaunch(function, (tiles_w * tiles_h * chunks * problem.batch, 1, 1), (threads, 1, 1), (args,),
                                shared_mem=shared_bytes)
    return Conv3dLaunch(packed, args, device)


def launch(config: Conv3dConfig, problem: Conv3dProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Convolve ``inputs["volume"]`` (unit stride along W) with ``inputs["kernel"]`` (contiguous) into
    ``out`` (contiguous), on torch's current stream: one :func:`prepare`d launch."""
    prepare(config, problem, inputs, out)(inputs["volume"], inputs["kernel"], out)
    return out


# ---- Registry entry ----------------------------------------------------------------------------------------


def _standard_problems() -> list[Conv3dProblem]:
    return [
        Conv3dProblem(1, 256, 256, 256, 5, 5, 5),
        Conv3dProblem(1, 256, 128, 128, 5, 5, 5),  # LeetGPU's largest
        Conv3dProblem(1, 256, 256, 256, 3, 3, 3),
        Conv3dProblem(1, 128, 128, 128, 7, 7, 7),
    ]


def shape_bucket(problem: Conv3dProblem) -> str:
    """Tuned-config key: the kernel's sides, and the log2 of the output's depth, height and width (what the
    tiles divide) and of the batch."""
    d, h, w, n = (log2_floor(x) for x in (problem.out_depth, problem.out_height, problem.out_width, problem.batch))
    return (f"k{problem.kd}x{problem.kh}x{problem.kw}:d2^{d}:h2^{h}:w2^{w}:n2^{n}:"
            f"in{problem.in_vector}:out{problem.out_vector}")


SPEC = register(KernelSpec(
    **shared_spec_fields(),
    variant="direct",
    config_cls=Conv3dConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    prepare=prepare,
    standard_problems=_standard_problems,
    description="direct 3-D convolution streaming input planes through shared memory, KD output planes per thread (conv3d.cu)",
    shape_bucket=shape_bucket,
    sweep_axes=(("tile_h", "tile_w", "thread_h", "thread_w"), ("depth", "stages")),
))
