"""The GEMV variant of ``hgemm`` and ``sgemm``: ``alpha * x @ w.t() + beta * c`` for a few rows of ``x``
(``F.linear`` in a decode step), CUDA C++ in ``legacy_cuda/gemv.cu`` compiled with NVRTC.

On such a call the whole cost is streaming the weight once; a GEMM tile computes 16-64 rows for one and,
without split-K, leaves most SMs idle. Two kernels read the weight (the problem's ``b``, a column-major
(K, N) view of a row-major (N, K) ``w``) in 16-byte loads: ``gemv_kernel`` gives each output column a warp
and sums FP32 products (any dtype, any alignment), ``gemv_mma_kernel`` gives 16 columns a CTA whose warps
split K and multiply on m16n8k16 tensor cores (16-bit, 16-byte rows). The op routes a call here when ``b``
is such a view, ``a`` is row-major, there is one product and M <= ``GEMV_MAX_ROWS`` (``takes``: 16-bit
rows past one only where they are 16-byte aligned); everything else stays on the tile kernels.
"""
from __future__ import annotations

import ctypes
import dataclasses

from ...runtime import device as _device
from ...runtime import nvrtc
from ...runtime.config_fields import check_choice, check_fields
from .problem import GemmProblem, widest_vector

__all__ = ["GemvConfig", "GEMV_MAX_ROWS", "SOURCE", "takes", "why_unsupported", "default_config", "candidates",
           "name_expression", "columns_per_cta", "compile", "prepare", "GemvLaunch", "gemv_fields"]

SOURCE = "gemv.cu"
# Rows of x one launch takes (gemv_kernel's kRows: 1, 2, 4 or 8; the tensor-core kernel's 8 columns of B).
GEMV_MAX_ROWS = 8
_CPP_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
_ROWS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Compile-time knobs of the GEMV kernel.

    - ``tensor_cores``: 16-bit inputs with 16-byte rows run ``gemv_mma_kernel`` (16 output columns per CTA
      as one m16n8k16 product per 16 k, the warps splitting K); otherwise, and for float32 or unaligned
      rows always, ``gemv_kernel`` (one output column per warp, FP32 FMAs).
    - ``warps``: warps per CTA.
    - ``unroll``: 16-byte chunks of ``w`` each lane has in flight before its first product.
    """

    tensor_cores: bool = True
    warps: int = 8
    unroll: int = 4

    def __post_init__(self) -> None:
        check_fields(self)
        check_choice(self, "warps", (4, 8, 16))
        check_choice(self, "unroll", (1, 2, 4, 8))

    def short(self) -> str:
        """Compact name for tables: mma_w8_u4 (simt_... without tensor cores)."""
        return f"{'mma' if self.tensor_cores else 'simt'}_w{self.warps}_u{self.unroll}"


def _vector(problem: GemmProblem) -> int:
    """Elements per access: 16 bytes where x's and w's rows allow it (the alignments count base, leading
    dimension and K), else 1."""
    widest = widest_vector(problem.dtype)
    return widest if problem.a_align == widest and problem.b_align == widest else 1


def _rows(problem: GemmProblem) -> int:
    return next(r for r in _ROWS if r >= problem.m)


def why_unsupported(config: GemvConfig, problem: GemmProblem) -> str | None:
    if problem.dtype not in _CPP_TYPES:
        return f"dtype {problem.dtype} is not float32, float16 or bfloat16"
    if problem.batch != 1:
        return f"a batch of {problem.batch} products (the GEMV variant runs one)"
    if problem.a_major != "k":
        return "a must be row-major (K contiguous)"
    if problem.b_major != "k":
        return "b must be a column-major (K, N) view of a row-major (N, K) weight (w.t())"
    if not 1 <= problem.m <= GEMV_MAX_ROWS:
        return f"M={problem.m} rows (the GEMV variant takes 1 to {GEMV_MAX_ROWS})"
    if -(-problem.n // columns_per_cta(config, problem)) > 2 ** 31 - 1:
        return "more CTAs than one launch's grid holds"
    return None


def takes(problem: GemmProblem) -> bool:
    """Whether the op runs ``problem`` on the GEMV variant: wherever its default config supports it, but
    16-bit rows past one only on the tensor-core kernel (16-byte rows). As measured on the H200 against
    cuBLAS and the swapped GEMM (docs/benchmarks-gemm-models.md): float32 1-8 rows 0.94-1.47x cuBLAS (the
    swapped GEMM 0.8x at 16); the FP32-FMA kernel's 16-bit rows past one (every row re-reads and converts
    its chunk of x per chunk of w) 0.6x at 4 rows and 0.3-0.4x at 8, so unaligned 16-bit rows past one
    stay on the swapped GEMM."""
    if why_unsupported(default_config(problem), problem) is not None:
        return False
    return problem.dtype == "float32" or problem.m == 1 or _vector(problem) == 8


# The tensor-core kernel's split of K: about this many warps in the whole grid (~31 per SM of the H200's
# 132), so that enough 16-byte loads are in flight to stream the weight. Measured on the H200 against
# cuBLAS (fp16, weights rotated past L2): N = 4096 (256 CTAs) ran best on 16 warps (11.5-12.4 us against
# 14.7-15.5 for M = 2-8), N = 14336 (896 CTAs) on 4 (32.4-33.4 against 32.9-33.3); one k-block in flight per
# warp beat 2-8 at both. One row runs fastest on the FP32-FMA kernel (9.6 us against cuBLAS's 14.7 at N =
# 4096; 33.7 against 33.2 at 14336).
MMA_GRID_WARPS = 4096


def default_config(problem: GemmProblem) -> GemvConfig:
    if problem.dtype == "float32" or _vector(problem) == 1 or problem.m == 1:
        return GemvConfig(tensor_cores=False, warps=8, unroll=4)
    ctas = -(-problem.n // 16)
    warps = 16
    while warps > 4 and ctas * warps > MMA_GRID_WARPS:
        warps //= 2
    return GemvConfig(tensor_cores=True, warps=warps, unroll=1)


def candidates() -> list[GemvConfig]:
    return [GemvConfig(tc, w, u) for tc in (True, False) for w in (4, 8, 16) for u in (1, 2, 4, 8)]


def _on_tensor_cores(config: GemvConfig, problem: GemmProblem) -> bool:
    return config.tensor_cores and problem.dtype != "float32" and _vector(problem) == 8


def columns_per_cta(config: GemvConfig, problem: GemmProblem) -> int:
    return 16 if _on_tensor_cores(config, problem) else config.warps


def name_expression(config: GemvConfig, problem: GemmProblem) -> str:
    cpp = _CPP_TYPES[problem.dtype]
    if _on_tensor_cores(config, problem):
        return f"gemv::gemv_mma_kernel<{cpp}, {config.warps}, {config.unroll}>"
    return f"gemv::gemv_kernel<{cpp}, {_rows(problem)}, {config.warps}, {_vector(problem)}, {config.unroll}>"


compile = nvrtc.checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001


class Params(ctypes.Structure):
    """gemv.cu's ``gemv::Params`` (88 bytes; the kernel static_asserts the size)."""

    _fields_ = ([(name, ctypes.c_void_p) for name in ("x", "w", "c", "out")]
                + [(name, ctypes.c_int64) for name in ("x_ld", "w_ld", "c_ld", "out_ld")]
                + [(name, ctypes.c_int32) for name in ("m", "n", "k")]
                + [("alpha", ctypes.c_float), ("beta", ctypes.c_float)])


class GemvLaunch:
    """The launch of one call structure: ``launch(a, b, c, out, alpha, beta)`` (the GEMM plans' signature)
    writes this call's pointers, strides and scalars into the packed ``Params`` and enqueues the kernel on
    torch's current stream of the tensors' device. ``a`` (M, K) row-major, ``b`` (K, N) column-major (``b.t()``
    is the weight), ``out`` and ``c`` (read when beta != 0) (M, N) row-major."""

    def __init__(self, packed: nvrtc.PackedLaunch, params: Params, columns: int, device_index: int):
        self.packed, self.params, self.columns, self.device_index = packed, params, columns, device_index

    def __call__(self, a, b, c, out, alpha, beta) -> None:
        p = self.params
        m, n = out.shape
        stream = _device.current_stream_handle(self.device_index)
        with self.packed.lock:
            p.x, p.w, p.out = a.data_ptr(), b.data_ptr(), out.data_ptr()
            p.x_ld, p.w_ld, p.out_ld = a.stride(0), b.stride(1), out.stride(0)
            p.c, p.c_ld = (0, 0) if c is None or beta == 0.0 else (c.data_ptr(), c.stride(0))
            p.m, p.n, p.k = m, n, a.shape[1]
            p.alpha, p.beta = alpha, beta
            self.packed.launch(stream, (-(-n // self.columns), 1, 1))


def prepare(config: GemvConfig, problem: GemmProblem, inputs: dict, out) -> GemvLaunch:
    """The launch of ``config`` for ``problem`` on ``out``'s device (the kernel compiled and loaded on first
    use); the caller validates the tensors it is given against ``problem``."""
    reason = why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    device_index = out.device.index
    kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device_index)
    params = Params()
    packed = nvrtc.PackedLaunch(kernel, (1, 1, 1), (32 * config.warps, 1, 1), (params,))
    return GemvLaunch(packed, params, columns_per_cta(config, problem), device_index)


def gemv_fields(standard_problems) -> dict:
    """The registry fields the ``hgemm`` and ``sgemm`` GEMV entries share (each op adds its dtypes,
    baseline and oracle)."""
    return dict(variant="gemv", backend="nvrtc", config_cls=GemvConfig, default_config=default_config,
                candidates=candidates, why_unsupported=why_unsupported, compile=compile, prepare=prepare,
                standard_problems=standard_problems, sources=(SOURCE,), bound="bandwidth", shape_bucket=None,
                sweep_axes=(("tensor_cores", "warps"), ("unroll",)),
                description="GEMV for a few rows times a transposed weight (x @ w.t(), M <= 8): the weight streamed "
                            "once in 16-byte loads, on FP32 FMAs (one warp per output column) or m16n8k16 "
                            "tensor cores (16 columns per CTA, K split over its warps)")
