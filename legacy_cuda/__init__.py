"""The CUDA C++ sources of the NVRTC ops (attention.cu, conv3d.cu, scan.cu, common.cuh): data, compiled at
run time by ``cute_kernels.runtime.nvrtc``."""
