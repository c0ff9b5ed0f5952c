"""The GEMM ops in the CuTe DSL: ``sgemm`` (FP32: ``simt_cpasync`` and ``tf32x3_mma``) and ``hgemm`` (FP16/BF16: ``sm80_mma`` and
``sm90_wgmma``), each with a ``gemv`` variant in CUDA C++ (``legacy_cuda/gemv.cu``, NVRTC) for a few rows
times a transposed weight; ``sgemm`` also has ``tf32x3_wgmma``, the Hopper 3xTF32 GEMM in CUDA C++
(``legacy_cuda/sgemm_sm90.cu``, NVRTC) for its large products. Importing this package registers every entry (see ``cute_kernels.registry``).

Layout, bottom up: ``problem`` (the problem and its checks), ``reference`` (the oracle's scales),
``ladder`` (the default-config heuristic), ``compile`` (compile keys, compiles, launches), ``spec`` (what
the registry entries share), ``op`` (the public ops' shared body); per variant a ``*_config``, a
``*_kernel`` and the variant module (``sgemm``, ``sgemm_tf32x3``, ``hgemm_sm80``, ``hgemm_sm90``; ``gemv`` is config, launch
and fields in one, as is ``sgemm_sm90``); ``hgemm`` is the op in front of the HGEMM variants.

The ops themselves are ``cute_kernels.ops.gemm.sgemm.sgemm`` and ``cute_kernels.ops.gemm.hgemm.hgemm``;
they are deliberately not re-exported here, so that ``sgemm`` and ``hgemm`` stay the modules (a same-named
function would shadow them).
"""

# The order registers each op's default variant first: sgemm's is tf32x3_mma (what the op runs for M and N
# above 32 on sm_80+), hgemm's sm80_mma.
from . import sgemm_tf32x3 as _sgemm_tf32x3  # noqa: F401
from . import sgemm as _sgemm  # noqa: F401
from . import hgemm_sm80 as _hgemm_sm80  # noqa: F401
from . import hgemm_sm90 as _hgemm_sm90  # noqa: F401
from . import hgemm as _hgemm  # noqa: F401
from .gemv import GemvConfig
from .hgemm_sm80_config import HgemmConfig
from .hgemm_sm90_config import HgemmSm90Config
from .problem import GemmProblem
from .sgemm_config import GemmConfig
from .sgemm_sm90 import Sm90Tf32x3Config
from .sgemm_tf32x3_config import Tf32x3GemmConfig

__all__ = ["GemmConfig", "GemvConfig", "HgemmConfig", "HgemmSm90Config", "Sm90Tf32x3Config", "Tf32x3GemmConfig",
           "GemmProblem"]
