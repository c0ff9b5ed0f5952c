"""One package per op: its problem and argument checks, configs, variants (each a registry entry) and
reference. Importing this package registers every entry.

- ``gemm``: ``sgemm`` (FP32 SIMT) and ``hgemm`` (FP16/BF16: ``sm80_mma`` and ``sm90_wgmma``), CuTe DSL.
- ``attention``: ``fused_fp32`` and ``flash2_mma``, CUDA C++ through NVRTC (``legacy_cuda/attention.cu``).
- ``conv3d``: ``direct``, CUDA C++ through NVRTC (``legacy_cuda/conv3d.cu``).
- ``scan``: ``lookback``, CUDA C++ through NVRTC (``legacy_cuda/scan.cu``).

The packages live here rather than directly under ``cute_kernels`` because the public ops take those
names there: ``cute_kernels.scan`` is the function, ``cute_kernels.ops.scan`` the package.
"""

from . import attention, conv3d, gemm, scan  # noqa: F401  (registers every entry)
