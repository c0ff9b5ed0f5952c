"""The Hopper variant of ``hgemm`` (registry entry ``hgemm/sm90_wgmma``): TMA + wgmma, warp-specialised,
persistent.

Same contract as the sm80-style variant (``hgemm.hgemm`` is the public op for both): ``a`` (M,K) and ``b``
(K,N) row-major float16/bfloat16, FP32 accumulation, ``alpha * a @ b + beta * c`` rounded once, ``c`` read
only when beta != 0, ``out=c`` in place, any M, N, K >= 1. What it needs beyond that, checked by
``why_unsupported`` before anything is compiled: an sm_90 device (wgmma and setmaxnreg are sm_90a-only),
and operands TMA can describe -- 16-byte aligned base addresses and row strides for A, B, C and out (the
problem's alignments all 8 elements). ``hgemm`` prefers this variant and falls back to the sm80-style one
wherever it refuses. The kernel is :class:`~.hgemm_sm90_kernel.HgemmSm90Kernel`; this module holds the
sweep space, the validity predicate, the default heuristic, compile/launch and the registry entry.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ...registry import register
from ...runtime import device as _device
from ...runtime.cute_compile import CompileCache
from .compile import CompiledLaunch, compile_cached, compile_kernel, gemm_launch
from .compile import compile_key as gemm_compile_key
from .hgemm_sm90_config import HgemmSm90Config
from .ladder import batch_split_problem, choose_from_ladder, smem_problem
from .problem import UNIT_INDEX_LIMIT, GemmProblem, index_problem
from .spec import HGEMM_DTYPE_NAMES, hgemm_spec
from .split_k import MIN_K_TILES_PER_SLICE, SPLIT_K_CHOICES, split_k_for, tile_count

__all__ = ["candidates", "default_config", "kernel_tiles", "leaves_sms_idle", "takes_narrow_columns", "why_unsupported",
           "compile", "compile_key", "prepare", "SPEC"]

# TMA's rule: global base addresses and every stride but the unit one multiples of 16 bytes = 8 elements.
_TMA_ALIGN_ELEMS = 8
_VECTORS = (_TMA_ALIGN_ELEMS,) * 3


# ---------------------------------------------------------------------------------------------- configs
# (tile_m, tile_n, consumer warpgroups) of the sweep; every one keeps <= 128 accumulators per thread.
_TILES = (
    (128, 256, 2),
    (256, 128, 2),
    (128, 192, 2),
    (128, 128, 2),
    (128, 128, 1),
    (64, 256, 1),
    (128, 64, 1),
    (64, 128, 1),
    (64, 64, 1),
)


# Skinny N (16-32 columns against thousands of rows, memory-bound on A): 32-column tiles, whose B stage is
# half a 64-column one's bytes (on a row-major B narrower than the tile the rest is TMA's zero fill), so the
# same shared memory holds a deeper ring of A: 16 stages in 203,776 bytes where 64x64 holds 12 in 207,872.
# One epilogue buffer (the tile is one sub-tile of 32 columns). On the H100 (fp16, same-run cuBLAS,
# docs/notes/gemm.md "32-column tiles for skinny N") 12 stages unsplit ran 8192x16x4096 0.99x against the
# sm80-style kernel's 0.82x, 4096x16x4096 0.90x against 64x64 split 2's 0.88x (bf16 0.91x against 0.87x),
# 8192x32x8192 1.00x against 0.98x; 16 stages unsplit 0.86-0.99x on the same shapes (split 2: below).
NARROW_COLUMNS = HgemmSm90Config(tile_m=64, tile_n=32, consumer_warpgroups=1, num_stages=12, epi_n=32,
                                 epi_stages=1)
NARROW_CANDIDATES = [dataclasses.replace(NARROW_COLUMNS, num_stages=num_stages, split_k=split)
                     for num_stages in (12, 16) for split in (1, 2)]
# Decode rows (up to DECODE_ROWS_MAX rows times a row-major weight) run transposed on those tiles: the weight
# is the 64-row operand (an M-major A, read as it lies), the rows are the 32 columns (a K-major B), and out^T
# is stored where out lies, so a tile computes at most 32 - M columns of zeros where a 64-row tile computes
# 64 - M rows. On the H100 (fp16, same-run cuBLAS, docs/notes/gemm.md "The transposed 32-column tiles for
# decode rows"), 16 stages unsplit: 32x4096x4096 0.95x against the sm80-style kernel's 0.88x, 24x5120x5120
# 0.94x against 0.87x, 20x6144x4096 1.01x against 0.96x (64x64 unsplit); 32x6144x4096 and 32x8192x4096 as
# 64x64 unsplit (1.00-1.02x); 16 and 8 rows as the sm80-style kernel (0.92-0.99x). Splits lost on every one.
DECODE_ROWS = dataclasses.replace(NARROW_COLUMNS, num_stages=16, transposed=True)
DECODE_ROWS_MAX = 32
# Where N is narrower than the 32-column tile (a B row shorter than the box) and the tiles fill a quarter to
# half of the SMs, they split K in two, so that the CTAs fill more than half and at most all of them; fewer
# tiles take the general rule (both in ``_split_for``). Their splits run 16 stages (``_split_stages``), the
# ring they were timed on. On the H100 (same-run cuBLAS) 4096x24x4096's 64 tiles ran 0.84-0.85x split 2
# against 0.77-0.80x unsplit, 4096x16x4096 0.89-0.90x against 0.86-0.91x (bf16 0.90x against 0.86-0.91x);
# but 2048x16x4096's 32 tiles 0.83x split 2 against 0.89-0.90x unsplit, and 8192x16x4096's 128 stay whole
# (0.98-0.99x); 1024x16x8192's 16 tiles over 128 k-tiles ran 0.86x split 4 against 0.59x unsplit.
# One row of tiles (33-64 rows) against at most ONE_TILE_ROW_MAX_N columns: 32-column tiles, twice the CTAs
# of 64x64 tiles, each streaming half as much of B. On the H100 (same-run cuBLAS, 16 stages unsplit)
# 64x1024x4096 ran 1.01-1.02x against 64x64's 0.96-0.97x (bf16 0.96-0.97x against 0.92x), 64x2048x4096
# 0.98x against 0.92x; 48x4096x4096 (64 tiles of 64x64) ran 0.95x against 0.98x, so wider outputs keep 64x64.
ONE_TILE_ROW = dataclasses.replace(NARROW_COLUMNS, num_stages=16)
ONE_TILE_ROW_MAX_N = 2048


def _takes_decode_rows(problem: GemmProblem) -> bool:
    return problem.batch == 1 and problem.m <= DECODE_ROWS_MAX and problem.b_major == "n"


def takes_narrow_columns(problem: GemmProblem) -> bool:
    """Skinny N: 32 or fewer columns of a row-major B against more rows, unbatched (``NARROW_COLUMNS``)."""
    return problem.batch == 1 and problem.n <= NARROW_COLUMNS.tile_n < problem.m and problem.b_major == "n"


def _takes_one_tile_row(problem: GemmProblem) -> bool:
    return (problem.batch == 1 and DECODE_ROWS_MAX < problem.m <= ONE_TILE_ROW.tile_m
            and NARROW_COLUMNS.tile_n < problem.n <= ONE_TILE_ROW_MAX_N and problem.b_major == "n")


def kernel_tiles(config: HgemmSm90Config, problem: GemmProblem) -> int:
    """The CTA tiles ``config`` runs for a call of ``problem`` (over N x M for a transposed config)."""
    return tile_count(config, _kernel_problem(config, problem))


def candidates() -> list[HgemmSm90Config]:
    """The sweep space: each tile of ``_TILES`` at tile_k 64 with 2..7 stages (``why_unsupported`` drops
    those past the shared-memory budget) and the one-consumer 64-row tiles up to 12; on the big tiles,
    2-CTA clusters with multicast (2x1: B shared, 1x2: A shared), tile_k 128, other tile orders (raster 1,
    4, 16) and epilogues of 64 columns or 4 buffers; two CTAs per SM on the one-consumer tiles; 2-CTA
    clusters on the one-consumer 64x64 and 64x128 tiles (skinny problems); split-K (2, 4, 8) on those
    tiles, 64x64 also at 10 and 12 stages; and 32-column tiles for skinny N (``NARROW_CANDIDATES``)."""
    out = []
    for tile_m, tile_n, warpgroups in _TILES:
        for num_stages in range(2, 8):
            out.append(HgemmSm90Config(tile_m=tile_m, tile_n=tile_n, num_stages=num_stages,
                                       consumer_warpgroups=warpgroups))
    # Deeper rings on the one-consumer 64-row tiles, whose memory-bound skinny shapes gained with every stage
    # up to the seventh on the H200 (docs/notes/gemm.md, "The H200 sweep of the weak zoo shapes").
    out += [HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=num_stages)
            for num_stages in (8, 10, 12)]
    out.append(HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=8))
    for big in (HgemmSm90Config(), HgemmSm90Config(tile_m=256, tile_n=128)):
        for cluster_m, cluster_n in ((2, 1), (1, 2)):
            for num_stages in (3, 4):
                out.append(dataclasses.replace(big, cluster_m=cluster_m, cluster_n=cluster_n, num_stages=num_stages))
        out.append(dataclasses.replace(big, tile_k=128, num_stages=2))
        out += [dataclasses.replace(big, raster=r) for r in (1, 4, 16)]
    # Wider and deeper epilogues on the big tiles (the epilogue is most of a short-K problem's time), 3 and 4
    # stages (why_unsupported drops what no longer fits).
    for big in (HgemmSm90Config(cluster_m=2), HgemmSm90Config(tile_m=256, tile_n=128)):
        for epi_n, epi_stages in ((64, 2), (32, 4), (64, 4), (32, 8)):
            out += [dataclasses.replace(big, epi_n=epi_n, epi_stages=epi_stages, num_stages=num_stages)
                    for num_stages in (3, 4)]
    # Two CTAs per SM on the one-consumer tiles: one CTA's epilogue beside the other's wgmmas, for short K
    # (why_unsupported drops the stage counts past the 113 KB each may have).
    for tile_m, tile_n in ((128, 128), (64, 128), (128, 64)):
        out += [HgemmSm90Config(tile_m=tile_m, tile_n=tile_n, consumer_warpgroups=1, num_stages=num_stages,
                                ctas_per_sm=2) for num_stages in (2, 3, 4)]
    out += [HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=2, epi_n=epi_n,
                            epi_stages=epi_stages, ctas_per_sm=2) for epi_n, epi_stages in ((64, 2), (32, 4))]
    # Skinny problems (a side of 64-128 against long ones, memory-bound): the one-consumer 64-row tiles in
    # 2-CTA clusters, where every CTA reads the same short-side operand from L2 (all of A at M = 64; B twice
    # at M = 128 on 64-row tiles): 1x2 multicasts A to two tile columns, 2x1 B to two tile rows, halving
    # that operand's L2 reads.
    for tile_n in (64, 128):
        for cluster_m, cluster_n in ((2, 1), (1, 2)):
            out += [HgemmSm90Config(tile_m=64, tile_n=tile_n, consumer_warpgroups=1, num_stages=num_stages,
                                    cluster_m=cluster_m, cluster_n=cluster_n) for num_stages in (6, 7)]
    # Split-K for the problems whose tiles leave SMs idle: the one-consumer rungs of up to 64 accumulators
    # per thread, split 2, 4 and 8.
    for tile_m, tile_n, num_stages in ((64, 64, 6), (64, 128, 6)):
        out += [HgemmSm90Config(tile_m=tile_m, tile_n=tile_n, consumer_warpgroups=1, num_stages=num_stages,
                                split_k=split) for split in SPLIT_K_CHOICES[1:4]]
    # The deeper rings under the splits that won the skinny shapes (2 and 4 on 64x64): a slice's CTA streams
    # as memory-bound a walk as an unsplit one (12 is the ladder's rung, which its splits keep).
    out += [HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=num_stages, split_k=split)
            for num_stages in (10, 12) for split in (2, 4)]
    out += NARROW_CANDIDATES
    return out


# The default ladder, largest tile first: (config, CTAs one SM holds, relative throughput of a full SM).
# From the H200 probes (scripts/probes/hgemm_sm90_probe.py and gemm_configs.py, same-run cuBLAS, fp16):
# - 128x256x64, 4 stages, two consumer warpgroups, 2x1 clusters sharing B by multicast: 0.99-1.02x at
#   4096^3 and 8192^3 and 0.98x at 2048^3 (1x1 clusters: 0.97x); the stage x tile sweep's winners at 4096^3
#   and 8192^3 are within noise of it.
# - 128x192, the same otherwise: 384 tiles at 3072^3 fill 2.9 waves of 132 SMs where 128x256's 288 fill
#   2.2; there it ran 0.97x cuBLAS against 128x256's 0.76x, i.e. 0.96 of 128x256's rate per tile area.
# - Where big tiles leave SMs idle the small ones win: 64x128 with one consumer warpgroup and 6 stages ran
#   0.96x at 1024^3 (128x256: 0.53x), 0.95x at 768^3 and 0.77x at 1000^3 (the sm80-style kernel: 0.66x,
#   0.55x); 64x64, the same otherwise, 1.01x at 512^3, 0.93x at 128x4096x4096, 0.90x at 4096x128x4096 and
#   0.83x at 64x4096x4096 (64x128: 0.95x, 0.86x, 0.78x, 0.72x). Their throughputs below are their rates
#   at those shapes relative to 128x256's.
# - The small rungs run deep rings: the skinny shapes they serve are bytes in flight. In the H200 zoo sweep
#   7 stages beat 6 unsplit on every one, the deepest it timed; on the H100 (docs/notes/gemm.md, "Where the
#   weak skinny shapes' time goes") 64x64 at 12 stages (208 KB) ran 64x4096x4096 1.02x against 0.94x at 7,
#   4096x128x4096 0.95x against 0.91x. 64x128 stays at 7: at 8, its deepest, 1000^3 ran the same.
_LADDER = (
    (HgemmSm90Config(cluster_m=2), 1, 1.0),
    (HgemmSm90Config(tile_n=192, cluster_m=2), 1, 0.96),
    (HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=4), 1, 0.75),
    (HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=7), 1, 0.55),
    (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=12), 1, 0.45),
)
# A split keeps its rung's ring. On the H100 (fp16, same-run cuBLAS) 12 stages beat 6 under every split
# timed: 4096x16x4096 split 2 0.87x against 0.84x, split 4 at 1x1024x4096 0.82x against 0.78x, 32x6144x4096
# 0.71x against 0.68x, 8x5120x5120 0.66x against 0.62x; and split 8 lost to split 4 on every shape it ran
# (64x1024x4096 0.80x against 0.92x, 128x1024x4096 0.57x against 0.89x, 32x6144x4096 0.39x against 0.68x).
# Those splits ran more CTAs than SMs; under the limits below (slices of 32 k-tiles or more, CTAs for half
# the SMs) 8 and 16 slices come only to one to four tiles over a long K, where they pay (H100, same-run
# cuBLAS): 64x64x32768 0.69x split 16 and 0.67x split 8 against 0.51x split 4, 128x64x16384 0.72x split 8
# against 0.68x; 64x256x8192 stays at 4 (0.85x, as split 8). cuBLAS runs all of these in ~10 us:
# they are still the variant's weakest shapes.
_MAX_SPLIT = 16
_NARROW_B_MAX_SPLIT = 4
# On the 12-stage ring an unsplit CTA streams its K walk fast enough that a split pays only where the tiles
# leave most SMs idle over a long K. On the H100 (fp16, same-run cuBLAS, docs/notes/gemm.md "When a split
# pays on the deep ring"): 64 tiles ran unsplit 1.01x at 4096x64x4096 and 0.95x at 48x4096x4096 against 0.92x
# and 0.87x split 2; 32 tiles 0.99x at 128x1024x4096 and 0.92x at 64x2048x4096 against 0.93x and 0.90x split
# 2; but 16 tiles over 128 k-tiles (1024x64x8192) ran 0.96x split 4 against 0.74x unsplit. 16 over 64
# (64x1024x4096) tie: split 2 0.92-1.01x against unsplit 0.93-1.00x over four calls (its tuned entry runs
# unsplit). So K splits where the tiles fill at most an eighth of the SMs, into slices of at least 32
# k-tiles, while the CTAs fill at most half of them. (The H200 chose its splits on the 6-stage ring; the
# 12-stage one was timed on the H100 alone.)
# A row-major B narrower than the tile is the exception: each box row of B is a part of a 128-byte line, and
# its CTAs stream slower (4096x16x4096 ran 21.7 us unsplit against 4096x64x4096's 18.0), so they keep the
# earlier rule, a split while the CTAs fit one wave, in at most 4 slices: 4096x16x4096 ran 0.87x split 2
# against 0.83x unsplit (bf16 0.87x against 0.81x), bf16 4096x48x4096 0.89x against 0.84x.
# The 32-column tiles over N < 32 split by their own rule (above NARROW_COLUMNS).
_SPLIT_MAX_TILES = _device.H200_SM_COUNT // 8
_SPLIT_TARGET_CTAS = _device.H200_SM_COUNT // 2
_SPLIT_MIN_K_TILES = 32


def _split_for(config: HgemmSm90Config, problem: GemmProblem) -> int:
    """The heuristic's split of ``config``'s K walk for ``problem`` (the rules above)."""
    sms, tiles = _device.H200_SM_COUNT, tile_count(config, problem)
    if problem.b_major == "n" and problem.n < config.tile_n:
        if config.tile_n > NARROW_COLUMNS.tile_n:
            return split_k_for(config, problem, sms, max_split=_NARROW_B_MAX_SPLIT)
        if sms // 2 < 2 * tiles <= sms and -(-problem.k // config.tile_k) >= 2 * MIN_K_TILES_PER_SLICE:
            return 2  # the 32-column tiles' halves (NARROW_COLUMNS)
    if tiles > _SPLIT_MAX_TILES:
        return 1
    return split_k_for(config, problem, _SPLIT_TARGET_CTAS, max_split=_MAX_SPLIT, min_k_tiles=_SPLIT_MIN_K_TILES)


def _split_stages(config: HgemmSm90Config, problem: GemmProblem) -> int:
    """A split keeps its rung's ring, but the 32-column tiles over a B narrower than themselves split on 16
    stages (the splits timed there, NARROW_COLUMNS)."""
    narrow_b = config == NARROW_COLUMNS and problem.n < config.tile_n
    return 16 if narrow_b else config.num_stages


def leaves_sms_idle(problem: GemmProblem) -> bool:
    """Whether the heuristic's tiles for ``problem`` (unbatched) fill at most half the SMs over a K of at least
    two slices' worth of k-tiles: the skinny problems whose time is the deep ring's stream, split or not
    (``hgemm``'s routing prefers this variant on them from 512^3 of work)."""
    config = default_config(problem)
    return (problem.batch == 1 and 2 * tile_count(config, problem) <= _device.H200_SM_COUNT
            and -(-problem.k // config.tile_k) >= 2 * MIN_K_TILES_PER_SLICE)


def default_config(problem: GemmProblem) -> HgemmSm90Config:
    """Decode rows (``DECODE_ROWS_MAX`` or fewer times a row-major weight, unbatched) take ``DECODE_ROWS``
    (transposed 32-column tiles, unsplit). Otherwise skinny N (32 or fewer columns of a row-major B against
    more rows, unbatched) takes the 32-column tile ``NARROW_COLUMNS`` (split in two where N < 32 and the
    tiles fill a quarter to half of the SMs), one row of tiles against up to 2048 columns of a row-major B
    ``ONE_TILE_ROW`` (32-column tiles too), and the rest the ladder entry with the smallest estimated time
    for the problem's M x N (``ladder.estimated_time``:
    128x256 tiles when they fill the 132 SMs in whole waves, smaller ones when a big tile's last wave would
    leave most SMs idle); a rung that can split (``HgemmSm90Config.why_split_k_cannot_run``) whose tiles
    fill at most an eighth of the SMs splits K into slices of at least 32 k-tiles while the CTAs (tiles x
    slices) fill at most half of them, in at most 16 slices (``split_k.split_k_for``; a row-major B narrower
    than the tile splits while the CTAs fit one wave, in at most 4 slices), on the rung's ring; the 64x128
    rung pairs tile rows in 2x1 clusters where rows are not whole 128-byte lines (``_pairs_ragged_rows``).
    For a problem this variant cannot run at all (see ``why_unsupported``) it returns the first rung
    anyway, which ``supports()`` then refuses, so the op moves on to the next variant."""
    if _problem_unsupported(problem) is not None:
        return _LADDER[0][0]
    if _takes_decode_rows(problem) and why_unsupported(DECODE_ROWS, problem) is None:
        return DECODE_ROWS
    if _takes_one_tile_row(problem) and why_unsupported(ONE_TILE_ROW, problem) is None:
        config = ONE_TILE_ROW
    elif takes_narrow_columns(problem) and why_unsupported(NARROW_COLUMNS, problem) is None:
        config = NARROW_COLUMNS
    else:
        config = choose_from_ladder(_LADDER, problem, why_unsupported=why_unsupported, candidates=candidates,
                                    family="HGEMM (sm90)")
    if problem.batch == 1 and config.why_split_k_cannot_run() is None:
        split = _split_for(config, problem)
        if split > 1:
            split_config = dataclasses.replace(config, split_k=split, num_stages=_split_stages(config, problem))
            if why_unsupported(split_config, problem) is None:
                return split_config
    if _pairs_ragged_rows(config, problem):
        paired = dataclasses.replace(config, cluster_m=2)
        if why_unsupported(paired, problem) is None:
            return paired
    if _two_ctas_pay(problem):
        two = dataclasses.replace(config, tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3, cluster_m=1,
                                  cluster_n=1, ctas_per_sm=2)
        if why_unsupported(two, problem) is None:
            return two
    return config


# Rows that are not a whole number of 128-byte lines (1000^3 fp16: 2000 bytes) make most TMA box rows straddle
# a line: under ncu on the H100, 1000^3 read 1.7x the L2 sectors of 1024^3 on the 64x128 rung. A 2x1 cluster
# multicasts each B box (the rung's larger one) to both tile rows, halving B's reads; cuBLAS runs 1000^3 so.
# H100, same-run cuBLAS: 1000^3 0.82x -> 1.03x fp16, 0.81x -> 1.01x bf16 (1x2, sharing A: 0.92x). Aligned
# rows were not timed paired, so they keep 1x1; and it takes two tile rows, or the pair's second CTA idles.
_LINE_ELEMS = 64  # 16-bit elements in a 128-byte line


def _pairs_ragged_rows(config: HgemmSm90Config, problem: GemmProblem) -> bool:
    a_row = problem.k if problem.a_major == "k" else problem.m
    b_row = problem.n if problem.b_major == "n" else problem.k
    on_the_rung = (config.tile_m, config.tile_n, config.consumer_warpgroups, config.cluster_size, config.split_k,
                   config.ctas_per_sm) == (64, 128, 1, 1, 1, 1)
    return on_the_rung and problem.m > config.tile_m and bool(a_row % _LINE_ELEMS or b_row % _LINE_ELEMS)


# Batches of short-K products are their output's stores: with a K of two 64-deep k-tiles a tile's epilogue
# takes as long as its wgmmas, and two CTAs per SM run one's stores beside the other's products. On the H200
# (fp16, same-run torch.bmm, docs/notes/gemm.md "Two CTAs per SM"): 16x2048x2048x128 54.2 -> 49.3 us,
# 8x4096x4096x128 105.1 -> 101.1; 32x256x256x256 (K 256, 512 tiles) gained nothing. From four waves of
# 128 x 128 tiles on the two-CTA grid (264 CTAs) up.
_TWO_CTAS_MAX_K = 128
_TWO_CTAS_MIN_TILES = 4 * 2 * _device.H200_SM_COUNT


def _two_ctas_pay(problem: GemmProblem) -> bool:
    tiles = problem.batch * -(-problem.m // 128) * -(-problem.n // 128)
    return problem.batch > 1 and problem.k <= _TWO_CTAS_MAX_K and tiles >= _TWO_CTAS_MIN_TILES


def _problem_unsupported(problem: GemmProblem) -> "str | None":
    """Why no config of this variant can run ``problem`` (None: some can)."""
    if problem.dtype not in HGEMM_DTYPE_NAMES:
        return f"hgemm computes float16/bfloat16 only, problem dtype is {problem.dtype}"
    if problem.sm // 10 != 9:
        return f"needs an sm_90 GPU (wgmma and setmaxnreg are sm_90a instructions), the device is sm_{problem.sm}"
    aligns = {"a": problem.a_align, "b": problem.b_align, "c/out": problem.c_align}
    short = [name for name, align in aligns.items() if align != _TMA_ALIGN_ELEMS]
    if short:
        return (f"TMA needs 16-byte aligned base addresses, row strides and row lengths (multiples of 8 elements); "
                f"{', '.join(short)} {'is' if len(short) == 1 else 'are'} not (alignments {aligns})")
    return None


def _kernel_problem(config: HgemmSm90Config, problem: GemmProblem) -> GemmProblem:
    """The product the kernel computes for a call of ``problem``: its transpose for a transposed config."""
    return problem.transposed() if config.transposed else problem


def why_unsupported(config: HgemmSm90Config, problem: GemmProblem) -> "str | None":
    """The one validity predicate (None = supported), checked before anything is compiled. Tile shapes and
    registers are checked by ``HgemmSm90Config`` itself (they do not depend on the problem)."""
    if not isinstance(config, HgemmSm90Config):
        return f"config must be an HgemmSm90Config, got {type(config).__name__}"
    if config.transposed:  # the kernel runs the transposed product: that problem is what it must support
        if problem.batch > 1:
            return "a transposed config runs one product (no batch)"
        config, problem = dataclasses.replace(config, transposed=False), _kernel_problem(config, problem)
    why = _problem_unsupported(problem)
    if why is not None:
        return why
    budget = _device.sm90_shared_per_cta_bytes(config.ctas_per_sm)
    return (smem_problem(config.smem_bytes(), budget) or batch_split_problem(config, problem)
            or index_problem(config, problem) or _units_problem(config, problem))


def _units_problem(config: HgemmSm90Config, problem: GemmProblem) -> "str | None":
    """Why split-K cannot run ``problem`` (None: it can): the persistent walk counts tiles x slices in 32 bits
    (``index_problem`` checks the tiles alone, as the cp.async kernels' grid.y holds their slices), and the
    FP32 workspace's rows, N of the product the kernel runs, are whole C/D vectors (a column-major result's
    N is not bounded by its alignment, which measures M)."""
    if config.split_k == 1:
        return None
    if problem.n % _TMA_ALIGN_ELEMS:
        return (f"split-K's FP32 workspace rows are N = {problem.n} of the product the kernel runs, not a multiple "
                f"of {_TMA_ALIGN_ELEMS}")
    tiles = tile_count(config, problem)
    if tiles * config.split_k > UNIT_INDEX_LIMIT:
        return f"{tiles} tiles x {config.split_k} split-K slices do not fit the kernel's 32-bit unit index"
    return None


# ---------------------------------------------------------------------------------------------- compile
# Kept on disk too, keyed by the sources of this package (the kernels and the code that shapes them).
_CACHE = CompileCache("hgemm_sm90", Path(__file__).parent)


def compile_key(config: HgemmSm90Config, problem: GemmProblem, arch: str) -> tuple:
    """Every compile-time property, nothing dynamic: sizes, leading dimensions and the persistent grid size
    are runtime values; the alignment is always TMA's."""
    return gemm_compile_key("hgemm_sm90", config, problem, _VECTORS, arch)


def compile(config: HgemmSm90Config, problem: GemmProblem, arch: str | None = None):  # noqa: A001
    """Compile (or fetch from the cache) the binary for ``config`` and the problem's compile-time traits;
    works without a GPU (fake tensors, explicit ``arch``, default ``CUTE_DSL_ARCH`` or the current device)."""
    return compile_cached(_CACHE, config, problem, arch, why_unsupported=why_unsupported, key=compile_key,
                          build=_build)


def _build(config: HgemmSm90Config, problem: GemmProblem, arch: str, extra_options: str = ""):
    """Compile without the cache (``extra_options``: more ``cute.compile`` options, e.g. to keep the PTX)."""
    import cutlass

    from .hgemm_sm90_kernel import DTYPES as CUTE_DTYPES
    from .hgemm_sm90_kernel import HgemmSm90Kernel

    runs = _kernel_problem(config, problem)
    kernel = HgemmSm90Kernel(config, dtype=problem.dtype, beta_zero=problem.beta_zero, a_major=runs.a_major,
                             b_major=runs.b_major, batched=problem.batch > 1, d_major=runs.d_major)
    return compile_kernel(kernel, CUTE_DTYPES[problem.dtype], _VECTORS, arch, problem,
                          extra_args=(cutlass.Int32(1),),  # max_clusters: a runtime value
                          extra_options=extra_options, split=config.split_k > 1, transposed=config.transposed)


def max_clusters(config: HgemmSm90Config, device) -> int:
    """Persistent clusters to launch at most: as many CTAs as the SMs hold at once (``ctas_per_sm`` each:
    the config's shared memory and registers are sized for that), so SMs * ctas_per_sm // cluster size. (A
    GPC whose SM count is odd could hold one 2-CTA cluster fewer; the surplus cluster then waits for a free
    pair, which costs time, not correctness.)"""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, _device.sm_count(index) * config.ctas_per_sm // config.cluster_size)


def prepare(config: HgemmSm90Config, problem: GemmProblem, inputs: dict, out) -> CompiledLaunch:
    """The compiled launch of ``config`` for ``problem`` on ``out``'s device (compiled on first use), with
    the persistent grid's cluster count for that device; the caller validates the tensors it is given
    against ``problem`` (see ``compile.CompiledLaunch``)."""
    compiled = compile(config, problem, _device.arch(out.device.index, arch_specific=True))
    # Split-K's workspace is sized by the product the kernel computes.
    return gemm_launch(compiled, config, _kernel_problem(config, problem), out.device.index,
                       (max_clusters(config, out.device),))


# ---------------------------------------------------------------------------------------------- registry
SPEC = register(
    hgemm_spec(
        variant="sm90_wgmma",
        config_cls=HgemmSm90Config,
        default_config=default_config,
        candidates=candidates,
        why_unsupported=why_unsupported,
        compile=compile,
        prepare=prepare,
        arch_specific=True,
        column_major_result=True,
        description="FP16/BF16 Hopper GEMM: TMA (128-byte swizzle, optional cluster multicast) into a "
                    "warp-specialised mbarrier pipeline, wgmma (FP32 accumulate), persistent banded tile "
                    "order, stmatrix + TMA-store epilogue",
        sweep_axes=(("tile_m", "tile_n", "consumer_warpgroups"), ("num_stages",)),
    )
)
