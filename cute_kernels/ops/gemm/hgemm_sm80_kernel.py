"""The FP16/BF16 tensor-core GEMM kernel (CuTe DSL, sm80-style): D = alpha * A @ B + beta * C, FP32 accumulate.
The 3xTF32 SGEMM (``sgemm_tf32x3_kernel``) subclasses it for float32; what follows says fp16/bf16 where the
two differ, and that module lists what it changes.

Operands as the kernel sees them (CuTe's (M,K) x (N,K) convention):

- ``mA``: (M, K), K-major (strides (lda, 1): a row-major ``a``) or M-major (strides (1, lda): ``x.t()``).
- ``mB``: (N, K), N-major (strides (1, ldb): the row-major (K, N) ``b`` viewed transposed) or K-major
  (strides (ldb, 1): ``w.t()``).
  Each operand's shared-memory stages keep its global majorness (cp.async copies along the contiguous mode);
  the MMA wants both K-major in registers, so an MN-major operand's fragments come through the transposing
  ``ldmatrix`` and a K-major one's through the plain one.
- ``mC`` (read only when beta != 0) and ``mD`` (written): (M, N) with strides (ld, 1).
- Batched (``batched``): each has a third mode L with its own stride (0: one matrix for every batch);
  grid.z walks the batch and each CTA works on its batch's matrices (``kernel_common.batch_matrices``).

Data path per CTA (one tile_m x tile_n block of D): cp.async global->shared (16-byte vectors when aligned)
into a ring of ``num_stages`` swizzled buffers; ``ldmatrix`` shared->register copies made from the
TiledMMA, one k-block (16 deep) ahead of the MMAs; ``mma.sync.m16n8k16`` with FP32 accumulators; an
epilogue that stages the accumulators through shared memory (FP32) so each thread stores whole 16-byte rows
of D, computing ``alpha * acc + beta * C`` in FP32 and rounding once. All sizes and leading dimensions are
dynamic; tile shapes, pipeline depth, warp layout, copy widths (alignment), dtype and the beta == 0 branch
are compile-time.

Split-K (``config.split_k`` > 1): grid.y cuts each tile's K walk into slices of whole k-tiles, one CTA
each. A slice stages its FP32 tile as above, writes it to its plane of the workspace ``mW`` (M, N, S), and
counts itself in the tile's arrival counter ``mS`` (``kernel_common.split_k_arrive`` says why it waits
where it waits). The last slice to arrive sums the S planes in slice order (so the bits do not depend on
which slice was last), applies alpha and beta and writes D.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

from .hgemm_sm80_config import MMA_K, MMA_M, MMA_N, VECTOR_BYTES, HgemmConfig
from .kernel_common import (CpAsyncPipeline, SplitKEntries, batch_matrices, cta_grid, cta_tile_coord,
                            operand_cta_tiles, plane_group_depth, split_k_arrive, split_k_grid, split_k_slice)

__all__ = ["HgemmKernel", "operand_swizzle", "epilogue_swizzle", "DTYPES"]

DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}

# Bytes in one shared-memory wavefront: 32 banks of 4 bytes.
_LINE_BYTES = 128


def operand_swizzle(contiguous: int, element_bits: int = 16) -> "tuple[tuple[int, int], tuple[int, int, int]]":
    """The swizzled atom of an A or B pipeline stage: ((atom_contiguous, atom_rows), Swizzle(B, M, S)).

    Units: the swizzle counts *elements* (it is composed into the layout, not applied to a byte pointer).
    The atom is ``atom_rows`` = 8 rows of ``atom_contiguous`` elements along the operand's contiguous mode
    (K for A, N for B): the tile's contiguous extent up to one 128-byte line (64 fp16/bf16 elements), so
    tile_k = 32 gives 64-byte rows and tile_k = 64 (or any tile_n) 128-byte rows.

    M = log2(elements per 16 bytes): 16-byte chunks (one cp.async vector, one ldmatrix row) stay whole.
    S = log2(elements per 128-byte line) - M: the XOR source bits start at the line index.
    B = log2(16-byte chunks per atom row): chunk' = chunk XOR (line index mod 2^B).

    Why conflict-free: an 8-lane phase of ``ldmatrix`` (plain or .trans) reads the same 16-byte chunk
    column of 8 consecutive rows. With 128-byte rows those rows are 8 different lines, and the XOR sends
    them to 8 different chunks = all 32 banks once. With 64-byte rows, rows 2i and 2i+1 share a line (its
    two halves: different banks) and the XOR with i in 0..3 separates the four lines. The cp.async writes
    of 8 consecutive threads fill one whole 128-byte line (permuted inside it), so they are conflict-free
    too.
    """
    elems_per_chunk = VECTOR_BYTES * 8 // element_bits
    elems_per_line = _LINE_BYTES * 8 // element_bits
    atom_contiguous = min(contiguous, elems_per_line)
    chunks = atom_contiguous // elems_per_chunk
    base = int(math.log2(elems_per_chunk))
    shift = int(math.log2(elems_per_line)) - base
    return (atom_contiguous, 8), (int(math.log2(chunks)), base, shift)


def epilogue_swizzle(tile_n: int) -> "tuple[int, int, int]":
    """Swizzle(B, M, S) (units: FP32 *elements*, composed into the layout) of the row-major FP32 tile the
    epilogue stages: the 32-byte chunk index inside each 128-byte line (element bits [3, 5)) XOR the row
    index mod 4 (element bits [log2(tile_n), +2)).

    An MMA accumulator store writes 2 floats per thread; one half-warp covers rows r..r+3 x one 32-byte
    chunk, which land in the same banks without the swizzle (row strides are multiples of 128 bytes) and in
    four different 32-byte bank groups with it. 32-byte chunks stay whole, so the read-back of 8
    consecutive floats per thread is two 128-bit loads.
    """
    return (2, 3, int(math.log2(tile_n)) - 3)


class HgemmKernel(SplitKEntries):
    """One compiled-to-be HGEMM: a validated config plus the problem's compile-time properties.

    The 3xTF32 SGEMM kernel (``sgemm_tf32x3_kernel``) subclasses it: the same CTA tiles, pipeline and
    epilogue, with its own element type, shared-memory layouts, MMA and main loop (``_mainloop``).

    ``dtype``: "float16" or "bfloat16" (A, B, C and D). ``a_vector``, ``b_vector``, ``c_vector``: elements per
    global access of A (along K), B (along N) and C/D (along N): 8 means 16-byte cp.async and 128-bit
    loads/stores; 4 and 2 are 8- and 4-byte cp.async; 1 is a synchronous 2-byte copy (cp.async has nothing
    narrower than 4 bytes). The caller proves the alignment (base address, leading dimension and
    contiguous extent all multiples of the vector). ``beta_zero`` compiles the epilogue that never reads C.
    """

    CONFIG = HgemmConfig
    DTYPES = DTYPES

    def __init__(self, config: HgemmConfig, *, dtype: str, a_vector: int, b_vector: int, c_vector: int,
                 beta_zero: bool, batched: bool = False, a_major: str = "k", b_major: str = "n"):
        if not isinstance(config, self.CONFIG):
            raise TypeError(f"config: expected {self.CONFIG.__name__}, got {type(config).__name__}")
        if dtype not in self.DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(self.DTYPES)}, got {dtype!r}")
        widest = VECTOR_BYTES // config.ELEMENT_BYTES
        for name, v in (("a_vector", a_vector), ("b_vector", b_vector), ("c_vector", c_vector)):
            if v < 1 or v > widest or v & (v - 1):
                raise ValueError(f"{name}: expected a power of 2 up to {widest} elements, got {v!r}")
        if a_major not in ("k", "m") or b_major not in ("n", "k"):
            raise ValueError(f"a_major, b_major: expected 'k'/'m' and 'n'/'k', got {a_major!r}, {b_major!r}")
        for operand, v, major in (("a", a_vector, a_major), ("b", b_vector, b_major)):
            why = config.copy_layout_problem(operand, v, major)
            if why is not None:
                raise ValueError(f"config {config.short()}: {why}")
        if batched and config.split_k > 1:
            raise ValueError(f"config {config.short()}: split-K runs unbatched problems only")
        self.cfg = config
        self.batched = bool(batched)
        self.a_k_major = a_major == "k"
        self.b_k_major = b_major == "k"
        self.dtype = self.DTYPES[dtype]
        self.a_vector = a_vector
        self.b_vector = b_vector
        self.c_vector = c_vector
        self.beta_zero = bool(beta_zero)
        self.split_k = config.split_k
        self.cta_tiler = (config.tile_m, config.tile_n, config.tile_k)

    # ------------------------------------------------------------------ host side
    # The entry points (__call__, call_split) are SplitKEntries'; both end here.
    def _launch(self, mA, mB, mC, mD, alpha, beta, mW, mS, stream):
        cfg = self.cfg
        # (BM, BK, PIPE) and (BN, BK, PIPE), each contiguous along its global contiguous mode.
        sA_layout = self._operand_smem_layout(*((cfg.tile_k, cfg.tile_m) if self.a_k_major else (cfg.tile_m, cfg.tile_k)),
                                              k_contiguous=self.a_k_major)
        sB_layout = self._operand_smem_layout(*((cfg.tile_k, cfg.tile_n) if self.b_k_major else (cfg.tile_n, cfg.tile_k)),
                                              k_contiguous=self.b_k_major)
        sC_layout = cute.make_composed_layout(
            cute.make_swizzle(*epilogue_swizzle(cfg.tile_n)),
            0,
            cute.make_layout((cfg.tile_m, cfg.tile_n), stride=(cfg.tile_n, 1)),
        )  # (BM, BN) FP32
        tiled_copy_A = self._g2s_tiled_copy(self.a_vector, cfg.tile_k if self.a_k_major else cfg.tile_m,
                                            k_contiguous=self.a_k_major)
        tiled_copy_B = self._g2s_tiled_copy(self.b_vector, cfg.tile_k if self.b_k_major else cfg.tile_n,
                                            k_contiguous=self.b_k_major)
        tiled_copy_epi = self._epilogue_tiled_copy()
        tiled_mma = self._tiled_mma()

        grid = cta_grid(mD, self.cta_tiler, self.batched)
        if cutlass.const_expr(self.split_k > 1):
            grid = split_k_grid(grid, mA.shape[1], cfg.tile_k, self.split_k)
        self.kernel(
            mA, mB, mC, mD, mW, mS, alpha, beta, sA_layout, sB_layout, sC_layout,
            tiled_copy_A, tiled_copy_B, tiled_copy_epi, tiled_mma,
        ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream)

    def _operand_smem_layout(self, contiguous: int, other: int, *, k_contiguous: bool):
        """(BM, BK, PIPE) for A or (BN, BK, PIPE) for B, K contiguous or M/N contiguous, built by tiling the
        swizzled atom of :func:`operand_swizzle` over the stage and the ring of stages."""
        (atom_contiguous, atom_rows), swizzle = self._operand_atom(contiguous, k_contiguous=k_contiguous)
        if k_contiguous:
            atom = cute.make_layout((atom_rows, atom_contiguous), stride=(atom_contiguous, 1))
            shape = (other, contiguous, self.cfg.num_stages)
        else:
            atom = cute.make_layout((atom_contiguous, atom_rows), stride=(1, atom_contiguous))
            shape = (contiguous, other, self.cfg.num_stages)
        if not self.cfg.swizzle:  # the conflicted reference layout (HgemmConfig.swizzle): no XOR bits
            swizzle = (0, swizzle[1], swizzle[2])
        composed = cute.make_composed_layout(cute.make_swizzle(*swizzle), 0, atom)
        return cute.tile_to_shape(composed, shape, (0, 1, 2))

    def _operand_atom(self, contiguous: int, *, k_contiguous: bool):
        """((atom_contiguous, atom_rows), Swizzle(B, M, S)) of a stage contiguous along K or along M/N:
        :func:`operand_swizzle` for both (``ldmatrix`` reads 16-byte rows either way)."""
        return operand_swizzle(contiguous, self.dtype.width)

    def _g2s_tiled_copy(self, vector: int, contiguous: int, *, k_contiguous: bool):
        """Global->shared TiledCopy: ``vector``-element copies, min(contiguous/vector, threads) threads along
        the contiguous mode (consecutive threads on consecutive vectors: coalesced), the rest across."""
        bits = self.dtype.width * vector
        if bits < 32:
            op = cute.nvgpu.CopyUniversalOp()  # 2 bytes: below cp.async's 4-byte minimum, a plain ld/st
        elif bits == 128:
            op = cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL)  # L2 only
        else:
            op = cute.nvgpu.cpasync.CopyG2SOp()  # .cg exists for 16-byte copies only
        atom = cute.make_copy_atom(op, self.dtype, num_bits_per_copy=bits)
        threads = self.cfg.num_threads
        along = min(contiguous // vector, threads)
        rows = threads // along
        if k_contiguous:  # (M or N, K), K contiguous
            thr = cute.make_layout((rows, along), stride=(along, 1))
            val = cute.make_layout((1, vector))
        else:  # (M or N, K), M or N contiguous
            thr = cute.make_layout((along, rows), stride=(1, along))
            val = cute.make_layout((vector, 1))
        return cute.make_tiled_copy_tv(atom, thr, val)

    def _epilogue_tiled_copy(self):
        """Thread/value layout of the epilogue over the (BM, BN) tile: ``c_vector`` consecutive columns per
        thread, consecutive threads along N. Used only to partition (the copies are autovec copies)."""
        threads = self.cfg.num_threads
        along = min(self.cfg.tile_n // self.c_vector, threads)
        thr = cute.make_layout((threads // along, along), stride=(along, 1))
        val = cute.make_layout((1, self.c_vector))
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=32)
        return cute.make_tiled_copy_tv(atom, thr, val)

    def _tiled_mma(self):
        cfg = self.cfg
        op = cute.nvgpu.warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (MMA_M, MMA_N, MMA_K))
        # warps_m x warps_n warps; each step covers (16 * warps_m) x (8 * n_atoms * warps_n) x 16 and repeats
        # over the tile. The N permutation gives each warp n_atoms adjacent atoms per step, so a 4-matrix
        # transposing ldmatrix fills the B fragments of two atoms at once.
        permutation = (MMA_M * cfg.warps_m, MMA_N * cfg.n_atoms * cfg.warps_n, MMA_K)
        return cute.make_tiled_mma(op, cute.make_layout((cfg.warps_m, cfg.warps_n, 1)), permutation_mnk=permutation)

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
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
        tiled_copy_A: cute.TiledCopy,
        tiled_copy_B: cute.TiledCopy,
        tiled_copy_epi: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
    ):
        cfg = self.cfg
        num_stages = cfg.num_stages
        tidx, _, _ = cute.arch.thread_idx()
        elem_bytes = self.dtype.width // 8
        if cutlass.const_expr(self.batched):  # grid.z: this CTA's matrices
            mA, mB, mC, mD = batch_matrices(
                (mA, mB, mC, mD), [elem_bytes * v for v in (self.a_vector, self.b_vector, self.c_vector, self.c_vector)])
        m_size, n_size, k_size, tile_coord = cta_tile_coord(mA, mB, self.cta_tiler, cfg.raster)

        # ---------------------------------------------------------------- CTA tiles
        # gA: (BM, BK, k)   gB: (BN, BK, k), K-shifted so the first k-tile is the partial one; cA, cB: the
        # same shapes, holding (row, col) coordinates of the global matrices (see operand_cta_tiles).
        # Split-K: this CTA walks k-tiles k_first .. k_first + k_count - 1 of the tile's walk (see _launch).
        k_first = None
        k_count = None
        if cutlass.const_expr(self.split_k > 1):
            k_first, k_count = split_k_slice(k_size, cfg.tile_k, self.split_k)
        gA, gB, cA, cB = operand_cta_tiles(
            mA, mB, self.cta_tiler, tile_coord, k_size, elem_bytes * self.a_vector, elem_bytes * self.b_vector,
            k_first=k_first,
        )

        # One shared-memory block holds the pipeline ring and, after the main loop, the FP32 tile of the
        # epilogue (the larger of the two; HgemmConfig.tiles_bytes).
        smem = SmemAllocator()
        base = smem.allocate(cfg.tiles_bytes(), byte_alignment=1024)  # split-K's flag is allocated apart
        sA = cute.make_tensor(cute.recast_ptr(base, dtype=self.dtype), sA_layout)  # (BM, BK, PIPE)
        sB_ptr = cute.recast_ptr(base, dtype=self.dtype) + cute.cosize(sA_layout)
        sB = cute.make_tensor(sB_ptr, sB_layout)  # (BN, BK, PIPE)

        # ---------------------------------------------------------------- global->shared pipeline
        # Partitions tAgA/tAsA, tBgB/tBsB and their predicates: see CpAsyncPipeline. start() zeroes the ring
        # and puts tiles 0..S-2 in flight.
        pipe = CpAsyncPipeline.create(tidx, tiled_copy_A, tiled_copy_B, gA, sA, cA, gB, sB, cB, m_size, n_size,
                                      k_tile_count=k_count)
        pipe.start(num_stages)

        tCrC = self._mainloop(tidx, tiled_mma, sA, sB, pipe)  # (MMA, MMA_M, MMA_N) FP32 accumulators
        thr_mma = tiled_mma.get_slice(tidx)

        # ---------------------------------------------------------------- epilogue
        # The FP32 tile reuses the pipeline's shared memory: every cp.async (dummies included) must have
        # landed and every warp must be past its last ldmatrix before anyone overwrites it.
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        sC = cute.make_tensor(cute.recast_ptr(base, dtype=cutlass.Float32), sC_layout)  # (BM, BN) FP32
        tCsC = thr_mma.partition_C(sC)  # (MMA, MMA_M, MMA_N)
        cute.autovec_copy(tCrC, tCsC)
        cute.arch.sync_threads()
        if cutlass.const_expr(self.split_k > 1):
            sFlag = smem.allocate_array(cutlass.Int32, 4)  # [0]: this CTA finishes the tile
            self._finish_split(tiled_copy_epi, tidx, sC, sFlag, mC, mD, mW, mS, alpha, beta, tile_coord)
        else:
            self._store_tile(tiled_copy_epi, tidx, sC, mC, mD, alpha, beta, tile_coord)

    @cute.jit
    def _mainloop(self, tidx, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, pipe: CpAsyncPipeline):
        """The MMAs over this CTA's k-tiles, fed from the pipeline's ring (``sA``: (BM, BK, PIPE), ``sB``:
        (BN, BK, PIPE)) once ``pipe.start`` has run; returns the FP32 accumulators (MMA, MMA_M, MMA_N)."""
        cfg = self.cfg
        # ---------------------------------------------------------------- MMA and ldmatrix partitions
        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K, PIPE)
        tCsB = thr_mma.partition_B(sB)  # (MMA, MMA_N, MMA_K, PIPE)
        tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])  # (MMA, MMA_M, MMA_K)
        tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])  # (MMA, MMA_N, MMA_K)
        acc_shape = tiled_mma.partition_shape_C((cfg.tile_m, cfg.tile_n))
        tCrC = tiled_mma.make_fragment_C(acc_shape)  # (MMA, MMA_M, MMA_N) FP32 accumulators
        tCrC.fill(0.0)

        # ldmatrix copies built from the TiledMMA, so each thread receives exactly its MMA fragment: plain from
        # a K-major stage, transposed from an M- or N-major one (the MMA wants both operands K-major).
        s2r_A = cute.make_tiled_copy_A(
            cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(not self.a_k_major, 4), self.dtype), tiled_mma)
        s2r_B = cute.make_tiled_copy_B(
            cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(not self.b_k_major, 4), self.dtype), tiled_mma)
        thr_s2r_A = s2r_A.get_slice(tidx)
        thr_s2r_B = s2r_B.get_slice(tidx)
        tXsA = thr_s2r_A.partition_S(sA)  # (CPY, CPY_M, CPY_K, PIPE)
        tXrA = thr_s2r_A.retile(tCrA)  # (CPY, CPY_M, CPY_K): the same registers as tCrA
        tXsB = thr_s2r_B.partition_S(sB)  # (CPY, CPY_N, CPY_K, PIPE)
        tXrB = thr_s2r_B.retile(tCrB)  # (CPY, CPY_N, CPY_K)

        self._k_tile_loop(tiled_mma, pipe, s2r_A, s2r_B, tXsA, tXsB, tXrA, tXrB, (tCrA, tCrB, tCrC))
        return tCrC

    @cute.jit
    def _k_tile_loop(self, tiled_mma, pipe: CpAsyncPipeline, s2r_A, s2r_B, tXsA, tXsB, tXrA, tXrB, frags):
        """The main loop both warp-MMA kernels share: shared->register copies ``s2r_A``/``s2r_B`` of the
        stages (``tXsA``/``tXsB``: (CPY, CPY_M|N, CPY_K, PIPE)) into the fragments (``tXrA``/``tXrB``),
        and per k-block :meth:`_multiply` on ``frags`` (the kernel's own register tensors), bracketed per
        k-tile by :meth:`_begin_k_tile` and :meth:`_end_k_tile`.

        The waits and the barrier are CpAsyncPipeline's (its docstring says why they sit where they do):
        wait_next before the first fragment read of a k-tile, refill (tile t+S-1) right after it. Fragments
        are read one k-block ahead of the MMAs (register double buffering), across the barrier too: the
        first k-block of tile t+1 is loaded before the last k-block of tile t is multiplied."""
        num_stages = self.cfg.num_stages
        num_k_blocks = cute.size(tXrA, mode=[2])
        smem_read = cutlass.Int32(0)
        smem_write = cutlass.Int32(num_stages - 1)
        k_tile_next = cutlass.Int32(num_stages - 1)
        tXsA_read = tXsA[None, None, None, 0]
        tXsB_read = tXsB[None, None, None, 0]
        pipe.wait_next(num_stages)
        cute.copy(s2r_A, tXsA_read[None, None, 0], tXrA[None, None, 0])
        cute.copy(s2r_B, tXsB_read[None, None, 0], tXrB[None, None, 0])

        for _ in range(pipe.k_tile_count):
            self._begin_k_tile(frags)
            for k_block in cutlass.range_constexpr(num_k_blocks):
                if k_block == num_k_blocks - 1:
                    tXsA_read = tXsA[None, None, None, smem_read]
                    tXsB_read = tXsB[None, None, None, smem_read]
                    pipe.wait_next(num_stages)
                # Load the next k-block's fragments (the next tile's first one at the last k-block).
                k_next = (k_block + 1) % num_k_blocks
                cute.copy(s2r_A, tXsA_read[None, None, k_next], tXrA[None, None, k_next])
                cute.copy(s2r_B, tXsB_read[None, None, k_next], tXrB[None, None, k_next])
                if k_block == 0:
                    k_tile_next, smem_write, smem_read = pipe.refill(k_tile_next, smem_write, smem_read, num_stages)
                self._multiply(tiled_mma, frags, k_block)
            self._end_k_tile(frags)

    def _begin_k_tile(self, frags):
        """Before a k-tile's first k-block (nothing here: the HGEMM accumulates the whole K in place)."""

    def _end_k_tile(self, frags):
        """After a k-tile's last k-block (nothing here)."""

    def _multiply(self, tiled_mma, frags, k_block: int):
        """One k-block's MMAs: ``frags`` = (tCrA, tCrB, tCrC), accumulated in place."""
        tCrA, tCrB, tCrC = frags
        cute.gemm(tiled_mma, tCrC, tCrA[None, None, k_block], tCrB[None, None, k_block], tCrC)

    @cute.jit
    def _finish_split(self, tiled_copy_epi, tidx, sC, sFlag, mC, mD, mW, mS, alpha, beta, tile_coord):
        """Split-K epilogue (the module docstring): write this slice's
        FP32 tile to its workspace plane, count the arrival, and if it is the tile's last slice, sum the
        planes in slice order and store D as :meth:`_store_tile` does (:meth:`_write_vector`)."""
        _, split, _ = cute.arch.block_idx()
        _, splits, _ = cute.arch.grid_dim()
        thr_epi = tiled_copy_epi.get_slice(tidx)
        cD = cute.local_tile(cute.make_identity_tensor(mD.shape), self.cta_tiler, tile_coord, proj=(1, 1, None))
        tDcD = thr_epi.partition_D(cD)  # (CPY, CPY_M, CPY_N) -> (m, n)
        tDsC = thr_epi.partition_S(sC)  # (CPY, CPY_M, CPY_N) FP32
        shape_mn = (mD.shape[0], mD.shape[1])
        gW = cute.local_tile(mW[None, None, split], self.cta_tiler, tile_coord, proj=(1, 1, None))  # (BM, BN)
        tWgW = thr_epi.partition_D(gW)  # (CPY, CPY_M, CPY_N) FP32
        for m in cutlass.range_constexpr(cute.size(tWgW, mode=[1])):
            for n in cutlass.range_constexpr(cute.size(tWgW, mode=[2])):
                if cute.elem_less(tDcD[0, m, n], shape_mn):
                    cute.autovec_copy(tDsC[None, m, n], tWgW[None, m, n])
        if split_k_arrive(tidx, mS, sFlag):
            gD = cute.local_tile(mD, self.cta_tiler, tile_coord, proj=(1, 1, None))  # (BM, BN)
            tDgD = thr_epi.partition_D(gD)
            tDgC = tDgD
            if cutlass.const_expr(not self.beta_zero):
                tDgC = thr_epi.partition_D(cute.local_tile(mC, self.cta_tiler, tile_coord, proj=(1, 1, None)))
            # The planes are summed in slice order, this slice's own from its staged tile (the same values
            # as its plane). They are read in groups of ``depth``, every load of a group issued before any
            # of its adds: a load followed at once by its add stalls in-order issue for the load's latency,
            # and a plane at a time the sum paid one L2 round trip per slice, one after another.
            rSum = cute.make_fragment_like(tDsC)  # (CPY, CPY_M, CPY_N) FP32
            depth = plane_group_depth(cute.size(rSum))
            rParts = [cute.make_fragment_like(tDsC) for _ in range(depth)]
            rSum.fill(0.0)
            for j in cutlass.range_constexpr(depth):
                rParts[j].fill(0.0)  # vectors outside D are summed but never stored
            for first in range(0, splits, depth):
                for j in cutlass.range_constexpr(depth):
                    s = first + j
                    if s == split:
                        cute.autovec_copy(tDsC, rParts[j])
                    elif s < splits:
                        gWs = cute.local_tile(mW[None, None, s], self.cta_tiler, tile_coord, proj=(1, 1, None))
                        tWgWs = thr_epi.partition_D(gWs)
                        for m in cutlass.range_constexpr(cute.size(tWgWs, mode=[1])):
                            for n in cutlass.range_constexpr(cute.size(tWgWs, mode=[2])):
                                if cute.elem_less(tDcD[0, m, n], shape_mn):
                                    cute.autovec_copy(tWgWs[None, m, n], rParts[j][None, m, n])
                for j in cutlass.range_constexpr(depth):
                    if first + j < splits:
                        rSum.store(rSum.load() + rParts[j].load())
            rC = cute.make_fragment_like(tDgD[None, 0, 0])  # (CPY) D's dtype
            rOut = cute.make_fragment_like(tDgD[None, 0, 0])
            for m in cutlass.range_constexpr(cute.size(tDgD, mode=[1])):
                for n in cutlass.range_constexpr(cute.size(tDgD, mode=[2])):
                    if cute.elem_less(tDcD[0, m, n], shape_mn):
                        self._write_vector(rSum[None, m, n], tDgC[None, m, n], tDgD[None, m, n], rC, rOut,
                                           alpha, beta)

    @cute.jit
    def _store_tile(self, tiled_copy_epi, tidx, sC, mC, mD, alpha, beta, tile_coord):
        """D = alpha * acc + beta * C in FP32, rounded once to the output dtype; each thread moves
        ``c_vector`` consecutive columns at a time (one 128-bit load of C / store of D when aligned), read
        back from the staged FP32 tile. With beta == 0 the C branch is not compiled: C is never read, so
        NaN/Inf in C cannot leak. A vector is wholly inside or outside D (N and the leading dimension are
        multiples of c_vector): one predicate per vector."""
        gD = cute.local_tile(mD, self.cta_tiler, tile_coord, proj=(1, 1, None))  # (BM, BN)
        cD = cute.local_tile(cute.make_identity_tensor(mD.shape), self.cta_tiler, tile_coord, proj=(1, 1, None))
        thr_epi = tiled_copy_epi.get_slice(tidx)
        tDsC = thr_epi.partition_S(sC)  # (CPY, CPY_M, CPY_N) FP32
        tDgD = thr_epi.partition_D(gD)  # (CPY, CPY_M, CPY_N)
        tDcD = thr_epi.partition_D(cD)  # (CPY, CPY_M, CPY_N) -> (m, n)
        tDgC = tDgD
        if cutlass.const_expr(not self.beta_zero):
            gC = cute.local_tile(mC, self.cta_tiler, tile_coord, proj=(1, 1, None))
            tDgC = thr_epi.partition_D(gC)
        rAcc = cute.make_fragment_like(tDsC[None, 0, 0])  # (CPY) FP32
        rC = cute.make_fragment_like(tDgD[None, 0, 0])  # (CPY) D's dtype
        rOut = cute.make_fragment_like(tDgD[None, 0, 0])
        shape_mn = (mD.shape[0], mD.shape[1])
        for m in cutlass.range_constexpr(cute.size(tDgD, mode=[1])):
            for n in cutlass.range_constexpr(cute.size(tDgD, mode=[2])):
                if cute.elem_less(tDcD[0, m, n], shape_mn):
                    cute.autovec_copy(tDsC[None, m, n], rAcc)
                    self._write_vector(rAcc, tDgC[None, m, n], tDgD[None, m, n], rC, rOut, alpha, beta)

    @cute.jit
    def _write_vector(self, rAcc, tDgC_v, tDgD_v, rC, rOut, alpha, beta):
        """One vector of D from its FP32 accumulators ``rAcc``: alpha * acc (+ beta * C, read only when beta
        != 0: with beta == 0 the C branch is not compiled), rounded once to the output dtype. ``tDgC_v``,
        ``tDgD_v``: the vector's slices of C and D; ``rC``, ``rOut``: register staging."""
        if cutlass.const_expr(self.beta_zero):
            rOut.store((rAcc.load() * alpha).to(self.dtype))
        else:
            cute.autovec_copy(tDgC_v, rC)
            rOut.store((rAcc.load() * alpha + rC.load().to(cutlass.Float32) * beta).to(self.dtype))
        cute.autovec_copy(rOut, tDgD_v)
