"""The GEMV variant of ``hgemm`` and ``sgemm``: ``alpha * x @ w.t() + beta * c`` for a few rows of ``x``
(``F.linear`` in a decode step), CUDA C++ in ``legacy_cuda/gemv.cu`` compiled with NVRTC.

On such a call the whole cost is streaming the weight once; a GEMM tile computes 16-64 rows for one and,
without split-K, leaves most SMs idle. Two kernels read the weight (the problem's ``b``, a column-major
(K, N) view of a row-major (N, K) ``w``) in 16-byte loads: ``gemv_kernel`` gives a few output columns a
few warps and sums FP32 products (any dtype, any alignment), ``gemv_mma_kernel`` gives 16 or 32 columns a
CTA whose warps split K and multiply on m16n8k16 tensor cores (16-bit, 16-byte rows, up to 16 of them). The op routes a call
here when ``b`` is such a view, ``a`` is row-major, there is one product and M <= ``TAKES_MAX_ROWS``
(up to 16 where the tensor-core kernel runs them: ``takes``), and a float32 GEMM with N <= ``TRANSPOSED_MAX_COLUMNS`` as its transpose
(``TransposedLaunch``); everything else stays on the tile kernels. A row-major ``b`` (K, N) (``x @ w`` with
the weight kept as (in, out)) runs on ``gemv_rows_kernel``, whose lanes own 16-byte chunks of adjacent output
columns and walk down K, the warps and CTAs splitting K: up to ``ROW_MAJOR_MAX_ROWS`` rows, taken by the
op where ``takes`` says.
"""
from __future__ import annotations

import ctypes
import dataclasses

import torch

from ...runtime import device as _device
from ...runtime.device import H200_SM_COUNT
from ...runtime import nvrtc, tma
from ...runtime.config_fields import check_choice, check_fields
from ...runtime.dry_run import is_dry_run
from ...runtime.workspace import stream_buffer
from .problem import GemmProblem, unit_strides, widest_dividing, widest_vector

__all__ = ["GemvConfig", "GEMV_MAX_ROWS", "MMA_MAX_ROWS", "TAKES_MAX_ROWS", "TRANSPOSED_MAX_COLUMNS",
           "transposed_problem", "takes_transposed", "TransposedLaunch", "SOURCE", "takes", "why_unsupported", "default_config", "candidates",
           "name_expression", "columns_per_cta", "compile", "prepare", "GemvLaunch", "gemv_fields"]

SOURCE = "gemv.cu"
# Rows of x one launch takes (gemv_kernel's kRows: 1, 2, 4, 8 or 16); the tensor-core kernel takes them as
# one or two groups of its MMA's 8 columns of B.
GEMV_MAX_ROWS = 16
MMA_MAX_ROWS = 16
_MMA_GROUP_ROWS = 8
_CPP_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
# gemv_tma_kernel (gemv.cu): ring depths, rows of w per CTA, k per stage, bytes per stage, threads.
TMA_STAGES = (4, 6, 8, 11)
_TMA_ROWS, _TMA_K, _TMA_X_ROWS = 128, 64, 16
_TMA_STAGE_BYTES = (_TMA_ROWS + _TMA_X_ROWS) * _TMA_K * 2
_TMA_THREADS = 160
_ROWS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Compile-time knobs of the GEMV kernel.

    - ``tensor_cores``: 16-bit inputs with 16-byte rows run ``gemv_mma_kernel`` (16 output columns per CTA
      and group, m16n8k16 products, the warps splitting K); otherwise, and for float32 or unaligned rows
      always, ``gemv_kernel`` (one output column per warp, FP32 FMAs).
    - ``warps``: warps per CTA.
    - ``unroll``: 16-byte chunks of each row of ``w`` each lane has in flight before its first product.
    - ``columns``: output columns per warp of ``gemv_kernel`` (1, 2 or 4), or groups of 16 output columns
      per CTA of the tensor-core kernel (1 or 2): each chunk of ``x`` loaded serves that many chunks of
      ``w``.
    - ``k_warps``: warps of ``gemv_kernel`` that share one group of columns, each streaming a contiguous
      share of K (their sums meet in shared memory): more loads in flight per column (the tensor-core
      kernel takes 1: its warps always split K).
    - ``k_ctas``: CTAs of the tensor-core kernel that share one group of columns, each walking a
      contiguous share of K and so reading only that share of ``x`` (which every CTA otherwise re-reads
      whole from L2); their FP32 partial tiles are summed in a fixed order by the one that finishes last.
      With 16 rows and 32 columns per CTA that keeps the grid's CTA count and halves the reads of ``x``.
      On the TMA kernel: CTAs per 128 rows of ``w``, the same split.
    - ``tma_stages``: 0, or the depth of the shared-memory ring of ``gemv_tma_kernel`` (sm_90, the
      tensor-core kernel's rows): the weight arrives by TMA in 128 x 64 boxes, 18 KB a stage with x's 16 x
      64, and 128 output columns per CTA multiply on wgmma; ``warps``, ``unroll`` and ``columns`` stay at
      their defaults (its CTA is one consumer warpgroup and a producer warp).

    A row-major ``b`` runs ``gemv_rows_kernel`` on FP32 FMAs (``tensor_cores=False``, ``columns=1``, no TMA):
    each lane owns one 16-byte chunk of output columns, a warp a strip of 32 chunks; ``warps`` per CTA,
    ``k_warps`` of them per strip splitting the CTA's rows of K, ``unroll`` rows of b in flight per lane,
    ``k_ctas`` CTAs per strip splitting K.
    """

    tensor_cores: bool = True
    warps: int = 8
    unroll: int = 4
    columns: int = 1
    k_warps: int = 1
    k_ctas: int = 1
    tma_stages: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        check_choice(self, "warps", (4, 8, 16))
        check_choice(self, "unroll", (1, 2, 4, 8))
        check_choice(self, "columns", (1, 2, 4))
        check_choice(self, "k_warps", (1, 2, 4, 8))
        check_choice(self, "k_ctas", (1, 2, 4, 8))
        check_choice(self, "tma_stages", (0,) + TMA_STAGES)
        if self.tma_stages and (not self.tensor_cores or (self.warps, self.unroll, self.columns, self.k_warps)
                                != (8, 4, 1, 1)):
            raise ValueError("tma_stages: the TMA kernel is a tensor-core kernel (tensor_cores=True) with no warps, "
                             "unroll, columns or k_warps of its own (leave them at 8, 4, 1, 1)")
        if self.tensor_cores and (self.columns > 2 or self.k_warps != 1):
            raise ValueError("columns, k_warps: the tensor-core kernel's CTA computes 16 or 32 columns "
                             "(columns 1 or 2) with its warps splitting K (k_warps 1)")
        if self.warps % self.k_warps:
            raise ValueError(f"k_warps: {self.k_warps} must divide warps={self.warps}")

    def short(self) -> str:
        """Compact name for tables: mma_w8_u4 (simt_..._c4 without tensor cores, 4 columns per warp)."""
        if self.tma_stages:
            return f"tma_s{self.tma_stages}" + (f"_k{self.k_ctas}" if self.k_ctas > 1 else "")
        if self.tensor_cores:
            return (f"mma_w{self.warps}_u{self.unroll}" + (f"_c{self.columns}" if self.columns > 1 else "")
                    + (f"_k{self.k_ctas}" if self.k_ctas > 1 else ""))
        return (f"simt_w{self.warps}_u{self.unroll}_c{self.columns}_s{self.k_warps}"
                + (f"_k{self.k_ctas}" if self.k_ctas > 1 else ""))


def _vector(problem: GemmProblem) -> int:
    """Elements per access: 16 bytes where x's and w's rows allow it (the alignments count base, leading
    dimension and K; N for a row-major b, whose kernel reads x by the element), else 1."""
    widest = widest_vector(problem.dtype)
    if _row_major_weight(problem):
        return widest if problem.b_align == widest else 1
    return widest if problem.a_align == widest and problem.b_align == widest else 1


def _row_major_weight(problem: GemmProblem) -> bool:
    """Whether ``problem``'s b is row-major (K, N): gemv_rows_kernel's layout."""
    return problem.b_major == "n"


def _rows(problem: GemmProblem) -> int:
    """gemv_kernel's and gemv_rows_kernel's kRows: M rounded up to a power of two (the largest where M is
    more than it takes)."""
    return next((r for r in _ROWS if r >= problem.m), _ROWS[-1])


def why_unsupported(config: GemvConfig, problem: GemmProblem) -> str | None:
    if problem.dtype not in _CPP_TYPES:
        return f"dtype {problem.dtype} is not float32, float16 or bfloat16"
    if problem.batch != 1:
        return f"a batch of {problem.batch} products (the GEMV variant runs one)"
    if problem.a_major != "k":
        return "a must be row-major (K contiguous)"
    if _row_major_weight(problem):
        return _why_not_rows_kernel(config, problem)
    if not 1 <= problem.m <= GEMV_MAX_ROWS:
        return f"M={problem.m} rows (the GEMV variant takes 1 to {GEMV_MAX_ROWS})"
    reason = _grid_problem(config, problem)
    if reason is not None:
        return reason
    if config.k_ctas > 1 and not _on_tensor_cores(config, problem):
        return ("K is split across CTAs on the tensor-core kernels (16-bit inputs with 16-byte rows, up to "
                f"{MMA_MAX_ROWS} of them) and the row-major weight's kernel only")
    if config.tma_stages:
        if problem.sm != 90:
            return f"the TMA kernel (tma_stages) runs on sm_90 only, not sm_{problem.sm}"
        if not _on_tensor_cores(config, problem):
            return f"the TMA kernel takes 16-bit inputs with 16-byte rows, up to {MMA_MAX_ROWS} of them"
    return None


def _why_not_rows_kernel(config: GemvConfig, problem: GemmProblem) -> str | None:
    """gemv_rows_kernel's rules (a row-major b): FP32 FMAs on one chunk of columns per lane, up to
    ``ROW_MAJOR_MAX_ROWS`` rows of x."""
    if not 1 <= problem.m <= ROW_MAJOR_MAX_ROWS:
        return f"M={problem.m} rows (a row-major b takes 1 to {ROW_MAJOR_MAX_ROWS})"
    if config.tensor_cores or config.tma_stages or config.columns != 1:
        return ("a row-major b runs on FP32 FMAs with one 16-byte chunk of columns per lane "
                "(tensor_cores=False, columns=1, tma_stages=0)")
    return _grid_problem(config, problem)


def _grid_problem(config: GemvConfig, problem: GemmProblem) -> str | None:
    """Why one launch's grid cannot hold ``problem``'s column groups (None: it can)."""
    if -(-problem.n // columns_per_cta(config, problem)) > 2 ** 31 - 1:
        return "more CTAs than one launch's grid holds"
    return None


def tma_shared_bytes(config: GemvConfig) -> int:
    """gemv_tma_kernel's dynamic shared memory (gemv.cu's kTmaSharedBytes): alignment slack, the ring, its
    full and empty barriers."""
    return 1024 + config.tma_stages * _TMA_STAGE_BYTES + 2 * config.tma_stages * 8


# Rows the op routes here on any kernel (``takes``); up to GEMV_MAX_ROWS run where a GemvConfig is given,
# and 9-16 rows are taken where the tensor-core kernel runs them. On the H200 at 16 rows the FP32-FMA
# kernel's best (one column per warp, K over 4 warps) ran 0.80x cuBLAS (N = K = 4096): 16 chunks of x per
# chunk of w load L1, and more columns per warp (fewer x loads) cost the registers that keep loads in
# flight; the tensor-core kernel's second row group reuses the weight's fragments instead.
TAKES_MAX_ROWS = 8
# 9-16 rows are taken only where the warp-MMA kernel's grid has at least this many CTAs (one per SM of the
# H200): it does not split K across CTAs, and the swapped GEMM they ran on before does. Measured at N = 4096
# and 14336 only (256 and 448+ CTAs); smaller N keep the swapped GEMM. On sm_90 the TMA kernel runs the rows
# taken (32 CTAs of 128 columns at N = 4096, 0.99x cuBLAS on the H100).
_MIN_CTAS_PAST_8_ROWS = H200_SM_COUNT

# Rows of x gemv_rows_kernel takes (its kRows: 1, 2, 4 or 8; a row-major b), and the dtypes the op sends it.
# H100, cuBLAS interleaved, N = K = 4096 unless said (the default config): float32 1 row 0.97x (the SGEMM's
# 32 x 32 tiles 0.19x), 4 rows 2.34x, 8 rows 1.15x (0.89x), 1 x 11008 1.01x, 8 x 14336 0.95x. fp16 1 row
# 0.88x (8 rows in flight per lane 0.96x) against the sm80-style kernel's split-K 0.94x, and 4-8 rows
# 0.17-0.32x (each row of x costs a conversion and 8 FMAs per 16 bytes streamed): 16-bit stays on the tiles.
ROW_MAJOR_MAX_ROWS = 8
ROW_MAJOR_TAKES_DTYPES = ("float32",)
# gemv_rows_kernel's default splits K across CTAs until the grid holds this many (about two an SM), each
# CTA keeping at least ROWS_MIN_K_PER_CTA rows of b.
ROWS_GRID_CTAS = 2 * H200_SM_COUNT
ROWS_MIN_K_PER_CTA = 64


def takes(problem: GemmProblem) -> bool:
    """Whether the op runs ``problem`` on the GEMV variant: up to ``TAKES_MAX_ROWS`` rows wherever its
    default config supports them. As measured on the H200 against cuBLAS (N = K = 4096, weights rotated
    past L2; docs/notes/gemm.md, "GEMV"): float32 1.2-1.4x at 1-8 rows; 16-bit 16-byte rows on the tensor
    cores, up to 16 of them; 16-bit rows that are not (K odd) on the FP32-FMA kernel, 1.18x at 4 rows and
    0.58x at 8, where the swapped GEMM, staging the whole weight, ran 0.09-0.12x. A row-major b: the dtypes
    of ``ROW_MAJOR_TAKES_DTYPES``, up to ``ROW_MAJOR_MAX_ROWS`` rows."""
    if _row_major_weight(problem):
        return problem.dtype in ROW_MAJOR_TAKES_DTYPES and why_unsupported(default_config(problem), problem) is None
    if problem.m > MMA_MAX_ROWS:
        return False
    config = default_config(problem)
    if problem.m > TAKES_MAX_ROWS and (
            not _on_tensor_cores(config, problem)
            or -(-problem.n // columns_per_cta(_warp_mma_config(problem), problem)) < _MIN_CTAS_PAST_8_ROWS):
        return False
    return why_unsupported(config, problem) is None


# The skinny-N GEMM a @ b (N <= TRANSPOSED_MAX_COLUMNS, a row-major) runs as its transpose on the GEMV kernel:
# out^T = b^T @ a^T, a the weight streamed once, b^T the few rows of x (a row-major copy of N x K elements
# where b is row-major), out^T written where out lies (column strides). The tile kernels spend most of each
# tile on columns past N (4096 x 8 x 4096 on the H200: 43.7 us against the 32 x 32 tiles' 56.5 split in 4
# and cuBLAS's 45.4); the N the GEMV takes directly (``TAKES_MAX_ROWS``).
TRANSPOSED_MAX_COLUMNS = TAKES_MAX_ROWS


def transposed_problem(problem: GemmProblem) -> GemmProblem:
    """The GEMV problem of ``problem``'s transpose: x = b^T ((N, K) row-major: b itself where it is
    column-major, else a fresh copy), w = a."""
    x_align = problem.b_align if problem.b_major == "k" else widest_dividing(problem.k, widest_vector(problem.dtype))
    return GemmProblem(m=problem.n, n=problem.m, k=problem.k, dtype=problem.dtype, beta_zero=problem.beta_zero,
                       a_align=x_align, b_align=problem.a_align, c_align=1, sm=problem.sm, b_major="k")


def takes_transposed(problem: GemmProblem) -> bool:
    """Whether the op runs ``problem`` as its transpose on the GEMV variant (``TransposedLaunch``): float32,
    one product, a row-major, N <= ``TRANSPOSED_MAX_COLUMNS`` and more rows than the GEMV takes directly."""
    return (problem.dtype == "float32" and problem.batch == 1 and problem.a_major == "k"
            and problem.n <= TRANSPOSED_MAX_COLUMNS < problem.m and takes(transposed_problem(problem)))


class TransposedLaunch:
    """``out = alpha * a @ b + beta * c`` run as ``out^T = alpha * b^T @ a^T + beta * c^T`` on a GEMV launch
    of ``transposed_problem``: x = b^T (copied row-major where ``copy_x``: one torch op on the current
    stream), the weight a read in place, c^T and out^T the transposed views (the kernel takes both strides)."""

    __slots__ = ("inner", "copy_x")

    def __init__(self, inner: "GemvLaunch", copy_x: bool):
        self.inner, self.copy_x = inner, copy_x

    def __call__(self, a, b, c, out, alpha, beta) -> None:
        # clone, not contiguous: with N == 1 b^T counts as contiguous already, and a view of b would keep b's
        # base address, which transposed_problem does not claim aligned. unit_strides: a column-major b of
        # one column keeps a row stride that is not the canonical one.
        x = unit_strides(b.t().clone(memory_format=torch.contiguous_format) if self.copy_x else b.t())
        self.inner(x, a.t(), None if c is None else c.t(), out.t(), alpha, beta)


# The tensor-core kernel's split of K: about this many warps in the whole grid (~31 per SM of the H200's
# 132), so that enough 16-byte loads are in flight to stream the weight. Measured on the H200 against
# cuBLAS (fp16, weights rotated past L2): N = 4096 (256 CTAs) ran best on 16 warps (11.5-12.4 us against
# 14.7-15.5 for M = 2-8), N = 14336 (896 CTAs) on 4 (32.4-33.4 against 32.9-33.3); one k-block in flight per
# warp beat 2-8 at both. One row runs fastest on the FP32-FMA kernel (9.6 us against cuBLAS's 14.7 at N =
# 4096; 33.7 against 33.2 at 14336).
MMA_GRID_WARPS = 4096
# On sm_90 the TMA kernel (weights streamed through an 11-stage ring onto wgmma, no split of K across CTAs)
# takes 9-16 rows, and 2-8 rows from N = 8192. H100, fp16, cuBLAS interleaved, us (docs/notes/gemm.md):
# 16 x 14336 x 4096 47.0 against the warp-MMA kernel's 51.4 (cuBLAS 44.5-45.3); 16 x 4096 x 4096 18.9 against
# 21.3 (18.8); 16 x 4096 x 14336 49.0 against 59.3 (47.0); 8 x 14336 46.0 against 48.1 (44.0); but 8 x 4096
# 18.6 against 16.6 (16.5), so fewer rows of a narrower weight stay on the warp-MMA kernel. Splitting K over
# 2-4 CTAs lost everywhere (0.68-0.89x).
TMA_MIN_N = 8192
TMA_DEFAULT_STAGES = 11
# 9-16 rows (fp16, H200, cuBLAS interleaved, us): N = 14336 took 41.6 on 32 columns per CTA with 8 warps and
# 2 k-blocks in flight against 51.3 on 16 columns (cuBLAS 34.4); N = 4096 19.5 either way (15.8), where 32
# columns leave 128 CTAs for 132 SMs and fewer warps lose (8 warps 29.1, 4 warps 47.1).
_TWO_COLUMN_GROUPS_MIN_N = 8192


def default_config(problem: GemmProblem) -> GemvConfig:
    """For 2-16 16-bit 16-byte rows a tensor-core kernel: on sm_90 the TMA one for 9-16 rows and for N from
    ``TMA_MIN_N``; otherwise the warp-MMA one (32 columns per CTA, 2 k-blocks in flight, for 9-16 rows and N
    from ``_TWO_COLUMN_GROUPS_MIN_N``), K split so the grid holds about ``MMA_GRID_WARPS`` warps. The FP32-FMA
    kernel elsewhere (``_fma_config``). A row-major b: ``_rows_config``."""
    if _row_major_weight(problem):
        return _rows_config(problem)
    if problem.dtype == "float32" or _vector(problem) == 1 or problem.m == 1 or problem.m > MMA_MAX_ROWS:
        return _fma_config(problem)
    if problem.sm == 90 and (problem.m > _MMA_GROUP_ROWS or problem.n >= TMA_MIN_N):
        return GemvConfig(tensor_cores=True, tma_stages=TMA_DEFAULT_STAGES)
    return _warp_mma_config(problem)


def _warp_mma_config(problem: GemmProblem) -> GemvConfig:
    """The warp-MMA tensor-core kernel's config: 32 columns per CTA and 2 k-blocks in flight for 9-16 rows
    and N from ``_TWO_COLUMN_GROUPS_MIN_N``, else 16 and 1; K split so the grid holds about
    ``MMA_GRID_WARPS`` warps."""
    columns = 2 if problem.m > _MMA_GROUP_ROWS and problem.n >= _TWO_COLUMN_GROUPS_MIN_N else 1
    ctas = -(-problem.n // (16 * columns))
    warps = 16
    while warps > 4 and ctas * warps > MMA_GRID_WARPS:
        warps //= 2
    return GemvConfig(tensor_cores=True, warps=warps, unroll=columns, columns=columns)


def _rows_config(problem: GemmProblem) -> GemvConfig:
    """gemv_rows_kernel's config: a strip of 8 warps per CTA splitting its rows of K, 4 rows of b in flight
    per lane, K split across CTAs, doubled (up to 8) while the grid holds fewer than ``ROWS_GRID_CTAS`` CTAs
    and each CTA keeps ``ROWS_MIN_K_PER_CTA`` rows (so the grid may end up to twice that)."""
    config = GemvConfig(tensor_cores=False, warps=8, unroll=4, k_warps=8)
    strips = -(-problem.n // columns_per_cta(config, problem))
    k_ctas = 1
    while k_ctas < 8 and strips * k_ctas < ROWS_GRID_CTAS and problem.k >= 2 * k_ctas * ROWS_MIN_K_PER_CTA:
        k_ctas *= 2
    return dataclasses.replace(config, k_ctas=k_ctas)


def _fma_config(problem: GemmProblem) -> GemvConfig:
    """The FP32-FMA kernel's config by rows, as the H200 probe ran them against cuBLAS (N = K = 4096 unless
    said; weights rotated past L2). float32: up to 4 rows one column per warp and one warp per column
    (1.21-1.38x); 5-8 rows 4 columns per warp, K over all 8 warps, 2 chunks per row in flight (8 rows: 35.0
    us against the first's 47.9 and cuBLAS's 48.2; N = 14336: 81.2 against 99.0 and 122.7; N = 1000: 19.8
    against 30.7 and 23.6); more rows one column per warp, K over 4 warps (16 rows: 66.4 against 70.0 and
    53.3). 16-bit rows (K odd): 4 columns per warp, K over 4 warps up to 4 rows (24.2 us, cuBLAS 28.6),
    then 2 columns (8 rows: 52.6 against 63.9 and 30.4)."""
    rows = problem.m
    if problem.dtype == "float32":
        if rows <= 4:
            return GemvConfig(tensor_cores=False, warps=8, unroll=4)
        if rows <= 8:
            return GemvConfig(tensor_cores=False, warps=8, unroll=2, columns=4, k_warps=8)
        return GemvConfig(tensor_cores=False, warps=8, unroll=4, k_warps=4)
    if rows == 1:
        return GemvConfig(tensor_cores=False, warps=8, unroll=4)
    return GemvConfig(tensor_cores=False, warps=8, unroll=4, columns=4 if rows <= 4 else 2, k_warps=4)


def candidates() -> list[GemvConfig]:
    return ([GemvConfig(True, w, u, c) for w in (4, 8, 16) for u in (1, 2, 4, 8) for c in (1, 2)]
            + [GemvConfig(True, w, u, c, k_ctas=s) for w in (4, 8, 16) for u in (1, 2) for c in (1, 2)
               for s in (2, 4)]
            + [GemvConfig(False, w, u, c, s) for w in (4, 8, 16) for u in (1, 2, 4, 8) for c in (1, 2, 4)
               for s in (1, 2, 4, 8) if w % s == 0]
            + [GemvConfig(True, k_ctas=s, tma_stages=t) for t in TMA_STAGES for s in (1, 2, 4, 8)]
            # gemv_rows_kernel's K split across CTAs (a row-major b; one chunk of columns per lane).
            + [GemvConfig(False, w, u, 1, s, k_ctas=c) for w in (4, 8, 16) for u in (1, 2, 4, 8)
               for s in (1, 2, 4, 8) if w % s == 0 for c in (2, 4, 8)])


def _on_tensor_cores(config: GemvConfig, problem: GemmProblem) -> bool:
    return (config.tensor_cores and problem.dtype != "float32" and _vector(problem) == 8
            and problem.m <= MMA_MAX_ROWS)


def _on_tma(config: GemvConfig, problem: GemmProblem) -> bool:
    """Whether ``config`` runs ``problem`` on gemv_tma_kernel (its rows are the tensor-core kernel's)."""
    return config.tma_stages > 0 and _on_tensor_cores(config, problem)


def columns_per_cta(config: GemvConfig, problem: GemmProblem) -> int:
    if _row_major_weight(problem):
        return config.warps // config.k_warps * 32 * _vector(problem)
    if _on_tma(config, problem):
        return _TMA_ROWS
    if _on_tensor_cores(config, problem):
        return 16 * config.columns
    return config.warps // config.k_warps * config.columns


def name_expression(config: GemvConfig, problem: GemmProblem) -> str:
    cpp = _CPP_TYPES[problem.dtype]
    if _row_major_weight(problem):
        split = "true" if config.k_ctas > 1 else "false"
        return (f"gemv::gemv_rows_kernel<{cpp}, {_rows(problem)}, {config.warps}, {config.k_warps}, {_vector(problem)}, "
                f"{config.unroll}, {split}>")
    if _on_tma(config, problem):
        return f"gemv::gemv_tma_kernel<{cpp}, {config.tma_stages}, {'true' if config.k_ctas > 1 else 'false'}>"
    if _on_tensor_cores(config, problem):
        groups = -(-problem.m // _MMA_GROUP_ROWS)
        split = "true" if config.k_ctas > 1 else "false"
        return f"gemv::gemv_mma_kernel<{cpp}, {config.warps}, {config.unroll}, {groups}, {config.columns}, {split}>"
    return (f"gemv::gemv_kernel<{cpp}, {_rows(problem)}, {config.columns}, {config.k_warps}, {config.warps}, "
            f"{_vector(problem)}, {config.unroll}>")


# The TMA kernel is sm_90a's own (its launch compiles and looks it up there); the others build for the arch named.
compile = nvrtc.checked_compile(SOURCE, why_unsupported, name_expression, arch_specific=_on_tma)  # noqa: A001


class Params(ctypes.Structure):
    """gemv.cu's ``gemv::Params`` (120 bytes; the kernel static_asserts the size)."""

    _fields_ = ([(name, ctypes.c_void_p) for name in ("x", "w", "c", "out")]
                + [(name, ctypes.c_int64) for name in ("x_ld", "w_ld", "c_ld", "out_ld", "c_cs", "out_cs")]
                + [(name, ctypes.c_int32) for name in ("m", "n", "k")]
                + [("alpha", ctypes.c_float), ("beta", ctypes.c_float)]
                + [(name, ctypes.c_void_p) for name in ("partials", "arrivals")])


class TmaParams(ctypes.Structure):
    """gemv.cu's ``gemv::TmaParams`` (384 bytes): the weight's and x's tensor maps, then ``Params``."""

    _fields_ = [("w_map", tma.TmaMapBytes), ("x_map", tma.TmaMapBytes), ("p", Params), ("_pad", ctypes.c_uint8 * 8)]


def _tma_maps(a, b) -> dict:
    """The TMA kernel's maps of x (``a``, (M, K) row-major) and the weight (``b``, its (K, N) column-major
    view), as 4-D (K, rows, 1, 1) maps in (64, box rows) boxes; ValueError where TMA cannot reach one. A
    single row's stride is any valid one: K's (16-byte rows make it a multiple of 16 bytes)."""
    (m, k), n = a.shape, b.shape[1]
    maps = {}
    for name, t, rows, ld, box_rows in (("x", a, m, a.stride(0) if m > 1 else k, _TMA_X_ROWS),
                                        ("w", b, n, b.stride(1) if n > 1 else k, _TMA_ROWS)):
        row_bytes = ld * t.element_size()
        dims, strides, box = (k, rows, 1, 1), (row_bytes, row_bytes * rows, row_bytes * rows), (_TMA_K, box_rows, 1, 1)
        reason = tma.why_not(t, dims, strides, box)
        if reason is not None:
            raise ValueError(f"{'a' if name == 'x' else 'b'}: the GEMV's TMA kernel cannot reach it: {reason}")
        maps[name] = (f"{name}_map", tma.TiledMap(t.dtype, dims, strides, box))
    return maps


class GemvLaunch:
    """The launch of one call structure: ``launch(a, b, c, out, alpha, beta)`` (the GEMM plans' signature)
    writes this call's pointers, strides and scalars into the packed ``Params`` and enqueues the kernel on
    torch's current stream of the tensors' device. ``a`` (M, K) row-major, ``b`` (K, N) column-major (``b.t()``
    is the weight; or row-major, for ``gemv_rows_kernel``: ``row_major_b``), ``out`` and ``c`` (read when beta != 0) (M, N) at any strides (``TransposedLaunch``
    passes transposed views). With K split across ``k_ctas`` CTAs, the partial tiles (``tile`` floats per
    CTA) and arrival counters come from the stream's workspace (``runtime.workspace``). The TMA kernel's
    maps live in ``tma_params``: described from the first call's x and weight (``prepare`` may be given
    stand-ins, as the op's staged and swapped launches do) and again where their shapes or row strides change,
    then pointed at each call's tensors (re-encoded only where a pointer moved)."""

    def __init__(self, packed: nvrtc.PackedLaunch, params: Params, columns: int, device_index: int,
                 k_ctas: int = 1, tile: int = 0, tma_params: "TmaParams | None" = None, row_major_b: bool = False):
        self.packed, self.params, self.columns, self.device_index = packed, params, columns, device_index
        self.k_ctas, self.tile, self.tma_params = k_ctas, tile, tma_params
        self.b_ld_dim = 0 if row_major_b else 1  # the dim of b whose stride is the weight's row stride
        self.maps = self.described = None

    def __call__(self, a, b, c, out, alpha, beta) -> None:
        p = self.params
        m, n = out.shape
        ctas = -(-n // self.columns)
        stream = _device.current_stream_handle(self.device_index)
        with self.packed.lock:
            if self.tma_params is not None:
                described = (a.shape, a.stride(0), b.shape, b.stride(1))
                if described != self.described:
                    self.maps = tma.ParamMaps(self.tma_params, _tma_maps(a, b))
                    self.described = described
                self.maps.point("x", a.data_ptr())
                self.maps.point("w", b.data_ptr())
            p.x, p.w, p.out = a.data_ptr(), b.data_ptr(), out.data_ptr()
            p.x_ld, p.w_ld, (p.out_ld, p.out_cs) = a.stride(0), b.stride(self.b_ld_dim), out.stride()
            p.c, p.c_ld, p.c_cs = (0, 0, 0) if c is None or beta == 0.0 else (c.data_ptr(), *c.stride())
            p.m, p.n, p.k = m, n, a.shape[1]
            p.alpha, p.beta = alpha, beta
            if self.k_ctas > 1 and not is_dry_run():
                # Held until the launch is enqueued: under graph capture each is a fresh tensor, and one
                # freed before the other is allocated could hand the counters the partials' memory.
                partials = stream_buffer("partials", self.device_index, stream, self.k_ctas * ctas * self.tile)
                arrivals = stream_buffer("arrivals", self.device_index, stream, ctas)
                p.partials, p.arrivals = partials.data_ptr(), arrivals.data_ptr()
            self.packed.launch(stream, (ctas, self.k_ctas, 1))


def prepare(config: GemvConfig, problem: GemmProblem, inputs: dict, out) -> GemvLaunch:
    """The launch of ``config`` for ``problem`` on ``out``'s device (the kernel compiled and loaded on first
    use); the caller validates the tensors it is given against ``problem``."""
    reason = why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    device_index = out.device.index
    columns = columns_per_cta(config, problem)
    if _on_tma(config, problem):
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device_index, arch_specific=True)
        tma_params = tma.aligned_instance(TmaParams)
        packed = nvrtc.PackedLaunch(kernel, (1, 1, 1), (_TMA_THREADS, 1, 1), (tma_params,),
                                    shared_mem=tma_shared_bytes(config))
        # The tile of the split's partial planes: 128 rows of w by 16 rows of x, whatever M is.
        return GemvLaunch(packed, tma_params.p, columns, device_index, config.k_ctas, columns * _TMA_X_ROWS,
                          tma_params)
    kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device_index)
    params = Params()
    packed = nvrtc.PackedLaunch(kernel, (1, 1, 1), (32 * config.warps, 1, 1), (params,))
    if _row_major_weight(problem):  # gemv_rows_kernel's tile: its columns times its kRows
        return GemvLaunch(packed, params, columns, device_index, config.k_ctas, columns * _rows(problem),
                          row_major_b=True)
    # gemv_mma_kernel's tile: its columns times its row groups' 8 rows each.
    tile = columns * _MMA_GROUP_ROWS * -(-problem.m // _MMA_GROUP_ROWS)
    return GemvLaunch(packed, params, columns, device_index, config.k_ctas, tile)


def gemv_fields(standard_problems) -> dict:
    """The registry fields the ``hgemm`` and ``sgemm`` GEMV entries share (each op adds its dtypes,
    baseline and oracle)."""
    return dict(variant="gemv", backend="nvrtc", config_cls=GemvConfig, default_config=default_config,
                candidates=candidates, why_unsupported=why_unsupported, compile=compile, prepare=prepare,
                keep_launches=True, standard_problems=standard_problems, sources=(SOURCE,), bound="bandwidth", shape_bucket=None,
                sweep_axes=(("tensor_cores", "tma_stages", "warps", "k_warps", "k_ctas"), ("unroll", "columns")),
                description="GEMV for a few rows times a transposed weight (x @ w.t(), M <= 8, 16 on tensor cores): the weight streamed "
                            "once in 16-byte loads, on FP32 FMAs (one warp per output column) or m16n8k16 "
                            "tensor cores (16 or 32 columns per CTA, K split over its warps and optionally over CTAs); "
                            "a row-major weight (x @ w, M <= 8) on FP32 FMAs, a chunk of output columns per lane, K "
                            "split over warps and CTAs")
