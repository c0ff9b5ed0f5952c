"""HgemmConfig: every compile-time knob of the FP16/BF16 tensor-core GEMM, validated in one place; and
``WarpMmaConfig``, what it shares with the 3xTF32 SGEMM's config (``sgemm_tf32x3_config``), whose kernel is
the same pipeline with another MMA.

A config describes the CTA tile (tile_m x tile_n x tile_k), the cp.async pipeline depth, the warp grid of
the TiledMMA (warps_m x warps_n warps, each owning a (tile_m/warps_m) x (tile_n/warps_n) block of the
accumulators), the MMA permutation along N, and the CTA rasterization width. Problem-dependent validity
(alignment, the shared-memory budget) lives in ``hgemm_sm80.why_unsupported``; what is checked here holds for
every problem.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ...runtime.config_fields import check_choice, check_fields, check_range
from .split_k import SPLIT_FLAG_BYTES, SPLIT_K_CHOICES

__all__ = ["HgemmConfig", "WarpMmaConfig", "MMA_M", "MMA_N", "MMA_K", "VECTOR_BYTES"]

# mma.sync.aligned.m16n8k16 (MmaF16BF16Op): one warp computes a 16x8 block of D per 16-deep K step.
MMA_M, MMA_N, MMA_K = 16, 8, 16

# Widest global access: 16 bytes (cp.async.cg, 128-bit loads and stores) = 8 fp16/bf16 elements.
VECTOR_BYTES = 16
ELEMENT_BYTES = 2  # fp16 and bf16

# Registers one thread may spend on accumulators and (double-buffered) MMA fragments; the rest of its 255
# hold addresses, predicates and loop state. Past this ptxas spills.
_FRAGMENT_REGISTER_BUDGET = 216


@dataclasses.dataclass(frozen=True)
class WarpMmaConfig:
    """The knobs and checks of a warp-MMA (mma.sync) GEMM binary; each family subclasses it with its MMA's K
    depth, its element size, its tile_k choices and its register estimate. Concrete classes only: a config
    names its family (the ops pick the registry entry by the config's class).

    - ``tile_m, tile_n, tile_k``: the CTA tile; one CTA computes a tile_m x tile_n block of D and walks K in
      steps of tile_k (a multiple of the MMA's K; each k-tile is tile_k/MMA_K k-blocks).
    - ``num_stages``: shared-memory buffers in the cp.async pipeline (2 = double buffering).
    - ``warps_m, warps_n``: the warp grid of the TiledMMA (4 or 8 warps in all).
    - ``n_atoms``: the N permutation -- each warp takes ``n_atoms`` adjacent 8-column MMA atoms per step
      along N (permutation_mnk N = warps_n * 8 * n_atoms), so one 4-matrix transposing ldmatrix loads the B
      fragments of two atoms (16 columns x 16 k). 2 is CUTLASS's choice; 4 gives each warp 32 contiguous
      columns per step.
    - ``raster``: CTA rasterization width; consecutive CTAs walk a band of ``raster`` tile-rows column by
      column, so the B tiles they share stay in L2 (1 = plain row-major tile order).
    - ``swizzle``: the A and B stages in the family's swizzled layout (the kernel's ``_operand_atom``; True,
      the only value the sweeps and defaults use), or in plain row-major atoms (False): the bank-conflicted
      layout the swizzle is measured against (``scripts/profile.sh`` conflict counts, the HGEMM probe).
    - ``split_k``: the K walk of each tile is cut into up to ``split_k`` slices, one CTA each (split-K), for
      problems whose M x N tiles leave most SMs idle while K is long (decode-sized M, skinny N). Each
      slice writes its FP32 partial tile to a workspace; the slice that finishes last sums every slice's
      partial in slice order (the same bits whichever finishes last) and writes D. 1: no split.
      tile_m 16 and 32 serve the decode rows (M of 1 to 32) without computing 64 rows of zeros.
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 32
    num_stages: int = 4
    warps_m: int = 2
    warps_n: int = 4
    n_atoms: int = 2
    raster: int = 8
    swizzle: bool = True
    split_k: int = 1

    MMA_K: ClassVar[int] = MMA_K
    ELEMENT_BYTES: ClassVar[int] = ELEMENT_BYTES
    TILE_K_CHOICES: ClassVar[tuple] = (32, 64)
    FRAGMENT_REGISTER_BUDGET: ClassVar[int] = _FRAGMENT_REGISTER_BUDGET

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_fields(self)
        check_choice(self, "tile_m", (16, 32, 64, 128, 256))
        check_choice(self, "tile_n", (64, 128, 256))
        check_choice(self, "tile_k", self.TILE_K_CHOICES, " or ".join(map(str, self.TILE_K_CHOICES)))
        check_range(self, "num_stages", 2, 8)
        for field in ("warps_m", "warps_n"):
            check_choice(self, field, (1, 2, 4, 8))
        if self.num_warps not in (4, 8):
            raise ValueError(
                f"{name}: warps_m * warps_n must be 4 or 8, got {self.warps_m} * {self.warps_n} = {self.num_warps}"
            )
        check_choice(self, "n_atoms", (2, 4), "2 or 4")
        check_range(self, "raster", 1, 64)
        check_choice(self, "split_k", SPLIT_K_CHOICES)
        if self.tile_m % (MMA_M * self.warps_m):
            raise ValueError(
                f"{name}: tile_m must be a multiple of {MMA_M} * warps_m = {MMA_M * self.warps_m}, "
                f"got tile_m={self.tile_m}"
            )
        if self.tile_n % (MMA_N * self.n_atoms * self.warps_n):
            raise ValueError(
                f"{name}: tile_n must be a multiple of {MMA_N} * n_atoms * warps_n = "
                f"{MMA_N * self.n_atoms * self.warps_n}, got tile_n={self.tile_n}"
            )
        if self.fragment_registers() > self.FRAGMENT_REGISTER_BUDGET:
            raise ValueError(
                f"{name}: a {self.warp_tile_m}x{self.warp_tile_n} warp tile needs about "
                f"{self.fragment_registers()} registers per thread for accumulators and fragments, more than "
                f"the {self.FRAGMENT_REGISTER_BUDGET} that leave room for addresses (255 in all); use more warps or a "
                f"smaller tile"
            )
        # The 16-byte copy layouts must tile A and B exactly; narrower copies are checked per problem.
        widest = VECTOR_BYTES // self.ELEMENT_BYTES
        for why in (self.copy_layout_problem("a", widest), self.copy_layout_problem("b", widest)):
            if why is not None:
                raise ValueError(f"{name}: {why}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps

    @property
    def warp_tile_m(self) -> int:
        return self.tile_m // self.warps_m

    @property
    def warp_tile_n(self) -> int:
        return self.tile_n // self.warps_n

    def fragment_registers(self) -> int:
        """32-bit registers per thread for the FP32 accumulators plus two k-blocks of A and B fragments
        (the one being multiplied and the one being loaded): an m16k16 A fragment is 4 registers per
        thread, an n8k16 B fragment 2."""
        accumulators = self.warp_tile_m * self.warp_tile_n // 32
        a_frag = (self.warp_tile_m // MMA_M) * 4
        b_frag = (self.warp_tile_n // MMA_N) * 2
        return accumulators + 2 * (a_frag + b_frag)

    def pipeline_bytes(self) -> int:
        """Shared memory of all pipeline stages of A and B."""
        return self.ELEMENT_BYTES * self.num_stages * self.tile_k * (self.tile_m + self.tile_n)

    def epilogue_bytes(self) -> int:
        """Shared memory of the FP32 accumulator tile the epilogue stages (it reuses the pipeline's)."""
        return 4 * self.tile_m * self.tile_n

    def tiles_bytes(self) -> int:
        """Shared memory of the pipeline ring, reused by the epilogue's FP32 tile: the larger of the two."""
        return max(self.pipeline_bytes(), self.epilogue_bytes())

    def smem_bytes(self) -> int:
        return self.tiles_bytes() + (SPLIT_FLAG_BYTES if self.split_k > 1 else 0)

    def copy_layout_problem(self, operand: str, vector: int, major: "str | None" = None) -> "str | None":
        """Why the global->shared thread layout of ``operand`` cannot use ``vector``-element copies, or None.

        Each operand is copied fastest along its contiguous mode in global memory (``major``: "k" or "m"
        for A, "n" or "k" for B; row-major when None: A K-fastest, B N-fastest). min(contiguous/vector,
        threads) threads sit along the contiguous extent and the rest of the CTA along the other one; the
        pattern repeats over the tile in both.
        """
        mn_tile = self.tile_m if operand == "a" else self.tile_n
        k_major = (major or ("k" if operand == "a" else "n")) == "k"
        contiguous, other = (self.tile_k, mn_tile) if k_major else (mn_tile, self.tile_k)
        along = min(contiguous // vector, self.num_threads)
        if contiguous % (along * vector) or self.num_threads % along:
            return (
                f"copying {operand.upper()} with {vector}-element copies puts {along} threads along an extent "
                f"of {contiguous}, which does not tile it or num_threads={self.num_threads}"
            )
        rows = self.num_threads // along
        if other % rows:
            return (
                f"copying {operand.upper()} with {vector}-element copies puts {rows} threads along an extent of "
                f"{other}, which it does not divide"
            )
        return None

    def short(self) -> str:
        """Compact name for tables: 128x256x32_s4_w2x4_n2_r8 (``_k4`` when split in 4)."""
        return (
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}_s{self.num_stages}_w{self.warps_m}x{self.warps_n}"
            f"_n{self.n_atoms}_r{self.raster}" + ("" if self.swizzle else "_unswizzled")
            + (f"_k{self.split_k}" if self.split_k > 1 else "")
        )


@dataclasses.dataclass(frozen=True)
class HgemmConfig(WarpMmaConfig):
    """Compile-time knobs of one HGEMM binary (the sm80-style FP16/BF16 kernel): ``WarpMmaConfig``'s, with
    the m16n8k16 MMA and 2-byte elements."""
