"""fused_fp32: attention in FP32 arithmetic throughout (FFMA, never TF32), any d up to 256; where the query
tiles alone cannot fill the GPU it splits the keys across CTAs and merges the splits in the kernel."""

from __future__ import annotations

import dataclasses

import torch

from cute_kernels.runtime import nvrtc

from ...runtime.bounded import remember
from ...runtime.config_fields import check_choice, check_fields
from ...runtime.device import H200_SM_COUNT, MAX_GRID_X, sm_count
from ...runtime.workspace import stream_buffer
from .problem import (HEAD_DIMS, SOURCE, AttentionLaunch, AttentionProblem, _largest_fitting, _scale_of, launch_with,
                      make_params, window_key_tiles)
from .spec import attention_spec, fp32_standard_problems

MAX_SPLITS = 32  # key splits per query tile (the merge keeps one weight per split and row in shared memory)


@dataclasses.dataclass(frozen=True)
class Fp32Config:
    """A CTA holds ``block_m`` query rows and walks the keys ``block_n`` at a time; each lane owns
    ``rows_per_thread`` rows (so a warp owns 4x that many and the CTA has 8 * block_m / rows_per_thread
    threads)."""

    block_m: int = 128
    block_n: int = 64
    rows_per_thread: int = 4

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "block_m", (32, 64, 128), "32, 64 or 128")
        check_choice(self, "block_n", (32, 64), "32 or 64")
        check_choice(self, "rows_per_thread", (2, 4), "2 or 4")
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
    if ctas > MAX_GRID_X:
        return f"{ctas} CTAs exceed one launch's grid"
    return None


def fp32_candidates() -> list[Fp32Config]:
    return [Fp32Config(bm, bn, r) for bm in (32, 64, 128) for bn in (32, 64) for r in (2, 4) if 8 * bm // r <= 256]


def fp32_default_config(problem: AttentionProblem) -> Fp32Config:
    return _largest_fitting(_fp32_preferred(problem), fp32_candidates(), fp32_why_unsupported, problem)


def _fp32_preferred(problem: AttentionProblem) -> Fp32Config:
    if problem.head_dim > 128:
        return Fp32Config(64, 32, 2)
    # Big tiles (fewest shared-memory loads per FFMA) when there is enough work to give every SM a few
    # of them, with key splits where the query tiles alone are too few; small tiles (and splits) for
    # problems like M=512, N=256 where even the splits of big tiles leave most SMs idle.
    big = Fp32Config(128, 64, 4)
    key_tiles = max(window_key_tiles(problem, big.block_m, big.block_n)) if problem.windowed else -(-problem.n // big.block_n)
    work = problem.batch_heads * -(-problem.m // big.block_m) * key_tiles
    if work >= 2 * H200_SM_COUNT:
        return big
    return Fp32Config(32, 32, 2)


def fp32_name_expression(config: Fp32Config, problem: AttentionProblem) -> str:
    return (f"attention::fused_fp32_kernel<{problem.head_dim}, {config.block_m}, {config.block_n}, "
            f"{config.rows_per_thread}, {problem.vector_width}{problem.template_flags}>")


# (config, head dim, vector, device) -> (kernel, shared bytes, CTAs per SM, SMs)
_fp32_plans: dict[tuple, tuple] = {}


def _fp32_plan(config: Fp32Config, problem: AttentionProblem, device: int) -> tuple:
    key = (config, problem.head_dim, problem.vector_width, problem.windowed, problem.lse, device)
    plan = _fp32_plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, fp32_name_expression(config, problem), device)
        smem = config.shared_bytes(problem.head_dim)
        per_sm = nvrtc.occupancy(kernel, config.threads, smem)
        sms = sm_count(device)
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
    if problem.windowed:  # split the longest query tile's key loop as a full one of that length
        key_tiles = max(1, max(window_key_tiles(problem, config.block_m, config.block_n)))
    elif problem.causal:
        per_tile = causal_key_tiles(problem.m, problem.n, config.block_m, config.block_n)
        tiles_per_split = _causal_plans.get((config, problem.batch_heads, problem.m, problem.n, sms, ctas_per_sm))
        if tiles_per_split is None:
            tiles_per_split = choose_causal_tiles_per_split(per_tile, problem.batch_heads, sms, ctas_per_sm)
            remember(_causal_plans, (config, problem.batch_heads, problem.m, problem.n, sms, ctas_per_sm),
                     tiles_per_split)
        return -(-max(per_tile) // tiles_per_split), tiles_per_split
    splits = choose_splits(problem.batch_heads * query_tiles, key_tiles, sms, ctas_per_sm)
    tiles_per_split = -(-key_tiles // splits)
    return -(-key_tiles // tiles_per_split), tiles_per_split  # no split without keys when N divides unevenly


_causal_plans: dict[tuple, int] = {}  # keyed by shapes (batch x heads, M, N): bounded by remember()


def fp32_prepare(config: Fp32Config, problem: AttentionProblem, inputs: dict, out: torch.Tensor) -> AttentionLaunch:
    """The fused_fp32 launch for calls with the strides of ``inputs`` ({"q", "k", "v"}) and ``out``
    (contiguous) on their device: the kernel loaded, the key splits chosen, the parameters packed; a split
    launch takes its partials from the current stream's workspace at each call."""
    device = inputs["q"].device.index
    kernel, smem, per_sm, sms = _fp32_plan(config, problem, device)
    params = make_params(problem, inputs, out, _scale_of(problem, inputs))
    query_ctas = problem.batch_heads * -(-problem.m // config.block_m)
    splits, tiles_per_split = fp32_split_plan(config, problem, sms, per_sm)
    params.splits, params.tiles_per_split = splits, tiles_per_split
    workspace = None
    if splits > 1:
        rows = query_ctas * splits * config.block_m  # a multiple of 32: the partial outputs stay 16-byte aligned

        def workspace(p, stream):  # the current stream's buffers (runtime.workspace), held until the launch
            data = stream_buffer("partials", device, stream, rows * (problem.head_dim + 1))
            arrivals = stream_buffer("arrivals", device, stream, query_ctas)
            p.arrivals = arrivals.data_ptr()
            p.partial_lse = data.data_ptr()
            p.partial_o = data.data_ptr() + rows * 4
            return data, arrivals

    packed = nvrtc.PackedLaunch(kernel, (query_ctas * splits, 1, 1), (config.threads, 1, 1), (params,),
                                shared_mem=smem)
    return AttentionLaunch(packed, params, problem.d, device, workspace, writes_lse=problem.lse)


FP32_SPEC = attention_spec(
    variant="fused_fp32",
    dtypes=(torch.float32,),
    config_cls=Fp32Config,
    default_config=fp32_default_config,
    candidates=fp32_candidates,
    why_unsupported=fp32_why_unsupported,
    name_expression=fp32_name_expression,
    launch=launch_with(fp32_prepare),
    prepare=fp32_prepare,
    standard_problems=fp32_standard_problems,
    description="fused FP32 attention, online softmax, register-tiled FFMA, in-kernel key-split merge",
    baseline_name="torch SDPA (efficient, fp32, TF32 off)",
    bound="fp32",
    sweep_axes=(("block_m", "block_n"), ("rows_per_thread",)),
)
