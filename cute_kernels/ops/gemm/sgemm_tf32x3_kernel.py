"""The 3xTF32 SGEMM kernel (CuTe DSL, sm80-style): D = alpha * A @ B + beta * C in float32 on tensor cores,
as accurate as an FP32 FFMA GEMM.

Each float32 operand x is split into a TF32 "big" half (x rounded to 10 mantissa bits) and the rest,
small = x - big (exact in FP32, truncated to TF32 by the MMA that reads it); a product is then
big_a * big_b + big_a * small_b + small_a * big_b, three ``mma.sync.m16n8k8`` TF32 MMAs with FP32
accumulation. The dropped small_a * small_b is below 2^-22 of the product, under FP32's own rounding of
a K-long sum.

The tensor core adds each MMA's products into its accumulators rounding towards zero, so over a long K
those sums drift towards zero by about half an ulp per MMA (3 per k-block), far beyond an FFMA GEMM's
error (docs/notes/attention.md, "float32 on tensor cores: 3xTF32", found there first). The MMAs of one
k-tile therefore accumulate into a partial tile ``tCrP`` that starts from zero, and at the end of each
k-tile the partial is added into the running sums ``tCrC`` with FP32 adds, which round to nearest: the
truncation then acts on one k-tile's partial sum, whose signs vary from tile to tile, never on the
running total.

Everything else is the sm80-style HGEMM's (:class:`~.hgemm_sm80_kernel.HgemmKernel`: CTA tiles, the
cp.async pipeline and its waits, the shared-memory epilogue, split-K); its module docstring describes
them. What differs:

- Elements are float32 (16-byte copies are 4 elements), k-tiles 16 or 32 deep.
- Fragments come from shared memory element by element (``ldmatrix`` moves 16-bit elements), through a
  copy made from the TiledMMA. An m16n8k8 TF32 fragment has lane (g, t) = (lane / 4, lane % 4) read row
  g (+8) and column t (+4) of A's 16x8 tile, and column g, row t (+4) of B's 8x8 tile. The stages are
  swizzled so that these 32 reads fall in 32 different banks:
  K-contiguous stages (A row-major, B column-major) use :func:`~.hgemm_sm80_kernel.operand_swizzle` at
  32-bit elements: lanes read 4 consecutive floats of 8 different rows, whose 16-byte chunks the
  swizzle puts in 8 different chunk columns. M/N-contiguous stages (B row-major, A column-major) use
  :func:`mn_swizzle`: lanes read 8 consecutive floats of 4 consecutive k-rows, which the swizzle moves to
  4 different 8-float groups.
- Split in registers, per k-block, after the next k-block's fragments are requested (their shared-memory
  latency hides behind the split and the MMAs).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

from .hgemm_sm80_config import MMA_M, MMA_N
from .hgemm_sm80_kernel import HgemmKernel, operand_swizzle
from .kernel_common import CpAsyncPipeline
from .sgemm_tf32x3_config import TF32_MMA_K, Tf32x3GemmConfig

__all__ = ["Tf32x3GemmKernel", "mn_swizzle", "DTYPES"]

DTYPES = {"float32": cutlass.Float32}

# Floats in one 128-byte shared-memory line.
_LINE_FLOATS = 32
# The rounding of an FP32 bit pattern to TF32's 10 mantissa bits: add half of the dropped 13 bits' range,
# then clear them (round to nearest, ties away from zero: cvt.rna.tf32.f32).
_TF32_HALF = 0x1000
_TF32_MASK = -0x2000  # 0xffffe000 as an Int32


def mn_swizzle(contiguous: int) -> "tuple[tuple[int, int], tuple[int, int, int]]":
    """The swizzled atom of an M- or N-contiguous float32 stage: ((atom_contiguous, atom_rows),
    Swizzle(B, M, S)), in elements.

    The atom is 8 k-rows of ``atom_contiguous`` = min(contiguous, 32) floats (one 128-byte line each). The
    swizzle XORs the 8-float group index inside the line (element bits [3, 5)) with the k-row index mod 4
    (element bits [log2(atom_contiguous), +2)): a fragment read of 8 consecutive floats in each of 4
    consecutive k-rows then covers 4 different groups, all 32 banks. 16-byte chunks stay whole (cp.async
    vectors), and a row is still one line, so a warp's row of cp.async writes stays conflict-free.
    """
    atom_contiguous = min(contiguous, _LINE_FLOATS)
    return (atom_contiguous, 8), (2, 3, int(math.log2(atom_contiguous)) - 3)


class Tf32x3GemmKernel(HgemmKernel):
    """One compiled-to-be 3xTF32 SGEMM: a validated :class:`Tf32x3GemmConfig` plus the problem's
    compile-time properties (as :class:`HgemmKernel`; ``dtype`` is "float32", vectors up to 4 elements)."""

    CONFIG = Tf32x3GemmConfig
    DTYPES = DTYPES

    def _operand_atom(self, contiguous: int, *, k_contiguous: bool):
        if k_contiguous:
            return operand_swizzle(contiguous, 32)
        return mn_swizzle(contiguous)

    def _tiled_mma(self):
        cfg = self.cfg
        op = cute.nvgpu.warp.MmaTF32Op((MMA_M, MMA_N, TF32_MMA_K))
        permutation = (MMA_M * cfg.warps_m, MMA_N * cfg.n_atoms * cfg.warps_n, TF32_MMA_K)
        return cute.make_tiled_mma(op, cute.make_layout((cfg.warps_m, cfg.warps_n, 1)), permutation_mnk=permutation)

    @cute.jit
    def _split(self, x: cute.Tensor, big: cute.Tensor, small: cute.Tensor):
        """x = big + small for one k-block's fragments: ``x`` float32 as loaded, ``big`` and ``small`` the
        TF32 operands (bit views of the same registers). big is x rounded to TF32; small = x - big is exact
        in FP32 and the MMA reads it truncated to TF32 (at most 2^-21 of |x|, with either sign; rounding it
        first, 2^-22, made no difference to the GEMM's error over K, emulated on random and x x^T inputs,
        nor to float32 attention's, measured). Three
        instructions an element (IADD, LOP, FADD); the integer pipe, half the FP32 one's rate, is what the
        split costs, so nothing else goes here. Non-finite values: a NaN x gives a NaN small whatever big
        becomes (the rounding add carries the GPU's NaN 0x7fffffff into the sign: big = -0); an infinite x
        gives big = x and small = inf - inf = NaN; a finite magnitude from 0x7f7ff000 (about 3.4020e38,
        within 2^-12 of FLT_MAX) rounds to big = +-inf, small = -+inf. The sums they enter are NaN (inf - inf
        across the three products, or inf * 0), where an FFMA GEMM gives an infinity or, for those last
        finite values times small ones, a finite sum."""
        x_bits = cute.recast_tensor(x, cutlass.Int32)
        big_bits = cute.recast_tensor(big, cutlass.Int32)
        big_value = cute.recast_tensor(big, cutlass.Float32)
        small_value = cute.recast_tensor(small, cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(x)):
            big_bits[i] = (x_bits[i] + _TF32_HALF) & cutlass.Int32(_TF32_MASK)
            small_value[i] = x[i] - big_value[i]

    @cute.jit
    def _mainloop(self, tidx, tiled_mma: cute.TiledMma, sA: cute.Tensor, sB: cute.Tensor, pipe: CpAsyncPipeline):
        """The 3xTF32 MMAs over this CTA's k-tiles (``HgemmKernel._mainloop``'s contract), each k-tile's
        products summed in ``tCrP`` and folded into ``tCrC`` (the module docstring says why)."""
        cfg = self.cfg
        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)  # (MMA, MMA_M, MMA_K, PIPE) float32
        tCsB = thr_mma.partition_B(sB)  # (MMA, MMA_N, MMA_K, PIPE) float32
        # The operands as loaded (float32) and their TF32 halves, one k-block at a time.
        tCrA_x = cute.make_fragment_like(tiled_mma.make_fragment_A(tCsA[None, None, None, 0]), cutlass.Float32)
        tCrB_x = cute.make_fragment_like(tiled_mma.make_fragment_B(tCsB[None, None, None, 0]), cutlass.Float32)
        tCrA_big = tiled_mma.make_fragment_A(tCsA[None, None, 0, 0])  # (MMA, MMA_M) TF32
        tCrA_small = tiled_mma.make_fragment_A(tCsA[None, None, 0, 0])
        tCrB_big = tiled_mma.make_fragment_B(tCsB[None, None, 0, 0])  # (MMA, MMA_N) TF32
        tCrB_small = tiled_mma.make_fragment_B(tCsB[None, None, 0, 0])
        acc_shape = tiled_mma.partition_shape_C((cfg.tile_m, cfg.tile_n))
        tCrC = tiled_mma.make_fragment_C(acc_shape)  # (MMA, MMA_M, MMA_N) FP32 running sums
        tCrP = tiled_mma.make_fragment_C(acc_shape)  # (MMA, MMA_M, MMA_N) this k-tile's partial sums
        tCrC.fill(0.0)

        # Element-wise shared->register copies laid out by the TiledMMA: each thread reads its fragments.
        s2r_A = cute.make_tiled_copy_A(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32), tiled_mma)
        s2r_B = cute.make_tiled_copy_B(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32), tiled_mma)
        thr_s2r_A = s2r_A.get_slice(tidx)
        thr_s2r_B = s2r_B.get_slice(tidx)
        tXsA = thr_s2r_A.partition_S(sA)  # (CPY, CPY_M, CPY_K, PIPE)
        tXrA = thr_s2r_A.retile(tCrA_x)  # (CPY, CPY_M, CPY_K): the registers of tCrA_x
        tXsB = thr_s2r_B.partition_S(sB)  # (CPY, CPY_N, CPY_K, PIPE)
        tXrB = thr_s2r_B.retile(tCrB_x)  # (CPY, CPY_N, CPY_K)

        frags = (tCrA_x, tCrB_x, tCrA_big, tCrA_small, tCrB_big, tCrB_small, tCrC, tCrP)
        self._k_tile_loop(tiled_mma, pipe, s2r_A, s2r_B, tXsA, tXsB, tXrA, tXrB, frags)
        return tCrC

    def _begin_k_tile(self, frags):
        """Each k-tile's MMAs accumulate into a partial tile that starts from zero."""
        *_, tCrP = frags
        tCrP.fill(0.0)

    def _end_k_tile(self, frags):
        """The k-tile's partial sums are added into the running ones with FP32 adds (rounded to nearest)."""
        *_, tCrC, tCrP = frags
        tCrC.store(tCrC.load() + tCrP.load())

    def _multiply(self, tiled_mma, frags, k_block: int):
        """One k-block: its fragments split into TF32 halves (after the next k-block's reads are issued, so
        their latency hides behind the split), then the three products, small terms first so that the
        partial's truncated sums end on its largest products."""
        tCrA_x, tCrB_x, tCrA_big, tCrA_small, tCrB_big, tCrB_small, _, tCrP = frags
        self._split(tCrA_x[None, None, k_block], tCrA_big, tCrA_small)
        self._split(tCrB_x[None, None, k_block], tCrB_big, tCrB_small)
        cute.gemm(tiled_mma, tCrP, tCrA_small, tCrB_big, tCrP)
        cute.gemm(tiled_mma, tCrP, tCrA_big, tCrB_small, tCrP)
        cute.gemm(tiled_mma, tCrP, tCrA_big, tCrB_big, tCrP)
