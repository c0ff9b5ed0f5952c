"""The Hopper 3xTF32 SGEMM (``legacy_cuda/sgemm_sm90.cu``: TMA, warpgroup MMAs on TF32, FP32-accurate):
``d = alpha * a @ b + beta * c`` for a row-major float32 ``a`` (M, K) and a row-major or column-major ``b``
(K, N) (``w.t()`` of a row-major weight), with 16-byte aligned rows, on sm_90.

Not a registry entry and not reachable from ``ck.sgemm``: it compiles for sm_90a without spills or
serialised wgmmas (tests/test_sgemm_sm90_cpu.py), and its GPU tests (tests/test_sgemm_sm90_gpu.py) and
timings have not run yet. The op takes it once they have (docs/notes/gemm.md, "SGEMM on tensor cores").
"""

from __future__ import annotations

import ctypes

import torch

from ...runtime import nvrtc, tma
from ...runtime.device import current_stream_handle, device_sm

__all__ = ["SOURCE", "name_expression", "why_not", "Sm90Tf32x3Launch", "prepare", "sgemm_sm90"]

SOURCE = "sgemm_sm90.cu"
STAGES = 4
BLOCK_M = BLOCK_N = 128
BLOCK_K = 32
THREADS = 384
# sgemm_sm90::Shared (four raw A and B stages, two pairs of split B tiles, eight mbarriers; 1024-byte
# aligned) and the 1024 bytes the kernel may skip to align it.
SHARED_BYTES = 3 * 4 * BLOCK_M * BLOCK_K * 4 + 1024 + 1024


def name_expression(b_k_major: bool) -> str:
    return f"sgemm_sm90::sgemm_tf32x3_kernel<{STAGES}, {'true' if b_k_major else 'false'}>"


def _b_k_major(b: torch.Tensor) -> bool:
    """Whether ``b`` (K, N) is column-major (K contiguous: ``w.t()``) rather than row-major."""
    return b.stride(0) == 1 and b.stride(1) != 1


class Params(ctypes.Structure):
    """sgemm_sm90::Params: the two tensor maps, the result's and C's pointers and row strides, the sizes, the
    tile grid and the scalars (padded to the C++ struct's 64-byte multiple; the kernel asserts the size)."""

    _fields_ = [("a_map", tma.TmaMapBytes), ("b_map", tma.TmaMapBytes), ("d", ctypes.c_void_p),
                ("c", ctypes.c_void_p), ("ldd", ctypes.c_int64), ("ldc", ctypes.c_int64), ("m", ctypes.c_int32),
                ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("tiles_m", ctypes.c_int32),
                ("tiles_n", ctypes.c_int32), ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
                ("_pad", ctypes.c_uint8 * 4)]


PARAMS_BYTES = 320


def _maps(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """(dims, byte strides, box) of A as (K, M, 1, 1) and B as (N, K, 1, 1), innermost first (a column-major B
    as (K, N, 1, 1))."""
    (m, k), n = a.shape, b.shape[1]
    a_row = a.stride(0) * 4
    a_map = ((k, m, 1, 1), (a_row, a_row * m, a_row * m), (BLOCK_K, BLOCK_M, 1, 1))
    if _b_k_major(b):
        b_row = b.stride(1) * 4
        return a_map, ((k, n, 1, 1), (b_row, b_row * n, b_row * n), (BLOCK_K, BLOCK_N, 1, 1))
    b_row = b.stride(0) * 4
    return a_map, ((n, k, 1, 1), (b_row, b_row * k, b_row * k), (32, BLOCK_K, 1, 1))


def why_not(a: torch.Tensor, b: torch.Tensor, device_sm: int, out: "torch.Tensor | None" = None,
            c: "torch.Tensor | None" = None) -> "str | None":
    """Why the kernel cannot run ``out = a @ b (+ c)`` (None: it can). Conservative at size-1 dims: a size-1
    dim's stride goes into the map as it is, so where TMA cannot take it the call is refused, never misread."""
    if device_sm != 90:
        return f"wgmma and TMA as compiled here need sm_90, not sm_{device_sm}"
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        return "float32 operands only"
    if a.dim() != 2 or b.dim() != 2 or a.stride(1) != 1 or not (b.stride(1) == 1 or b.stride(0) == 1):
        return "a row-major 2-D a and a row- or column-major 2-D b only"
    if a.shape[1] != b.shape[0]:
        return f"a is {tuple(a.shape)}, b {tuple(b.shape)}: K differs"
    if a.shape[0] == 0 or b.shape[1] == 0 or a.shape[1] == 0:
        return "M, N or K = 0 (an empty result, or with K = 0 beta * c: no product to run)"
    for name, t in (("out", out), ("c", c)):
        if t is not None and (t.dtype != torch.float32 or tuple(t.shape) != (a.shape[0], b.shape[1])
                              or t.stride(1) != 1):
            return f"{name}: a row-major float32 ({a.shape[0]}, {b.shape[1]}) matrix only"
    for name, t, (dims, strides, box) in zip("ab", (a, b), _maps(a, b)):
        reason = tma.why_not(t, dims, strides, box)
        if reason is not None:
            return f"{name}: {reason}"
    return None


class Sm90Tf32x3Launch:
    """The launch for every call with one problem's shapes and operand strides (its maps describe them): per
    call, the maps are encoded for the call's pointers (``tma.ParamMaps``), the result's and C's pointers,
    row strides and the scalars written."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        (m, k), n = a.shape, b.shape[1]
        self.device_index = a.device.index
        self.structure = (a.shape, a.stride(), b.shape, b.stride())
        kernel = nvrtc.kernel_for(SOURCE, name_expression(_b_k_major(b)), self.device_index, arch_specific=True)
        self.params = p = tma.aligned_instance(Params)
        a_map, b_map = _maps(a, b)
        self.maps = tma.ParamMaps(p, {"a": ("a_map", tma.TiledMap(a.dtype, *a_map)),
                                      "b": ("b_map", tma.TiledMap(b.dtype, *b_map))})
        p.m, p.n, p.k = m, n, k
        p.tiles_m, p.tiles_n = -(-m // BLOCK_M), -(-n // BLOCK_N)
        self.packed = nvrtc.PackedLaunch(kernel, (p.tiles_m * p.tiles_n, 1, 1), (THREADS, 1, 1), (p,),
                                         shared_mem=SHARED_BYTES)

    def __call__(self, a, b, c, out, alpha: float, beta: float) -> None:
        if (a.shape, a.stride(), b.shape, b.stride()) != self.structure:
            raise ValueError(f"a {tuple(a.shape)} {a.stride()}, b {tuple(b.shape)} {b.stride()}: not the shapes "
                             f"and strides this launch was prepared for")
        p = self.params
        with self.packed.lock:
            self.maps.point("a", a.data_ptr())
            self.maps.point("b", b.data_ptr())
            p.d, p.ldd = out.data_ptr(), out.stride(0)
            p.c, p.ldc = (c.data_ptr(), c.stride(0)) if c is not None else (0, 0)
            p.alpha, p.beta = alpha, beta if c is not None else 0.0
            self.packed.launch(current_stream_handle(self.device_index))


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, c: "torch.Tensor | None" = None) -> Sm90Tf32x3Launch:
    """The launch of ``out = a @ b (+ c)``, after ``why_not``; it serves every call with the shapes and
    strides of ``a`` and ``b``."""
    reason = why_not(a, b, device_sm(a), out, c)
    if reason is not None:
        raise ValueError(f"sgemm_sm90: {reason}")
    return Sm90Tf32x3Launch(a, b)


def sgemm_sm90(a: torch.Tensor, b: torch.Tensor, c: "torch.Tensor | None" = None, *, alpha: float = 1.0,
               beta: float = 0.0, out: "torch.Tensor | None" = None) -> torch.Tensor:
    """``alpha * a @ b + beta * c`` on this kernel, for tests and probes: ``out`` and ``c`` row-major (M, N)
    (``out`` may be ``c``); nothing is checked beyond what the kernel needs (``why_not``)."""
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32, device=a.device)
    read_c = c is not None and beta != 0.0
    prepare(a, b, out, c if read_c else None)(a, b, c if read_c else None, out, float(alpha),
                                              float(beta) if read_c else 0.0)
    return out
