"""The Hopper FP16/BF16 GEMM kernel (CuTe DSL, sm_90a): D = alpha * A @ B + beta * C, FP32 accumulate,
with TMA loads, warpgroup MMA (wgmma), a warp-specialised mbarrier pipeline and a persistent tile scheduler.

Operands as the kernel sees them (CuTe's (M,K) x (N,K) convention, as in the sm80-style kernel):

- ``mA``: (M, K), K-major (strides (lda, 1): a row-major ``a``) or M-major (strides (1, lda): ``x.t()``).
- ``mB``: (N, K), N-major (strides (1, ldb): a row-major (K, N) ``b`` viewed transposed) or K-major
  (strides (ldb, 1): ``w.t()``, as ``F.linear`` multiplies).
- ``mC`` (read only when beta != 0) and ``mD`` (written by TMA stores): (M, N) with strides (ld, 1), or
  (1, ld) with ``d_major="m"`` (a row-major result seen transposed: the op's swapped launch of a few rows
  times a transposed weight writes ``out^T`` in place).
- Batched (``batched``): each has a third mode L, the batch, with its own stride (0 for an operand that
  broadcasts over the batch); a tile's coordinates carry its batch.

The majorness of A and B is compile-time: TMA copies each operand as it lies into 128-byte-swizzled stages
of the same majorness, and wgmma reads 16-bit operands K-major or MN-major straight from shared memory
(the descriptors' major mode), so no layout costs a transpose.

CTA layout: warpgroup 0 produces (its first warp issues every TMA load; setmaxnreg gives its registers
away), warpgroups 1..W consume (wgmma on 64-row slices of the tile, FP32 accumulators in registers, then
the epilogue). The grid is persistent: ``min(cluster tiles, max_clusters)`` clusters, each walking cluster
tiles ``blockIdx.z, blockIdx.z + gridDim.z, ...`` in the banded order of :func:`~.kernel_common.tile_of_cta`;
producer and consumers walk the same sequence, so the producer runs up to ``num_stages`` k-tiles ahead,
across tile boundaries (the next tile's loads overlap this tile's epilogue).

Split-K (``config.split_k`` > 1, 1x1 clusters, unbatched): the walk's units are (tile, slice) pairs, slice
fastest; a unit's producer loads only the slice's k-tiles, and its consumers write their FP32 accumulators
to the slice's plane of the workspace ``mW`` (M, N, S) and count the slice in the tile's arrival counter
``mS``; the slice that arrives last sums the planes in slice order and runs the epilogue
(:meth:`HgemmSm90Kernel._finish_split` says why it waits where it waits).

Bounds: TMA zero-fills what lies outside A and B (the K tail, the M/N edges, whole tiles of a cluster
that overhang the matrix) and clips the D stores at the matrix edge; the C loads are predicated per
element. So any M, N, K >= 1 works, given what TMA needs: 16-byte aligned base addresses and row strides
(``hgemm_sm90.why_unsupported`` sends other problems to the sm80-style kernel).

SASS (cuobjdump -sass of the sm_90a cubin): the main loop is HGMMA.64xNx16.F32 (N = tile_n) fed by
UTMALDG loads, the epilogue STSM + UTMASTG; see tests/test_hgemm_sm90_cpu.py for the PTX-level check
(wgmma.mma_async, cp.async.bulk.tensor, setmaxnreg).
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cutlass.utils import hopper_helpers as sm90_utils

from .hgemm_sm90_config import (
    PRODUCER_REGISTERS,
    WARPGROUP_THREADS,
    HgemmSm90Config,
)
from .kernel_common import kernel_views, split_k_count, split_slices, sum_planes, tile_of_cta

__all__ = ["HgemmSm90Kernel", "DTYPES", "make_tiled_mma", "make_r2s_tiled_copy", "epilogue_smem_layout",
           "swizzled_smem_layout"]

DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}

# Named barrier 0 is __syncthreads; the consumers' epilogue barrier takes the next one.
_EPILOGUE_BARRIER_ID = 1

# CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT is a percentage of the unified L1/shared array.
_MAX_SHARED_CARVEOUT = 100


def operand_smem_layout(k_major: bool, dtype, rows: int, tile_k: int, stages: int):
    """The (rows, tile_k, PIPE) stages of an operand, K-major or MN-major as the operand lies in global
    memory: K-major in 128-byte atoms (tile_k is a multiple of 64 elements); MN-major in the widest atom its
    rows fill, 128 bytes from 64 rows, 64 bytes for a 32-row B tile (tile_n = 32)."""
    kinds = warpgroup.SmemLayoutAtomKind
    if k_major:
        return swizzled_smem_layout(kinds.K_SW128, dtype, (rows, tile_k, stages), (0, 1, 2))
    return swizzled_smem_layout(kinds.MN_SW128 if rows % 64 == 0 else kinds.MN_SW64, dtype,
                                (rows, tile_k, stages), (1, 0, 2))


def swizzled_smem_layout(kind, dtype, shape: tuple, order: tuple):
    """A (rows, cols, PIPE) shared-memory layout tiled from the wgmma/TMA swizzle atom ``kind``
    (``warpgroup.SmemLayoutAtomKind``: K_SW128 for K-major A, MN_SW128 for N-major B (MN_SW64 for a 32-column
    one), K_SW64 or K_SW128 for the row-major D sub-tile of 32 or 64 columns). The atom is a ComposedLayout in
    *elements*: its swizzle XORs element offsets (Swizzle<3,4,3> on 16-bit data = the 128-byte pattern that
    TMA writes and wgmma's descriptor expects; Swizzle<2,4,3> the 64-byte one).
    ``order`` is the mode order ``tile_to_shape`` fills: the contiguous mode first."""
    atom = warpgroup.make_smem_layout_atom(kind, dtype)
    return cute.tile_to_shape(atom, shape, order)


def make_tiled_mma(config: HgemmSm90Config, dtype, a_k_major: bool = True, b_k_major: bool = False):
    """The consumers' TiledMma: one m64nNk16 wgmma atom (N = tile_n, A and B read from shared memory in
    their majorness, FP32 accumulators) per consumer warpgroup, the warpgroups stacked along M; it repeats
    tile_m / (64 * consumer_warpgroups) times over the tile."""
    return sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        OperandMajorMode.K if a_k_major else OperandMajorMode.MN,
        OperandMajorMode.K if b_k_major else OperandMajorMode.MN,
        cutlass.Float32,
        (config.consumer_warpgroups, 1, 1),
        tiler_mn=(64, config.tile_n),
    )


def make_r2s_tiled_copy(tiled_mma, dtype, m_major: bool = False):
    """Accumulators (converted to 16 bits) -> a shared-memory sub-tile by stmatrix: 8x8 16-bit matrices, 4
    per instruction, each written as whole 16-byte rows -- of the row-major sub-tile, or with ``m_major``
    (stmatrix .trans) of the column-major one, so that either lies in shared memory as D lies in global
    memory and one TMA box stores it. Built from the TiledMma, so each thread's source values are exactly
    its accumulator fragment."""
    layout = LayoutEnum.COL_MAJOR if m_major else LayoutEnum.ROW_MAJOR
    store_atom = sm90_utils.get_smem_store_op(layout, dtype, cutlass.Float32)
    c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(m_major, 4), dtype)
    return cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))


def epilogue_smem_layout(config: HgemmSm90Config, dtype, m_major: bool = False):
    """The epi_stages ring of (EM, EN) D sub-tiles in shared memory, laid as D lies in global memory.
    Row-major: epi_n contiguous elements, 32 = 64 bytes taking the 64-byte swizzle and 64 = 128 bytes the
    128-byte one. Column-major (``m_major``): EM = 64 or 128 contiguous rows, whole 128-byte MN atoms."""
    kinds = warpgroup.SmemLayoutAtomKind
    shape = (config.epi_tile_m, config.epi_n, config.epi_stages)
    if m_major:  # as an M-major operand's stages: each 64-row atom column holds every EN column, then the next
        return swizzled_smem_layout(kinds.MN_SW128, dtype, shape, (1, 0, 2))
    return swizzled_smem_layout(kinds.K_SW64 if config.epi_n == 32 else kinds.K_SW128, dtype, shape, (0, 1, 2))


class HgemmSm90Kernel:
    """One compiled-to-be Hopper HGEMM: a validated config plus the problem's compile-time properties.

    ``dtype``: "float16" or "bfloat16" (A, B, C and D). ``beta_zero`` compiles the epilogue that never reads
    C. ``a_major``: "k" (row-major ``a``) or "m"; ``b_major``: "n" (row-major ``b``) or "k". ``batched``:
    the tensors have a batch mode L (third). The caller guarantees what TMA needs (16-byte aligned bases,
    leading dimensions and batch strides of A, B, C, D). A ``transposed`` config takes a call's tensors and
    runs D^T = B^T A^T: the majors given here are then those of that product (``GemmProblem.transposed``).
    """

    def __init__(self, config: HgemmSm90Config, *, dtype: str, beta_zero: bool, a_major: str = "k",
                 b_major: str = "n", batched: bool = False, d_major: str = "n"):
        if not isinstance(config, HgemmSm90Config):
            raise TypeError(f"config: expected HgemmSm90Config, got {type(config).__name__}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        if a_major not in ("k", "m") or b_major not in ("n", "k"):
            raise ValueError(f"a_major, b_major: expected 'k'/'m' and 'n'/'k', got {a_major!r}, {b_major!r}")
        if d_major not in ("n", "m") or (d_major == "m" and batched):
            raise ValueError(f"d_major: expected 'n', or 'm' for an unbatched problem, got {d_major!r}")
        self.cfg = config
        self.dtype = DTYPES[dtype]
        self.beta_zero = bool(beta_zero)
        self.a_k_major = a_major == "k"
        self.b_k_major = b_major == "k"
        self.d_m_major = d_major == "m"
        self.batched = bool(batched)
        self.cta_tiler = (config.tile_m, config.tile_n, config.tile_k)
        self.epi_tile = (config.epi_tile_m, config.epi_n)
        self.cluster_shape_mnk = (config.cluster_m, config.cluster_n, 1)
        self.num_consumer_threads = WARPGROUP_THREADS * config.consumer_warpgroups
        self.split_k = config.split_k
        if batched and config.split_k > 1:
            raise ValueError(f"config {config.short()}: split-K runs unbatched problems only")
        if batched and config.transposed:
            raise ValueError(f"config {config.short()}: a transposed config runs one product (no batch)")

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        max_clusters: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        mA, mB, mC, mD = kernel_views(mA, mB, mC, mD, self.batched, self.cfg.transposed)
        # Without split-K the workspace and counters are never touched: D stands in for both.
        self._launch(mA, mB, mC, mD, alpha, beta, max_clusters, mD, mD, stream)

    @cute.jit
    def call_split(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        max_clusters: cutlass.Int32,
        mW: cute.Tensor,
        mS: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """The split-K entry: ``mW`` (M, N, S) FP32 partial tiles, one plane per slice (S >= split_k),
        ``mS`` (tiles,) Int32 arrival counters, zero before the launch and left zero after it."""
        mA, mB, mC, mD = kernel_views(mA, mB, mC, mD, self.batched, self.cfg.transposed)
        self._launch(mA, mB, mC, mD, alpha, beta, max_clusters, mW, mS, stream)

    def _launch(self, mA, mB, mC, mD, alpha, beta, max_clusters, mW, mS, stream):
        cfg = self.cfg
        sA_layout = operand_smem_layout(self.a_k_major, self.dtype, cfg.tile_m, cfg.tile_k, cfg.num_stages)
        sB_layout = operand_smem_layout(self.b_k_major, self.dtype, cfg.tile_n, cfg.tile_k, cfg.num_stages)
        sD_layout = epilogue_smem_layout(cfg, self.dtype, self.d_m_major)

        # A is shared by the CTAs of a cluster row (same tile row, cluster_n of them), B by those of a
        # cluster column: each such CTA loads 1/cluster_n of the A tile and multicasts it to the others.
        tma_atom_a, tma_a = self._tma_load(mA, sA_layout, (cfg.tile_m, cfg.tile_k), cfg.cluster_n)
        tma_atom_b, tma_b = self._tma_load(mB, sB_layout, (cfg.tile_n, cfg.tile_k), cfg.cluster_m)
        tma_atom_d, tma_d = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(sD_layout, (None, None, 0)), self.epi_tile
        )
        tiled_mma = make_tiled_mma(cfg, self.dtype, self.a_k_major, self.b_k_major)

        tiles_m = (mD.shape[0] + cfg.tile_m - 1) // cfg.tile_m
        tiles_n = (mD.shape[1] + cfg.tile_n - 1) // cfg.tile_n
        cluster_tiles = ((tiles_m + cfg.cluster_m - 1) // cfg.cluster_m) * ((tiles_n + cfg.cluster_n - 1) // cfg.cluster_n)
        if cutlass.const_expr(self.batched):
            cluster_tiles = cluster_tiles * mD.shape[2]
        units = cluster_tiles
        if cutlass.const_expr(self.split_k > 1):
            units = cluster_tiles * split_slices((mA.shape[1] + cfg.tile_k - 1) // cfg.tile_k, self.split_k)[1]
        persistent_clusters = cutlass.min(units, max_clusters)

        self.kernel(
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_d, tma_d, mC, mW, mS, alpha, beta,
            tiled_mma, sA_layout, sB_layout, sD_layout,
        ).launch(
            grid=[cfg.cluster_m, cfg.cluster_n, persistent_clusters],
            block=[cfg.num_threads, 1, 1],
            cluster=list(self.cluster_shape_mnk),
            # ptxas sizes the launch's registers for this many resident CTAs (128 a thread for two); with
            # two, the function also asks for the whole carveout as shared memory so that both fit.
            min_blocks_per_mp=cfg.ctas_per_sm,
            preferred_smem_carveout=_MAX_SHARED_CARVEOUT if cfg.ctas_per_sm > 1 else None,
            stream=stream,
        )

    def _tma_load(self, tensor, smem_layout_staged, tile: tuple, multicast: int):
        """TMA load atom for one operand and its TMA coordinate tensor; multicast to ``multicast`` CTAs."""
        op = cpasync.CopyBulkTensorTileG2SMulticastOp() if multicast > 1 else cpasync.CopyBulkTensorTileG2SOp()
        smem_layout = cute.slice_(smem_layout_staged, (None, None, 0))
        return cpasync.make_tiled_tma_atom(op, tensor, smem_layout, tile, num_multicast=multicast)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        tma_a: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        tma_b: cute.Tensor,
        tma_atom_d: cute.CopyAtom,
        tma_d: cute.Tensor,
        mC: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        alpha: cutlass.Float32,
        beta: cutlass.Float32,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sD_layout: cute.ComposedLayout,
    ):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup_idx = cute.arch.make_warp_uniform(tidx // WARPGROUP_THREADS)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_d)

        # ---------------------------------------------------------------- cluster and multicast
        cta_layout_mnk = cute.make_layout(self.cluster_shape_mnk)
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)  # (m, n, 0) inside the cluster
        a_mcast_mask = 0
        b_mcast_mask = 0
        if cutlass.const_expr(cfg.cluster_n > 1):
            a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
        if cutlass.const_expr(cfg.cluster_m > 1):
            b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)

        # ---------------------------------------------------------------- shared memory and the pipeline
        smem = SmemAllocator()
        barriers = smem.allocate_array(cutlass.Int64, 2 * cfg.num_stages, byte_alignment=8)
        sA = smem.allocate_tensor(self.dtype, sA_layout.outer, 1024, swizzle=sA_layout.inner)  # (BM, BK, PIPE)
        sB = smem.allocate_tensor(self.dtype, sB_layout.outer, 1024, swizzle=sB_layout.inner)  # (BN, BK, PIPE)
        sD = smem.allocate_tensor(self.dtype, sD_layout.outer, 1024, swizzle=sD_layout.inner)  # (EM, EN, EPI)
        sFlag = sD  # split-K's arrival flag; without split-K nothing reads it
        if cutlass.const_expr(self.split_k > 1):
            sFlag = smem.allocate_array(cutlass.Int32, 4)  # [0]: this CTA finishes the tile

        # The producer/consumer ring (PipelineTmaAsync): stage s has a "full" mbarrier, armed by the
        # producer with the stage's byte count and completed by the TMA unit when both tiles have landed,
        # and an "empty" one on which each consumer warp arrives once the wgmmas reading the stage have
        # retired. With a cluster, a CTA's stage is also written by its partner's multicast, so every
        # consumer warp arrives on the empty barrier of each CTA that writes into its stages
        # (cluster_m + cluster_n - 1 of them, itself included) and the producer waits for all of them
        # before reusing a stage.
        multicast_peers = cfg.cluster_m + cfg.cluster_n - 1
        consumer_warps = self.num_consumer_threads // 32
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers,
            num_stages=cfg.num_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, multicast_peers * consumer_warps),
            tx_count=cfg.stage_bytes(),
            cta_layout_vmnk=cute.make_layout((1, *self.cluster_shape_mnk)),
            defer_sync=True,
        )
        # Barrier init must be visible to the whole cluster (partners arrive on our barriers and multicast
        # into our stages) before anyone uses it: fence + cluster arrive now, wait just before the roles split.
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mnk[:2], is_relaxed=True)

        # ---------------------------------------------------------------- TMA partitions
        # gA: (BM, BK, tiles_m, k[, L])  gB: (BN, BK, tiles_n, k[, L]) over the TMA coordinate tensors.
        tile_any = (None, None, None) if cutlass.const_expr(self.batched) else (None, None)
        gA = cute.local_tile(tma_a, (cfg.tile_m, cfg.tile_k), tile_any)
        gB = cute.local_tile(tma_b, (cfg.tile_n, cfg.tile_k), tile_any)
        # tAsA: (TMA, PIPE)  tAgA: (TMA, tiles_m, k[, L]); tBsB: (TMA, PIPE)  tBgB: (TMA, tiles_n, k[, L]).
        # With multicast each CTA's TMA box is its 1/cluster share of the tile, picked by its cluster coordinate.
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, cluster_coord[1], cute.make_layout(cfg.cluster_n),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, cluster_coord[0], cute.make_layout(cfg.cluster_m),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2),
        )
        k_tile_count = cute.size(gA, mode=[3])

        # ---------------------------------------------------------------- persistent tile order
        m_size = tma_d.shape[0]
        n_size = tma_d.shape[1]
        tiles_m = (m_size + cfg.tile_m - 1) // cfg.tile_m
        tiles_n = (n_size + cfg.tile_n - 1) // cfg.tile_n
        cluster_tiles_m = (tiles_m + cfg.cluster_m - 1) // cfg.cluster_m
        cluster_tiles_n = (tiles_n + cfg.cluster_n - 1) // cfg.cluster_n
        cluster_tiles = cluster_tiles_m * cluster_tiles_n  # per batch
        all_cluster_tiles = cluster_tiles
        if cutlass.const_expr(self.batched):
            all_cluster_tiles = cluster_tiles * tma_d.shape[2]
        _, _, first_unit = cute.arch.block_idx()
        _, _, persistent_clusters = cute.arch.grid_dim()
        # Units of the persistent walk: cluster tiles, or with split-K (tile, slice) pairs, slice fastest,
        # so the slices of one tile run side by side and finish close together.
        per_slice, slices = k_tile_count, 1
        if cutlass.const_expr(self.split_k > 1):
            per_slice, slices = split_slices(k_tile_count, self.split_k)
        all_units = all_cluster_tiles * slices

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mnk[:2])

        if warpgroup_idx == 0:
            # ------------------------------------------------------------ producer warpgroup
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == 0:
                # Producer: for every k-tile of every tile this cluster owns, wait until the stage is free
                # (all consumers of every CTA it feeds have released it), arm its full barrier with the
                # stage's bytes, and issue the two TMA loads that complete it. No wait on the data: the
                # loads of up to num_stages k-tiles are in flight at once, across tile boundaries.
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.num_stages)
                for unit in range(first_unit, all_units, persistent_clusters):
                    cluster_tile = unit // slices
                    k_first = (unit - cluster_tile * slices) * per_slice
                    k_count = cutlass.min(per_slice, k_tile_count - k_first)
                    tile_m_idx, tile_n_idx, batch = self._cta_tile(cluster_tile, cluster_tiles, cluster_tiles_m,
                                                                   cluster_tiles_n, cluster_coord)
                    tAgA_tile = self._k_walk(tAgA, tile_m_idx, batch)  # (TMA, k)
                    tBgB_tile = self._k_walk(tBgB, tile_n_idx, batch)  # (TMA, k)
                    for k_tile in range(k_first, k_first + k_count):
                        ab_pipeline.producer_acquire(state)
                        full_barrier = ab_pipeline.producer_get_barrier(state)
                        cute.copy(tma_atom_a, tAgA_tile[None, k_tile], tAsA[None, state.index],
                                  tma_bar_ptr=full_barrier, mcast_mask=a_mcast_mask)
                        cute.copy(tma_atom_b, tBgB_tile[None, k_tile], tBsB[None, state.index],
                                  tma_bar_ptr=full_barrier, mcast_mask=b_mcast_mask)
                        ab_pipeline.producer_commit(state)
                        state.advance()
                # Keep this CTA (and its barriers and stages) alive until every consumer it fed, its
                # cluster partner's included, has released the last stages.
                ab_pipeline.producer_tail(state)
        else:
            # ------------------------------------------------------------ consumer warpgroups
            cute.arch.setmaxregister_increase(cfg.consumer_registers())
            consumer_tidx = tidx - WARPGROUP_THREADS
            # wgmma operands are per warpgroup: slice the TiledMma by the warpgroup's first thread.
            thr_mma = tiled_mma.get_slice((warpgroup_idx - 1) * WARPGROUP_THREADS)
            tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K, PIPE)
            tCsB = thr_mma.partition_B(sB)  # (MMA, MMA_N, MMA_K, PIPE)
            tCrA = tiled_mma.make_fragment_A(tCsA)  # smem descriptors, same shape
            tCrB = tiled_mma.make_fragment_B(tCsB)
            acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.tile_m, cfg.tile_n)), cutlass.Float32)
            # Every wgmma accumulates (acc is zeroed per tile); set once, outside the loops, because the
            # TiledMma's field is a traced value that the loops would otherwise have to carry.
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            epilogue = _Epilogue.create(self, tiled_mma, consumer_tidx, acc, sD, tma_atom_d, tma_d, mC)

            read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.num_stages)
            release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.num_stages)
            for unit in range(first_unit, all_units, persistent_clusters):
                cluster_tile = unit // slices
                split = unit - cluster_tile * slices
                k_count = cutlass.min(per_slice, k_tile_count - split * per_slice)
                tile_m_idx, tile_n_idx, batch = self._cta_tile(cluster_tile, cluster_tiles, cluster_tiles_m,
                                                               cluster_tiles_n, cluster_coord)
                # The states come back (and are reassigned here) so the DSL carries them across tiles.
                read_state, release_state = self._mainloop(
                    tiled_mma, acc, tCrA, tCrB, ab_pipeline, read_state, release_state, k_count
                )
                if cutlass.const_expr(self.split_k > 1):
                    if self._finish_split(tiled_mma, consumer_tidx, acc, mW, mS, sFlag, epilogue.epi_barrier,
                                          split, slices, tile_m_idx, tile_n_idx, tiles_n, m_size, n_size):
                        epilogue.store_tile(self, acc, tile_m_idx, tile_n_idx, batch, warp_idx, alpha, beta,
                                            m_size, n_size)
                else:
                    epilogue.store_tile(self, acc, tile_m_idx, tile_n_idx, batch, warp_idx, alpha, beta,
                                        m_size, n_size)
            epilogue.drain()

    @cute.jit
    def _cta_tile(self, cluster_tile, cluster_tiles, cluster_tiles_m, cluster_tiles_n, cluster_coord):
        """(tile row, tile column, batch) of this CTA for a linear cluster-tile index: batch by batch (the
        batch is 0 unbatched), inside one the banded order of tile_of_cta over cluster tiles, then this
        CTA's place inside the cluster."""
        batch = cutlass.Int32(0)
        in_batch = cluster_tile
        if cutlass.const_expr(self.batched):
            batch = cluster_tile // cluster_tiles
            in_batch = cluster_tile - batch * cluster_tiles
        cluster_m_idx, cluster_n_idx = tile_of_cta(in_batch, cluster_tiles_m, cluster_tiles_n, self.cfg.raster)
        return (cluster_m_idx * self.cfg.cluster_m + cluster_coord[0],
                cluster_n_idx * self.cfg.cluster_n + cluster_coord[1], batch)

    def _k_walk(self, tXgX, tile_idx, batch):
        """(TMA, k): the k-tiles of one tile row of A (or column of B) in its batch."""
        if cutlass.const_expr(self.batched):
            return tXgX[None, tile_idx, None, batch]
        return tXgX[None, tile_idx, None]

    @cute.jit
    def _finish_split(self, tiled_mma, consumer_tidx, acc, mW, mS, sFlag, barrier, split, slices, tile_m_idx,
                      tile_n_idx, tiles_n, m_size, n_size):
        """Split-K after one slice's main loop: write the slice's FP32 tile (``acc``) to its workspace
        plane, count its arrival at the tile, and, in the slice that arrives last, replace ``acc`` by the
        sum of the planes in slice order (the same bits whichever slice is last). Returns whether this
        slice is the last, i.e. whether to run the epilogue.

        Why it waits where it waits: ``kernel_common.split_k_count`` over the consumer threads (their
        epilogue barrier): the barrier orders every consumer thread's plane stores before the first
        consumer thread's acq_rel atomic on the tile's counter, and the last slice's threads fence before
        they read the other planes. The producer warp takes no part: it only ever reads A and B."""
        shape_mn = (m_size, n_size)
        tile = (self.cfg.tile_m, self.cfg.tile_n)
        tile_coord = (tile_m_idx, tile_n_idx)
        thr_mma = tiled_mma.get_slice(consumer_tidx)
        # tCcW: (MMA, MMA_M, MMA_N) -> (m, n), the coordinates of this thread's accumulators.
        tCcW = thr_mma.partition_C(cute.local_tile(cute.make_identity_tensor(shape_mn), tile, tile_coord))
        tCgW = thr_mma.partition_C(cute.local_tile(mW[None, None, split], tile, tile_coord))
        values = cute.size(acc)
        # A tile inside the matrix stores and loads unpredicated, which lets the copy vectorise the column
        # pairs; an edge tile value by value under its bounds check.
        whole = (tile_m_idx + 1) * self.cfg.tile_m <= m_size and (tile_n_idx + 1) * self.cfg.tile_n <= n_size
        if whole:
            cute.autovec_copy(acc, tCgW)
        else:
            for v in cutlass.range_constexpr(values):
                if cute.elem_less(tCcW[v], shape_mn):
                    tCgW[v] = acc[v]
        last = split_k_count(consumer_tidx == 0, tile_m_idx * tiles_n + tile_n_idx, slices, mS, sFlag,
                             barrier.arrive_and_wait)
        if last:
            # The slice's own plane is read back like the others (split-K is limited to 64 accumulators per
            # thread, see HgemmSm90Config, and the group's buffers to kernel_common.PLANE_BUFFER_VALUES).
            sum_planes(acc, lambda s: thr_mma.partition_C(cute.local_tile(mW[None, None, s], tile, tile_coord)),
                       slices, whole, tCcW, shape_mn)
        return last

    @cute.jit
    def _mainloop(self, tiled_mma, acc, tCrA, tCrB, ab_pipeline, read_state, release_state, k_tile_count):
        """acc = A_tile @ B_tile over all k-tiles, consuming the ring.

        Why it waits where it waits: ``consumer_wait`` blocks until the stage's full barrier has flipped
        (TMA landed both tiles). wgmma is asynchronous and reads shared memory after it is issued, so a stage
        may be released only once the wgmmas that read it have retired: each k-tile's wgmmas form one
        commit group, and after issuing k-tile t, ``wait_group(1)`` retires k-tile t-1's group, whose stage
        is then released -- one k-tile of MMAs stays in flight behind the wait (the first k-tile has no
        predecessor, hence the one-tile prologue). ``wait_group(0)`` at the end retires the last group
        before the epilogue reads the accumulators, and releases the last stage.
        """
        num_k_blocks = cute.size(tCrA, mode=[2])
        acc.fill(0.0)
        # Order the zero fill (and the previous tile's epilogue reads) before wgmma touches acc.
        warpgroup.fence()
        ab_pipeline.consumer_wait(read_state)
        for k_block in cutlass.range_constexpr(num_k_blocks):
            cute.gemm(tiled_mma, acc, tCrA[None, None, k_block, read_state.index],
                      tCrB[None, None, k_block, read_state.index], acc)
        warpgroup.commit_group()
        read_state.advance()
        for _ in range(1, k_tile_count):
            ab_pipeline.consumer_wait(read_state)
            for k_block in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(tiled_mma, acc, tCrA[None, None, k_block, read_state.index],
                          tCrB[None, None, k_block, read_state.index], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            read_state.advance()
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
        return read_state, release_state


@dataclasses.dataclass(frozen=True)
class _Epilogue:
    """The consumers' epilogue: D = alpha * acc + beta * C in FP32, rounded once, stored by TMA.

    The tile is stored in (64 * consumer_warpgroups) x epi_n sub-tiles, M-major order of sub-tile rows and
    N-fastest inside a row -- the order in which the accumulator registers lie (each warpgroup's
    accumulators of one 64-row wgmma block run along N in 8-column groups; the next block follows), so
    sub-tile ``e`` is the register slice [e * V, (e + 1) * V) of the stmatrix-retiled accumulators
    (tests/test_hgemm_sm90_cpu.py checks this against the coordinates). Per sub-tile: registers ->
    stmatrix into an epi_stages ring of swizzled buffers -> fence (generic -> async proxy) -> consumer
    barrier -> one thread issues the TMA store -> it waits until at most epi_stages - 1 stores still read
    shared memory -> consumer barrier, after which the buffer the next sub-tile writes (last stored
    epi_stages sub-tiles back) may be overwritten.

    C (beta != 0 only) is read straight from global memory into the registers that hold the same
    elements of D (the stmatrix source partition of C), predicated per element at the M/N edges.
    """

    tiled_copy_r2s: cute.TiledCopy
    thr_copy_r2s: object
    tRS_rAcc: cute.Tensor  # (R2S, R2S_M, R2S_N): the accumulators in the stmatrix source order
    tRS_sD: cute.Tensor  # (R2S, R2S_M, R2S_N, EPI)
    sD_boxes: cute.Tensor  # ((EM, EN), EPI): one TMA box per buffer
    tma_atom_d: cute.CopyAtom
    tma_d: cute.Tensor
    mC: cute.Tensor
    store_pipeline: object
    epi_barrier: object

    @staticmethod
    def create(kernel: HgemmSm90Kernel, tiled_mma, consumer_tidx, acc, sD, tma_atom_d, tma_d, mC):
        tiled_copy_r2s = make_r2s_tiled_copy(tiled_mma, kernel.dtype, kernel.d_m_major)
        thr_copy_r2s = tiled_copy_r2s.get_slice(consumer_tidx)
        tRS_sD = thr_copy_r2s.partition_D(sD)  # (R2S, R2S_M, R2S_N, EPI)
        tRS_rAcc = tiled_copy_r2s.retile(acc)  # the accumulators in the copy's source order
        sD_boxes = cute.group_modes(sD, 0, 2)
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=kernel.cfg.epi_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, kernel.num_consumer_threads),
        )
        epi_barrier = pipeline.NamedBarrier(barrier_id=_EPILOGUE_BARRIER_ID, num_threads=kernel.num_consumer_threads)
        return _Epilogue(tiled_copy_r2s, thr_copy_r2s, tRS_rAcc, tRS_sD, sD_boxes, tma_atom_d, tma_d, mC,
                         store_pipeline, epi_barrier)

    @cute.jit
    def store_tile(self, kernel, acc, tile_m_idx, tile_n_idx, batch, warp_idx, alpha, beta, m_size, n_size):
        cfg = kernel.cfg
        tma_d = self.tma_d
        mC = self.mC
        if cutlass.const_expr(kernel.batched):  # this tile's matrices
            tma_d = tma_d[None, None, batch]
            mC = mC[None, None, batch]
        epi_m, epi_n = kernel.epi_tile
        subtiles_m = cfg.tile_m // epi_m
        subtiles_n = cfg.tile_n // epi_n
        tile_coord = (tile_m_idx, tile_n_idx)

        # gD_epi: ((EM, EN), (subtiles_m, subtiles_n)) of TMA coordinates; bSG_gD: (TMA, (subtiles_m, subtiles_n)).
        gD = cute.local_tile(tma_d, (cfg.tile_m, cfg.tile_n), tile_coord)
        gD_epi = cute.zipped_divide(gD, kernel.epi_tile)
        bSG_sD, bSG_gD = cpasync.tma_partition(
            self.tma_atom_d, 0, cute.make_layout(1), self.sD_boxes, gD_epi,
        )
        if cutlass.const_expr(not kernel.beta_zero):
            # The C tile and its coordinates, split into sub-tiles: (EM, EN, subtiles_m, subtiles_n).
            gC_epi = cute.flat_divide(cute.local_tile(mC, (cfg.tile_m, cfg.tile_n), tile_coord), kernel.epi_tile)
            cC_epi = cute.flat_divide(
                cute.local_tile(cute.make_identity_tensor((m_size, n_size)), (cfg.tile_m, cfg.tile_n), tile_coord),
                kernel.epi_tile,
            )

        # rAcc: one sub-tile's accumulators (FP32), rD: the 16-bit result, both in the stmatrix source layout.
        rD_shape = self.thr_copy_r2s.partition_S(cute.make_identity_tensor(kernel.epi_tile)).shape
        rAcc = cute.make_rmem_tensor(rD_shape, cutlass.Float32)
        rD = cute.make_rmem_tensor(rD_shape, kernel.dtype)
        values = cute.size(rAcc)
        for sub_m in cutlass.range_constexpr(subtiles_m):
            for sub_n in cutlass.range_constexpr(subtiles_n):
                subtile = sub_m * subtiles_n + sub_n
                buffer = subtile % cfg.epi_stages  # static: every tile has a multiple of epi_stages sub-tiles
                for v in cutlass.range_constexpr(values):
                    rAcc[v] = self.tRS_rAcc[subtile * values + v]
                if cutlass.const_expr(kernel.beta_zero):
                    rD.store((rAcc.load() * alpha).to(kernel.dtype))
                else:
                    rC = self._load_c(gC_epi[None, None, sub_m, sub_n], cC_epi[None, None, sub_m, sub_n],
                                      m_size, n_size, kernel.dtype)
                    rD.store((rAcc.load() * alpha + rC.load().to(cutlass.Float32) * beta).to(kernel.dtype))
                cute.copy(self.tiled_copy_r2s, rD, self.tRS_sD[None, None, None, buffer])
                # stmatrix writes through the generic proxy, TMA reads through the async one.
                cute.arch.fence_proxy("async.shared", space="cta")
                self.epi_barrier.arrive_and_wait()
                if warp_idx == WARPGROUP_THREADS // 32:  # the first consumer warp issues the store
                    cute.copy(self.tma_atom_d, bSG_sD[None, buffer], bSG_gD[None, (sub_m, sub_n)])
                    self.store_pipeline.producer_commit()
                    self.store_pipeline.producer_acquire()
                self.epi_barrier.arrive_and_wait()

    @cute.jit
    def _load_c(self, gC_sub, cC_sub, m_size, n_size, dtype):
        """This thread's elements of a C sub-tile (those its registers hold for D), 0 outside the matrix.
        A sub-tile wholly inside C (all but the edge ones) is loaded unpredicated, which lets the copy
        vectorise the column pairs; an edge sub-tile element by element under its bounds check."""
        tRS_gC = self.thr_copy_r2s.partition_S(gC_sub)
        tRS_cC = self.thr_copy_r2s.partition_S(cC_sub)
        rC = cute.make_rmem_tensor(tRS_gC.shape, dtype)
        first_row, first_col = cC_sub[0, 0]
        epi_m, epi_n = cute.size(cC_sub, mode=[0]), cute.size(cC_sub, mode=[1])
        if first_row + epi_m <= m_size and first_col + epi_n <= n_size:
            cute.autovec_copy(tRS_gC, rC)
        else:
            rC.fill(0.0)
            for v in cutlass.range_constexpr(cute.size(rC)):
                if cute.elem_less(tRS_cC[v], (m_size, n_size)):
                    rC[v] = tRS_gC[v]
        return rC

    def drain(self):
        """Wait until the last TMA stores have read shared memory before the CTA exits."""
        self.store_pipeline.producer_tail()
