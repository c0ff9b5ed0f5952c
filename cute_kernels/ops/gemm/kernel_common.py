"""Device-side pieces shared by the GEMM kernels (CuTe DSL): CTA tile order, the K-shifted operand tiles,
copy predicates and the cp.async multistage pipeline (prologue, waits, refills).

Both kernels tile D into CTA tiles launched on a 1-D grid, shift the K tiles so that the first one is the
partial one, and predicate global->shared copies per copy vector (rows/columns inside the matrix, and k >= 0
for the first k-tile). These helpers are traced inline into each kernel.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

__all__ = [
    "tile_of_cta",
    "make_copy_pred",
    "fill_copy_preds",
    "cta_tile_coord",
    "cta_grid",
    "batch_matrices",
    "operand_cta_tiles",
    "SplitKEntries",
    "split_slices",
    "split_k_grid",
    "split_k_slice",
    "split_k_arrive",
    "split_k_count",
    "plane_group_depth",
    "sum_planes",
    "CpAsyncPipeline",
]


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


@cute.jit
def cta_tile_coord(mA, mB, cta_tiler, band: cutlass.Constexpr):
    """This CTA's tile of D and the problem sizes: (m_size, n_size, k_size, (tile row, tile column, None)).

    ``mA``: (M, K), ``mB``: (N, K). The grid is 1-D (see :func:`cta_grid`); :func:`tile_of_cta` maps the
    linear block id to a tile in bands of ``band`` tile-rows.
    """
    bidx, _, _ = cute.arch.block_idx()
    m_size = mA.shape[0]
    k_size = mA.shape[1]
    n_size = mB.shape[0]
    tiles_m = (m_size + cta_tiler[0] - 1) // cta_tiler[0]
    tiles_n = (n_size + cta_tiler[1] - 1) // cta_tiler[1]
    tile_m_idx, tile_n_idx = tile_of_cta(bidx, tiles_m, tiles_n, band)
    return m_size, n_size, k_size, (tile_m_idx, tile_n_idx, None)


def cta_grid(mD, cta_tiler, batched: bool = False):
    """The launch grid: one CTA per (BM, BN) tile of ``mD`` along x (the kernel maps its linear id to a
    tile, :func:`tile_of_cta`) and, ``batched``, one layer per matrix of the batch along z (``mD`` is
    (M, N, L); see :func:`batch_matrices`)."""
    tiles_m = (mD.shape[0] + cta_tiler[0] - 1) // cta_tiler[0]
    tiles_n = (mD.shape[1] + cta_tiler[1] - 1) // cta_tiler[1]
    return [tiles_m * tiles_n, 1, mD.shape[2] if batched else 1]


@cute.jit
def batch_matrices(tensors, align_bytes):
    """This CTA's matrices of a batched launch: each (rows, cols, L) tensor of ``tensors`` at batch
    blockIdx.z, its pointer re-asserted ``align_bytes`` aligned (the batch offset is dynamic, so the DSL
    cannot infer it; the op proved the batch strides multiples of each vector)."""
    _, _, batch = cute.arch.block_idx()
    out = []
    for t, align in zip(tensors, align_bytes):
        matrix = t[None, None, batch]
        out.append(cute.make_tensor(matrix.iterator.align(align), matrix.layout))
    return out


@cute.jit
def operand_cta_tiles(mA, mB, cta_tiler, tile_coord, k_size, a_align_bytes: cutlass.Constexpr,
                      b_align_bytes: cutlass.Constexpr, mD=None, k_first=None):
    """The CTA's K-walk over A and B with K shifted so that the *first* k-tile is the partial one.

    Returns gA: (BM, BK, k), gB: (BN, BK, k) and cA, cB: the same shapes holding (row, col) coordinates of
    the global matrices (for predication only). The shift is residue_k (in (-BK, 0]): only the prologue's
    first copy then needs a K predicate, and the main loop copies whole tiles. Vectors stay aligned: A's run
    along K and K is a multiple of the A vector (the caller's alignment proof covers the column count); B's
    run along N, and a K shift moves them by whole rows of ldb, a multiple of the B vector. ``*_align_bytes``
    re-assert that alignment on the shifted pointers (the offset is dynamic, so the DSL cannot infer it).

    With ``mD`` (M, N) it also returns D's tile gD: (BM, BN) and its coordinates cD (gA, gB, cA, cB, gD,
    cD), made between the A/B tiles and the shift, where the SGEMM kernel has always made them: made after
    the shift, they reorder the kernel's address arithmetic in the PTX.

    ``k_first`` (split-K): the first k-tile of this CTA's slice of the walk; the returned tiles start there,
    so their k-tile 0 is the slice's first (the partial one only for the first slice).
    """
    gA = cute.local_tile(mA, cta_tiler, tile_coord, proj=(1, None, 1))
    gB = cute.local_tile(mB, cta_tiler, tile_coord, proj=(None, 1, 1))
    if cutlass.const_expr(mD is not None):
        gD = cute.local_tile(mD, cta_tiler, tile_coord, proj=(1, 1, None))
    cA = cute.local_tile(cute.make_identity_tensor(mA.shape), cta_tiler, tile_coord, proj=(1, None, 1))
    cB = cute.local_tile(cute.make_identity_tensor(mB.shape), cta_tiler, tile_coord, proj=(None, 1, 1))
    if cutlass.const_expr(mD is not None):
        cD = cute.local_tile(cute.make_identity_tensor(mD.shape), cta_tiler, tile_coord, proj=(1, 1, None))
    residue_k = k_size - cta_tiler[2] * cute.size(gA, mode=[2])
    gA = cute.domain_offset((0, residue_k, 0), gA)
    gB = cute.domain_offset((0, residue_k, 0), gB)
    cA = cute.domain_offset((0, residue_k, 0), cA)
    cB = cute.domain_offset((0, residue_k, 0), cB)
    if cutlass.const_expr(k_first is not None):
        gA = cute.domain_offset((0, 0, k_first), gA)
        gB = cute.domain_offset((0, 0, k_first), gB)
        cA = cute.domain_offset((0, 0, k_first), cA)
        cB = cute.domain_offset((0, 0, k_first), cB)
    gA = cute.make_tensor(gA.iterator.align(a_align_bytes), gA.layout)
    gB = cute.make_tensor(gB.iterator.align(b_align_bytes), gB.layout)
    if cutlass.const_expr(mD is not None):
        return gA, gB, cA, cB, gD, cD
    return gA, gB, cA, cB


def _modes(tensor: cute.Tensor, order: tuple) -> cute.Tensor:
    """The same memory with its modes reordered (``order[i]``: the old mode that becomes mode i)."""
    return cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=list(order)))


def kernel_views(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, batched: bool,
                 transposed: bool = False):
    """The kernels' views of the tensors a call passes in torch's layouts (host-side layout algebra in the
    compiled function: no per-call views in Python): A (M, K), B (K, N), C and D (M, N), batched with a
    leading L, become CuTe's (M, K), (N, K), (M, N), batched with a trailing L. Shapes and strides are
    the same symbols in another order, so the kernels compile as they did from kernel-order tensors.
    ``transposed`` (one product): the views of D^T = B^T A^T instead, whose (M, K) operand is B^T (N, K),
    whose (N, K) operand is A itself, and whose result is D^T (N, M)."""
    if batched:  # Python bools: the choice is made while tracing
        return _modes(mA, (1, 2, 0)), _modes(mB, (2, 1, 0)), _modes(mC, (1, 2, 0)), _modes(mD, (1, 2, 0))
    if transposed:
        return _modes(mB, (1, 0)), mA, _modes(mC, (1, 0)), _modes(mD, (1, 0))
    return mA, _modes(mB, (1, 0)), mC, mD


class SplitKEntries:
    """The host entry points of the cp.async GEMM kernels, which differ only in what they pass on to the
    kernel class's ``_launch(mA, mB, mC, mD, alpha, beta, mW, mS, stream)``: ``__call__`` for a config
    without split-K, ``call_split`` for one with it (``compile.compile_kernel(split=True)`` compiles that).
    Both take the tensors as a call passes them and hand the kernel their :func:`kernel_views`."""

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        mA, mB, mC, mD = kernel_views(mA, mB, mC, mD, self.batched)
        # Without split-K the workspace and counters are never touched: D stands in for both.
        self._launch(mA, mB, mC, mD, alpha, beta, mD, mD, stream)

    @cute.jit
    def call_split(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        mW: cute.Tensor,
        mS: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """The split-K entry: ``mW`` (M, N, S) FP32 partial tiles, one plane per slice (S >= split_k),
        ``mS`` (tiles,) Int32 arrival counters, zero before the launch and left zero after it."""
        mA, mB, mC, mD = kernel_views(mA, mB, mC, mD, self.batched)
        self._launch(mA, mB, mC, mD, alpha, beta, mW, mS, stream)


def split_slices(k_tiles, split_k: int):
    """(k-tiles per slice, slices) of a K walk of ``k_tiles`` (>= 1) cut into at most ``split_k`` slices of
    whole k-tiles, none empty: fewer than ``split_k`` when K has too few k-tiles to share. Plain integer
    arithmetic, so the host side and a kernel compute the same values (Python ints or DSL integers)."""
    per_slice = (k_tiles + split_k - 1) // split_k
    return per_slice, (k_tiles + per_slice - 1) // per_slice


def split_k_grid(grid, k_size, tile_k: int, split_k: int):
    """The split-K launch grid: ``grid`` (one CTA per tile along x) with grid.y the slices of whole
    k-tiles, none empty (:func:`split_slices`; see :func:`split_k_slice`)."""
    return [grid[0], split_slices((k_size + tile_k - 1) // tile_k, split_k)[1], grid[2]]


@cute.jit
def split_k_slice(k_size, tile_k: cutlass.Constexpr, split_k: cutlass.Constexpr):
    """This CTA's slice of its tile's K walk under split-K (grid.y, :func:`split_k_grid`): (first k-tile,
    number of k-tiles)."""
    _, split, _ = cute.arch.block_idx()
    k_tiles = (k_size + tile_k - 1) // tile_k
    per_slice = (k_tiles + split_k - 1) // split_k
    k_first = split * per_slice
    return k_first, min(per_slice, k_tiles - k_first)


@cute.jit
def split_k_arrive(tidx, mS, sFlag):
    """Count this CTA's slice (block y) at its tile (block x) with all its threads: :func:`split_k_count`."""
    tile_linear, _, _ = cute.arch.block_idx()
    _, splits, _ = cute.arch.grid_dim()
    return split_k_count(tidx == 0, tile_linear, splits, mS, sFlag, cute.arch.sync_threads)


# Registers a thread gives the split-K sum's plane buffers (FP32 values): the planes it loads at once. Twice
# this spills the Hopper kernel's 64x128 tile (64 accumulators beside two 64-value planes); see
# docs/notes/gemm.md, "The split-K sum, one plane at a time", for each kernel's registers.
PLANE_BUFFER_VALUES = 64
MAX_PLANE_GROUP = 4


def plane_group_depth(values: int) -> int:
    """How many workspace planes of ``values`` FP32 values a thread the last slice loads before it adds them
    (:func:`split_k_count`'s callers): as many as ``PLANE_BUFFER_VALUES`` registers hold, 1 to
    ``MAX_PLANE_GROUP``. Plain integer arithmetic, done while the kernel is traced."""
    return max(1, min(MAX_PLANE_GROUP, PLANE_BUFFER_VALUES // values))


@cute.jit
def sum_planes(acc, plane, slices, whole, tXcX, shape_mn):
    """``acc`` = the sum of split-K's workspace planes 0 .. ``slices`` - 1, added in slice order (the same bits
    whichever slice is last). ``plane(s)``: slice ``s``'s plane partitioned as ``acc`` is; ``whole``: the
    tile lies inside D, so planes load unpredicated; else value by value where ``tXcX`` (acc's (m, n)
    coordinates) is inside ``shape_mn``, 0 outside.

    The planes are read in groups (:func:`plane_group_depth`), every load of a group issued before any of
    its adds: a load followed at once by its add stalls in-order issue for the load's whole latency, and a
    plane at a time the sum paid one L2 round trip per slice, one after another."""
    values = cute.size(acc)
    depth = plane_group_depth(values)
    planes = [cute.make_fragment_like(acc) for _ in range(depth)]
    acc.fill(0.0)
    for first in range(0, slices, depth):
        for j in cutlass.range_constexpr(depth):
            if first + j < slices:
                tXgW = plane(first + j)
                if whole:
                    cute.autovec_copy(tXgW, planes[j])
                else:
                    planes[j].fill(0.0)
                    for v in cutlass.range(values, unroll_full=True):
                        if cute.elem_less(tXcX[v], shape_mn):
                            planes[j][v] = tXgW[v]
        for j in cutlass.range_constexpr(depth):
            if first + j < slices:
                for v in cutlass.range(values, unroll_full=True):
                    acc[v] = acc[v] + planes[j][v]


@cute.jit
def split_k_count(counts, tile_linear, splits, mS, sFlag, sync):
    """Count one slice's arrival at tile ``tile_linear`` (``mS``: one Int32 counter per tile) among the
    threads that ``sync`` (a barrier over them) joins, ``counts`` true in exactly one of them; True in
    every one of those threads of the slice that arrives last, which also resets the counter to 0 for the
    next launch on the stream. ``sFlag``: one Int32 of shared memory.

    Why it waits where it waits: the callers' partial stores come before the first barrier, and the
    counting thread's acq_rel atomic after it publishes them (the barrier orders the group's stores before
    the release). The slice that sees ``splits - 1`` earlier arrivals is the last: every other slice's
    stores happened before its acquire; the second barrier hands that to the other threads, and their own
    acq_rel fence orders their reads of the other slices' partials after it."""
    sync()
    if counts:
        arrived = cute.arch.atomic_add(mS.iterator + tile_linear, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        sFlag[0] = cutlass.Int32(0)
        if arrived == splits - 1:
            sFlag[0] = cutlass.Int32(1)
            mS[tile_linear] = cutlass.Int32(0)  # every slice has arrived: ready for the next launch
    sync()
    last = sFlag[0] == 1
    if last:
        cute.arch.fence_acq_rel_gpu()
    return last


@dataclasses.dataclass(frozen=True)
class CpAsyncPipeline:
    """The global->shared half of both kernels: a ring of ``num_stages`` shared-memory stages filled by
    predicated cp.async copies of A and B, one commit group per k-tile. A plain Python holder of the
    per-thread partitions, built while the kernel is traced (frozen: the DSL then treats it as
    read-only inside dynamic loops instead of trying to carry it).

    Partitions (``tiled_copy_*`` sliced by the thread):
    tAgA: (CPY, CPY_M, CPY_K, k)   tAsA: (CPY, CPY_M, CPY_K, PIPE)   tAcA: (CPY, CPY_M, CPY_K, k) -> (m, k)
    tBgB: (CPY, CPY_N, CPY_K, k)   tBsB: (CPY, CPY_N, CPY_K, PIPE)   tBcB: (CPY, CPY_N, CPY_K, k) -> (n, k)
    Predicates, one per copy instruction: tApA / tBpB (CPY_REST, CPY_M|N, CPY_K) with stride 0 in K (rows
    or columns inside the matrix; every whole k-tile is inside in K) for the main loop; tApA_k0 / tBpB_k0
    the same plus k >= 0, for the shifted first k-tile (see :func:`operand_cta_tiles`).

    Why the consumer waits where it waits (the kernels' main loops follow this): stage s of the ring holds
    k-tile t with t % S == s; every k-tile owns one cp.async group, committed in order (empty or dummy
    groups past the last tile keep the count uniform).

    - Before the first shared->register read of k-tile t+1 (at the last k-block of tile t), groups 0..t+1
      must have landed. Groups committed so far: (S-1) in :meth:`start` + (t+1) by :meth:`refill`, so
      cp_async_wait_group(S-2) -- "at most S-2 still in flight" -- is exactly that (:meth:`wait_next`). It
      waits only for this thread's copies, hence the CTA barrier right after it, which makes every
      thread's copies of tile t+1 visible.
    - The same barrier is the write-after-read fence: every read of tile t's stage was issued before it (the
      last k-block's fragments are loaded one k-block earlier), so after it nobody reads stage t % S again,
      and the refill issued at the start of tile t+1 (tile t+S, into that stage) may overwrite it. One
      barrier per k-tile.
    - Copies for tile t+S-1 are issued at the top of tile t, after the first fragment read, so S-1 tiles are
      in flight while tile t computes (with S == 2: one, overlapping one tile of math).
    """

    tiled_copy_A: cute.TiledCopy
    tiled_copy_B: cute.TiledCopy
    tAgA: cute.Tensor
    tAsA: cute.Tensor
    tApA: cute.Tensor
    tApA_k0: cute.Tensor
    tBgB: cute.Tensor
    tBsB: cute.Tensor
    tBpB: cute.Tensor
    tBpB_k0: cute.Tensor
    k_tile_count: object  # the number of k-tiles: dynamic (Int32)

    @classmethod
    def create(cls, tidx, tiled_copy_A, tiled_copy_B, gA, sA, cA, gB, sB, cB, m_size, n_size, k_tile_count=None):
        """Partition this thread's share of the copies and fill the predicates (``gA``, ``gB``, ``cA``,
        ``cB`` from :func:`operand_cta_tiles`; ``sA``: (BM, BK, PIPE), ``sB``: (BN, BK, PIPE)).
        ``k_tile_count``: the k-tiles this CTA walks (a split-K slice), else every k-tile of the tiles."""
        thr_copy_A = tiled_copy_A.get_slice(tidx)
        thr_copy_B = tiled_copy_B.get_slice(tidx)
        tAgA = thr_copy_A.partition_S(gA)  # (CPY, CPY_M, CPY_K, k)
        tAsA = thr_copy_A.partition_D(sA)  # (CPY, CPY_M, CPY_K, PIPE)
        tAcA = thr_copy_A.partition_S(cA)  # (CPY, CPY_M, CPY_K, k) -> (m, k)
        tBgB = thr_copy_B.partition_S(gB)  # (CPY, CPY_N, CPY_K, k)
        tBsB = thr_copy_B.partition_D(sB)  # (CPY, CPY_N, CPY_K, PIPE)
        tBcB = thr_copy_B.partition_S(cB)  # (CPY, CPY_N, CPY_K, k) -> (n, k)

        tApA = make_copy_pred(tAsA, k_broadcast=True)
        tBpB = make_copy_pred(tBsB, k_broadcast=True)
        tApA_k0 = make_copy_pred(tAsA, k_broadcast=False)
        tBpB_k0 = make_copy_pred(tBsB, k_broadcast=False)
        if k_tile_count is None:
            k_tile_count = cute.size(tAgA, mode=[3])
        fill_copy_preds(tApA, tApA_k0, tAcA, m_size, k_tile_count)
        fill_copy_preds(tBpB, tBpB_k0, tBcB, n_size, k_tile_count)
        return cls(tiled_copy_A, tiled_copy_B, tAgA, tAsA, tApA, tApA_k0, tBgB, tBsB, tBpB, tBpB_k0, k_tile_count)

    def _copy(self, k_tile, stage, tApA, tBpB):
        cute.copy(self.tiled_copy_A, self.tAgA[None, None, None, k_tile], self.tAsA[None, None, None, stage], pred=tApA)
        cute.copy(self.tiled_copy_B, self.tBgB[None, None, None, k_tile], self.tBsB[None, None, None, stage], pred=tBpB)

    @cute.jit
    def start(self, num_stages: cutlass.Constexpr):
        """Zero the ring, then put k-tiles 0..S-2 in flight (one commit group each, empty past K)."""
        # Predicated-off copies write nothing, so zero every stage first: rows past M / columns past N and
        # the k < 0 part of the first tile then read as 0 and contribute nothing to the accumulators.
        self.tAsA.fill(0.0)
        self.tBsB.fill(0.0)
        cute.arch.sync_threads()

        self._copy(0, 0, self.tApA_k0, self.tBpB_k0)
        cute.arch.cp_async_commit_group()
        for stage in cutlass.range_constexpr(1, num_stages - 1):
            if stage < self.k_tile_count:
                self._copy(stage, stage, self.tApA, self.tBpB)
            # Commit even when nothing was issued: every stage owns exactly one group, which is what makes
            # the fixed wait count of wait_next correct for any K.
            cute.arch.cp_async_commit_group()

    @staticmethod
    def wait_next(num_stages: int):
        """Wait until the next k-tile's stage has landed for every thread (see the class docstring)."""
        cute.arch.cp_async_wait_group(num_stages - 2)
        cute.arch.sync_threads()

    @cute.jit
    def refill(self, k_tile_next, smem_write, smem_read, num_stages: cutlass.Constexpr):
        """Copy k-tile ``k_tile_next`` into stage ``smem_write`` (one commit group) and advance the ring:
        returns the next (k_tile_next, smem_write, smem_read).

        Past the last k-tile the copy re-reads the last k-tile into the stage being freed (nothing reads that
        stage again) instead of branching around the copy: unconditional, its address math stays
        loop-invariant and ptxas hoists it; behind a branch it is rebuilt from the thread index every k-tile
        (docs/notes/gemm.md#issue-bound-main-loop). The last k-tile is whole and
        inside K when there are two or more; with one, the main-loop predicates are all off (see
        :func:`fill_copy_preds`), so nothing is read.
        """
        k_src = k_tile_next
        if k_tile_next >= self.k_tile_count:
            k_src = self.k_tile_count - 1
        self._copy(k_src, smem_write, self.tApA, self.tBpB)
        cute.arch.cp_async_commit_group()
        k_tile_next = k_tile_next + 1
        smem_write = smem_read
        smem_read = smem_read + 1
        if smem_read == num_stages:
            smem_read = cutlass.Int32(0)
        return k_tile_next, smem_write, smem_read
