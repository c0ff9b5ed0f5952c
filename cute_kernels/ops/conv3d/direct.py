"""conv3d's ``direct`` variant: the register-blocked kernel of ``legacy_cuda/conv3d.cu`` (compiled with
NVRTC), its launch, and its registry entry."""

from __future__ import annotations

import ctypes

import torch

from cute_kernels.runtime import nvrtc
from cute_kernels.runtime.nvrtc import checked_compile

from ...registry import KernelSpec, log2_floor, register, register_zoo
from ...runtime.device import current_stream_handle
from .config import Conv3dConfig, candidates, default_config
from .config import grid_shape, why_unsupported
from .problem import Conv3dProblem, as_4d
from .reference import conv3d_reference, conv3d_scale, torch_conv3d

SOURCE = "conv3d.cu"


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


def _make_inputs(problem: Conv3dProblem, device, generator=None) -> dict:
    shape = (problem.batch, problem.depth, problem.height, problem.width)
    volume = torch.randn(shape, dtype=torch.float32, device=device, generator=generator)
    kernel = torch.randn((problem.kd, problem.kh, problem.kw), dtype=torch.float32, device=device, generator=generator)
    return {"volume": volume if problem.batched else volume[0], "kernel": kernel}


def _reference(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return conv3d_reference(inputs["volume"], inputs["kernel"], problem.pads)


def _baseline(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return torch_conv3d(inputs["volume"], inputs["kernel"], problem.pads)


def _standard_problems() -> list[Conv3dProblem]:
    return [
        Conv3dProblem(1, 256, 256, 256, 5, 5, 5),
        Conv3dProblem(1, 256, 128, 128, 5, 5, 5),  # LeetGPU's largest
        Conv3dProblem(1, 256, 256, 256, 3, 3, 3),
        Conv3dProblem(1, 128, 128, 128, 7, 7, 7),
    ]


def _zoo_problems() -> list[Conv3dProblem]:
    """The shape zoo (issue 22): small volumes, batched volumes, every kernel side 1..7 on one volume,
    kernels that are not cubes, sides past 7 and a "same"-padded image."""
    small = [Conv3dProblem(1, 16, 16, 16, 5, 5, 5), Conv3dProblem(1, 32, 32, 32, 3, 3, 3)]
    batched = [Conv3dProblem(8, 64, 64, 64, 3, 3, 3, batched=True), Conv3dProblem(4, 32, 32, 32, 7, 7, 7, batched=True)]
    sides = [Conv3dProblem(1, 64, 64, 64, s, s, s) for s in range(1, 8)]
    uneven = [Conv3dProblem(1, 64, 96, 128, 1, 3, 7), Conv3dProblem(1, 96, 64, 100, 7, 1, 3)]
    # Sides past 7 (issue 26's targets): a 15x15 blur of a 3072^2 image, 9^3 over 128^3, a 15-tap filter.
    large = [Conv3dProblem(1, 1, 3072, 3072, 1, 15, 15), Conv3dProblem(1, 128, 128, 128, 9, 9, 9),
             Conv3dProblem(1, 1, 1, 1 << 24, 1, 1, 15)]
    padded = [Conv3dProblem(1, 1, 4096, 4096, 1, 5, 5, pads=(0, 0, 2, 2, 2, 2))]
    return small + batched + sides + uneven + large + padded


def _held_out_problems() -> list[Conv3dProblem]:
    """Held-out shapes (registry.register_zoo): a 100^3 volume with an even kernel, an uneven batched one."""
    return [Conv3dProblem(1, 100, 100, 100, 4, 4, 4), Conv3dProblem(2, 40, 60, 80, 3, 5, 7, batched=True)]


def _flops(problem: Conv3dProblem) -> float:
    return 2.0 * problem.batch * problem.out_depth * problem.out_height * problem.out_width * problem.taps


def _bytes(problem: Conv3dProblem) -> float:
    outs = problem.batch * problem.out_depth * problem.out_height * problem.out_width
    return 4.0 * (problem.batch * problem.depth * problem.height * problem.width + outs + problem.taps)  # (padding: no bytes)


def shape_bucket(problem: Conv3dProblem) -> str:
    """Tuned-config key: the kernel's sides, and the log2 of the output's depth, height and width (what the
    tiles divide) and of the batch."""
    d, h, w, n = (log2_floor(x) for x in (problem.out_depth, problem.out_height, problem.out_width, problem.batch))
    return (f"k{problem.kd}x{problem.kh}x{problem.kw}:d2^{d}:h2^{h}:w2^{w}:n2^{n}:"
            f"in{problem.in_vector}:out{problem.out_vector}")


SPEC = register(KernelSpec(
    op="conv3d",
    variant="direct",
    backend="nvrtc",
    dtypes=(torch.float32,),
    config_cls=Conv3dConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    prepare=prepare,
    make_inputs=_make_inputs,
    reference=_reference,
    baseline=_baseline,
    flops=_flops,
    bytes=_bytes,
    standard_problems=_standard_problems,
    description="direct 3-D convolution streaming input planes through shared memory, KD output planes per thread (conv3d.cu)",
    sources=(SOURCE,),
    baseline_name="torch conv3d (cuDNN, TF32 off)",
    bound="fp32",
    error_scale=lambda p, inputs: conv3d_scale(inputs["volume"], inputs["kernel"], p.pads),
    shape_bucket=shape_bucket,
    sweep_axes=(("tile_h", "tile_w", "thread_h", "thread_w"), ("depth", "stages")),
))
register_zoo(SPEC.op, _zoo_problems, lambda problem: SPEC, _held_out_problems)
