"""Tf32x3GemmConfig: the compile-time knobs of the 3xTF32 SGEMM (``sgemm_tf32x3_kernel``), validated in one
place. The knobs are the sm80-style HGEMM's (``WarpMmaConfig``: CTA tile, pipeline depth, warp grid, N
permutation, rasterization, split-K); what differs is the MMA (m16n8k8 TF32), the 4-byte elements, the
k-tile depths and the registers each thread holds.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .hgemm_sm80_config import MMA_M, MMA_N, WarpMmaConfig

__all__ = ["Tf32x3GemmConfig", "TF32_MMA_K"]

# mma.sync.aligned.m16n8k8 with TF32 operands (MmaTF32Op): a 16x8 block of D per 8-deep K step.
TF32_MMA_K = 8


@dataclasses.dataclass(frozen=True)
class Tf32x3GemmConfig(WarpMmaConfig):
    """Compile-time knobs of one 3xTF32 SGEMM binary: ``WarpMmaConfig``'s, with k-tiles 16 or 32 floats
    deep (64- or 128-byte rows of a K-major stage). ``swizzle`` and ``n_atoms`` mean what they mean for the
    HGEMM (the N permutation here only orders the atoms: fragments are loaded element by element)."""

    tile_n: int = 128  # the default is the ladder's largest rung: 128x128x32, 4 stages, 2x4 warps

    MMA_K: ClassVar[int] = TF32_MMA_K
    ELEMENT_BYTES: ClassVar[int] = 4
    TILE_K_CHOICES: ClassVar[tuple] = (16, 32)
    FRAGMENT_REGISTER_BUDGET: ClassVar[int] = 232

    def fragment_registers(self) -> int:
        """32-bit registers per thread the main loop keeps: the FP32 accumulators twice (the running sums
        and the partial sums of one k-tile, which the kernel folds into them), two k-blocks of A and B
        fragments as loaded (an m16k8 A fragment is 4 registers, an n8k8 B fragment 2) and one k-block's
        big and small TF32 halves."""
        accumulators = self.warp_tile_m * self.warp_tile_n // 32
        a_frag = (self.warp_tile_m // MMA_M) * 4
        b_frag = (self.warp_tile_n // MMA_N) * 2
        return 2 * accumulators + 2 * (a_frag + b_frag) + 2 * (a_frag + b_frag)
