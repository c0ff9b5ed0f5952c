"""flash3_wgmma: FP16/BF16 attention forward for Hopper (sm_90a) in raw CUDA, FlashAttention-3's structure:
TMA loads into a ring of swizzled shared-memory stages tracked by mbarriers, wgmma from shared memory for
S = Q K^T and from registers for O += P V, a producer warpgroup and two consumer warpgroups with registers
moved between them (attention_sm90.cu)."""

from __future__ import annotations

import ctypes
import dataclasses
import math

import torch

from cute_kernels.runtime import nvrtc

from ...runtime import tma
from ...runtime.config_fields import check_choice, check_fields
from ...runtime.device import H200_SM_COUNT, MAX_GRID_X, sm_count
from ...runtime.bounded import kept_launch
from ...runtime.workspace import stream_buffer
from .problem import LOG2E, AttentionLaunch, AttentionProblem, _strides4, batch_heads_of, launch_with, padded_head_dim
from .spec import _cudnn_attention, attention_spec, flash_standard_problems

SOURCE = "attention_sm90.cu"
CPP_TYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
HEAD_DIMS = (64, 128, 256)  # the compiled head dims; a smaller d runs as the next one (TMA reads zeros past d)


def compiled_head_dim(problem: AttentionProblem) -> int:
    """The kernel's head dim for the problem's d: the next of HEAD_DIMS."""
    return padded_head_dim(problem.d, HEAD_DIMS)


@dataclasses.dataclass(frozen=True)
class Flash3Config:
    """Key tiles of ``block_n`` keys through a ring of ``stages`` shared-memory stages; ``overlap``: issue
    tile j's S = Q K^T together with tile j-1's O += P V, so that tile j's softmax runs while the tensor
    cores finish P V (FlashAttention-3's intra-warpgroup overlap); ``pingpong``: the two consumer warpgroups
    take turns issuing their products, so one's softmax overlaps the other's (its inter-warpgroup
    schedule); ``persistent``: one CTA per SM walks the work units (query tiles of each batch and head), so
    the next unit's loads run during this one's last products and stores; otherwise one CTA per unit;
    ``dynamic`` (persistent only): each CTA takes the next unit no CTA has taken from an atomic counter,
    instead of every grid-th one, so units of unequal cost (causal) even out over the SMs; ``consumers``:
    consumer warpgroups of 64 query rows each, 2 (240 registers each) or 3 (160 each, head dims up to 64:
    each K and V tile serves 192 rows, three warps per SM sub-partition hide the exponentials);
    ``tma_store``: each consumer writes its O tile to shared memory and one thread stores it with TMA, so
    the consumers start the next unit while the copy engine writes (64 x d x 2 bytes more shared memory per
    consumer), instead of storing pairs of columns from registers; the output must be one a tensor map
    describes, as the op's 16-byte rule for this kernel makes it; ``q_buffers`` (persistent only): 2 loads
    each unit's Q a whole unit ahead into a second buffer, where one buffer waits for the previous unit's
    last S = Q K^T (for short sequences, whose units have too little work after it to hide Q's load);
    ``fma_exp2`` (0: none): one exponential in every ``fma_exp2`` of the softmax runs as a degree-3
    polynomial on the FP32 pipe instead of the MUFU, whose exponentials take as long as a tile's products
    at head dim 64 (relative error 8.6e-5 on those, below a 16-bit P's rounding; NaN scores still give NaN
    rows); ``grouped_units`` (causal without a window, whose units' costs differ): the units taken in groups
    of (batch, head) pairs whose K and V share L2 (``unit_group_pairs``), every pair's longest query tile
    before any pair's next (longest-processing-time-first), instead of pair by pair (the defaults take it
    for causal calls without a window below d 256)."""

    block_n: int = 128
    stages: int = 2
    overlap: bool = True
    pingpong: bool = True
    persistent: bool = True
    consumers: int = 2
    dynamic: bool = False
    tma_store: bool = False
    q_buffers: int = 1
    fma_exp2: int = 0
    grouped_units: bool = False

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "block_n", (64, 80, 128, 176), "64, 80, 128 or 176")
        check_choice(self, "stages", (2, 3), "2 or 3")
        check_choice(self, "consumers", (2, 3), "2 or 3")
        check_choice(self, "q_buffers", (1, 2), "1 or 2")
        check_choice(self, "fma_exp2", (0, 2, 4, 8, 16), "0 (none), 2, 4, 8 or 16")
        if self.dynamic and not self.persistent:
            raise ValueError("Flash3Config.dynamic: the scheduler hands units to persistent CTAs; set persistent=True")
        if self.q_buffers > 1 and not self.persistent:
            raise ValueError("Flash3Config.q_buffers: a second Q buffer serves a CTA's next unit; set persistent=True")

    @property
    def block_m(self) -> int:
        """A work unit's query rows."""
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def shared_bytes(self, head_dim: int) -> int:
        """attention_sm90.cu Layout::kAllocBytes: the Q buffers, the K and V stages, with tma_store each
        consumer's O tile, the barriers, the consumers' pin slots (16 bytes), 1024 bytes of alignment."""
        rows_tile = self.block_m * head_dim * 2  # a Q buffer, and as much again for the O tiles
        return (rows_tile * (self.q_buffers + (1 if self.tma_store else 0))
                + 2 * self.stages * self.block_n * head_dim * 2 + 8 * (2 * self.q_buffers + 4 * self.stages) + 16 + 1024)


def flash3_why_unsupported(config: Flash3Config, problem: AttentionProblem) -> str | None:
    if problem.sm != 90:
        return f"wgmma and TMA as compiled here need sm_90 (compute capability 9.0), not {problem.sm}"
    if problem.dtype not in CPP_TYPES:
        return f"dtype {problem.dtype} is not float16 or bfloat16"
    if not 1 <= problem.d <= HEAD_DIMS[-1]:
        return f"head dim {problem.d} is outside 1..{HEAD_DIMS[-1]}"
    if problem.vector_width != 8 or not problem.tma:
        return "TMA needs 16-byte aligned pointers and positive strides that are multiples of 16 bytes"
    head_dim = compiled_head_dim(problem)
    if config.consumers == 3 and head_dim > 64:
        return f"three consumer warpgroups (160 registers each) hold O only up to head dim 64, not {problem.d}"
    shared = config.shared_bytes(head_dim)
    if shared > problem.shared_limit:
        return f"{shared} bytes of shared memory exceed the device's {problem.shared_limit}"
    if head_dim == 256 and problem.windowed and config.overlap and config.block_n > 64:
        # O's 128 accumulators, S and P of two tiles and the rows' window bounds: ptxas spills (sm_90a).
        return f"{config.block_n}-key tiles with overlap spill registers at head dim 256 with a window"
    if -(-problem.m // config.block_m) * problem.batch_heads > MAX_GRID_X:
        return "more query tiles than a launch's grid (and the kernel's 32-bit unit index) holds"
    return None


# The K and V bytes the pairs of one unit group may hold in L2 (Hopper's is 50 MB): the rest for Q, O and the
# tiles of the groups before and after, whose units overlap this one's at its ends.
UNIT_GROUP_L2_BYTES = 32 * 2 ** 20


def unit_group_pairs(config: Flash3Config, problem: AttentionProblem) -> int:
    """Params.group_pairs: with ``config.grouped_units``, for a causal call without a window, as many (batch,
    head) pairs as hold ``UNIT_GROUP_L2_BYTES`` of K and V (a pair's share of its kv head's: grouped-query
    heads share one), at least 1, at most every pair; else 1 (pair by pair)."""
    if not config.grouped_units or not problem.causal or problem.windowed:
        return 1
    kv_bytes = 2 * problem.n * problem.d * problem.dtype.itemsize / problem.kv_group
    return max(1, min(problem.batch_heads, int(UNIT_GROUP_L2_BYTES // kv_bytes)))


def flash3_candidates() -> list[Flash3Config]:
    return ([Flash3Config(bn, 2, overlap, pingpong) for bn in (64, 128) for overlap in (True, False)
             for pingpong in (True, False)]
            + [Flash3Config(80), Flash3Config(128, 3), Flash3Config(176), Flash3Config(persistent=False)]
            + [Flash3Config(128, 2, overlap, pingpong, consumers=3) for overlap in (True, False)
               for pingpong in (True, False)]
            + [Flash3Config(dynamic=True), Flash3Config(consumers=3, dynamic=True)]
            + [Flash3Config(tma_store=True), Flash3Config(consumers=3, tma_store=True),
               Flash3Config(dynamic=True, tma_store=True), Flash3Config(consumers=3, dynamic=True, tma_store=True)]
            + [Flash3Config(tma_store=True, q_buffers=2), Flash3Config(consumers=3, tma_store=True, q_buffers=2),
               Flash3Config(dynamic=True, tma_store=True, q_buffers=2)]
            + [Flash3Config(consumers=consumers, tma_store=True, fma_exp2=every) for consumers in (2, 3)
               for every in (4, 8, 16)]
            + [Flash3Config(consumers=consumers, dynamic=True, tma_store=True, q_buffers=q_buffers, grouped_units=True)
               for consumers, q_buffers in ((2, 1), (3, 1), (2, 2))])


def flash3_default_config(problem: AttentionProblem) -> Flash3Config:
    # Causal units cost in proportion to their query tile's index. Persistent CTAs taking units at a fixed
    # stride left some CTAs a third more work (B1 H8 S8192 d128: 376 us against cuDNN's 289); one CTA per
    # unit, which the hardware hands out longest first as SMs free up, ran 271; persistent CTAs taking the
    # next untaken unit (the dynamic scheduler, longest first) ran 267, and 496 against 514 us at B4 H16
    # S4096 d128, where it also lets d 64 take three consumers (352 against 400 us). A window evens the
    # units out again (persistent 84.7 vs 89.6 us one CTA per unit at a window of 1024, S8192).
    # d 256: two stages of 80-key K and V tiles beside Q fill 226 KB (128-key tiles would not fit), as
    # FlashAttention-3 tiles it; with a window 80-key tiles spill, 64-key tiles do not. No room is left for
    # the O tiles of the TMA-store epilogue, which every smaller head dim takes: it was faster on every
    # problem timed (B16 H16 S256 d128 32.0 vs 36.5 us, B1 H16 S1024 d128 21.9 vs 24.0, B4 H16 S4096 d128
    # 851 vs 882, causal 472 vs 491; d64 with three consumers 567 vs 569).
    head_dim = compiled_head_dim(problem)
    dynamic = problem.causal and not problem.windowed
    if head_dim == 256:
        return Flash3Config(64 if problem.windowed else 80, dynamic=dynamic)
    # Causal units taken longest first across groups of (batch, head) pairs rather than pair by pair (H100,
    # same run against cuDNN: B8 H16 S512 d64 31.0 -> 28.0 us, B4 H16 S4096 d64 364 -> 338, d128 509 -> 492,
    # B1 H8 S8192 d128 285 -> 240; docs/notes/attention-hopper.md). d 256 was not timed with it.
    three = head_dim == 64 and not (problem.causal and problem.windowed) and _three_consumers_pay(problem)
    config = Flash3Config(128, dynamic=dynamic, consumers=3 if three else 2, tma_store=True, grouped_units=dynamic)
    # Short sequences: a unit is a few key tiles, too short to hide the next unit's Q load behind its own
    # last softmax and stores, so a second Q buffer loads it a whole unit ahead (B16 H16 S256 d64 24.7 ->
    # 21.6 us, d128 32.1 -> 27.8, B8 H16 S512 d64 causal 29.1 -> 27.7; docs/notes/attention-hopper.md).
    if problem.n <= _SHORT_KEYS:
        two = dataclasses.replace(config, q_buffers=2)
        if two.shared_bytes(head_dim) <= problem.shared_limit:
            return two
    return config


# The longest key sequence that takes the second Q buffer by default (measured at 256 and 512 keys).
_SHORT_KEYS = 1024


# Three consumers ran the B4 H16 S4096 d64 forward 1.12x faster than two (560 vs 631 us); their 192-row units
# pay that back only where they do not add rounds of units per SM (B1 H16 S2048: 176 units take two rounds
# of 192 rows where 256 units take two of 128) or padded rows (M 256: one 192-row unit pads to 384 rows).
_THREE_CONSUMER_SPEED_UP = 1.12


def _three_consumers_pay(problem: AttentionProblem) -> bool:
    def rows_per_sm(block_m: int) -> int:
        units = -(-problem.m // block_m) * problem.batch_heads
        return -(-units // H200_SM_COUNT) * block_m
    return rows_per_sm(192) < _THREE_CONSUMER_SPEED_UP * rows_per_sm(128)


def flash3_name_expression(config: Flash3Config, problem: AttentionProblem) -> str:
    flag = lambda b: "true" if b else "false"  # noqa: E731
    head_dim = compiled_head_dim(problem)
    return (f"attention_sm90::forward_kernel<{CPP_TYPES[problem.dtype]}, {config.consumers}, {head_dim}, {config.block_n}, "
            f"{config.stages}, {flag(problem.causal)}, {flag(config.overlap)}, {flag(config.pingpong)}, "
            f"{flag(problem.lse)}, {flag(problem.windowed)}, {flag(config.tma_store)}"
            + (f", {config.q_buffers}" if config.q_buffers > 1 or config.fma_exp2 else "")
            + (f", {config.fma_exp2}>" if config.fma_exp2 else ">"))


class Params(ctypes.Structure):
    """attention_sm90::Params: four tensor maps (the output's used with tma_store), then the output's pointer
    and strides, the sizes, and with the dynamic scheduler its counters and the units' words."""

    _fields_ = (
        [(name, tma.TmaMapBytes) for name in ("q_map", "k_map", "v_map", "o_map")]
        + [("o", ctypes.c_void_p), ("lse", ctypes.c_void_p)]
        + [(f"o_{s}_stride", ctypes.c_int64) for s in ("batch", "head", "row")]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "kv_group")]
        + [("scale_log2", ctypes.c_float), ("m_blocks", ctypes.c_int32), ("units", ctypes.c_int32)]
        + [(name, ctypes.c_int32) for name in ("group_pairs", "causal", "window_left", "window_right", "num_sinks", "d")]
        + [("scheduler", ctypes.c_void_p), ("unit_slots", ctypes.c_void_p), ("_pad", ctypes.c_uint8 * 16)]
    )


PARAMS_BYTES = 640  # attention_sm90.cu static_asserts the same size


def _map_of(t: torch.Tensor, rows: int, box_rows: int) -> tuple[tuple, tuple, tuple]:
    """(dims, byte strides, box) of a 4-D (d, rows, heads, batch) map of a 2-, 3- or 4-D attention operand.
    A dim of size 1 gets the stride of everything inside it (any valid stride describes it)."""
    e = t.element_size()
    batch, heads = batch_heads_of(t)
    d = t.shape[-1]
    batch_stride, head_stride, row_stride = _strides4(t)
    row_bytes = row_stride * e if rows > 1 else d * e
    head_bytes = head_stride * e if heads > 1 else row_bytes * rows
    batch_bytes = batch_stride * e if batch > 1 else head_bytes * heads
    return (d, rows, heads, batch), (row_bytes, head_bytes, batch_bytes), (64, box_rows, 1, 1)


def map_why_not(t: torch.Tensor, rows: int, box_rows: int) -> str | None:
    dims, strides, box = _map_of(t, rows, box_rows)
    return tma.why_not(t, dims, strides, box)


def tma_describes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether tensor maps describe q, k and v (AttentionProblem.tma): their bases and strides; every box of
    every config (at most 192 rows by 64 columns) is within TMA's limits."""
    return all(map_why_not(t, t.shape[-2], 192) is None for t in (q, k, v))


class Flash3Launch(AttentionLaunch):
    """The flash3_wgmma launch for every call of one structure: per call, the tensor maps (q, k, v and with
    tma_store the output's) are encoded for the call's pointers (skipped where a pointer is the last call's)
    into the packed parameters."""

    def __init__(self, packed, params: Params, maps: dict, d: int, device_index: int, writes_lse: bool,
                 workspace=None):
        super().__init__(packed, params, d, device_index, workspace, writes_lse=writes_lse)
        self.maps = tma.ParamMaps(params, {name: (f"{name}_map", tiled) for name, tiled in maps.items()})

    def write_pointers(self, p, q, k, v, out, lse) -> None:
        tensors = {"q": q, "k": k, "v": v, "o": out}
        for name in self.maps.names:
            self.maps.point(name, tensors[name].data_ptr())
        p.o = out.data_ptr()
        p.lse = 0 if lse is None else lse.data_ptr()


def flash3_prepare(config: Flash3Config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> Flash3Launch:
    """The launch for calls with the strides of ``inputs`` ({"q", "k", "v"}) and ``out`` on their device."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    # The maps: q, k and v, and with tma_store the output in 64-row boxes (the op's 16-byte rule for this
    # kernel keeps it describable).
    operands = [("q", q, problem.m, config.block_m), ("k", k, problem.n, config.block_n),
                ("v", v, problem.n, config.block_n)] + ([("o", out, problem.m, 64)] if config.tma_store else [])
    for name, t, rows, box in operands:
        reason = map_why_not(t, rows, box)
        if reason is not None:
            raise ValueError(f"{'out' if name == 'o' else name}: flash3_wgmma cannot reach it through TMA: {reason}")
    device = q.device.index
    kernel = nvrtc.kernel_for(SOURCE, flash3_name_expression(config, problem), device, arch_specific=True)
    params = tma.aligned_instance(Params)
    maps = {}
    for name, t, rows, box in operands:
        dims, strides, box_dims = _map_of(t, rows, box)
        maps[name] = tma.TiledMap(t.dtype, dims, strides, box_dims)
    for suffix, stride in zip(("batch", "head", "row"), _strides4(out)):
        setattr(params, f"o_{suffix}_stride", stride)
    params.heads, params.m, params.n, params.kv_group = problem.heads, problem.m, problem.n, problem.kv_group
    scale = inputs.get("scale")
    params.scale_log2 = (1.0 / math.sqrt(problem.d) if scale is None else float(scale)) * LOG2E
    params.causal, params.d = int(problem.causal), problem.d
    # As attention.cu's parameters: sides clamped to M and N, so the kernels' row bounds stay in 32 bits.
    left, right = problem.window or (None, None)
    params.window_left = problem.m if left is None else min(left, problem.m)
    params.window_right = problem.n if right is None else min(right, problem.n)
    params.num_sinks = min(problem.num_sinks, problem.n)
    params.m_blocks = -(-problem.m // config.block_m)
    params.units = params.m_blocks * problem.heads * problem.batch
    params.group_pairs = unit_group_pairs(config, problem)
    grid = (min(params.units, sm_count(device)) if config.persistent else params.units, 1, 1)
    shared = config.shared_bytes(compiled_head_dim(problem))
    packed = nvrtc.PackedLaunch(kernel, grid, (config.threads, 1, 1), (params,), shared_mem=shared)

    def scheduler_workspace(p, stream):  # the current stream's two counters, zero at rest (runtime.workspace)
        counters = stream_buffer("arrivals", device, stream, 2)
        p.scheduler = counters.data_ptr()
        # The consumers learn each unit the scheduler hands their CTA through a global word per (CTA, Q
        # buffer), any value at rest: the stream's uninitialised partials. (At a fixed stride they count the
        # units themselves.)
        slots = stream_buffer("partials", device, stream, grid[0] * config.q_buffers)
        p.unit_slots = slots.data_ptr()
        return counters, slots  # held until the launch

    return Flash3Launch(packed, params, maps, problem.d, device, writes_lse=problem.lse,
                        workspace=scheduler_workspace if config.dynamic else None)


# The registry's launches (the report, sweeps and tests call it for every timed call): the prepared launch of
# each call structure, so a call encodes its maps and launches as the op's plans do. Keyed by caller-driven
# shapes and strides: bounded.
_registry_launches: dict[tuple, Flash3Launch] = {}


def _registry_prepare(config: Flash3Config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> Flash3Launch:
    return kept_launch(_registry_launches, flash3_prepare, config, problem, inputs, out,
                       (inputs["q"], inputs["k"], inputs["v"], out))


flash3_launch = launch_with(_registry_prepare)


def flash3_standard_problems() -> list[AttentionProblem]:
    """The FlashAttention-2 entry's standard problems, then the rest of the grid the Hopper kernel is held
    to against cuDNN (issue 27): B4 H16 S4096 at d64 and d128, causal or not, fp16 and bf16."""
    F16, B16 = torch.float16, torch.bfloat16
    return flash_standard_problems() + [
        AttentionProblem(4, 16, 4096, 4096, 64, F16, causal=True),
        AttentionProblem(4, 16, 4096, 4096, 64, B16),
        AttentionProblem(4, 16, 4096, 4096, 64, B16, causal=True),
        AttentionProblem(4, 16, 4096, 4096, 128, B16, causal=True),
    ]


FLASH3_SPEC = attention_spec(
    variant="flash3_wgmma",
    dtypes=(torch.float16, torch.bfloat16),
    config_cls=Flash3Config,
    default_config=flash3_default_config,
    candidates=flash3_candidates,
    why_unsupported=flash3_why_unsupported,
    name_expression=flash3_name_expression,
    source=SOURCE,
    arch_specific=True,
    launch=flash3_launch,
    prepare=flash3_prepare,
    standard_problems=flash3_standard_problems,
    description="FlashAttention-3 structure for sm_90a: TMA + mbarrier ring, wgmma (S from shared memory, "
                "P from registers), producer/consumer warpgroups with setmaxnreg",
    baseline_name="torch SDPA FLASH_ATTENTION",
    other_baselines={"torch SDPA cuDNN": _cudnn_attention},
    bound="fp16",
    sweep_axes=(("block_n", "stages"), ("overlap", "pingpong")),
)
