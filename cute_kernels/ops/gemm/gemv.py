"""The GEMV variant of ``hgemm`` and ``sgemm``: ``alpha * x @ w.t() + beta * c`` for a few rows of ``x``
(``F.linear`` in a decode step), CUDA C++ in ``legacy_cuda/gemv.cu`` compiled with NVRTC.

On such a call the whole cost is streaming the weight once; a GEMM tile computes 16-64 rows for one and,
without split-K, leaves most SMs idle. The kernel gives each output column one warp that reads its row of
``w`` in 16-byte chunks (the problem's ``b``, a column-major (K, N) view of a row-major (N, K) weight) and
multiplies it with every row of ``x``. The op routes a call here when ``b`` is such a view, ``a`` is
row-major, there is one product and M <= ``GEMV_MAX_ROWS`` (``takes``); everything else stays on the
tile kernels.
"""

from __future__ import annotations

import ctypes
import dataclasses

from ...runtime import device as _device
from ...runtime import nvrtc
from ...runtime.config_fields import check_choice, check_fields
from .problem import GemmProblem

__all__ = ["GemvConfig", "GEMV_MAX_ROWS", "SOURCE", "takes", "why_unsupported", "default_config", "candidates",
           "name_expression", "compile", "prepare", "GemvLaunch", "gemv_fields"]

SOURCE = "gemv.cu"
# Rows of x one launch takes (the kernel's kRows: 1, 2, 4 or 8). Every row re-reads its chunk of x for
# each chunk of w, through L1; from 16 rows on a tensor-core tile has the better shape (the swapped GEMM).
GEMV_MAX_ROWS = 8
_CPP_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
_ROWS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Compile-time knobs of the GEMV kernel.

    - ``warps``: warps per CTA, one output column each.
    - ``unroll``: 16-byte chunks of ``w`` each lane has in flight before its first product.
    """

    warps: int = 8
    unroll: int = 4

    def __post_init__(self) -> None:
        check_fields(self)
        check_choice(self, "warps", (4, 8, 16))
        check_choice(self, "unroll", (1, 2, 4, 8))

    def short(self) -> str:
        """Compact name for tables: w8_u4."""
        return f"w{self.warps}_u{self.unroll}"


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
    if -(-problem.n // config.warps) > 2 ** 31 - 1:
        return "more CTAs than one launch's grid holds"
    return None


def takes(problem: GemmProblem) -> bool:
    """Whether the op runs ``problem`` on the GEMV variant (its default config supports it)."""
    return why_unsupported(default_config(problem), problem) is None


def default_config(problem: GemmProblem) -> GemvConfig:
    return GemvConfig()


def candidates() -> list[GemvConfig]:
    return [GemvConfig(w, u) for w in (4, 8, 16) for u in (1, 2, 4, 8)]


def name_expression(config: GemvConfig, problem: GemmProblem) -> str:
    return (f"gemv::gemv_kernel<{_CPP_TYPES[problem.dtype]}, {_rows(problem)}, {config.warps}, {_vector(problem)}, "
            f"{config.unroll}>")


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

    def __init__(self, packed: nvrtc.PackedLaunch, params: Params, warps: int, device_index: int):
        self.packed, self.params, self.warps, self.device_index = packed, params, warps, device_index

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
            self.packed.launch(stream, (-(-n // self.warps), 1, 1))


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
    return GemvLaunch(packed, params, config.warps, device_index)


def gemv_fields(standard_problems) -> dict:
    """The registry fields the ``hgemm`` and ``sgemm`` GEMV entries share (each op adds its dtypes,
    baseline and oracle)."""
    return dict(variant="gemv", backend="nvrtc", config_cls=GemvConfig, default_config=default_config,
                candidates=candidates, why_unsupported=why_unsupported, compile=compile, prepare=prepare,
                standard_problems=standard_problems, sources=(SOURCE,), bound="bandwidth", shape_bucket=None,
                sweep_axes=(("warps",), ("unroll",)),
                description="GEMV for a few rows times a transposed weight (x @ w.t(), M <= 8): one warp per "
                            "output column streams its row of w in 16-byte chunks, FP32 sums")
