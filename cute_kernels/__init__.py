"""cute-kernels: GPU kernels written in the CuTe Python DSL and in CUDA C++ (NVRTC), behind one registry.

    import cute_kernels as ck
    y = ck.scan(x)                      # prefix sum along the last dim, like torch.cumsum(x, -1)
    ck.registry.list()                  # every (op, variant) with its configs, reference and baseline
"""

from . import registry
from legacy_cuda.scan import ScanConfig, scan

__all__ = ["registry", "scan", "ScanConfig"]
__version__ = "0.1.0"
