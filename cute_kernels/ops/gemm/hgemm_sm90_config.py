"""HgemmSm90Config: every compile-time knob of the Hopper (TMA + WGMMA) FP16/BF16 GEMM, validated in one place.

A config describes the CTA tile (tile_m x tile_n x tile_k), the depth of the TMA -> WGMMA shared-memory
pipeline, how many consumer warpgroups split the tile along M, the thread-block cluster (and so TMA
multicast), and the order in which the persistent CTAs walk the output tiles. Problem-dependent validity
(alignment for TMA, the device's arch and shared-memory budget) lives in ``hgemm_sm90.why_unsupported``;
what is checked here holds for every problem.
"""

from __future__ import annotations

import dataclasses

from ...runtime.config_fields import check_choice, check_fields, check_range
from .split_k import SPLIT_FLAG_BYTES, SPLIT_K_CHOICES

__all__ = [
    "HgemmSm90Config",
    "WGMMA_M",
    "EPI_TILE_N",
    "EPI_STAGES",
    "PRODUCER_REGISTERS",
]

# One warpgroup's wgmma covers 64 rows of the tile (m64nNk16); N is the whole tile width.
WGMMA_M = 64
WARPGROUP_THREADS = 128
ELEMENT_BYTES = 2  # fp16 and bf16

# The epilogue moves the accumulators out in (64 * consumer_warpgroups) x epi_n sub-tiles through a ring of
# epi_stages shared-memory buffers, each stored by TMA while the next one is filled: by default 32 columns
# and 2 buffers (the config fields' defaults).
EPI_TILE_N = 32
EPI_STAGES = 2

# Registers per thread after setmaxnreg: the producer warpgroup only issues TMA and walks the tile order, so
# it gives most of its registers to the consumers, which hold the FP32 accumulators (up to 128 per thread)
# and the epilogue. One CTA per SM: 128 * 40 + 256 * 232 = 64512 of the SM's 65536 with two consumer
# warpgroups. Two CTAs per SM (one consumer warpgroup each) launch at 65536 / 512 = 128 registers a thread
# and move the producer's surplus to the consumer: 128 * 40 + 128 * 216 = 32768, half the file.
PRODUCER_REGISTERS = 40
_CONSUMER_REGISTERS = {(1, 1): 240, (2, 1): 232, (1, 2): 216}

# ptxas judges each wgmma against the launch's register count, not setmaxnreg's: at two CTAs per SM (128 a
# thread) an m64n256k16, whose 128 accumulators alone fill it, is refused; m64n128k16 compiles without spills.
_MAX_TILE_N_TWO_CTAS = 128

# Accumulators per consumer thread past which ptxas spills under the consumer register cap.
_MAX_ACCUMULATORS_PER_THREAD = 128
# Split-K's last slice sums the planes through a plane-sized fragment beside the accumulators: at most this
# many accumulators per thread (a 64x128 tile on one consumer), so that both fit under the cap.
SPLIT_MAX_ACCUMULATORS = 64

# Bytes of shared memory beyond the operand and epilogue buffers: the mbarriers, and alignment padding of
# the three 1024-byte-aligned buffers (the 128-byte swizzle repeats every 1024 bytes).
_SMEM_OVERHEAD = 3 * 1024


@dataclasses.dataclass(frozen=True)
class HgemmSm90Config:
    """Compile-time knobs of one Hopper HGEMM binary.

    - ``tile_m, tile_n, tile_k``: the CTA tile; one CTA computes tile_m x tile_n blocks of D (several, one
      after the other: the kernel is persistent) and walks K in steps of tile_k.
    - ``num_stages``: shared-memory stages of the TMA -> WGMMA pipeline (each holds one k-tile of A and B).
    - ``consumer_warpgroups``: warpgroups issuing wgmma (1 or 2); they split the tile along M, each
      owning tile_m / consumer_warpgroups rows. One more warpgroup produces (issues TMA).
    - ``cluster_m, cluster_n``: the thread-block cluster. CTAs of a cluster that share a B tile (same
      tile column, cluster_m = 2) or an A tile (same tile row, cluster_n = 2) each load half of it and
      multicast it to both, halving that operand's L2 -> SM traffic.
    - ``raster``: the persistent tile order walks bands of ``raster`` cluster-tile rows column by column,
      so the tiles in flight at once share A and B tiles in L2 (1 = plain row-major order).
    - ``split_k``: each tile's K walk is cut into up to ``split_k`` slices of whole k-tiles, each a unit of
      the persistent walk; a slice writes its FP32 partial tile to a workspace plane, and the slice that
      arrives last sums the planes in slice order (the same bits whichever finishes last) and runs the
      epilogue. For problems whose tiles leave SMs idle while K is long. 1: no split.
    - ``epi_n``, ``epi_stages``: the epilogue's sub-tile width (32 or 64 columns: 64- or 128-byte rows) and
      how many sub-tile buffers its TMA stores rotate through (1 for a tile of one sub-tile, 2, 4 or 8; 8
      holds a whole 128x256 tile in 32-column sub-tiles, so each wait is for a store issued a tile's worth
      of sub-tiles before): wider and
      deeper let more of D's stores be in flight while the consumers fill the next buffer, for problems whose
      run time is mostly the epilogue (short K), at the price of shared memory the main loop's stages could
      use.
    - ``ctas_per_sm``: 1, or 2 CTAs resident on each SM (one consumer warpgroup each, tiles of at most 128
      columns, at most 113 KB of shared memory and 216 consumer registers a thread; the persistent grid is
      twice as large). The
      hardware then interleaves two independent pipelines: one CTA's epilogue (its stores of D) runs
      while the other's wgmmas do, where a lone CTA does one after the other. For problems whose time is
      mostly the epilogue (a short K: two k-tiles per tile at K = 128).
    - ``transposed``: the binary takes a call's A (M, K), B (K, N) and C/D (M, N) as they lie and runs the
      product of their transposes, D^T = B^T A^T, so its tiles run over N x M (``GemmProblem.transposed``:
      the problem the kernel sees). For decode-sized M with a column-major B (``x @ w.t()``): the weight
      fills the tiles' rows and the few rows of x their columns, with no per-call views or copies. One
      product (no batch).
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    num_stages: int = 4
    consumer_warpgroups: int = 2
    cluster_m: int = 1
    cluster_n: int = 1
    raster: int = 8
    split_k: int = 1
    epi_n: int = EPI_TILE_N
    epi_stages: int = EPI_STAGES
    ctas_per_sm: int = 1
    # Named in tables and sweep keys only where set: the configs measured before it keep their names.
    transposed: bool = dataclasses.field(default=False, metadata={"described": "unless default"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_choice(self, "tile_m", (64, 128, 192, 256))
        # A 128-byte swizzle atom spans 64 16-bit elements of the contiguous mode (K for A, N for B): tile_n
        # and tile_k are whole atoms, or tile_n is 32 (an N-major B tile in 64-byte atoms, for skinny N).
        check_choice(self, "tile_n", (32, 64, 128, 192, 256),
                     "one of 32, 64, 128, 192, 256 (whole 128-byte swizzle atoms or one 64-byte one, wgmma N <= 256)")
        check_choice(self, "tile_k", (64, 128), "64 or 128 (whole 128-byte swizzle atoms of A)")
        check_range(self, "num_stages", 2, 16)  # shared memory decides (why_unsupported); 12 fit at 64x64
        check_choice(self, "consumer_warpgroups", (1, 2), "1 or 2")
        for field in ("cluster_m", "cluster_n"):
            check_choice(self, field, (1, 2), "1 or 2")
        if self.cluster_m * self.cluster_n > 2:
            raise ValueError(
                f"HgemmSm90Config: clusters of at most 2 CTAs (2x1 or 1x2), got {self.cluster_m}x{self.cluster_n}"
            )
        check_range(self, "raster", 1, 64)
        check_choice(self, "split_k", SPLIT_K_CHOICES)
        check_choice(self, "epi_n", (32, 64), "32 or 64 (64- or 128-byte swizzled rows of D)")
        check_choice(self, "epi_stages", (1, 2, 4, 8), "1, 2, 4 or 8")
        check_choice(self, "ctas_per_sm", (1, 2), "1 or 2")
        if self.ctas_per_sm > 1 and self.consumer_warpgroups > 1:
            raise ValueError(
                f"HgemmSm90Config: {self.ctas_per_sm} CTAs per SM run one consumer warpgroup each (two would have "
                f"about 100 registers a thread for their accumulators and the epilogue), got "
                f"consumer_warpgroups={self.consumer_warpgroups}"
            )
        if self.ctas_per_sm > 1 and self.tile_n > _MAX_TILE_N_TWO_CTAS:
            raise ValueError(
                f"HgemmSm90Config: {self.ctas_per_sm} CTAs per SM launch at 128 registers a thread, and ptxas "
                f"refuses a wgmma of more than {_MAX_TILE_N_TWO_CTAS} columns there (its accumulators alone "
                f"take tile_n / 2); got tile_n={self.tile_n}"
            )
        why_not = self.why_split_k_cannot_run() if self.split_k > 1 else None
        if why_not is not None:
            raise ValueError(f"HgemmSm90Config: {why_not}, got split_k={self.split_k} on {self.short()}")
        if self.tile_m % self.epi_tile_m:
            raise ValueError(
                f"HgemmSm90Config: tile_m must be a multiple of {WGMMA_M} * consumer_warpgroups = "
                f"{self.epi_tile_m}, got tile_m={self.tile_m}"
            )
        if self.accumulators_per_thread() > _MAX_ACCUMULATORS_PER_THREAD:
            raise ValueError(
                f"HgemmSm90Config: a {self.tile_m}x{self.tile_n} tile on {self.consumer_warpgroups} consumer "
                f"warpgroup(s) is {self.accumulators_per_thread()} FP32 accumulators per thread, more than the "
                f"{_MAX_ACCUMULATORS_PER_THREAD} that fit beside the epilogue in "
                f"{self.consumer_registers()} registers; use 2 consumer warpgroups or a smaller tile"
            )
        if self.tile_n % self.epi_n:
            raise ValueError(
                f"HgemmSm90Config: epi_n must divide tile_n (a {self.tile_n}-column tile in {self.epi_n}-column "
                f"epilogue sub-tiles), got epi_n={self.epi_n}"
            )
        if self.epi_subtiles % self.epi_stages:
            raise ValueError(
                f"HgemmSm90Config: the tile has {self.epi_subtiles} epilogue sub-tiles of {self.epi_n} columns, "
                f"not a whole multiple of the {self.epi_stages} epilogue buffers (a tile of one sub-tile takes "
                f"epi_stages=1)"
            )

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_threads(self) -> int:
        """Threads per CTA: one producer warpgroup plus the consumers."""
        return WARPGROUP_THREADS * (1 + self.consumer_warpgroups)

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def epi_tile_m(self) -> int:
        """Rows of an epilogue sub-tile: one 64-row wgmma block of every consumer warpgroup."""
        return WGMMA_M * self.consumer_warpgroups

    @property
    def epi_subtiles(self) -> int:
        return (self.tile_m // self.epi_tile_m) * (self.tile_n // self.epi_n)

    def consumer_registers(self) -> int:
        """Registers a consumer thread holds after setmaxnreg."""
        return _CONSUMER_REGISTERS[(self.consumer_warpgroups, self.ctas_per_sm)]

    def accumulators_per_thread(self) -> int:
        return self.tile_m * self.tile_n // (WARPGROUP_THREADS * self.consumer_warpgroups)

    def why_split_k_cannot_run(self) -> "str | None":
        """Why this tile, cluster and consumer count cannot split K (None: they can): the one check behind
        the config's validation and the default's choice to split."""
        if self.consumer_warpgroups > 1:
            return ("split-K runs one consumer warpgroup only (the plane stores and the sum were built and "
                    "tested on one)")
        if self.accumulators_per_thread() > SPLIT_MAX_ACCUMULATORS:
            return (f"split-K holds at most {SPLIT_MAX_ACCUMULATORS} accumulators per thread (the sum of the "
                    f"planes keeps a plane-sized fragment beside them, under the register cap); a "
                    f"{self.tile_m}x{self.tile_n} tile holds {self.accumulators_per_thread()}")
        if self.cluster_size > 1:
            return ("split-K runs 1x1 clusters only (a cluster's tiles may overhang the matrix, and the arrival "
                    "counters are per tile)")
        return None

    def stage_bytes(self) -> int:
        """Bytes of one pipeline stage (one k-tile of A and of B): what TMA delivers per full barrier."""
        return ELEMENT_BYTES * self.tile_k * (self.tile_m + self.tile_n)

    def epilogue_bytes(self) -> int:
        return ELEMENT_BYTES * self.epi_stages * self.epi_tile_m * self.epi_n

    def smem_bytes(self) -> int:
        """Shared memory per CTA: the pipeline stages, the epilogue ring, barriers and alignment (and split-K's
        arrival flag)."""
        flag = SPLIT_FLAG_BYTES if self.split_k > 1 else 0
        return self.num_stages * self.stage_bytes() + self.epilogue_bytes() + _SMEM_OVERHEAD + flag

    def short(self) -> str:
        """Compact name for tables: 128x256x64_s4_wg2_c1x1_r8 (``_k4`` when split in 4, ``_e64x4`` for an
        epilogue other than 32 columns x 2 buffers, ``_o2`` for two CTAs per SM, ``_T`` transposed)."""
        epilogue = (self.epi_n, self.epi_stages) != (EPI_TILE_N, EPI_STAGES)
        return (
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}_s{self.num_stages}_wg{self.consumer_warpgroups}"
            f"_c{self.cluster_m}x{self.cluster_n}_r{self.raster}" + (f"_k{self.split_k}" if self.split_k > 1 else "")
            + (f"_e{self.epi_n}x{self.epi_stages}" if epilogue else "")
            + (f"_o{self.ctas_per_sm}" if self.ctas_per_sm > 1 else "") + ("_T" if self.transposed else "")
        )
