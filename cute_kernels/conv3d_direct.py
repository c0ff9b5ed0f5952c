"""3-D valid cross-correlation in FP32: the direct, register-blocked kernel of ``legacy_cuda/conv3d.cu``
(compiled with NVRTC), its config, its registry entry and the public ``conv3d`` op.

``conv3d(volume, kernel)``: ``volume`` (D, H, W) or (N, D, H, W), ``kernel`` (KD, KH, KW) with sides 1..7;
the result is (D - KD + 1, H - KH + 1, W - KW + 1) (N in front when batched), with
``O[i, j, k] = sum_{d, r, c} V[i + d, j + r, k + c] * K[d, r, c]``, like ``torch.nn.functional.conv3d`` with
one channel and TF32 off.
"""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from legacy_cuda import nvrtc

from . import _checks
from .registry import KernelSpec, register
from .runtime.device import SM90_SHARED_BYTES, current_stream_handle, shared_memory_limit
from .runtime.nvrtc_compile import checked_compile
from .testing import conv3d_reference, conv3d_scale

SOURCE = "conv3d.cu"
MAX_KERNEL_SIDE = 7
MAX_ACCUMULATORS = 64  # conv3d.cu: Geometry::kAccumulators (KD * thread_h * thread_w) must not exceed this
ASSUMED_SMS = 132  # the H200's SM count, for the default heuristic's grid-size target
INT32_MAX = 2**31 - 1


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


@dataclasses.dataclass(frozen=True)
class Conv3dConfig:
    """A CTA computes a ``tile_h x tile_w`` tile of output rows x columns through ``depth`` consecutive
    output planes; each thread ``thread_h x thread_w`` outputs of the tile in each of KD planes at once.
    ``stages``: input-plane buffers in shared memory (planes in flight = stages - 1). ``depth`` is a launch
    argument, not a template one: changing it compiles nothing."""

    tile_h: int = 16
    tile_w: int = 128
    thread_h: int = 1
    thread_w: int = 8
    depth: int = 32
    stages: int = 3

    def __post_init__(self):
        if self.thread_w not in (4, 8):
            raise ValueError(f"Conv3dConfig.thread_w: expected 4 or 8 (whole 128-bit window loads), got {self.thread_w}")
        if self.thread_h not in (1, 2, 4):
            raise ValueError(f"Conv3dConfig.thread_h: expected 1, 2 or 4, got {self.thread_h}")
        if self.tile_w <= 0 or self.tile_w % (8 * self.thread_w):
            raise ValueError(f"Conv3dConfig.tile_w: expected a positive multiple of 8 * thread_w = {8 * self.thread_w} "
                             f"(8 threads per 128-bit shared-memory phase), got {self.tile_w}")
        if self.tile_h <= 0 or self.tile_h % self.thread_h:
            raise ValueError(f"Conv3dConfig.tile_h: expected a positive multiple of thread_h = {self.thread_h}, got {self.tile_h}")
        if self.threads % 32 or self.threads > 1024:
            raise ValueError(f"Conv3dConfig: (tile_h / thread_h) * (tile_w / thread_w) = {self.threads} threads; "
                             "expected whole warps and at most 1024")
        if self.stages not in (2, 3, 4):
            raise ValueError(f"Conv3dConfig.stages: expected 2, 3 or 4, got {self.stages}")
        if self.depth < 1:
            raise ValueError(f"Conv3dConfig.depth: expected at least 1 output plane per CTA, got {self.depth}")

    @property
    def threads(self) -> int:
        return (self.tile_h // self.thread_h) * (self.tile_w // self.thread_w)

    def shared_bytes(self, kd: int, kh: int, kw: int) -> int:
        """conv3d.cu's Geometry::kSharedBytes: ``stages`` plane buffers of (tile_h + KH - 1) rows with a pitch
        of tile_w + round_up(KW - 1, 4) floats, and the weights as [KH][KD][round_up(KW, 4)]."""
        plane = (self.tile_h + kh - 1) * (self.tile_w + _round_up(kw - 1, 4))
        weights = kh * kd * _round_up(kw, 4)
        return 4 * (self.stages * plane + weights)

    def compile_key(self) -> tuple:
        """The fields that are template arguments (``depth`` is not)."""
        return (self.tile_h, self.tile_w, self.thread_h, self.thread_w, self.stages)


def _widest_vector(*conditions) -> int:
    """The widest of 4, 2, 1 elements for which every ``condition(v)`` holds."""
    for v in (4, 2, 1):
        if all(c(v) for c in conditions):
            return v
    return 1


@dataclasses.dataclass(frozen=True)
class Conv3dProblem:
    """One conv3d call as far as a config or a compile key may depend on it.

    ``in_vector``: elements per copy of the volume (4, 2 or 1): its address and row, plane and batch strides
    are multiples of it. ``out_vector``: elements per store (the output's width and address allow it).
    0 means what fresh contiguous tensors allow."""

    batch: int
    depth: int
    height: int
    width: int
    kd: int
    kh: int
    kw: int
    batched: bool = False  # the input had a batch dim (it shapes make_inputs; the kernel does not care)
    in_vector: int = 0
    out_vector: int = 0
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device

    @property
    def out_depth(self) -> int:
        return self.depth - self.kd + 1

    @property
    def out_height(self) -> int:
        return self.height - self.kh + 1

    @property
    def out_width(self) -> int:
        return self.width - self.kw + 1

    @property
    def out_shape(self) -> tuple:
        spatial = (self.out_depth, self.out_height, self.out_width)
        return (self.batch, *spatial) if self.batched else spatial

    @property
    def taps(self) -> int:
        return self.kd * self.kh * self.kw

    @property
    def in_vec(self) -> int:
        return self.in_vector or _widest_vector(lambda v: self.width % v == 0)

    @property
    def out_vec(self) -> int:
        return self.out_vector or _widest_vector(lambda v: self.out_width % v == 0)


def make_problem(volume: torch.Tensor, kernel_shape, out: torch.Tensor, batched: bool) -> Conv3dProblem:
    """The problem for a 4-D ``volume`` view with unit stride along W and a contiguous 4-D ``out``."""
    n, d, h, w = volume.shape
    kd, kh, kw = kernel_shape
    in_align = _checks.alignment_bytes(volume)
    # Batch, plane and row strides, where they are used to step (the W stride is 1 or unused).
    strides = [s for size, s in zip(volume.shape[:3], volume.stride()[:3]) if size > 1]
    in_vec = _widest_vector(lambda v: in_align >= 4 * v, lambda v: all(s % v == 0 for s in strides))
    out_align = _checks.alignment_bytes(out)
    out_w = w - kw + 1
    out_vec = _widest_vector(lambda v: out_align >= 4 * v, lambda v: out_w % v == 0)
    limit = shared_memory_limit(volume.device.index) if volume.is_cuda else SM90_SHARED_BYTES
    return Conv3dProblem(n, d, h, w, kd, kh, kw, batched, in_vec, out_vec, limit)


def grid_shape(config: Conv3dConfig, problem: Conv3dProblem) -> tuple[int, int, int]:
    """(tiles along W, tiles along H, runs of output planes along D) for one batch item."""
    return (-(-problem.out_width // config.tile_w), -(-problem.out_height // config.tile_h),
            -(-problem.out_depth // config.depth))


def why_unsupported(config: Conv3dConfig, problem: Conv3dProblem) -> str | None:
    sides = (problem.kd, problem.kh, problem.kw)
    if not all(1 <= s <= MAX_KERNEL_SIDE for s in sides):
        return f"kernel sides {sides} must each be 1..{MAX_KERNEL_SIDE}"
    if problem.out_depth < 1 or problem.out_height < 1 or problem.out_width < 1:
        return f"kernel {sides} is larger than the volume {(problem.depth, problem.height, problem.width)}"
    if max(problem.depth, problem.height, problem.width) > INT32_MAX:
        return "volume sides past 2^31 - 1 do not fit the kernel's 32-bit coordinates"
    accumulators = problem.kd * config.thread_h * config.thread_w
    if accumulators > MAX_ACCUMULATORS:
        return (f"KD * thread_h * thread_w = {accumulators} accumulators per thread exceed {MAX_ACCUMULATORS} "
                "(they would not fit in registers)")
    smem = config.shared_bytes(*sides)
    if smem > problem.shared_limit:
        return f"{smem} bytes of shared memory exceed the device's {problem.shared_limit}"
    if problem.in_vec not in (1, 2, 4) or problem.out_vec not in (1, 2, 4):
        return f"vector widths must be 1, 2 or 4, got in {problem.in_vec}, out {problem.out_vec}"
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    ctas = tiles_w * tiles_h * chunks * problem.batch
    if ctas > INT32_MAX:
        return f"{ctas} CTAs exceed one launch's grid (2^31 - 1)"
    return None


def candidates() -> list[Conv3dConfig]:
    """The sweep space: 128 to 512 threads per CTA; ``depth`` spans the run lengths the heuristic picks from."""
    out = []
    for thread_w in (4, 8):
        for thread_h in (1, 2):
            for tile_w in (32, 64, 128):
                for tile_h in (8, 16, 32):
                    if tile_w % (8 * thread_w) or tile_h % thread_h:
                        continue
                    threads = (tile_h // thread_h) * (tile_w // thread_w)
                    if threads not in (128, 256, 512):
                        continue
                    for depth in (8, 16, 32, 64):
                        for stages in (2, 3):
                            out.append(Conv3dConfig(tile_h, tile_w, thread_h, thread_w, depth, stages))
    return out


# (tile_h, tile_w) shapes the heuristic picks from, best first by the H200 sweep of 2026-11-29 (40 sampled
# configs at each of 256^3 with 5^3 and 3^3 kernels, 256x128x128 with 5^3, 128^3 with 7^3; the log is in
# docs/sweeps/2026-11-29-h200/conv3d-sweep-e125ea3.log). Every winner computed 4 columns per thread
# (thread_w = 4), and 2 rows (thread_h = 2) for kernels up to 5^3; 7^3 kernels won with one row.
_DEFAULT_TILES = ((16, 64), (32, 64), (8, 64), (16, 32), (32, 32))
_RESIDENT_THREADS = 512  # per SM: two 256-thread CTAs at <= 128 registers per thread (ptxas: 64-127 here)


def estimated_time(config: Conv3dConfig, problem: Conv3dProblem) -> float:
    """A relative time for the default heuristic: waves of CTAs over the SMs times the plane steps of one
    CTA. A run of ``depth`` output planes takes depth + KD - 1 input planes, the first and last KD - 1 of
    which do part of the FMAs (counted as 0.6 of a step). A last wave that leaves SMs half empty runs its
    CTAs faster (0.6 of a full wave's time: fewer warps share each SM's FMA units)."""
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    ctas = tiles_w * tiles_h * chunks * problem.batch
    slots = max(1, _RESIDENT_THREADS // config.threads) * ASSUMED_SMS
    full, rest = divmod(ctas, slots)
    last = 0.0 if rest == 0 else (0.6 if 2 * rest <= slots else 1.0)
    return (full + last) * (config.depth + 0.6 * (problem.kd - 1))


def default_config(problem: Conv3dProblem) -> Conv3dConfig:
    # The sweep's lessons (see _DEFAULT_TILES): thread_w = 4 everywhere, thread_h = 2 while the kernel has
    # at most 125 taps (with 7^3 the second row's window costs more registers than it saves loads), 2
    # stages. Among the tiles and runs of 64 .. 4 planes, the lowest estimated_time wins; ties go to the
    # earlier tile and the longer run (fewer halo planes and rows loaded per output).
    thread_h = 2 if problem.kd * problem.kh * problem.kw <= 125 else 1
    best = None
    for tile_h, tile_w in _DEFAULT_TILES:
        for rows in (thread_h, 1):
            for depth in (64, 32, 16, 8, 4):
                config = Conv3dConfig(tile_h, tile_w, rows, 4, depth, 2)
                if why_unsupported(config, problem) is not None:
                    continue
                cost = estimated_time(config, problem)
                if best is None or cost < best[0] - 1e-9:
                    best = (cost, config)
            if best is not None:
                break  # this tile works with the preferred rows per thread (or one): take it
    if best is None:
        raise ValueError(f"no default tile supports {problem}")
    return best[1]


def name_expression(config: Conv3dConfig, problem: Conv3dProblem) -> str:
    return (f"conv3d::conv3d_kernel<{problem.kd}, {problem.kh}, {problem.kw}, {config.tile_h}, {config.tile_w}, "
            f"{config.thread_h}, {config.thread_w}, {config.stages}, {problem.in_vec}, {problem.out_vec}>")


compile = checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001


class Conv3dArgs(ctypes.Structure):
    """conv3d.cu's ``conv3d::Args``, field for field (natural C alignment on both sides: 88 bytes)."""

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
    ]


# The struct travels as the kernel's one by-value parameter: None tells cuda-bindings to pass its address.
_SIGNATURE = (None,)

# (config's template fields, kernel sides, vector widths, device) -> (kernel, threads, shared bytes).
_plans: dict[tuple, tuple] = {}


def _plan(config: Conv3dConfig, problem: Conv3dProblem, device: int) -> tuple:
    key = (config.compile_key(), problem.kd, problem.kh, problem.kw, problem.in_vec, problem.out_vec, device)
    plan = _plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        plan = _plans[key] = (kernel, config.threads, config.shared_bytes(problem.kd, problem.kh, problem.kw))
    return plan


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 4 else t.unsqueeze(0)


def launch(config: Conv3dConfig, problem: Conv3dProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Convolve ``inputs["volume"]`` (unit stride along W) with ``inputs["kernel"]`` (contiguous) into
    ``out`` (contiguous), on torch's current stream. Nothing is checked here: the op and the tests check."""
    volume, kernel = _as_4d(inputs["volume"]), inputs["kernel"]
    out4 = _as_4d(out)
    device = volume.device.index
    function, threads, shared_bytes = _plan(config, problem, device)
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    sn, sd, sh, _ = volume.stride()
    args = Conv3dArgs(volume.data_ptr(), kernel.data_ptr(), out4.data_ptr(), sn, sd, sh,
                      problem.depth, problem.height, problem.width,
                      problem.out_depth, problem.out_height, problem.out_width,
                      tiles_w, tiles_h, chunks, config.depth)
    stream = current_stream_handle(device)
    nvrtc.launch(function, (tiles_w * tiles_h * chunks * problem.batch, 1, 1), (threads, 1, 1), (args,),
                 _SIGNATURE, shared_mem=shared_bytes, stream_handle=stream)
    return out


# Calls already validated, by structure (see _checks.ValidatedCalls); out's overlaps are checked every call.
_VALIDATED = _checks.ValidatedCalls()


def conv3d(volume: torch.Tensor, kernel: torch.Tensor, *, out: torch.Tensor | None = None,
           config: Conv3dConfig | None = None, variant: str | None = None) -> torch.Tensor:
    """Valid 3-D cross-correlation of ``volume`` (D, H, W) or (N, D, H, W) with ``kernel`` (KD, KH, KW).

    float32 in and out, FP32 arithmetic. Kernel sides 1..7, none longer than the volume's. The volume may
    be any strided view; one whose last dim is not unit-stride is copied to a contiguous tensor first.
    ``out``: a contiguous float32 tensor of the result's shape, not overlapping the inputs. Errors name the
    argument; nothing is written on an error.
    """
    key = _VALIDATED.key((volume, kernel, out), config, variant)
    known = _VALIDATED.get(key)
    if known is None:
        _checks.tensor("volume", volume)
        _checks.tensor("kernel", kernel)
        if volume.dim() not in (3, 4):
            raise ValueError(f"volume: expected a (D, H, W) or (N, D, H, W) tensor, got {volume.dim()}-D with shape "
                             f"{tuple(volume.shape)}")
        if kernel.dim() != 3:
            raise ValueError(f"kernel: expected a (KD, KH, KW) tensor, got {kernel.dim()}-D with shape {tuple(kernel.shape)}")
        _checks.dtype_in("volume", volume, (torch.float32,))
        _checks.dtype_in("kernel", kernel, (torch.float32,))
        ksides = tuple(kernel.shape)
        if not all(1 <= s <= MAX_KERNEL_SIDE for s in ksides):
            raise ValueError(f"kernel: expected each side in 1..{MAX_KERNEL_SIDE}, got shape {ksides}")
        vsides = tuple(volume.shape[-3:])
        if min(vsides) == 0:
            raise ValueError(f"volume: expected non-empty (D, H, W) sides, got shape {tuple(volume.shape)}")
        if any(k > v for k, v in zip(ksides, vsides)):
            raise ValueError(f"kernel: shape {ksides} is larger than the volume's (D, H, W) = {vsides} along some side")
        if max(vsides) > INT32_MAX:
            raise ValueError(f"volume: sides {vsides} past 2^31 - 1 do not fit the kernel's 32-bit coordinates")
        batched = volume.dim() == 4
        batch = volume.shape[0] if batched else 1
        out_spatial = tuple(v - k + 1 for v, k in zip(vsides, ksides))
        out_shape = (batch, *out_spatial) if batched else out_spatial
        if out is not None:
            _checks.output("out", out, shape=out_shape, dtype=torch.float32, device=volume.device,
                           inputs={"volume": volume, "kernel": kernel})
        _checks.config_type(config, Conv3dConfig)
        # Device checks after the structural ones, so that those are testable with CPU tensors.
        _checks.cuda_tensor("volume", volume)
        _checks.cuda_tensor("kernel", kernel)
        _checks.same_device(volume=volume, kernel=kernel)
        spec = _registry_entry(variant)
    else:  # this structure passed every check here before; out's overlaps depend on the values
        spec, out_shape, batch, batched, ksides, problem = known
        if out is not None:
            _checks.no_overlap("out", out, {"volume": volume, "kernel": kernel})

    result = out if out is not None else torch.empty(out_shape, dtype=torch.float32, device=volume.device)
    if batch == 0:
        return result
    volume4 = _as_4d(volume)
    if volume4.stride(-1) != 1 and volume4.shape[-1] > 1:
        volume4 = volume4.contiguous()
    kernel_c = kernel.contiguous()
    out4 = _as_4d(result)
    if known is None:
        problem = make_problem(volume4, ksides, out4, batched)
        if config is not None:
            reason = spec.why_unsupported(config, problem)
            if reason is not None:
                raise ValueError(f"config: {config} cannot run {problem}: {reason}")
        _VALIDATED.remember(key, (spec, out_shape, batch, batched, ksides, problem))
    if config is None:
        try:
            config = spec.choose_config(problem, volume.device.index)
        except ValueError as e:  # no tile runs it (the default heuristic says why)
            raise ValueError(f"volume: shape {tuple(volume.shape)} with a {ksides} kernel: {e}") from None
    inputs = {"volume": volume4, "kernel": kernel_c}
    if volume.device.index == torch.cuda.current_device():
        spec.launch(config, problem, inputs, out4)
    else:
        with torch.cuda.device(volume.device):
            spec.launch(config, problem, inputs, out4)
    return result


# ---- Registry entry ----------------------------------------------------------------------------------------


def _make_inputs(problem: Conv3dProblem, device, generator=None) -> dict:
    shape = (problem.batch, problem.depth, problem.height, problem.width)
    volume = torch.randn(shape, dtype=torch.float32, device=device, generator=generator)
    kernel = torch.randn((problem.kd, problem.kh, problem.kw), dtype=torch.float32, device=device, generator=generator)
    return {"volume": volume if problem.batched else volume[0], "kernel": kernel}


def _reference(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return conv3d_reference(inputs["volume"], inputs["kernel"])


def torch_conv3d(volume: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """torch's (cuDNN's) FP32 answer, TF32 off: the vendor baseline and the error our kernel is allowed twice of."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        v = _as_4d(volume).unsqueeze(1)
        o = torch.nn.functional.conv3d(v, kernel[None, None]).squeeze(1)
    return o if volume.dim() == 4 else o[0]


def _baseline(problem: Conv3dProblem, inputs: dict) -> torch.Tensor:
    return torch_conv3d(inputs["volume"], inputs["kernel"])


def _standard_problems() -> list[Conv3dProblem]:
    return [
        Conv3dProblem(1, 256, 256, 256, 5, 5, 5),
        Conv3dProblem(1, 256, 128, 128, 5, 5, 5),  # LeetGPU's largest
        Conv3dProblem(1, 256, 256, 256, 3, 3, 3),
        Conv3dProblem(1, 128, 128, 128, 7, 7, 7),
    ]


def _flops(problem: Conv3dProblem) -> float:
    return 2.0 * problem.batch * problem.out_depth * problem.out_height * problem.out_width * problem.taps


def _bytes(problem: Conv3dProblem) -> float:
    outs = problem.batch * problem.out_depth * problem.out_height * problem.out_width
    return 4.0 * (problem.batch * problem.depth * problem.height * problem.width + outs + problem.taps)


def shape_bucket(problem: Conv3dProblem) -> str:
    """Tuned-config key: the kernel's sides, and the log2 of the output's depth, height and width (what the
    tiles divide) and of the batch."""
    def log2(x: int) -> int:
        return max(x, 1).bit_length() - 1

    return (f"k{problem.kd}x{problem.kh}x{problem.kw}:d2^{log2(problem.out_depth)}:h2^{log2(problem.out_height)}:"
            f"w2^{log2(problem.out_width)}:n2^{log2(problem.batch)}:in{problem.in_vector}:out{problem.out_vector}")


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
    error_scale=lambda p, inputs: conv3d_scale(inputs["volume"], inputs["kernel"]),
    shape_bucket=shape_bucket,
    sweep_axes=(("tile_h", "tile_w", "thread_h", "thread_w"), ("depth", "stages")),
))


def _registry_entry(variant: str | None) -> KernelSpec:
    from . import registry

    return registry.for_call("conv3d", variant)
