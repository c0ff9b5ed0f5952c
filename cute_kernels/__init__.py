"""cute-kernels: GPU kernels written in the CuTe Python DSL and in CUDA C++ (NVRTC), behind one registry.

    import cute_kernels as ck
    c = ck.sgemm(a, b)                  # float32 C = alpha * A @ B + beta * C, CuTe DSL
    h = ck.hgemm(a16, b16)              # float16/bfloat16, FP32 accumulate, tensor cores (mma.sync)
    y = ck.scan(x)                      # prefix sum along the last dim, like torch.cumsum(x, -1)
    ck.registry.list()                  # every (op, variant) with its configs, reference and baseline
"""

from . import registry
from .gemm.config import GemmConfig
from .gemm.sgemm import sgemm
from .gemm.hgemm import HgemmConfig, hgemm
from .prefix_sum import ScanConfig, scan

__all__ = ["registry", "sgemm", "GemmConfig", "hgemm", "HgemmConfig", "scan", "ScanConfig"]
__version__ = "0.1.0"
