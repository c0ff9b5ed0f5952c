"""GemmConfig: every compile-time knob of the SIMT GEMM family, validated in one place.

A config describes the CTA tile (tile_m x tile_n x tile_k), the cp.async pipeline depth, the thread grid
that owns the C tile (threads_m x threads_n, each thread a (tile_m/threads_m) x (tile_n/threads_n) register
micro-tile made of 4x4 blocks), how A is kept in shared memory, and the CTA rasterization width.
Problem-dependent validity (alignment, the shared-memory budget of the target) lives in the kernel module's
``why_unsupported``; what is checked here holds for every problem.
"""

from __future__ import annotations

import dataclasses

from ...runtime.config_fields import check_choice, check_fields, check_range, field_error
from .split_k import SPLIT_FLAG_BYTES, SPLIT_K_CHOICES

__all__ = ["GemmConfig", "MICRO_VECTOR"]

# Each thread owns its micro-tile as 4x4 blocks: 4 consecutive rows (M) and 4 consecutive columns (N),
# so every shared-memory read of a fragment and every store of C is one 128-bit vector.
MICRO_VECTOR = 4

# Padding (in floats) of each K-row of an M-major A tile: keeps 16-byte alignment of every row (needed by
# the 128-bit fragment reads) and makes the transposing 4-byte cp.async writes of 8 K-rows x 4 M-columns
# land on 8*4 = 32 distinct banks (bank = (4*k + m) mod 32).
A_M_MAJOR_PAD = 4
# The same padding of each K-row of the N-major B stage when B is K-major in global memory (``w.t()``): its
# tile is transposed on the way in by 4-byte copies, 8 K-rows x 4 N-columns per warp on 32 distinct banks.
B_K_MAJOR_PAD = 4

# Consecutive K values one warp copies from each row of A when the tile is transposed to M-major: 8 floats =
# one 32-byte sector per row, 4 rows per warp (see SgemmKernel._tiled_copy_a).
A_M_MAJOR_K_RUN = 8


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Compile-time knobs of one SIMT SGEMM binary.

    - ``tile_m, tile_n, tile_k``: the CTA tile; one CTA computes a tile_m x tile_n block of C and walks K in
      steps of tile_k.
    - ``num_stages``: shared-memory buffers in the cp.async pipeline (2 = double buffering).
    - ``threads_m, threads_n``: the thread grid over the C tile (N fastest, so a warp spans N); the CTA has
      threads_m * threads_n threads.
    - ``a_smem_major``: "k" keeps A's tile K-major like global memory (16-byte cp.async when aligned,
      XOR-swizzled, fragments read 4 K-values at a time); "m" transposes it to M-major on the way in
      (4-byte cp.async, padded rows, fragments read 4 M-values at a time).
    - ``raster``: CTA rasterization width; consecutive CTAs walk a band of ``raster`` tile-rows
      column by column, so the B tiles they share stay in L2 (1 = plain row-major tile order).
    - ``warp_rows``: how a warp's 32 threads sit on the thread grid: ``warp_rows`` thread-rows (M) by
      ``32 / warp_rows`` thread-columns (N). 0 = the plain N-fastest order (a warp is 32/threads_n rows of
      whole thread-rows). A squarer warp (4 x 8) reads fewer distinct 16-byte chunks of B per fragment load
      (8 instead of 16: one shared-memory wavefront instead of two) for a few more of A (4 instead of 2).
    - ``split_k``: the K walk of each tile cut into up to ``split_k`` slices, one CTA each, for problems whose
      tiles leave most SMs idle while K is long; the last slice to finish sums the slices' FP32 partials
      in slice order (deterministic) and writes D (see the kernel's docstring). 1: no split.
    - ``min_ctas_per_sm``: occupancy hint (``.minnctapersm``); 2 makes ptxas fit a 256-thread CTA in 128
      registers so two CTAs share an SM (more warps to hide latency, at the risk of spills). 1 = no hint.
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 8
    num_stages: int = 3
    threads_m: int = 16
    threads_n: int = 16
    a_smem_major: str = "m"
    raster: int = 8
    min_ctas_per_sm: int = 1
    warp_rows: int = 0
    split_k: int = 1

    def __post_init__(self) -> None:
        check_fields(self)
        for field in ("tile_m", "tile_n"):
            check_choice(self, field, (32, 64, 128, 256))
        check_choice(self, "tile_k", (8, 16, 32))
        check_range(self, "num_stages", 2, 8)
        for field in ("threads_m", "threads_n"):
            check_choice(self, field, (2, 4, 8, 16, 32), "a power of two in 2..32")
        if self.threads_n < 4:
            raise field_error(self, "threads_n", "at least 4 (a warp may span at most 8 thread rows)")
        if self.num_threads % 32 or not 64 <= self.num_threads <= 1024:
            raise ValueError(
                f"GemmConfig: threads_m * threads_n must be a multiple of 32 in 64..1024, "
                f"got {self.threads_m} * {self.threads_n} = {self.num_threads}"
            )
        if self.tile_m % (MICRO_VECTOR * self.threads_m):
            raise ValueError(
                f"GemmConfig: tile_m must be a multiple of {MICRO_VECTOR} * threads_m = "
                f"{MICRO_VECTOR * self.threads_m}, got tile_m={self.tile_m}"
            )
        if self.tile_n % (MICRO_VECTOR * self.threads_n):
            raise ValueError(
                f"GemmConfig: tile_n must be a multiple of {MICRO_VECTOR} * threads_n = "
                f"{MICRO_VECTOR * self.threads_n}, got tile_n={self.tile_n}"
            )
        check_choice(self, "a_smem_major", ("k", "m"), "'k' or 'm'")
        check_range(self, "min_ctas_per_sm", 1, 4)
        check_range(self, "raster", 1, 64)
        check_choice(self, "warp_rows", (0, 1, 2, 4, 8), "0 (plain order), 1, 2, 4 or 8")
        check_choice(self, "split_k", SPLIT_K_CHOICES)
        if self.warp_rows and (self.threads_m % self.warp_rows or self.threads_n % (32 // self.warp_rows)):
            raise ValueError(
                f"GemmConfig: a warp of {self.warp_rows} x {32 // self.warp_rows} threads must tile the "
                f"{self.threads_m} x {self.threads_n} thread grid"
            )
        # The 16-byte copy layouts must tile A and B exactly; narrower copies are checked per problem.
        for why in (self.copy_layout_problem("a", 4), self.copy_layout_problem("b", 4)):
            if why is not None:
                raise ValueError(f"GemmConfig: {why}")
        if self.micro_m * self.micro_n > 128:
            raise ValueError(
                f"GemmConfig: a {self.micro_m}x{self.micro_n} register micro-tile per thread needs more than "
                f"the 255 registers a thread has; use more threads or a smaller tile"
            )

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_threads(self) -> int:
        return self.threads_m * self.threads_n

    @property
    def lanes_m(self) -> int:
        """Thread-rows (M) one warp spans; it spans 32 // lanes_m thread-columns (N)."""
        return self.warp_rows or max(1, 32 // self.threads_n)

    @property
    def micro_m(self) -> int:
        return self.tile_m // self.threads_m

    @property
    def micro_n(self) -> int:
        return self.tile_n // self.threads_n

    @property
    def a_row_floats(self) -> int:
        """Floats between consecutive K-rows of an M-major A stage (tile_m plus padding)."""
        return self.tile_m + A_M_MAJOR_PAD

    def b_row_floats(self, b_k_major: bool = False) -> int:
        """Floats between consecutive K-rows of the N-major B stage (tile_n, padded for a K-major B)."""
        return self.tile_n + (B_K_MAJOR_PAD if b_k_major else 0)

    def smem_bytes(self, b_k_major: bool = False) -> int:
        """Shared memory of all pipeline stages of A and B, in bytes (fp32); ``b_k_major``: B is K-major in
        global memory (its stage rows are padded)."""
        a_stage = self.tile_k * (self.a_row_floats if self.a_smem_major == "m" else self.tile_m)
        b_stage = self.tile_k * self.b_row_floats(b_k_major)
        return 4 * self.num_stages * (a_stage + b_stage) + (SPLIT_FLAG_BYTES if self.split_k > 1 else 0)

    def copy_layout_problem(self, operand: str, vector: int, major: "str | None" = None) -> "str | None":
        """Why the global->shared thread layout of ``operand`` cannot use ``vector``-element copies, or None.

        ``major``: how the operand lies in global memory ("k" or "m" for A, "n" or "k" for B; row-major
        when None). A row-major A is copied K-fastest; with ``a_smem_major == "m"`` it moves one element per
        copy instead: threads cover 8-wide K runs of num_threads/8 rows, and the pattern repeats over the
        tile in M and K. An M-major A (its stage is M-major) is copied M-fastest in vectors. A row-major B
        is copied N-fastest; a K-major one one element per copy in 8-wide K runs, like the transposed A.
        """
        if operand == "a":
            if major == "m":
                contiguous, other = self.tile_m, self.tile_k
            elif self.a_smem_major == "m":
                contiguous, other, vector = A_M_MAJOR_K_RUN, self.tile_m, 1
            else:
                contiguous, other = self.tile_k, self.tile_m
        elif major == "k":
            contiguous, other, vector = A_M_MAJOR_K_RUN, self.tile_n, 1
        else:
            contiguous, other = self.tile_n, self.tile_k
        threads_contiguous = contiguous // vector
        if threads_contiguous > self.num_threads or self.num_threads % threads_contiguous:
            return (
                f"copying {operand.upper()} with {vector}-element copies needs {threads_contiguous} threads "
                f"along its contiguous dim, which does not divide num_threads={self.num_threads}"
            )
        threads_other = self.num_threads // threads_contiguous
        if other % threads_other:
            return (
                f"copying {operand.upper()} with {vector}-element copies puts {threads_other} threads along "
                f"an extent of {other}, which it does not divide"
            )
        return None

    def short(self) -> str:
        """Compact name for tables: 128x128x8_s3_t16x16_ak_r8."""
        return (
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}_s{self.num_stages}_t{self.threads_m}x{self.threads_n}"
            f"_a{self.a_smem_major}_r{self.raster}"
            + (f"_o{self.min_ctas_per_sm}" if self.min_ctas_per_sm > 1 else "")
            + (f"_w{self.warp_rows}" if self.warp_rows else "")
            + (f"_k{self.split_k}" if self.split_k > 1 else "")
        )
