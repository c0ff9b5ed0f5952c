"""GEMM kernels in the CuTe DSL. Importing this package registers them (see ``cute_kernels.registry``).

The op itself is ``cute_kernels.gemm.sgemm.sgemm``; it is deliberately not re-exported here, so that
``cute_kernels.gemm.sgemm`` stays the module (a same-named function would shadow it).
"""

from . import sgemm as _sgemm_module  # noqa: F401  (registers the "sgemm" KernelSpec)
from .config import GemmConfig
from .sgemm import GemmProblem

__all__ = ["GemmConfig", "GemmProblem"]
