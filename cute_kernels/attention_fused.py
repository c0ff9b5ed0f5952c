"""Fused attention, ``softmax(q k^T * scale) v``: the kernels of ``legacy_cuda/attention.cu`` compiled with
NVRTC, their configs, their registry entries and the public ``attention`` op.

- ``fused_fp32``: FP32 arithmetic throughout (FFMA, never TF32); any d up to 256; splits the keys across
  CTAs (merged in the kernel) when the query tiles alone cannot fill the GPU.
- ``flash2_mma``: FP16/BF16 FlashAttention-2 on mma.sync tensor cores, FP32 softmax state and accumulators.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math

import torch

from legacy_cuda import nvrtc

from . import _checks
from .registry import KernelSpec, register
from .runtime.device import SM90_SHARED_BYTES, current_stream_handle, shared_memory_limit
from .runtime.nvrtc_compile import checked_compile

SOURCE = "attention.cu"
SM_COUNT_FOR_HEURISTICS = 132  # the H200's; launches use the device's own count
MAX_SPLITS = 32  # key splits per query tile (the merge keeps one weight per split and row in shared memory)
HEAD_DIMS = (32, 64, 128, 256)  # compiled head dims of fused_fp32; d is zero-padded up to the next one
LOG2E = 1.4426950408889634


def padded_head_dim(d: int, choices=HEAD_DIMS) -> int:
    for h in choices:
        if d <= h:
            return h
    raise ValueError(f"head dim {d} is larger than {choices[-1]}")


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """Everything a config and a compile key may depend on. ``vector``: elements per global access that
    every row start allows (16 bytes when d and the strides allow it, else 1); 0 means the widest."""

    batch: int
    heads: int
    m: int
    n: int
    d: int
    dtype: torch.dtype = torch.float32
    causal: bool = False
    vector: int = 0
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device

    @property
    def vector_width(self) -> int:
        widest = 16 // self.dtype.itemsize
        return self.vector or (widest if self.d % widest == 0 else 1)

    @property
    def head_dim(self) -> int:
        return padded_head_dim(self.d)

    @property
    def batch_heads(self) -> int:
        return self.batch * self.heads


# ---- the launch parameters: one struct, the layout of attention::Params ---------------------------------


class Params(ctypes.Structure):
    _fields_ = (
        [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p)]
        + [(f"{t}_{s}_stride", ctypes.c_int64) for t in "qkvo" for s in ("batch", "head", "row")]
        + [("partial_o", ctypes.c_void_p), ("partial_lse", ctypes.c_void_p), ("arrivals", ctypes.c_void_p)]
        + [(name, ctypes.c_int32) for name in ("heads", "m", "n", "d", "splits", "tiles_per_split")]
        + [("scale_log2", ctypes.c_float), ("causal", ctypes.c_int32)]
    )


PARAMS_BYTES = 184  # attention.cu static_asserts the same size
_SIGNATURE = (None,)  # one argument: the Params structure, passed by address and copied at launch


def _strides4(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a 2-D (rows, d) or 4-D (B, H, rows, d) tensor, in elements."""
    if t.dim() == 2:
        return (0, 0, t.stride(0))
    return (t.stride(0), t.stride(1), t.stride(2))


# (problem, the strides of q, k, v and out, scale) -> Params holding everything but the four pointers: a
# repeat call copies it (184 bytes) and sets the pointers, instead of some 30 field writes.
_param_templates: dict[tuple, Params] = {}
_MAX_PARAM_TEMPLATES = 4096


def make_params(problem: AttentionProblem, inputs: dict, out: torch.Tensor, scale: float) -> Params:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    key = (problem, q.stride(), k.stride(), v.stride(), out.stride(), scale)
    template = _param_templates.get(key)
    if template is None:
        template = Params()
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
            for suffix, stride in zip(("batch", "head", "row"), _strides4(t)):
                setattr(template, f"{name}_{suffix}_stride", stride)
        template.heads, template.m, template.n, template.d = problem.heads, problem.m, problem.n, problem.d
        template.splits, template.tiles_per_split = 1, 0
        template.scale_log2 = scale * LOG2E
        template.causal = int(problem.causal)
        if len(_param_templates) >= _MAX_PARAM_TEMPLATES:
            _param_templates.clear()
        _param_templates[key] = template
    p = Params.from_buffer_copy(template)
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    return p


def _scale_of(problem: AttentionProblem, inputs: dict) -> float:
    scale = inputs.get("scale")
    return 1.0 / math.sqrt(problem.d) if scale is None else float(scale)


# ==========================================================================================================
# fused_fp32
# ==========================================================================================================


@dataclasses.dataclass(frozen=True)
class Fp32Config:
    """A CTA holds ``block_m`` query rows and walks the keys ``block_n`` at a time; each lane owns
    ``rows_per_thread`` rows (so a warp owns 4x that many and the CTA has 8 * block_m / rows_per_thread
    threads)."""

    block_m: int = 128
    block_n: int = 64
    rows_per_thread: int = 4

    def __post_init__(self):
        if self.block_m not in (32, 64, 128):
            raise ValueError(f"Fp32Config.block_m: expected 32, 64 or 128, got {self.block_m}")
        if self.block_n not in (32, 64):
            raise ValueError(f"Fp32Config.block_n: expected 32 or 64, got {self.block_n}")
        if self.rows_per_thread not in (2, 4):
            raise ValueError(f"Fp32Config.rows_per_thread: expected 2 or 4, got {self.rows_per_thread}")
        if self.threads > 256:
            raise ValueError(f"Fp32Config: {self.threads} threads per CTA allow only 128 registers per thread, and "
                             "the accumulators spill; use rows_per_thread=4 with block_m=128")

    @property
    def threads(self) -> int:
        return 8 * self.block_m // self.rows_per_thread

    def shared_bytes(self, head_dim: int) -> int:
        """attention.cu Fp32Tile::kSmemBytes: sQ, sK (pitch d + 4), sV (pitch d), sP (pitch block_n + 8)."""
        return 4 * ((self.block_m + self.block_n) * (head_dim + 4) + self.block_n * head_dim
                    + self.block_m * (self.block_n + 8))


def fp32_why_unsupported(config: Fp32Config, problem: AttentionProblem) -> str | None:
    if problem.dtype != torch.float32:
        return f"dtype {problem.dtype} is not float32"
    if not 1 <= problem.d <= HEAD_DIMS[-1]:
        return f"head dim {problem.d} is outside 1..{HEAD_DIMS[-1]}"
    if problem.vector_width not in (1, 4):
        return f"vector width {problem.vector_width} is neither 1 nor 4"
    if problem.vector_width == 4 and problem.d % 4:
        return f"float4 accesses need d % 4 == 0, got d={problem.d}"
    if config.rows_per_thread * problem.head_dim > 512:
        return (f"rows_per_thread={config.rows_per_thread} x head dim {problem.head_dim} accumulators per lane "
                "do not fit in registers")
    if config.shared_bytes(problem.head_dim) > problem.shared_limit:
        return f"{config.shared_bytes(problem.head_dim)} bytes of shared memory exceed the device's {problem.shared_limit}"
    ctas = problem.batch_heads * -(-problem.m // config.block_m) * MAX_SPLITS
    if ctas > 2**31 - 1:
        return f"{ctas} CTAs exceed one launch's grid"
    return None


def fp32_candidates() -> list[Fp32Config]:
    return [Fp32Config(bm, bn, r) for bm in (32, 64, 128) for bn in (32, 64) for r in (2, 4) if 8 * bm // r <= 256]


def _largest_fitting(preferred, candidates, why_unsupported, problem):
    """``preferred`` when it runs on the problem (and device), else the supported candidate with the
    largest tile: a GPU with less shared memory than the H200 still gets a working default."""
    if why_unsupported(preferred, problem) is None:
        return preferred
    fitting = [c for c in candidates if why_unsupported(c, problem) is None]
    if not fitting:
        raise ValueError(f"no {type(preferred).__name__} runs {problem}")
    return max(fitting, key=lambda c: (c.block_m * c.block_n, c.block_m))


def fp32_default_config(problem: AttentionProblem) -> Fp32Config:
    return _largest_fitting(_fp32_preferred(problem), fp32_candidates(), fp32_why_unsupported, problem)


def _fp32_preferred(problem: AttentionProblem) -> Fp32Config:
    if problem.head_dim > 128:
        return Fp32Config(64, 32, 2)
    # Big tiles (fewest shared-memory loads per FFMA) when there is enough work to give every SM a few
    # of them, with key splits where the query tiles alone are too few; small tiles (and splits) for
    # problems like M=512, N=256 where even the splits of big tiles leave most SMs idle.
    big = Fp32Config(128, 64, 4)
    work = problem.batch_heads * -(-problem.m // big.block_m) * -(-problem.n // big.block_n)
    if work >= 2 * SM_COUNT_FOR_HEURISTICS:
        return big
    return Fp32Config(32, 32, 2)


def fp32_name_expression(config: Fp32Config, problem: AttentionProblem) -> str:
    return (f"attention::fused_fp32_kernel<{problem.head_dim}, {config.block_m}, {config.block_n}, "
            f"{config.rows_per_thread}, {problem.vector_width}>")


fp32_compile = checked_compile(SOURCE, fp32_why_unsupported, fp32_name_expression)


# (config, head dim, vector, device) -> (kernel, shared bytes, CTAs per SM, SMs)
_fp32_plans: dict[tuple, tuple] = {}


def _fp32_plan(config: Fp32Config, problem: AttentionProblem, device: int) -> tuple:
    key = (config, problem.head_dim, problem.vector_width, device)
    plan = _fp32_plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, fp32_name_expression(config, problem), device)
        smem = config.shared_bytes(problem.head_dim)
        per_sm = nvrtc.occupancy(kernel, config.threads, smem)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        plan = _fp32_plans[key] = (kernel, smem, per_sm, sms)
    return plan


def choose_splits(query_ctas: int, key_tiles: int, sms: int, ctas_per_sm: int) -> int:
    """Key splits per query tile: enough CTAs to cover every SM once, never more than one full wave of
    resident CTAs (a partial second wave would cost as much as the first), never an empty split."""
    if query_ctas >= sms:
        return 1
    splits = min(key_tiles, MAX_SPLITS, -(-sms // query_ctas))
    slots = sms * ctas_per_sm
    if query_ctas * splits > slots:
        splits = max(1, slots // query_ctas)
    return splits


def causal_key_tiles(m: int, n: int, block_m: int, block_n: int) -> list[int]:
    """Key tiles each query tile of a causal (top-left) attention reads, longest first (the kernel's launch
    order): rows i0 .. min(m, i0 + block_m) - 1 see keys 0 .. min(n, m, i0 + block_m) - 1."""
    query_tiles = -(-m // block_m)
    return [-(-min(n, m, (tile + 1) * block_m) // block_n) for tile in reversed(range(query_tiles))]


# Costs, in key tiles of work, that the causal split choice weighs against shorter splits: a CTA with keys
# loads Q and waits for its first K/V tile before it computes anything, and writes a partial output that
# the merge reads back; a split with no keys only launches, publishes -inf and arrives.
SPLIT_CTA_OVERHEAD = 1.0
EMPTY_SPLIT_OVERHEAD = 0.1
MAX_SIMULATED_CTAS = 1 << 13  # bounds the one-off cost of a choice (it is cached per problem shape)


def simulated_makespan(key_tiles: list[int], batch_heads: int, tiles_per_split: int, slots: int) -> float:
    """When the last CTA finishes if the block scheduler hands CTAs out in launch order (tile-major, as
    attention.cu's TileSlot orders causal launches) to whichever of ``slots`` resident-CTA places frees up
    first, each CTA costing its key tiles plus the overheads above."""
    import heapq

    splits = -(-max(key_tiles) // tiles_per_split)
    free_at = [0.0] * slots
    for tiles in key_tiles:
        for split in range(splits):
            own = min(tiles, (split + 1) * tiles_per_split) - split * tiles_per_split
            cost = (own + (SPLIT_CTA_OVERHEAD if splits > 1 else 0.0)) if own > 0 else EMPTY_SPLIT_OVERHEAD
            for _ in range(batch_heads):
                heapq.heappush(free_at, heapq.heappop(free_at) + cost)
    return max(free_at)


def choose_causal_tiles_per_split(key_tiles: list[int], batch_heads: int, sms: int, ctas_per_sm: int) -> int:
    """Key tiles per split for a causal launch (``key_tiles``: per query tile, longest first).

    The non-causal rule (choose_splits) sizes splits from the full key count, so the longest causal tile's
    splits are as long as without the mask and the critical path does not shrink although the work halves.
    Here the floor on a split's length is the total causal work spread over the resident CTA places: no
    split when the longest tile is within that share; else every split count from 1 up to where splits
    get shorter than the share (or MAX_SPLITS) is scored by simulating the block scheduler, and the shortest
    makespan wins, ties going to fewer splits (fewer CTAs, less merging)."""
    longest = max(key_tiles)
    slots = sms * ctas_per_sm
    query_ctas = batch_heads * len(key_tiles)
    share = max(1, -(-batch_heads * sum(key_tiles) // slots))
    if longest <= share:
        return longest
    best, best_time = longest, simulated_makespan(key_tiles, batch_heads, longest, slots)
    for splits in range(2, MAX_SPLITS + 1):
        tiles_per_split = -(-longest // splits)
        if tiles_per_split < share or query_ctas * splits > MAX_SIMULATED_CTAS:
            break
        if -(-longest // tiles_per_split) != splits:
            continue  # this length gives fewer splits: already scored
        time = simulated_makespan(key_tiles, batch_heads, tiles_per_split, slots)
        if time < best_time:
            best, best_time = tiles_per_split, time
    return best


def fp32_split_plan(config: Fp32Config, problem: AttentionProblem, sms: int, ctas_per_sm: int) -> tuple[int, int]:
    """(splits, key tiles per split) of a fused_fp32 launch; every split of the longest query tile has keys."""
    query_tiles = -(-problem.m // config.block_m)
    key_tiles = -(-problem.n // config.block_n)
    if problem.causal:
        per_tile = causal_key_tiles(problem.m, problem.n, config.block_m, config.block_n)
        tiles_per_split = _causal_plans.get((config, problem.batch_heads, problem.m, problem.n, sms, ctas_per_sm))
        if tiles_per_split is None:
            tiles_per_split = choose_causal_tiles_per_split(per_tile, problem.batch_heads, sms, ctas_per_sm)
            _causal_plans[(config, problem.batch_heads, problem.m, problem.n, sms, ctas_per_sm)] = tiles_per_split
        return -(-max(per_tile) // tiles_per_split), tiles_per_split
    splits = choose_splits(problem.batch_heads * query_tiles, key_tiles, sms, ctas_per_sm)
    tiles_per_split = -(-key_tiles // splits)
    return -(-key_tiles // tiles_per_split), tiles_per_split  # no split without keys when N divides unevenly


_causal_plans: dict[tuple, int] = {}


# Per (device, stream): the partial outputs and row statistics of the key splits (float32, uninitialised),
# and the per-query-tile arrival counters, a separate tensor because the kernel leaves them at zero: they
# are zeroed once, when allocated, and never share memory with data a larger launch could overwrite.
# Reuse is safe because every use is stream-ordered. Under CUDA graph capture fresh ones come from the
# graph's pool (the zeroing is captured with them), so a replay never shares them with eager calls.
_workspaces: dict[tuple[int, int, str], torch.Tensor] = {}


def _buffer(kind: str, device: int, stream: int, numel: int) -> torch.Tensor:
    dtype, make = (torch.int32, torch.zeros) if kind == "arrivals" else (torch.float32, torch.empty)
    if torch.cuda.is_current_stream_capturing():
        return make(numel, dtype=dtype, device=device)
    buf = _workspaces.get((device, stream, kind))
    if buf is None or buf.numel() < numel:
        buf = _workspaces[(device, stream, kind)] = make(max(numel, 1 << 14), dtype=dtype, device=device)
    return buf


def fp32_launch(config: Fp32Config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Run fused_fp32 on ``inputs`` ({"q", "k", "v"}, optionally "scale") into ``out`` (contiguous)."""
    q = inputs["q"]
    device = q.device.index
    kernel, smem, per_sm, sms = _fp32_plan(config, problem, device)
    params = make_params(problem, inputs, out, _scale_of(problem, inputs))
    query_ctas = problem.batch_heads * -(-problem.m // config.block_m)
    splits, tiles_per_split = fp32_split_plan(config, problem, sms, per_sm)
    params.splits, params.tiles_per_split = splits, tiles_per_split
    stream = current_stream_handle(device)
    if splits > 1:
        rows = query_ctas * splits * config.block_m  # a multiple of 32: the partial outputs stay 16-byte aligned
        data = _buffer("partials", device, stream, rows * (problem.head_dim + 1))
        params.arrivals = _buffer("arrivals", device, stream, query_ctas).data_ptr()
        params.partial_lse = data.data_ptr()
        params.partial_o = data.data_ptr() + rows * 4
    nvrtc.launch(kernel, (query_ctas * splits, 1, 1), (config.threads, 1, 1), (params,), _SIGNATURE,
                 shared_mem=smem, stream_handle=stream)
    return out


# ==========================================================================================================
# flash2_mma
# ==========================================================================================================

FLASH_HEAD_DIMS = (64, 128, 256)  # 64 and 128: the fast paths; other d are zero-padded up to the next one
FLASH_CPP_TYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


# The key loops of flash2_mma (attention.cu): "classic" is flash2_mma_kernel (two barriers per key tile,
# scores scaled by an FMUL and shifted by an FADD, O rescaled every tile); "lean" is flash2_lean_kernel (one
# barrier per tile, predicate-free copies of whole tiles, the scale folded into the FFMA feeding ex2, O
# rescaled only when a row's maximum grows by more than 2^8); "lean_eager" is the lean loop with O rescaled
# every tile, as the classic loop does.
FLASH_MAINLOOPS = ("classic", "lean", "lean_eager")


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """``block_m`` query rows per CTA over ``warps`` warps (each owning block_m / warps rows, in blocks of
    16), keys ``block_n`` at a time; ``mainloop``: which key loop (FLASH_MAINLOOPS) runs the tiles."""

    block_m: int = 128
    block_n: int = 32
    warps: int = 4
    mainloop: str = "classic"

    def __post_init__(self):
        if self.block_m not in (64, 128):
            raise ValueError(f"FlashConfig.block_m: expected 64 or 128, got {self.block_m}")
        if self.block_n not in (32, 64, 128):
            raise ValueError(f"FlashConfig.block_n: expected 32, 64 or 128, got {self.block_n}")
        if self.warps not in (4, 8) or self.block_m % (16 * self.warps):
            raise ValueError(f"FlashConfig.warps: expected 4 or 8 with block_m a multiple of 16 * warps, got "
                             f"{self.warps} for block_m={self.block_m}")
        if self.mainloop not in FLASH_MAINLOOPS:
            raise ValueError(f"FlashConfig.mainloop: expected one of {FLASH_MAINLOOPS}, got {self.mainloop!r}")

    @property
    def row_blocks(self) -> int:
        """16-row blocks per warp (the kM16 of attention.cu)."""
        return self.block_m // (16 * self.warps)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, head_dim: int) -> int:
        """attention.cu FlashTile::kSmemBytes: sQ and two buffers each of sK and sV, rows padded by 8."""
        return 2 * (self.block_m + 4 * self.block_n) * (head_dim + 8)

    def accumulators(self, head_dim: int) -> int:
        """FP32 accumulator registers per lane: O (head_dim / 2 per row block) and S (block_n / 2)."""
        return self.o_accumulators(head_dim) + self.s_accumulators

    def o_accumulators(self, head_dim: int) -> int:
        return self.row_blocks * head_dim // 2

    @property
    def s_accumulators(self) -> int:
        return self.row_blocks * self.block_n // 2


# Measured with ptxas -v (sm_90a, NVRTC 13.5): above these the 255-register budget spills (the element-wise
# copies of the slow path hold a few more registers than cp.async). 192 is FlashAttention-2's own budget:
# 128x64 tiles at d=128 and 128x128 at d=64, four warps, each warp 32 rows.
FLASH_MAX_ACCUMULATORS = {8: 192, 1: 144}
# The lean loops sit at the 255-register cap at that full budget too, and which of them fit there is what
# ptxas says, not a formula (tests/test_attention_cpu.py compiles every supported candidate and checks for
# spills; NVRTC 13.5 for sm_80/sm_90a and 13.0, the H200's, for sm_90a agree on this). At 192 accumulators,
# "lean" fits with at most 64 S accumulators per lane (128x64 at d=128) and spills with 128 (128x128 at
# d=64); "lean_eager", which rescales O every tile, spills on both. Below the full budget every tile fits.
# Value: the most S accumulators per lane a loop fits at the full budget (None: no tile).
FLASH_LEAN_S_AT_FULL_BUDGET = {"lean": 64, "lean_eager": None}


def _lean_spill_reason(config: FlashConfig, head_dim: int, budget: int) -> str | None:
    if config.mainloop not in FLASH_LEAN_S_AT_FULL_BUDGET or config.accumulators(head_dim) < budget:
        return None
    limit = FLASH_LEAN_S_AT_FULL_BUDGET[config.mainloop]
    if limit is None:
        return f"mainloop={config.mainloop!r} spills at the full {budget}-accumulator budget"
    if config.s_accumulators > limit:
        return (f"mainloop={config.mainloop!r} spills with {config.s_accumulators} S accumulators per lane at the "
                f"full {budget}-accumulator budget (at most {limit})")
    return None


def flash_why_unsupported(config: FlashConfig, problem: AttentionProblem) -> str | None:
    if problem.dtype not in FLASH_CPP_TYPES:
        return f"dtype {problem.dtype} is not float16 or bfloat16"
    if not 1 <= problem.d <= FLASH_HEAD_DIMS[-1]:
        return f"head dim {problem.d} is outside 1..{FLASH_HEAD_DIMS[-1]}"
    if problem.vector_width not in (1, 8) or (problem.vector_width == 8 and problem.d % 8):
        return f"vector width {problem.vector_width} needs d % 8 == 0 (or use 1), got d={problem.d}"
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    budget = FLASH_MAX_ACCUMULATORS[problem.vector_width]
    if config.accumulators(head_dim) > budget:
        return (f"{config.accumulators(head_dim)} FP32 accumulators per lane at head dim {head_dim} spill "
                f"(at most {budget} with {problem.vector_width}-element copies)")
    lean = _lean_spill_reason(config, head_dim, budget)
    if lean is not None:
        return lean
    if config.shared_bytes(head_dim) > problem.shared_limit:
        return f"{config.shared_bytes(head_dim)} bytes of shared memory exceed the device's {problem.shared_limit}"
    if problem.batch_heads * -(-problem.m // config.block_m) > 2**31 - 1:
        return "more CTAs than one launch's grid holds"
    return None


def flash_candidates() -> list[FlashConfig]:
    return [FlashConfig(bm, bn, w, loop) for loop in FLASH_MAINLOOPS for bm in (64, 128) for bn in (32, 64, 128)
            for w in (4, 8) if bm % (16 * w) == 0]


def flash_default_config(problem: AttentionProblem) -> FlashConfig:
    # Where the preferred tile does not fit (less shared memory), the largest classic tile that does.
    classic = [c for c in flash_candidates() if c.mainloop == "classic"]
    return _largest_fitting(_flash_preferred(problem), classic, flash_why_unsupported, problem)


def _flash_preferred(problem: AttentionProblem) -> FlashConfig:
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    if problem.vector_width == 1:
        return FlashConfig(64, 32, 4)  # the slow path: element-wise copies, one 16-row block per warp
    # FlashAttention-2's tiles on sm80/sm90: 128 query rows over 4 warps (two 16-row blocks per warp, so
    # every K and V fragment read from shared memory feeds two MMAs), and the widest key tile whose S
    # accumulators still fit next to O: 64 keys at d=128, 128 at d=64. Wide key tiles spread each tile's
    # fixed costs (two barriers, the row max/sum shuffles, rescaling O) over more MMAs.
    # At d=64 and d=128 the lean key loop at 128x64 (one barrier per tile, the scale folded into the exp,
    # O rescaled only when a row max grows by 2^8) won on the H200 (scripts/attention_probe.py, fp16
    # B=4 H=16 S=4096, same-run torch FLASH, 2026-11-29): d=128 1.114x (classic 0.977x), causal 1.214x
    # (1.082x), d=64 1.076x (classic 128x128: 1.037x). Other head dims keep the classic loop (unmeasured).
    if head_dim in (64, 128):
        return FlashConfig(128, 64, 4, "lean")
    return FlashConfig(64, 32, 4)


def flash_name_expression(config: FlashConfig, problem: AttentionProblem) -> str:
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    args = (f"{FLASH_CPP_TYPES[problem.dtype]}, {head_dim}, {config.block_m}, {config.block_n}, {config.warps}, "
            f"{problem.vector_width}")
    if config.mainloop == "classic":
        return f"attention::flash2_mma_kernel<{args}>"
    lazy = "true" if config.mainloop == "lean" else "false"
    return f"attention::flash2_lean_kernel<{args}, {lazy}>"


flash_compile = checked_compile(SOURCE, flash_why_unsupported, flash_name_expression)


_flash_plans: dict[tuple, tuple] = {}


def flash_launch(config: FlashConfig, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Run flash2_mma on ``inputs`` ({"q", "k", "v"}, optionally "scale") into ``out`` (contiguous)."""
    device = inputs["q"].device.index
    head_dim = padded_head_dim(problem.d, FLASH_HEAD_DIMS)
    key = (config, problem.dtype, head_dim, problem.vector_width, device)
    plan = _flash_plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, flash_name_expression(config, problem), device)
        plan = _flash_plans[key] = (kernel, config.shared_bytes(head_dim))
    kernel, smem = plan
    params = make_params(problem, inputs, out, _scale_of(problem, inputs))
    ctas = problem.batch_heads * -(-problem.m // config.block_m)
    stream = current_stream_handle(device)
    nvrtc.launch(kernel, (ctas, 1, 1), (config.threads, 1, 1), (params,), _SIGNATURE,
                 shared_mem=smem, stream_handle=stream)
    return out


# ==========================================================================================================
# The public op
# ==========================================================================================================

DTYPE_VARIANTS = {torch.float32: "fused_fp32", torch.float16: "flash2_mma", torch.bfloat16: "flash2_mma"}


def _vector_width(dtype: torch.dtype, d: int, tensors) -> int:
    """16-byte accesses when d and every row start allow them (pointer and batch/head/row strides), else 1."""
    widest = 16 // dtype.itemsize
    if d % widest:
        return 1
    for t in tensors:
        if _checks.alignment_bytes(t) < 16 or any(s % widest for s in _strides4(t)):
            return 1
    return widest


def _check_scale(scale):
    if scale is None:
        return None
    scale = _checks.real_scalar("scale", scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    return scale


# Calls already validated, by structure (see _checks.ValidatedCalls); the scale and out's overlaps are
# checked every call.
_VALIDATED = _checks.ValidatedCalls()


def _check_attention_args(q, k, v, scale, causal):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.cuda_tensor(name, t)
        _checks.dtype_in(name, t, DTYPE_VARIANTS)
    _checks.same_device(q=q, k=k, v=v)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (like q), got {t.dtype}")
    if q.dim() not in (2, 4):
        raise ValueError(f"q: expected a 2-D (M, d) or 4-D (B, H, M, d) tensor, got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{name}: expected {q.dim()}-D like q, got shape {tuple(t.shape)}")
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(f"{name}: expected batch/head dims {tuple(q.shape[:-2])} (like q), got {tuple(t.shape[:-2])}")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"k: expected head dim {d} (like q), got {k.shape[-1]}")
    if v.shape[-1] != d:
        raise ValueError(f"v: expected head dim {d} (like q), got {v.shape[-1]}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: expected {k.shape[-2]} rows (like k), got {v.shape[-2]}")
    if k.shape[-2] == 0:
        raise ValueError("k: expected at least one key (N >= 1), got N=0: softmax over no keys is undefined")
    if not 1 <= d <= HEAD_DIMS[-1]:
        raise ValueError(f"q: expected a head dim d in 1..{HEAD_DIMS[-1]}, got {d}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] > 1 and t.stride(-1) != 1 and t.numel():
            raise ValueError(f"{name}: expected stride 1 in the last (head) dim, got strides {tuple(t.stride())}")
        span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
        # Row counts go through 32-bit arithmetic in the kernel with a tile added (m0 + kBlockM): keep a margin.
        if t.shape[-2] > 2**31 - 1024 or span >= 2**62:
            raise ValueError(f"{name}: too large ({tuple(t.shape)}) for the kernel's indexing")
    scale = _check_scale(scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    return scale


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              causal: bool = False, out: torch.Tensor | None = None, config=None,
              variant: str | None = None) -> torch.Tensor:
    """``softmax(q @ k^T * scale) @ v`` per (batch, head), like ``torch.nn.functional.scaled_dot_product_attention``.

    q: (M, d) or (B, H, M, d); k, v: (N, d) or (B, H, N, d); float32, float16 or bfloat16, all alike.
    ``scale`` defaults to 1/sqrt(d). ``causal=True`` lets query i see keys 0..i (top-left aligned, as torch's
    ``is_causal`` does also when M != N). float32 computes in FP32 throughout (no TF32); float16/bfloat16 on
    tensor cores with FP32 softmax and accumulators. Inputs need stride 1 in the head dim; any other strides
    are fine. ``out`` (contiguous, q's shape and dtype) receives the result; it is left untouched on an error.
    """
    key = _VALIDATED.key((q, k, v, out), type(scale), type(causal), causal, config, variant)
    known = _VALIDATED.get(key)
    if known is None:
        scale = _check_attention_args(q, k, v, scale, causal)
        if out is not None:
            _checks.output("out", out, shape=q.shape, dtype=q.dtype, device=q.device, inputs={"q": q, "k": k, "v": v})
        spec = _registry_entry(variant or DTYPE_VARIANTS[q.dtype])
        if q.dtype not in spec.dtypes:
            raise TypeError(f"q: variant {spec.variant!r} takes {spec.dtypes}, got {q.dtype}")
        _checks.config_type(config, spec.config_cls)  # the variant's own config class
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if out.numel() == 0:
            return out
        batch, heads = (q.shape[0], q.shape[1]) if q.dim() == 4 else (1, 1)
        d = q.shape[-1]
        problem = AttentionProblem(batch, heads, q.shape[-2], k.shape[-2], d, q.dtype, causal,
                                   vector=_vector_width(q.dtype, d, (q, k, v, out)),
                                   shared_limit=shared_memory_limit(q.device.index))
        if config is not None:
            reason = spec.why_unsupported(config, problem)
            if reason is not None:
                raise ValueError(f"config: {config} cannot run {problem}: {reason}")
        _VALIDATED.remember(key, (spec, problem))
    else:  # this structure passed every check above before; the values may still be wrong
        spec, problem = known
        scale = _check_scale(scale)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        else:
            _checks.no_overlap("out", out, {"q": q, "k": k, "v": v})
    if config is None:
        config = spec.choose_config(problem, q.device.index)
    inputs = {"q": q, "k": k, "v": v, "scale": scale}
    if q.device.index == torch.cuda.current_device():
        return spec.launch(config, problem, inputs, out)
    with torch.cuda.device(q.device):
        return spec.launch(config, problem, inputs, out)


# ==========================================================================================================
# Registry entries
# ==========================================================================================================


def _make_inputs(problem: AttentionProblem, device, generator=None) -> dict:
    def randn(rows):
        return torch.randn((problem.batch, problem.heads, rows, problem.d), dtype=problem.dtype, device=device,
                           generator=generator)

    return {"q": randn(problem.m), "k": randn(problem.n), "v": randn(problem.n)}


def _causal_mask(m: int, n: int, device) -> torch.Tensor:
    """True where query i may see key j: j <= i (top-left aligned, torch's is_causal)."""
    return torch.ones(m, n, dtype=torch.bool, device=device).tril()


def reference_and_scale(q, k, v, scale=None, causal=False) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention and its per-element error scale, sum_j p_ij |v_jc|: the size of the terms of each
    output's weighted sum, which is what rounding errors in p and in the sum are proportional to.
    Computed one (batch, head) slice at a time so the float64 scores of large problems fit in memory."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q4, k4, v4 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    ref = torch.empty(q4.shape, dtype=torch.float64, device=q.device)
    mag = torch.empty_like(ref)
    mask = _causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    for i in range(q4.shape[0]):
        s = (q4[i].double() @ k4[i].double().T) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        ref[i] = p @ v4[i].double()
        mag[i] = p @ v4[i].double().abs()
    shape = q.shape
    return ref.reshape(shape), mag.reshape(shape).clamp_min(torch.finfo(torch.float64).tiny)


def _reference(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    return reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal)[0]


def _error_scale(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    return reference_and_scale(inputs["q"], inputs["k"], inputs["v"], inputs.get("scale"), problem.causal)[1]


def sdpa_backends(dtype: torch.dtype):
    """The torch SDPA backends we compare against: FlashAttention-2 for fp16/bf16; for float32, torch's own
    choice among the backends that take it (efficient, else math), TF32 off."""
    from torch.nn.attention import SDPBackend

    if dtype == torch.float32:
        return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION]


def _baseline(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with sdpa_kernel(sdpa_backends(problem.dtype)):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=problem.causal, scale=inputs.get("scale"))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _cudnn_attention(problem: AttentionProblem, inputs: dict) -> torch.Tensor:
    """torch SDPA's cuDNN backend, which uses Hopper-only instructions on the H200: shown beside the
    FlashAttention-2 baseline in the report (it raises where cuDNN cannot take the problem)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(
            inputs["q"], inputs["k"], inputs["v"], is_causal=problem.causal, scale=inputs.get("scale"))


def unmasked_pairs(m: int, n: int, causal: bool) -> int:
    """(query, key) pairs a causal (top-left) or full attention computes: sum_i min(i + 1, n)."""
    if not causal:
        return m * n
    full = max(0, m - n)  # rows i >= n see all n keys
    ramp = min(m, n)  # rows i < n see i + 1 keys
    return ramp * (ramp + 1) // 2 + full * n


def _flops(problem: AttentionProblem) -> float:
    return 4.0 * problem.batch_heads * unmasked_pairs(problem.m, problem.n, problem.causal) * problem.d


def _bytes(problem: AttentionProblem) -> float:
    return problem.batch_heads * (2 * problem.m + 2 * problem.n) * problem.d * problem.dtype.itemsize


def _fp32_standard_problems() -> list[AttentionProblem]:
    return [
        AttentionProblem(1, 1, 512, 256, 128, torch.float32),  # LeetGPU's size
        AttentionProblem(1, 1, 4096, 4096, 128, torch.float32),
        AttentionProblem(1, 1, 4096, 4096, 128, torch.float32, causal=True),
        AttentionProblem(4, 16, 1024, 1024, 64, torch.float32),
    ]


def shape_bucket(problem: AttentionProblem) -> str:
    """Tuned-config key: dtype, head dim, causal, vector width, and the log2 of M, N and batch * heads."""
    def log2(x: int) -> int:
        return max(x, 1).bit_length() - 1

    return (f"{str(problem.dtype).removeprefix('torch.')}:d{problem.d}:{'causal' if problem.causal else 'full'}:"
            f"vec{problem.vector_width}:m2^{log2(problem.m)}:n2^{log2(problem.n)}:bh2^{log2(problem.batch_heads)}")


FP32_SPEC = register(KernelSpec(
    op="attention",
    variant="fused_fp32",
    backend="nvrtc",
    dtypes=(torch.float32,),
    config_cls=Fp32Config,
    default_config=fp32_default_config,
    candidates=fp32_candidates,
    why_unsupported=fp32_why_unsupported,
    compile=fp32_compile,
    launch=fp32_launch,
    make_inputs=_make_inputs,
    reference=_reference,
    baseline=_baseline,
    flops=_flops,
    bytes=_bytes,
    standard_problems=_fp32_standard_problems,
    description="fused FP32 attention, online softmax, register-tiled FFMA, in-kernel key-split merge",
    sources=(SOURCE,),
    baseline_name="torch SDPA (efficient, fp32, TF32 off)",
    bound="fp32",
    error_scale=_error_scale,
    shape_bucket=shape_bucket,
    sweep_axes=(("block_m", "block_n"), ("rows_per_thread",)),
))


def _flash_standard_problems() -> list[AttentionProblem]:
    return [
        AttentionProblem(4, 16, 4096, 4096, 128, torch.float16),
        AttentionProblem(4, 16, 4096, 4096, 64, torch.float16),
        AttentionProblem(4, 16, 4096, 4096, 128, torch.bfloat16),
        AttentionProblem(4, 16, 4096, 4096, 128, torch.float16, causal=True),
    ]


FLASH_SPEC = register(KernelSpec(
    op="attention",
    variant="flash2_mma",
    backend="nvrtc",
    dtypes=(torch.float16, torch.bfloat16),
    config_cls=FlashConfig,
    default_config=flash_default_config,
    candidates=flash_candidates,
    why_unsupported=flash_why_unsupported,
    compile=flash_compile,
    launch=flash_launch,
    make_inputs=_make_inputs,
    reference=_reference,
    baseline=_baseline,
    flops=_flops,
    bytes=_bytes,
    standard_problems=_flash_standard_problems,
    description="FlashAttention-2, mma.sync m16n8k16 + ldmatrix + cp.async double buffering, P in registers",
    sources=(SOURCE,),
    baseline_name="torch SDPA FLASH_ATTENTION",
    other_baselines={"torch SDPA cuDNN": _cudnn_attention},
    bound="fp16",
    error_scale=_error_scale,
    shape_bucket=shape_bucket,
    sweep_axes=(("block_m", "block_n"), ("warps",)),
))


def _registry_entry(variant: str) -> KernelSpec:
    from . import registry

    return registry.for_call("attention", variant)
