"""conv3d: 3-D cross-correlation in FP32. Importing this package registers its two variants (``legacy_cuda/
conv3d.cu`` through NVRTC): ``direct`` (kernel sides up to 15, fully unrolled) and ``tiled`` (any side).

- ``problem``: Conv3dProblem, its padding, access widths and grid, the op's argument checks.
- ``config``: Conv3dConfig, the direct variant's sweep space and default heuristic.
- ``entry``: what both registry entries share (inputs, reference, baseline, work and traffic).
- ``direct``: the unrolled kernel's name expression, compile, launch and registry entry (SPEC).
- ``tiled``: the any-side kernel's config, predicate, launch and registry entry (TILED_SPEC).
- ``zoo``: the everyday shapes, each on its variant.
- ``grad``: the kernel-gradient kernel's launch and the input gradient's padding.
- ``reference``: the float64 reference, its error scale, and cuDNN's answer (the baseline).
- ``op``: the public ``conv3d``.
- ``planar``: ``conv2d`` and ``conv1d``, front ends that run images and signals on the same kernels.
"""

from .config import Conv3dConfig
from .direct import SPEC
from .tiled import TILED_SPEC, TiledConvConfig
from . import zoo  # noqa: F401  (registers the zoo, after both entries)
from .op import conv3d
from .planar import conv1d, conv2d
from .problem import Conv3dProblem

__all__ = ["conv3d", "conv2d", "conv1d", "Conv3dConfig", "TiledConvConfig", "Conv3dProblem", "SPEC", "TILED_SPEC"]
