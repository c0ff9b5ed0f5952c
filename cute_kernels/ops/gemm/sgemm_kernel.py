"""The SIMT FP32 GEMM kernel (CuTe DSL): D = alpha * A @ B + beta * C, exact FP32 (FFMA, no TF32).

Operands as the kernel sees them (CuTe's (M,K) x (N,K) convention):

- ``mA``: (M, K) with strides (lda, 1): row-major A, K-major; or (1, lda): a column-major ``x.t()``,
  M-major, whose tile is copied in vectors along M into the (padded) M-major stage.
- ``mB``: (N, K) with strides (1, ldb): the row-major (K, N) ``b`` viewed transposed, so N is the
  contiguous ("MN-major") mode; or (ldb, 1): a column-major ``w.t()``, K-major, whose tile is transposed
  on the way into the N-major stage (4-byte copies along K, padded stage rows), as a row-major A's is
  with ``a_smem_major == "m"``.
- ``mC`` (read only when beta != 0) and ``mD`` (written): (M, N) with strides (ld, 1).
- Batched (``batched``): each has a third mode L with its own stride (0: one matrix for every batch);
  grid.z walks the batch and each CTA works on its batch's matrices (``kernel_common.batch_matrices``).

Data path per CTA (one tile_m x tile_n block of D): cp.async global->shared into a ring of ``num_stages``
buffers; shared->register reads of 128-bit vectors into each thread's 4x4-blocked micro-tile fragments
(double-buffered in registers); one FFMA per (m, n, k) through a TiledMMA of ``MmaUniversalOp(Float32)``;
an FP32 alpha/beta epilogue with vector stores. All sizes and leading dimensions are dynamic; tile shapes,
pipeline depth, thread layout, copy widths (alignment) and the beta==0 branch are compile-time.

Split-K (``config.split_k`` > 1): grid.y cuts each tile's K walk into slices of whole k-tiles, one CTA
each. A slice stores its accumulators to its plane of the FP32 workspace ``mW`` (M, N, S) and counts
itself in the tile's arrival counter ``mS`` (``kernel_common.split_k_arrive`` says why it waits where it
waits). The last slice to arrive reloads its accumulators as the sum of the planes in slice order (the
bits do not depend on which slice finished last) and runs the ordinary epilogue.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

from .sgemm_config import A_M_MAJOR_K_RUN, MICRO_VECTOR, GemmConfig
from .kernel_common import (CpAsyncPipeline, SplitKEntries, batch_matrices, cta_grid, cta_tile_coord,
                            operand_cta_tiles, split_k_arrive, split_k_grid, split_k_slice, sum_planes)

__all__ = ["SgemmKernel"]


def a_tile_swizzle(config: GemmConfig) -> "tuple[int, int, int] | None":
    """Swizzle<B, M, S> (units: fp32 *elements*; it is composed into the layout) for a K-major A stage.

    A K-major stage stores row m at offset m*tile_k. Fragment reads are 128-bit vectors along K, and one warp
    instruction touches the same K-chunk of ``lanes_m`` different thread-rows, which sit 4 rows apart:
    4*tile_k >= 32 floats, i.e. the same banks. XOR-ing the row bits that tell those thread-rows apart
    (element bits [2+log2(tile_k), +B)) into the 16-byte-chunk bits ([2, 2+B)) sends each to a different
    group of 4 banks. M=2 keeps 4 consecutive K values together, so 128-bit reads and 16-byte cp.async
    writes stay whole; the writes (consecutive 16-byte chunks per warp) are only permuted within each
    128-byte line, so they stay conflict-free too. None when a warp spans a single thread-row.
    """
    rows_per_warp = config.lanes_m
    bits = int(math.log2(rows_per_warp))
    if bits == 0:
        return None
    return (bits, 2, int(math.log2(config.tile_k)))


class SgemmKernel(SplitKEntries):
    """One compiled-to-be SGEMM: a validated config plus the problem's compile-time properties.

    ``a_vector``, ``b_vector``, ``c_vector``: elements per global access of A (along K), B (along N) and
    C/D (along N): 4 means 16-byte cp.async / 128-bit stores; the caller proves the alignment (base address,
    leading dimension and contiguous extent all multiples of the vector). ``beta_zero`` compiles the
    epilogue that never reads C.
    """

    def __init__(self, config: GemmConfig, *, a_vector: int, b_vector: int, c_vector: int, beta_zero: bool,
                 batched: bool = False, a_major: str = "k", b_major: str = "n"):
        if not isinstance(config, GemmConfig):
            raise TypeError(f"config: expected GemmConfig, got {type(config).__name__}")
        for name, v in (("a_vector", a_vector), ("b_vector", b_vector), ("c_vector", c_vector)):
            if v not in (1, 2, 4):
                raise ValueError(f"{name}: expected 1, 2 or 4 elements, got {v!r}")
        if batched and config.split_k > 1:
            raise ValueError(f"config {config.short()}: split-K runs unbatched problems only")
        if a_major not in ("k", "m") or b_major not in ("n", "k"):
            raise ValueError(f"a_major, b_major: expected 'k'/'m' and 'n'/'k', got {a_major!r}, {b_major!r}")
        if a_major == "m" and config.a_smem_major != "m":
            raise ValueError(f"config {config.short()}: an M-major a needs a_smem_major='m' (its stage keeps M contiguous)")
        self.cfg = config
        self.batched = bool(batched)
        self.a_m_major = a_major == "m"
        self.b_k_major = b_major == "k"
        # A row-major A going to an M-major stage is written transposed, one element per cp.async, whatever
        # the alignment; so is a K-major B going to its N-major stage.
        self.a_vector = a_vector if (config.a_smem_major == "k" or self.a_m_major) else 1
        self.b_vector = 1 if self.b_k_major else b_vector
        # C/D move as whole 4-column runs or element by element (a 2-wide alignment gains little here).
        self.c_vector = c_vector if c_vector == MICRO_VECTOR else 1
        self.beta_zero = bool(beta_zero)
        for operand, v, major in (("a", self.a_vector, a_major), ("b", self.b_vector, b_major)):
            why = config.copy_layout_problem(operand, v, major)
            if why is not None:
                raise ValueError(f"config {config.short()}: {why}")
        # K values per shared->register read of a fragment: 4 when A stays K-major (one 128-bit read per
        # row), else 1 (each K step reads 128-bit vectors along M and N).
        self.k_group = MICRO_VECTOR if config.a_smem_major == "k" else 1
        self.cta_tiler = (config.tile_m, config.tile_n, config.tile_k)

    # ------------------------------------------------------------------ host side
    # The entry points (__call__, call_split) are SplitKEntries'; both end here.
    def _launch(self, mA, mB, mC, mD, alpha, beta, mW, mS, stream):
        cfg = self.cfg
        sA_layout = self._smem_layout_a()
        sB_layout = self._smem_layout_b()
        tiled_copy_A = self._tiled_copy_a()
        tiled_copy_B = self._tiled_copy_b()
        tiled_mma = self._tiled_mma()

        grid = cta_grid(mD, self.cta_tiler, self.batched)
        if cutlass.const_expr(cfg.split_k > 1):
            grid = split_k_grid(grid, mA.shape[1], cfg.tile_k, cfg.split_k)
        self.kernel(
            mA, mB, mC, mD, mW, mS, alpha, beta, sA_layout, sB_layout, tiled_copy_A, tiled_copy_B, tiled_mma
        ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream, **self._occupancy())

    def _occupancy(self) -> dict:
        # The carveout is given explicitly (max shared memory, in percent) because with a min-CTAs hint and
        # no carveout the DSL queries the *current* GPU at compile time, which breaks GPU-less compiles.
        if self.cfg.min_ctas_per_sm == 1:
            return {}
        return {"min_blocks_per_mp": self.cfg.min_ctas_per_sm, "preferred_smem_carveout": 100}

    def _smem_layout_a(self):
        cfg = self.cfg
        bm, bk, stages = cfg.tile_m, cfg.tile_k, cfg.num_stages
        if cfg.a_smem_major == "m":
            # (BM, BK, PIPE), M contiguous, each K-row padded by A_M_MAJOR_PAD floats (see sgemm_config.py): the
            # transposing 4-byte writes hit 32 distinct banks and each K-row stays 16-byte aligned.
            row = cfg.a_row_floats
            return cute.make_layout((bm, bk, stages), stride=(1, row, row * bk))
        # (BM, BK, PIPE), K contiguous as in global memory, XOR-swizzled (see a_tile_swizzle).
        outer = cute.make_layout((bm, bk, stages), stride=(bk, 1, bm * bk))
        swizzle = a_tile_swizzle(cfg)
        if swizzle is None:
            return outer
        return cute.make_composed_layout(cute.make_swizzle(*swizzle), 0, outer)

    def _smem_layout_b(self):
        # (BN, BK, PIPE), N contiguous like a row-major global B. No padding needed for it: 16-byte (or
        # narrower) cp.async writes from consecutive threads fill consecutive addresses, and a warp's
        # fragment reads are consecutive 16-byte chunks of one K-row; both are conflict-free. A K-major B is
        # transposed on the way in: its K-rows are padded (B_K_MAJOR_PAD) like an M-major A stage's.
        cfg = self.cfg
        row = cfg.b_row_floats(self.b_k_major)
        return cute.make_layout((cfg.tile_n, cfg.tile_k, cfg.num_stages), stride=(1, row, row * cfg.tile_k))

    @staticmethod
    def _g2s_atom(vector: int):
        bits = 32 * vector
        # cp.async.cg (L2 only) exists for 16-byte copies; narrower copies must use .ca.
        if bits == 128:
            op = cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL)
        else:
            op = cute.nvgpu.cpasync.CopyG2SOp()
        return cute.make_copy_atom(op, cutlass.Float32, num_bits_per_copy=bits)

    def _tiled_copy_a(self):
        cfg = self.cfg
        if self.a_m_major:
            # M contiguous in global memory and in the stage: vectors along M, consecutive threads on
            # consecutive vectors (each K-row of the padded stage stays 16-byte aligned).
            along_m = cfg.tile_m // self.a_vector
            thr = cute.make_layout((along_m, cfg.num_threads // along_m), stride=(1, along_m))
            return cute.make_tiled_copy_tv(self._g2s_atom(self.a_vector), thr, cute.make_layout((self.a_vector, 1)))
        if cfg.a_smem_major == "m":
            # Threads walk K in runs of 8 (32 coalesced bytes per row of A), 4 rows per warp; with the padded
            # M-major stage, the warp's 32 four-byte writes land on banks 4*k + m: all distinct. The
            # (rows, 8) pattern repeats over the tile in M and in K; a K repeat is a static offset (8 floats)
            # from the same row, so each thread keeps only tile_m / rows row pointers (64-bit, lda is
            # dynamic) whatever tile_k is -- a K-fastest thread order over all of tile_k would need
            # tile_k/8 times more of them, and ptxas rebuilt them with IMAD.WIDE in the mainloop.
            rows = cfg.num_threads // A_M_MAJOR_K_RUN
            thr = cute.make_layout((rows, A_M_MAJOR_K_RUN), stride=(A_M_MAJOR_K_RUN, 1))
            return cute.make_tiled_copy_tv(self._g2s_atom(1), thr, cute.make_layout((1, 1)))
        along_k = cfg.tile_k // self.a_vector
        thr = cute.make_layout((cfg.num_threads // along_k, along_k), stride=(along_k, 1))
        val = cute.make_layout((1, self.a_vector))
        return cute.make_tiled_copy_tv(self._g2s_atom(self.a_vector), thr, val)

    def _tiled_copy_b(self):
        cfg = self.cfg
        if self.b_k_major:
            # K contiguous in global memory, N in the stage: the transposing copy of an M-major A stage
            # (_tiled_copy_a), over (N, K): K runs of 8 per row, num_threads / 8 rows.
            rows = cfg.num_threads // A_M_MAJOR_K_RUN
            thr = cute.make_layout((rows, A_M_MAJOR_K_RUN), stride=(A_M_MAJOR_K_RUN, 1))
            return cute.make_tiled_copy_tv(self._g2s_atom(1), thr, cute.make_layout((1, 1)))
        along_n = cfg.tile_n // self.b_vector
        thr = cute.make_layout((along_n, cfg.num_threads // along_n), stride=(1, along_n))
        val = cute.make_layout((self.b_vector, 1))
        return cute.make_tiled_copy_tv(self._g2s_atom(self.b_vector), thr, val)

    def _tiled_mma(self):
        cfg = self.cfg
        # threads_m x threads_n FFMA atoms. A warp is lanes_m x (32 / lanes_m) of them, N fastest inside the
        # warp and across warps (with the plain order that is simply the row-major thread grid). The
        # permutation gives each thread 4 consecutive rows and 4 consecutive columns per 4*threads tile, so
        # fragments move as 128-bit vectors; the tile repeats tile_m / (4*threads_m) times in M (and so in N).
        lanes_m = cfg.lanes_m
        lanes_n = 32 // lanes_m
        warps_n = cfg.threads_n // lanes_n
        atoms = cute.make_layout(
            ((lanes_m, cfg.threads_m // lanes_m), (lanes_n, warps_n), 1),
            stride=((lanes_n, 32 * warps_n), (1, 32), 0),
        )
        perm_m = cute.make_layout((cfg.threads_m, MICRO_VECTOR), stride=(MICRO_VECTOR, 1))
        perm_n = cute.make_layout((cfg.threads_n, MICRO_VECTOR), stride=(MICRO_VECTOR, 1))
        return cute.make_tiled_mma(
            cute.nvgpu.MmaUniversalOp(cutlass.Float32), atoms, permutation_mnk=(perm_m, perm_n, None)
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        sA_layout: cute.ComposedLayout | cute.Layout,
        sB_layout: cute.Layout,
        tiled_copy_A: cute.TiledCopy,
        tiled_copy_B: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
    ):
        cfg = self.cfg
        num_stages = cfg.num_stages
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.batched):  # grid.z: this CTA's matrices
            mA, mB, mC, mD = batch_matrices(
                (mA, mB, mC, mD), [4 * v for v in (self.a_vector, self.b_vector, self.c_vector, self.c_vector)])
        m_size, n_size, k_size, tile_coord = cta_tile_coord(mA, mB, self.cta_tiler, cfg.raster)

        # ---------------------------------------------------------------- CTA tiles
        # gA: (BM, BK, k)   gB: (BN, BK, k), K-shifted so the first k-tile is the partial one (see
        # operand_cta_tiles)   gD: (BM, BN); cA, cB, cD: the same shapes, holding (row, col) coordinates of
        # the global matrices (for predication only).
        # Split-K: this CTA walks k-tiles k_first .. k_first + k_count - 1 of the tile's walk (see _launch).
        k_first = None
        k_count = None
        if cutlass.const_expr(cfg.split_k > 1):
            k_first, k_count = split_k_slice(k_size, cfg.tile_k, cfg.split_k)
        gA, gB, cA, cB, gD, cD = operand_cta_tiles(
            mA, mB, self.cta_tiler, tile_coord, k_size, 4 * self.a_vector, 4 * self.b_vector, mD=mD,
            k_first=k_first,
        )

        smem = SmemAllocator()
        sA = smem.allocate_tensor(cutlass.Float32, sA_layout, 16)  # (BM, BK, PIPE)
        sB = smem.allocate_tensor(cutlass.Float32, sB_layout, 16)  # (BN, BK, PIPE)

        # ---------------------------------------------------------------- global->shared pipeline
        # Partitions tAgA/tAsA, tBgB/tBsB and their predicates: see CpAsyncPipeline. start() zeroes the ring
        # and puts tiles 0..S-2 in flight.
        pipe = CpAsyncPipeline.create(tidx, tiled_copy_A, tiled_copy_B, gA, sA, cA, gB, sB, cB, m_size, n_size,
                                      k_tile_count=k_count)
        k_tile_count = pipe.k_tile_count
        pipe.start(num_stages)

        # ---------------------------------------------------------------- MMA partitions
        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K, PIPE)
        tCsB = thr_mma.partition_B(sB)  # (MMA, MMA_N, MMA_K, PIPE)
        tCgD = thr_mma.partition_C(gD)  # (MMA, MMA_M, MMA_N)
        tCcD = thr_mma.partition_C(cD)  # (MMA, MMA_M, MMA_N) -> (m, n)
        # Register fragments, ordered like their shared-memory source (K fastest for a K-major A), so one
        # autovec copy of a k-group is a handful of 128-bit reads.
        tCrA = cute.make_fragment_like(tCsA[None, None, None, 0])  # (MMA, MMA_M, MMA_K)
        tCrB = cute.make_fragment_like(tCsB[None, None, None, 0])  # (MMA, MMA_N, MMA_K)
        tCrC = tiled_mma.make_fragment_C(tCgD)  # (MMA, MMA_M, MMA_N) accumulators
        tCrC.fill(0.0)
        acc = self._accumulator_views(tCrC)  # acc[m][n]: the (MMA) accumulators of micro-tile element (m, n)

        # ---------------------------------------------------------------- mainloop
        # The waits and the barrier are CpAsyncPipeline's (its docstring says why they sit where they do):
        # wait_next before the first fragment read of a k-tile, refill (tile t+S-1) right after it. Fragment
        # reads run one k-group ahead of the FFMAs (register double buffering), across the barrier too: the
        # first group of tile t+1 is read before the last group of tile t is multiplied.
        num_groups = cfg.tile_k // self.k_group
        smem_read = cutlass.Int32(0)
        smem_write = cutlass.Int32(num_stages - 1)
        k_tile_next = cutlass.Int32(num_stages - 1)
        tCsA_read = tCsA[None, None, None, 0]
        tCsB_read = tCsB[None, None, None, 0]
        pipe.wait_next(num_stages)
        self._load_group(tCsA_read, tCrA, 0)
        self._load_group(tCsB_read, tCrB, 0)

        for _ in range(k_tile_count):
            for group in cutlass.range_constexpr(num_groups):
                if group == num_groups - 1:
                    tCsA_read = tCsA[None, None, None, smem_read]
                    tCsB_read = tCsB[None, None, None, smem_read]
                    pipe.wait_next(num_stages)
                # Prefetch the next k-group's fragments (the next tile's first group at the last group).
                self._load_group(tCsA_read, tCrA, (group + 1) % num_groups)
                self._load_group(tCsB_read, tCrB, (group + 1) % num_groups)
                if group == 0:
                    k_tile_next, smem_write, smem_read = pipe.refill(k_tile_next, smem_write, smem_read, num_stages)
                # A loop the compiler unrolls, not the tracer: the trace holds one k-slice of FFMAs per group
                # instead of k_group of them (the trace was half of a cold compile), and the unrolled code
                # is the same (scripts/sass_fingerprint.py: identical SASS).
                for kk in cutlass.range(self.k_group, unroll_full=True):
                    k_block = group * self.k_group + kk
                    self._fma_k_slice(tiled_mma, acc, tCrA[None, None, k_block], tCrB[None, None, k_block])

        # No cp.async may still be writing shared memory when the CTA exits (only empty groups remain).
        cute.arch.cp_async_wait_group(0)

        # ---------------------------------------------------------------- epilogue
        if cutlass.const_expr(cfg.split_k > 1):
            sFlag = smem.allocate_array(cutlass.Int32, 4)  # [0]: this CTA finishes the tile
            if self._sum_slices(thr_mma, tidx, tCrC, tCcD, mW, mS, sFlag, tile_coord):
                self._epilogue(thr_mma, tCrC, tCgD, tCcD, mC, mD, alpha, beta, tile_coord)
        else:
            self._epilogue(thr_mma, tCrC, tCgD, tCcD, mC, mD, alpha, beta, tile_coord)

    @cute.jit
    def _sum_slices(self, thr_mma, tidx, tCrC, tCcD, mW, mS, sFlag, tile_coord):
        """Split-K (the module docstring): store this slice's accumulators
        to its workspace plane and count the arrival; in the tile's last slice, reload the accumulators as
        the sum of every plane in slice order and return True (the caller runs the epilogue). A tile wholly
        inside D moves its planes unpredicated; the sum reads them in groups (``kernel_common.sum_planes``)."""
        _, split, _ = cute.arch.block_idx()
        _, splits, _ = cute.arch.grid_dim()
        shape_mn = (mW.shape[0], mW.shape[1])
        whole = ((tile_coord[0] + 1) * self.cta_tiler[0] <= shape_mn[0]
                 and (tile_coord[1] + 1) * self.cta_tiler[1] <= shape_mn[1])
        values = cute.size(tCrC)
        tCgW = thr_mma.partition_C(cute.local_tile(mW[None, None, split], self.cta_tiler, tile_coord,
                                                   proj=(1, 1, None)))  # (MMA, MMA_M, MMA_N) FP32
        if whole:
            cute.autovec_copy(tCrC, tCgW)
        else:
            for i in cutlass.range(values, unroll_full=True):
                if cute.elem_less(tCcD[i], shape_mn):
                    tCgW[i] = tCrC[i]
        last = split_k_arrive(tidx, mS, sFlag)
        if last:
            sum_planes(tCrC, lambda s: thr_mma.partition_C(cute.local_tile(mW[None, None, s], self.cta_tiler,
                                                                            tile_coord, proj=(1, 1, None))),
                       splits, whole, tCcD, shape_mn)
        return last

    @staticmethod
    def _accumulator_views(tCrC):
        """The accumulators' views per micro-tile element, made once before the mainloop: every k-slice's
        FFMAs use the same ones, so the trace holds one slice per element instead of two per FFMA (the
        trace is most of a cold compile). Plain Python: the loops are over static extents."""
        return [[tCrC[None, m, n] for n in range(cute.size(tCrC, mode=[2]))]
                for m in range(cute.size(tCrC, mode=[1]))]

    @staticmethod
    def _fma_k_slice(tiled_mma, acc, tCrA_k, tCrB_k):
        """acc += outer(tCrA_k, tCrB_k), one FFMA per accumulator, rows in serpentine order: odd rows run N
        backwards, so each row's first FFMA reuses the B register the row before ended on (operand reuse
        cache). cute.gemm runs every row forwards; then a row's first FFMA reads A, B and C from the register
        file, and where all three sit in one bank the issue waits a cycle (1 FFMA in 16 in the 128x128 tile's
        SASS; ncu: 0.26 dispatch stalls per instruction against cuBLAS's 0.10). Each A and B fragment is
        sliced once per k-slice, not once per FFMA."""
        rows, cols = len(acc), len(acc[0])
        b = [tCrB_k[None, n] for n in range(cols)]
        for m in range(rows):
            a = tCrA_k[None, m]
            for j in range(cols):
                n = j if m % 2 == 0 else cols - 1 - j
                cute.gemm(tiled_mma, acc[m][n], a, b[n], acc[m][n])

    @cute.jit
    def _load_group(self, tCs, tCr, group: cutlass.Constexpr):
        """Shared->register copy of k-group ``group`` (k_group consecutive K values) of one stage."""
        src = cute.logical_divide(tCs, (None, None, self.k_group))  # (MMA, MMA_M|N, (KG, MMA_K/KG))
        dst = cute.logical_divide(tCr, (None, None, self.k_group))
        cute.autovec_copy(src[None, None, (None, group)], dst[None, None, (None, group)])

    @cute.jit
    def _epilogue(self, thr_mma, tCrC, tCgD, tCcD, mC, mD, alpha, beta, tile_coord):
        """D = alpha * acc + beta * C in FP32, one 4-column run at a time (one 128-bit access when aligned).

        With beta == 0 the C branch is not even compiled: C is never read, so NaN/Inf in C cannot leak.
        Runs are streamed (load C, combine, store) to keep register pressure at the mainloop's level.
        """
        shape_mn = (mD.shape[0], mD.shape[1])
        tCgC = tCgD
        if cutlass.const_expr(not self.beta_zero):
            gC = cute.local_tile(mC, self.cta_tiler, tile_coord, proj=(1, 1, None))
            tCgC = thr_mma.partition_C(gC)  # (MMA, MMA_M, MMA_N)
        if cutlass.const_expr(self.c_vector == MICRO_VECTOR):
            # A run is wholly inside or outside D (16-byte aligned rows, N % 4 == 0): one predicate per run.
            # Staging registers are ordered like gD (N fastest) so each run is one vector; autovec_copy
            # picks the width from the pointers' proven alignment.
            # NB: cute.copy with a 128-bit atom on these (1, 4) slices is *not* safe -- the atom is applied
            # per element of mode 0, reading past the run -- hence autovec_copy.
            # The N mode is split into (4, runs) explicitly: with one repeat per tile it is a flat 4.
            vD = cute.logical_divide(tCgD, (None, None, MICRO_VECTOR))  # (MMA, MMA_M, (4, MMA_N/4))
            vC = cute.logical_divide(tCgC, (None, None, MICRO_VECTOR))
            vAcc = cute.logical_divide(tCrC, (None, None, MICRO_VECTOR))
            vCoord = cute.logical_divide(tCcD, (None, None, MICRO_VECTOR))
            rOut = cute.make_fragment_like(vD[None, 0, (None, 0)])  # (MMA, 4)
            rC = cute.make_fragment_like(vD[None, 0, (None, 0)])  # (MMA, 4)
            for m in cutlass.range_constexpr(cute.size(tCrC, mode=[1])):
                for j in cutlass.range_constexpr(cute.size(tCrC, mode=[2]) // MICRO_VECTOR):
                    if cute.elem_less(vCoord[0, m, (0, j)], shape_mn):
                        acc = vAcc[None, m, (None, j)].load()
                        if cutlass.const_expr(self.beta_zero):
                            rOut.store(acc * alpha)
                        else:
                            cute.autovec_copy(vC[None, m, (None, j)], rC)
                            rOut.store(acc * alpha + rC.load() * beta)
                        cute.autovec_copy(rOut, vD[None, m, (None, j)])
        else:
            for i in cutlass.range(cute.size(tCrC), unroll_full=True):
                if cute.elem_less(tCcD[i], shape_mn):
                    if cutlass.const_expr(self.beta_zero):
                        tCgD[i] = tCrC[i] * alpha
                    else:
                        tCgD[i] = tCrC[i] * alpha + tCgC[i] * beta
