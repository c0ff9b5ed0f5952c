"""What both GEMM families' split-K shares: the splits a config may take, the shared memory of the flag a
split CTA needs, the tile count of a (config, problem), and the choice of a split for a problem.

The kernels' side (the slice of the K walk, the arrival protocol) is ``kernel_common``'s; this module is
plain Python, which the config classes and the heuristics import without the DSL.
"""

from __future__ import annotations

__all__ = ["SPLIT_K_CHOICES", "SPLIT_FLAG_BYTES", "MIN_K_TILES_PER_SLICE", "tile_count", "split_k_for"]

# Slices of the K walk a split-K config may cut each tile into.
SPLIT_K_CHOICES = (1, 2, 4, 8, 16)
# Shared memory a split-K CTA needs beyond its tiles: the flag that tells its threads they finish the tile.
SPLIT_FLAG_BYTES = 16
# Slices shorter than this many k-tiles spend more on the workspace round trip than they win.
MIN_K_TILES_PER_SLICE = 8


def tile_count(config, problem) -> int:
    """CTA tiles of D: ceil(M / tile_m) * ceil(N / tile_n) (any family's config, any GemmProblem)."""
    return -(-problem.m // config.tile_m) * -(-problem.n // config.tile_n)


def split_k_for(config, problem, target_ctas: int, max_split: int = SPLIT_K_CHOICES[-1],
                min_k_tiles: int = MIN_K_TILES_PER_SLICE) -> int:
    """The split of ``config``'s K walk for ``problem``: doubled from 1 while the CTAs (tiles x split) stay
    within ``target_ctas``, the split is one of ``SPLIT_K_CHOICES`` up to ``max_split`` (a family's measured
    limit), and every slice keeps ``min_k_tiles`` k-tiles (``MIN_K_TILES_PER_SLICE`` unless a family
    measured shorter slices paying)."""
    tiles = tile_count(config, problem)
    k_tiles = -(-problem.k // config.tile_k)
    split = 1
    while (2 * split in SPLIT_K_CHOICES and 2 * split <= max_split and tiles * 2 * split <= target_ctas
           and k_tiles >= min_k_tiles * 2 * split):
        split *= 2
    return split
