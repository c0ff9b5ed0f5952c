"""conv3d: 3-D valid cross-correlation in FP32. Importing this package registers its one variant,
``direct`` (``legacy_cuda/conv3d.cu`` through NVRTC).

- ``problem``: Conv3dProblem, its access widths and grid, ``why_unsupported``, the op's argument checks.
- ``config``: Conv3dConfig, the sweep space and the default heuristic.
- ``direct``: the kernel's name expression, compile, launch and registry entry (SPEC).
- ``reference``: the float64 reference, its error scale, and cuDNN's answer (the baseline).
- ``op``: the public ``conv3d``.
- ``planar``: ``conv2d`` and ``conv1d``, front ends that run images and signals on the same kernels.
"""

from .config import Conv3dConfig
from .direct import SPEC
from .op import conv3d
from .planar import conv1d, conv2d
from .problem import Conv3dProblem

__all__ = ["conv3d", "conv2d", "conv1d", "Conv3dConfig", "Conv3dProblem", "SPEC"]
