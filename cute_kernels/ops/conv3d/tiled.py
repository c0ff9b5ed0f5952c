"""conv3d's ``tiled`` variant: any kernel side, the kernel walked in blocks through shared memory
(``legacy_cuda/conv3d.cu``: conv3d_tiled_kernel, sides as launch arguments). The op runs it where a side is
past what the ``direct`` variant compiles (15); its config, predicate, launch and registry entry."""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from ...registry import KernelSpec, register
from ...runtime import nvrtc
from ...runtime.checks import INT32_MAX
from ...runtime.config_fields import check_choice, check_fields, check_range, field_error
from ...runtime.device import current_stream_handle
from ...runtime.workspace import stream_buffer
from ...runtime.dry_run import is_dry_run
from .entry import SOURCE, shared_spec_fields
from .problem import COORD_MARGIN, Conv3dProblem, as_4d

STATIC_SHARED_BYTES = 48 * 1024  # the kernel's tiles are static shared memory
MAX_GRID_Y = 65535
# The CTAs a launch needs before splitting the kernel's planes stops paying: about what an H200's 132 SMs
# hold at once (up to 8 CTAs of 256 threads each).
RESIDENT_CTAS = 1024
# Signals of at least this many outputs, with at most this many taps, take 8 outputs per thread (probed:
# 2^24 samples with 7 or 15 taps 16-17% faster; 2^20 with 3 taps and 1.5M with 2047 taps faster at 4).
LONG_SIGNAL = 1 << 22
SHORT_SIGNAL_KERNEL = 64


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


@dataclasses.dataclass(frozen=True)
class TiledConvConfig:
    """A CTA computes a ``tile_h x tile_w`` output tile through ``depth`` output planes, each thread
    ``thread_h x thread_w`` of it; the kernel is walked in blocks of ``block_r`` rows x ``block_c`` columns
    of one kernel plane. ``kd_splits`` splits the kernel's planes across that many CTAs per tile (at most;
    each takes ceil(KD / kd_splits) planes), whose partial sums the host adds: parallelism for a small
    output under a deep kernel. ``depth`` and ``kd_splits`` are launch arguments; the rest are template
    arguments."""

    tile_h: int = 32
    tile_w: int = 64
    thread_h: int = 2
    thread_w: int = 4
    block_r: int = 8
    block_c: int = 32
    depth: int = 1
    kd_splits: int = 1

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "thread_w", (4, 8), "4 or 8 (whole 128-bit window loads)")
        check_choice(self, "thread_h", (1, 2, 4), "1, 2 or 4")
        if not 0 < self.tile_w <= 4096 or self.tile_w % self.thread_w:
            raise field_error(self, "tile_w", f"a positive multiple of thread_w = {self.thread_w} up to 4096")
        if not 0 < self.tile_h <= 512 or self.tile_h % self.thread_h:
            raise field_error(self, "tile_h", f"a positive multiple of thread_h = {self.thread_h} up to 512")
        check_range(self, "block_r", 1, 64, "1 to 64 kernel rows per block")
        if not 0 < self.block_c <= 1024 or self.block_c % 4:
            raise field_error(self, "block_c", "a positive multiple of 4 (whole 4-column steps) up to 1024")
        if self.threads % 32 or self.threads > 1024:
            raise ValueError(f"TiledConvConfig: (tile_h / thread_h) * (tile_w / thread_w) = {self.threads} threads; "
                             "expected whole warps and at most 1024")
        if self.shared_bytes > STATIC_SHARED_BYTES:
            raise ValueError(f"TiledConvConfig: the tiles take {self.shared_bytes} bytes of static shared memory, "
                             f"over {STATIC_SHARED_BYTES}")
        check_range(self, "depth", 1, INT32_MAX, f"1 to {INT32_MAX} output planes per CTA")
        check_range(self, "kd_splits", 1, MAX_GRID_Y, f"1 to {MAX_GRID_Y} (the grid's y dimension)")

    @property
    def threads(self) -> int:
        return (self.tile_h // self.thread_h) * (self.tile_w // self.thread_w)

    @property
    def shared_bytes(self) -> int:
        """conv3d.cu's TiledGeometry: the input rows a block reaches at a pitch of round_up(tile_w + block_c,
        4) floats, and the block's weights."""
        pitch = _round_up(self.tile_w + self.block_c, 4)
        return 4 * ((self.tile_h + self.block_r - 1) * pitch + self.block_r * self.block_c)


def grid_shape(config: TiledConvConfig, problem: Conv3dProblem) -> tuple[int, int, int]:
    return (-(-problem.out_width // config.tile_w), -(-problem.out_height // config.tile_h),
            -(-problem.out_depth // config.depth))


def kd_split(config: TiledConvConfig, problem: Conv3dProblem) -> tuple[int, int]:
    """(kernel planes per split, splits): ``kd_splits`` at most, none of them empty."""
    per_split = -(-problem.kd // config.kd_splits)
    return per_split, -(-problem.kd // per_split)


def why_unsupported(config: TiledConvConfig, problem: Conv3dProblem) -> str | None:
    sides = (problem.kd, problem.kh, problem.kw)
    if min(sides) < 1:
        return f"kernel sides {sides} must each be at least 1"
    if problem.out_depth < 1 or problem.out_height < 1 or problem.out_width < 1:
        return f"kernel {sides} is larger than the padded volume {problem.padded_sides}"
    if max(problem.padded_sides) > INT32_MAX - COORD_MARGIN:
        return f"padded volume sides past 2^31 - 1 - {COORD_MARGIN} do not fit the kernel's 32-bit coordinates"
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    if tiles_w * tiles_h * chunks * problem.batch > INT32_MAX:
        return "more CTAs than one launch's grid (2^31 - 1)"
    return None


def candidates() -> list[TiledConvConfig]:
    out = []
    for tile_h, tile_w, thread_h in ((1, 1024, 1), (1, 512, 1), (8, 128, 1), (16, 64, 2), (32, 64, 2), (32, 128, 2)):
        for thread_w in (4, 8):
            for block_r, block_c in ((1, 256), (4, 64), (8, 32), (16, 32)):
                if block_r > 1 and tile_h == 1:
                    continue
                try:
                    out.append(TiledConvConfig(tile_h, tile_w, thread_h, thread_w, block_r, block_c, 1))
                except ValueError:  # too many threads, or the tiles do not fit in static shared memory
                    continue
    return out


def default_config(problem: Conv3dProblem) -> TiledConvConfig:
    """From a probe of a few shapes (docs/notes/conv3d.md), not a sweep. One output plane per CTA (a CTA
    reuses nothing from one plane to the next, so a longer run only costs parallelism). One output row:
    one-row tiles with blocks of 256 taps, of 512 outputs 8 per thread for a long signal with a short
    kernel (fewer window loads per FMA, and enough CTAs anyway), else of 1024 outputs 4 per thread;
    otherwise 32 x 64 tiles with blocks of 16 x 32 taps. A grid short of ``RESIDENT_CTAS`` splits a deep
    kernel's planes until it is not."""
    if problem.out_height == 1:
        outputs = max(problem.batch, 1) * problem.out_depth * problem.out_width
        long_signal = outputs >= LONG_SIGNAL and problem.kw <= SHORT_SIGNAL_KERNEL
        config = TiledConvConfig(1, 512, 1, 8, 1, 256, 1) if long_signal else TiledConvConfig(1, 1024, 1, 4, 1, 256, 1)
    else:
        config = TiledConvConfig(32, 64, 2, 4, 16, 32, 1)
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    ctas = tiles_w * tiles_h * chunks * max(problem.batch, 1)
    splits = min(problem.kd, -(-RESIDENT_CTAS // ctas), MAX_GRID_Y)
    return dataclasses.replace(config, kd_splits=splits) if splits > 1 else config


def name_expression(config: TiledConvConfig, problem: Conv3dProblem) -> str:
    return (f"conv3d::conv3d_tiled_kernel<{config.tile_h}, {config.tile_w}, {config.thread_h}, {config.thread_w}, "
            f"{config.block_r}, {config.block_c}>")


compile = nvrtc.checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001


class Conv3dTiledArgs(ctypes.Structure):
    """conv3d.cu's ``conv3d::TiledArgs``, field for field (natural C alignment on both sides: 128 bytes)."""

    _fields_ = [(name, kind) for name, kind in (
        ("volume", ctypes.c_void_p), ("weights", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("stride_n", ctypes.c_int64), ("stride_d", ctypes.c_int64), ("stride_h", ctypes.c_int64),
        ("depth", ctypes.c_int32), ("height", ctypes.c_int32), ("width", ctypes.c_int32),
        ("out_depth", ctypes.c_int32), ("out_height", ctypes.c_int32), ("out_width", ctypes.c_int32),
        ("tiles_w", ctypes.c_int32), ("tiles_h", ctypes.c_int32), ("chunks_d", ctypes.c_int32),
        ("chunk_depth", ctypes.c_int32), ("pad_d", ctypes.c_int32), ("pad_h", ctypes.c_int32), ("pad_w", ctypes.c_int32),
        ("kd", ctypes.c_int32), ("kh", ctypes.c_int32), ("kw", ctypes.c_int32),
        ("kd_per_split", ctypes.c_int32), ("splits", ctypes.c_int32), ("split_stride", ctypes.c_int64))]


class TiledLaunch:
    """The tiled kernel's launch for every call of one structure: ``launch(volume, kernel, out)`` writes the
    three pointers into the packed arguments and enqueues it on torch's current stream. With the kernel's
    planes split, the kernel writes each split's partial sums to the stream's partials buffer
    (``runtime.workspace``) and their sum (in split order: repeatable) goes to ``out``."""

    def __init__(self, packed, args: Conv3dTiledArgs, device_index: int):
        self.packed, self.args, self.device_index = packed, args, device_index

    def __call__(self, volume, kernel, out) -> None:
        a = self.args
        stream = current_stream_handle(self.device_index)
        partials = None
        if a.splits > 1:
            numel = a.splits * out.numel()
            partials = stream_buffer("partials", self.device_index, stream, numel, per_thread=True)
            partials = partials[:numel].view(a.splits, -1)
        with self.packed.lock:
            target = out if partials is None else partials
            a.volume, a.weights, a.out = volume.data_ptr(), kernel.data_ptr(), target.data_ptr()
            self.packed.launch(stream)
        if partials is not None and not is_dry_run():  # precompile: no partials were written
            torch.sum(partials, 0, out=out.view(-1))


def prepare(config: TiledConvConfig, problem: Conv3dProblem, inputs: dict, out: torch.Tensor) -> TiledLaunch:
    volume = as_4d(inputs["volume"])
    device = volume.device.index
    kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    sn, sd, sh, _ = volume.stride()
    p = problem.pads
    per_split, splits = kd_split(config, problem)
    args = Conv3dTiledArgs(0, 0, 0, sn, sd, sh, problem.depth, problem.height, problem.width, problem.out_depth,
                           problem.out_height, problem.out_width, tiles_w, tiles_h, chunks, config.depth,
                           p[0], p[2], p[4], problem.kd, problem.kh, problem.kw, per_split, splits, out.numel())
    packed = nvrtc.PackedLaunch(kernel, (tiles_w * tiles_h * chunks * problem.batch, splits, 1),
                                (config.threads, 1, 1), (args,))
    return TiledLaunch(packed, args, device)


def launch(config: TiledConvConfig, problem: Conv3dProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    prepare(config, problem, inputs, out)(inputs["volume"], inputs["kernel"], out)
    return out


def _standard_problems() -> list[Conv3dProblem]:
    """Issue 26's large kernels: a 2047-tap filter over 1.5M samples, 31x31 and 63x63 over images, 17^3
    over a volume."""
    return [Conv3dProblem(1, 1, 1, 1_500_000, 1, 1, 2047), Conv3dProblem(1, 1, 2048, 2048, 1, 31, 31),
            Conv3dProblem(1, 1, 1024, 1024, 1, 63, 63), Conv3dProblem(1, 64, 64, 64, 17, 17, 17)]


TILED_SPEC = register(KernelSpec(
    **shared_spec_fields(),
    variant="tiled",
    config_cls=TiledConvConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    prepare=prepare,
    standard_problems=_standard_problems,
    description="any kernel side: the kernel walked in blocks through shared memory (conv3d.cu)",
    sweep_axes=(("tile_h", "tile_w", "thread_h"), ("block_r", "block_c")),
))
