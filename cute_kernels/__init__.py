"""cute-kernels: GPU kernels written in the CuTe Python DSL and in CUDA C++ (NVRTC), behind one registry.

    import cute_kernels as ck
    c = ck.sgemm(a, b)                  # float32 C = alpha * A @ B + beta * C, CuTe DSL
    c = ck.hgemm(a, b)                  # float16/bfloat16 tensor-core GEMM, FP32 accumulation, CuTe DSL
    o = ck.attention(q, k, v)           # fused softmax(q k^T / sqrt(d)) v, FP32 or FP16/BF16 (NVRTC)
    y = ck.conv3d(volume, kernel)       # valid 3-D cross-correlation, FP32 (NVRTC); ck.conv2d, ck.conv1d alike
    y = ck.scan(x)                      # prefix sum along the last dim, like torch.cumsum(x, -1)
    ck.registry.list()                  # every (op, variant) with its configs, reference and baseline

The ops' packages are ``cute_kernels.ops.<op>`` (docs/design.md has the layout).
"""

from . import ops, registry  # noqa: F401  (ops: registers every entry)
from .ops.attention import Flash3Config, FlashConfig, Fp32Config, Tf32x3Config
from .ops.conv3d import Conv3dConfig, TiledConvConfig
from .ops.gemm import GemmConfig, GemvConfig, HgemmConfig, HgemmSm90Config, Sm90Tf32x3Config, Tf32x3GemmConfig
from .ops.scan import ColumnScanConfig, ScanConfig
from .precompile import precompile, precompile_all

# The public ops: eager calls run the ops' Python entry points directly; under torch.compile they go
# through the torch.ops.cute_kernels.* custom ops (torch_ops.py) so the graph does not break.
from .torch_ops import attention, conv1d, conv2d, conv3d, hgemm, linear_scan, scan, sgemm
from .runtime import warm_up as _warm_up

# The backends' imports run beside torch's CUDA initialisation, not in the first kernel call.
_warm_up.schedule()

__all__ = ["registry", "sgemm", "GemmConfig", "Tf32x3GemmConfig", "Sm90Tf32x3Config", "hgemm", "HgemmConfig", "HgemmSm90Config", "GemvConfig", "attention", "FlashConfig", "Flash3Config", "Fp32Config", "Tf32x3Config",
           "conv3d", "conv2d", "conv1d", "Conv3dConfig", "TiledConvConfig", "scan", "linear_scan", "ScanConfig", "ColumnScanConfig", "precompile", "precompile_all"]
__version__ = "0.1.0"
