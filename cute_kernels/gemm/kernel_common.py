"""Device-side pieces shared by the GEMM kernels (CuTe DSL): CTA tile order and copy predicates.

Both kernels tile D into CTA tiles launched on a 1-D grid, shift the K tiles so that the first one is the
partial one, and predicate global->shared copies per copy vector (rows/columns inside the matrix, and k >= 0
for the first k-tile). These helpers are traced inline into each kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

__all__ = ["tile_of_cta", "make_copy_pred", "fill_copy_preds"]


@cute.jit
def tile_of_cta(bidx, tiles_m, tiles_n, band: cutlass.Constexpr):
    """Swizzled tile order: bands of ``band`` tile-rows, walked column by column.

    CTAs that run together share B tiles (same columns) and a band's A tiles, so both stay in L2.
    ``band == 1`` is plain row-major tile order. Returns (tile row, tile column).
    """
    tiles_per_band = band * tiles_n
    band_idx = bidx // tiles_per_band
    first_m = band_idx * band
    band_rows = min(tiles_m - first_m, band)
    in_band = bidx - band_idx * tiles_per_band
    return first_m + in_band % band_rows, in_band // band_rows


def make_copy_pred(tXsX, *, k_broadcast: bool):
    """A predicate tensor with one flag per copy instruction of a (CPY, CPY_MN, CPY_K[, PIPE]) partition:
    (CPY_REST, CPY_MN, CPY_K), with stride 0 along K when ``k_broadcast`` (only rows/columns matter)."""
    rest = tXsX.shape[0][1]
    n_mn = cute.size(tXsX, mode=[1])
    n_k = cute.size(tXsX, mode=[2])
    if k_broadcast:
        layout = cute.make_layout((rest, n_mn, n_k), stride=(n_mn, 1, 0))
    else:
        layout = cute.make_layout((rest, n_mn, n_k), stride=(n_mn * n_k, n_k, 1))
    return cute.make_rmem_tensor(layout, cutlass.Boolean)


@cute.jit
def fill_copy_preds(tXpX, tXpX_k0, tXcX, mn_size, k_tile_count):
    """Fill the main-loop predicates ``tXpX`` (row/column inside the matrix) and the first-k-tile ones
    ``tXpX_k0`` (also k >= 0) from ``tXcX``, the copy partition of the identity tensor.

    Coordinates are those of the first element of each copy vector: (row-or-column, k). A vector is wholly
    inside or outside the matrix because M/N extents and K are multiples of the vector width. The main-loop
    predicates are also off when there is a single k-tile: then every main-loop copy is a dummy, and the
    only tile to re-read would be the partial one, whose k < 0 part lies before the matrix.
    """
    for rest in cutlass.range_constexpr(tXpX.shape[0]):
        for i in cutlass.range_constexpr(tXpX.shape[1]):
            row = tXcX[(0, rest), i, 0, 0][0]
            tXpX[rest, i, 0] = cute.elem_less((row, cutlass.Int32(1)), (mn_size, k_tile_count))
    for rest in cutlass.range_constexpr(tXpX_k0.shape[0]):
        for i in cutlass.range_constexpr(tXpX_k0.shape[1]):
            for k in cutlass.range_constexpr(tXpX_k0.shape[2]):
                coord = tXcX[(0, rest), i, k, 0]
                tXpX_k0[rest, i, k] = cute.elem_less((coord[0], cutlass.Int32(-1)), (mn_size, coord[1]))
