"""The GEMV variant of ``hgemm`` and ``sgemm``: ``alpha * x @ w.t() + beta * c`` for a few rows of ``x``
(``F.linear`` in a decode step), CUDA C++ in ``legacy_cuda/gemv.cu`` compiled with NVRTC.

On such a call the whole cost is streaming the weight once; a GEMM tile computes 16-64 rows for one and,
without split-K, leaves most SMs idle. The kernel gives each output column one warp that reads its row of
``w`` in 16-byte chunks (the problem's ``b``, a column-major (K, N) view of a row-major (N, K) weight) and
multiplies it with every row of ``x``. The op routes a call here when ``b`` is such a view, ``a`` is
row-major, there is one product and M is within ``ROUTED_ROWS`` (``takes``); everything else stays on
the tile kernels. A ``GemvConfig`` runs it on up to ``GEMV_MAX_ROWS`` rows.
"""

from __future__ import annotations

import ctypes
import dataclasses

from ...runtime import device as _device
from ...runtime import nvrtc
from ...runtime.config_fields import check_choice, check_fields
from .problem import GemmProblem

__all__ = ["GemvConfig", "GEMV_MAX_ROWS", "SOURCE", "takes", "why_unsupported", "default_config", "candidates",
           "name_expression", "columns_per_cta", "compile", "prepare", "GemvLaunch", "gemv_fields"]

SOURCE = "gemv.cu"
# Rows of x one launch takes (the kernel's kRows: 1, 2, 4 or 8). Every row re-reads its chunk of x for
# each chunk of w, through L1, and converts both to FP32: in 16 bits that costs more than the stream from
# 4 rows on.
GEMV_MAX_ROWS = 8
# The rows the op sends here (``takes``): measured on the H200 against the swapped GEMM and cuBLAS
# (docs/benchmarks-gemm-models.md). float32: 1-8 rows at or above cuBLAS (1.0-1.4x; the swapped GEMM 0.8x
# at 16). 16-bit: 1 row 1.04-1.14x cuBLAS; 4 rows 0.6x and 8 rows 0.3-0.4x, where the swapped GEMM's
# tensor-core tile does better.
ROUTED_ROWS = {"float32": 8, "float16": 8, "bfloat16": 8}
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


def _widest(problem: GemmProblem) -> int:
    return 4 if problem.dtype == "float32" else 8


def _vector(problem: GemmProblem) -> int:
    """Elements per access: 16 bytes where x's and w's rows allow it (the alignments count base, leading
    dimension and K), else 1."""
    widest = _widest(problem)
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
    """Whether the op runs ``problem`` on the GEMV variant: its default config supports it and M is within
    the rows it is measured fast on (``ROUTED_ROWS``)."""
    return (problem.m <= ROUTED_ROWS.get(problem.dtype, 0)
            and why_unsupported(default_config(problem), problem) is None)


def default_config(problem: GemmProblem) -> GemvConfig:
    return GemvConfig()


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
                description="GEMV for a few rows times a transposed weight (x @ w.t(), M <= 8): one warp per "
                            "output column streams its row of w in 16-byte chunks, FP32 sums")
