"""cute-kernels: GPU kernels written in the CuTe Python DSL and in CUDA C++ (NVRTC), behind one registry.

    import cute_kernels as ck
    c = ck.sgemm(a, b)                  # float32 C = alpha * A @ B + beta * C, CuTe DSL
    y = ck.scan(x)                      # prefix sum along the last dim, like torch.cumsum(x, -1)
    o = ck.conv3d(v, k)                 # valid 3-D cross-correlation, float32, kernel sides 1..7
    ck.registry.list()                  # every (op, variant) with its configs, reference and baseline
"""

from . import registry
from .gemm.config import GemmConfig
from .gemm.sgemm import sgemm
from .prefix_sum import ScanConfig, scan
from .conv3d_direct import Conv3dConfig, conv3d

__all__ = ["registry", "sgemm", "GemmConfig", "scan", "ScanConfig", "conv3d", "Conv3dConfig"]
__version__ = "0.1.0"
