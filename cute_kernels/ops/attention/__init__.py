"""Fused attention, ``softmax(q k^T * scale) v``: the kernels of ``legacy_cuda/attention.cu`` compiled with
NVRTC, their configs, their registry entries and the public ``attention`` op.

- ``fused_fp32``: FP32 arithmetic throughout (FFMA, never TF32); any d up to 256; splits the keys across
  CTAs (merged in the kernel) when the query tiles alone cannot fill the GPU.
- ``flash2_mma``: FP16/BF16 FlashAttention-2 on mma.sync tensor cores, FP32 softmax state and accumulators.
- ``flash2_tf32x3``: float32 on mma.sync TF32 tensor cores, FP32-accurate (each product as three TF32
  products, as torch's own float32 attention computes them); flash2_mma's kernel with float tiles.
- ``flash3_wgmma``: FP16/BF16 forward for sm_90 (``legacy_cuda/attention_sm90.cu``): TMA, wgmma, a producer
  warpgroup and two consumers; the default on sm_90 for the calls it takes (any d up to 256 with
  16-byte aligned rows and strides a tensor map describes; windows, sinks, the log-sum-exp), flash2_mma for
  the rest.

``problem`` holds what both share (the problem, the launch parameters, the argument checks), ``spec`` the
reference, baselines and the registry-entry skeleton, ``op`` the public op.
"""

# fused_fp32 registers first: an op's default variant is its first registered (keep this order).
from . import fused_fp32  # noqa: F401  (registers "fused_fp32")
from . import flash2_mma  # noqa: F401  (registers "flash2_mma")
from . import flash3_wgmma  # noqa: F401  (registers "flash3_wgmma")
from . import flash2_tf32x3  # noqa: F401  (registers "flash2_tf32x3")
from .flash3_wgmma import FLASH3_SPEC, Flash3Config
from .flash2_mma import FLASH_SPEC, FlashConfig
from .flash2_tf32x3 import TF32X3_SPEC, Tf32x3Config
from .fused_fp32 import FP32_SPEC, Fp32Config
from .op import attention
from .problem import AttentionProblem

__all__ = ["attention", "AttentionProblem", "Fp32Config", "FlashConfig", "Flash3Config", "FP32_SPEC", "FLASH_SPEC",
           "FLASH3_SPEC", "Tf32x3Config", "TF32X3_SPEC"]
