"""The GEMM problem and its checks: the problem description, argument validation, the degenerate cases
(empty outputs, K == 0) that never launch a kernel, and the measurement of a call's problem.

Both ``sgemm`` and ``hgemm`` compute ``alpha * a @ b + beta * c`` on row-major matrices with the same
argument rules (docs/design.md, "Public API"); only the dtypes and the widest vector differ.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ...registry import log2_floor
from ...runtime import checks as _checks
from ...runtime.device import device_sm

__all__ = [
    "GemmProblem",
    "UNIT_INDEX_LIMIT",
    "operand_major",
    "operand_alignment",
    "widest_dividing",
    "widest_vector",
    "result_shape",
    "shape_bucket",
    "validate_gemm_args",
    "check_output_matrices",
    "check_out_overlaps",
    "trivial_result",
    "unit_strides",
    "device_sm",
    "GRID_Z_MAX",
    "make_problem",
    "may_fold",
    "MAX_EXTENT",
    "index_problem",
    "runs_c_as_expansion",
    "expansion_is_rows",
]

# The largest M, N or K the kernels index. Their sizes, tile counts and coordinates are 32-bit (the DSL's
# dynamic extents are Int32): ``(M + tile_m - 1) // tile_m`` and the coordinate one past the last tile of
# a cluster (two tiles of up to 256 on the Hopper kernel) must stay below 2^31, so a margin of 1024 covers
# every config. M = 2^31 - 1 otherwise wraps inside the DSL and fails at launch with a bare CUDA error.
MAX_EXTENT = 2**31 - 1024
# CUDA's largest grid.z: the most products one launch batches (the op runs a batch past it that does not
# fold into one GEMM as chunks: op.BatchChunks), and the most the persistent kernel's linear tile index may
# run past the end.
GRID_Z_MAX = 65535
# The largest linear tile (or unit) index a kernel may count to: 32 bits, with room for one persistent
# stride (at most the grid's z extent) past the end.
UNIT_INDEX_LIMIT = 2**31 - 1 - GRID_Z_MAX

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """Everything about one GEMM call that a config or a compile key may depend on.

    ``dtype``: the element type of A, B, C and D ("float32", "float16" or "bfloat16").
    ``a_align``, ``b_align``, ``c_align``: the widest vector (in elements: 4, 2, 1 for float32; 8, 4, 2, 1
    for 16-bit types -- 16 bytes at most) that every access of A (along K), B (along N) and C/out (along N)
    can use -- base address, leading dimension and contiguous extent all multiples of it (see
    ``operand_alignment``). ``beta_zero``: C is not read.
    ``sm``: compute capability of the device it runs on (major * 10 + minor: 90 for the H100/H200), which
    decides the variants that can run it (TMA and wgmma need 90); problems made without a device (tests,
    sweeps, compile checks) describe the H200 the project tunes on.
    ``batch``: the number of products of one call (1: a plain GEMM; more: ``a`` (B, M, K) and ``b``
    (B, K, N), either of which may broadcast over the batch). ``a_major``: "k" for a row-major ``a`` (K
    contiguous), "m" for a column-major one (``x.t()``); ``b_major``: "n" for a row-major ``b``, "k" for a
    column-major one (``w.t()``). A column-major operand's alignment is along its rows (M or K).
    ``d_major``: "n" for a row-major C and result, "m" for column-major ones (unbatched only): the layout
    of a row-major result seen transposed, which the op's swapped launch writes in place (``op.swaps``);
    their alignment is then along M.
    """

    m: int
    n: int
    k: int
    dtype: str = "float32"
    beta_zero: bool = True
    a_align: int = 4
    b_align: int = 4
    c_align: int = 4
    sm: int = 90
    batch: int = 1
    a_major: str = "k"
    b_major: str = "n"
    # Described (bench.describe: report rows, sweep CSV keys) only when not "n", so every earlier row keeps
    # its text.
    d_major: str = dataclasses.field(default="n", metadata={"described": "unless default"})

    def __post_init__(self) -> None:
        if self.a_major not in ("k", "m"):
            raise ValueError(f"GemmProblem.a_major: expected 'k' (row-major a) or 'm' (column-major), got {self.a_major!r}")
        if self.b_major not in ("n", "k"):
            raise ValueError(f"GemmProblem.b_major: expected 'n' (row-major b) or 'k' (column-major), got {self.b_major!r}")
        if self.d_major not in ("n", "m"):
            raise ValueError(f"GemmProblem.d_major: expected 'n' (row-major C and result) or 'm' (column-major), "
                             f"got {self.d_major!r}")
        if self.d_major == "m" and self.batch != 1:
            raise ValueError("GemmProblem.d_major: a column-major result ('m') is for unbatched problems only")
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"GemmProblem.batch: expected an int >= 1, got {self.batch!r}")
        for name in ("m", "n", "k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"GemmProblem.{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.dtype not in _DTYPE_NAMES.values():
            raise ValueError(f"GemmProblem.dtype: expected one of {sorted(_DTYPE_NAMES.values())}, got {self.dtype!r}")
        allowed = tuple(v for v in (1, 2, 4, 8) if v <= widest_vector(self.dtype))
        for name in ("a_align", "b_align", "c_align"):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"GemmProblem.{name}: expected one of {', '.join(map(str, allowed))} for {self.dtype}, "
                    f"got {getattr(self, name)!r}"
                )
        if not isinstance(self.sm, int) or self.sm < 10:
            raise ValueError(f"GemmProblem.sm: expected a compute capability such as 80 or 90, got {self.sm!r}")

    def transposed(self) -> "GemmProblem":
        """The product of the transposes, D^T = B^T A^T (N x M x K): B^T is its A (row-major where B is
        column-major), A^T its B, and its result's majorness the other one; the alignments go with the
        operands. One product: a column-major result is for those only."""
        if self.batch != 1:
            raise ValueError(f"GemmProblem.transposed: a batch of {self.batch} products has no transposed problem "
                             f"here (its result would be column-major)")
        return dataclasses.replace(self, m=self.n, n=self.m, a_align=self.b_align, b_align=self.a_align,
                                   a_major="k" if self.b_major == "k" else "m",
                                   b_major="k" if self.a_major == "k" else "n",
                                   d_major="m" if self.d_major == "n" else "n")


def shape_bucket(problem: GemmProblem) -> str:
    """Tuned-config key (see cute_kernels/tuned.py): dtype, the log2 of M, N and K (rounded down), whether C
    is read, and the alignments (they change which configs compile)."""
    layout = "" if (problem.a_major, problem.b_major) == ("k", "n") else f":{problem.a_major}{problem.b_major}"
    layout += "" if problem.d_major == "n" else ":dm"
    batch = "" if problem.batch == 1 else f":b2^{log2_floor(problem.batch)}"
    return (f"{problem.dtype}:m2^{log2_floor(problem.m)}:n2^{log2_floor(problem.n)}:k2^{log2_floor(problem.k)}:"
            f"{'beta0' if problem.beta_zero else 'beta'}:align{problem.a_align}.{problem.b_align}.{problem.c_align}"
            f"{layout}{batch}")


def operand_major(name: str, t) -> str:
    """How the matrices of ``t`` (its last two dims) lie: "row" (stride 1 along the columns, a leading
    dimension of at least the column count: a row-major matrix or a slice of a wider one) or "col" (stride
    1 along the rows: a transposed view such as ``w.t()``); a ValueError naming ``t`` otherwise. A matrix
    that is both (one row or one column) is "row"; an empty one is "row"."""
    rows, cols = t.shape[-2], t.shape[-1]
    if max(rows, cols) > _checks.INT32_MAX:
        raise ValueError(f"{name}: shape {tuple(t.shape)} has an extent past {_checks.INT32_MAX}, the kernels' "
                         "32-bit extents")
    if rows == 0 or cols == 0:
        return "row"
    row_stride, col_stride = t.stride(-2), t.stride(-1)
    if (cols == 1 or col_stride == 1) and (rows == 1 or row_stride >= cols):
        return "row"
    if (rows == 1 or row_stride == 1) and (cols == 1 or col_stride >= rows):
        return "col"
    raise ValueError(f"{name}: expected row-major matrices (stride 1 in the last dim) or column-major ones (stride "
                     f"1 in the second-to-last dim, as w.t() has), each with a leading dimension that covers it; got "
                     f"shape {tuple(t.shape)} with strides {tuple(t.stride())} ({name}.contiguous() is a row-major "
                     "copy)")


def _check_operand(name: str, t, dtypes) -> str:
    _checks.tensor(name, t)
    _checks.dtype_in(name, t, dtypes)
    if t.dim() not in (2, 3):
        raise ValueError(f"{name}: expected a 2-D matrix or a 3-D batch of matrices, got {t.dim()}-D with shape "
                         f"{tuple(t.shape)}")
    return operand_major(name, t)


def _check_output(name: str, out, shape: tuple, dtypes) -> None:
    """``out``: the result's shape, row-major matrices, and (batched) matrices that do not overlap."""
    _checks.tensor(name, out, written=True)
    _checks.dtype_in(name, out, dtypes)
    check_output_matrices(name, out, shape)


def check_output_matrices(name: str, out, shape: tuple) -> None:
    """The layout half of ``out``'s checks: the result's shape, in row-major matrices (each may be a slice
    of wider rows) that do not overlap. Every test here is one torch.compile traces (the compiled out=)."""
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(out.shape)}")
    if out.dim() == 3 and shape[0] == 0:
        return  # a batch of no matrices: no layout to check
    _checks.row_major_matrix(name, out if out.dim() == 2 else out[0], shape=shape[-2:])
    if out.dim() == 3 and shape[0] > 1 and out.numel() > 0:
        batch, rows, cols = shape
        span = (rows - 1) * out.stride(1) + cols  # elements one matrix spans
        # Apart, or interleaved row by row (a (M, B, N) buffer seen as (B, M, N)): each row of every matrix
        # lies before the next row of the first.
        interleaved = rows == 1 or out.stride(1) >= (batch - 1) * out.stride(0) + cols
        if out.stride(0) < span and not (out.stride(0) >= cols and interleaved):
            raise ValueError(f"{name}: its {shape[0]} matrices overlap (batch stride {out.stride(0)}, row stride "
                             f"{out.stride(1)}, {cols} columns); pass a tensor whose matrices are apart or "
                             "interleaved row by row, e.g. a contiguous one")


def result_shape(a, b) -> tuple:
    """The shape of ``a @ b`` for validated operands: (M, N), or (B, M, N) when either is a batch."""
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return (m, n)
    a_batch, b_batch = (a.shape[0] if a.dim() == 3 else 1), (b.shape[0] if b.dim() == 3 else 1)
    return (b_batch if a_batch == 1 else a_batch, m, n)  # a batch of 0 broadcasts like any other


def may_fold(a, b, shape) -> bool:
    """Whether a batched call of result ``shape`` may run as one GEMM of B * M rows: a batch of ``a`` times one
    ``b`` matrix, the folded rows within the kernels' extent (the op folds it where the layouts allow:
    ``Arrangement``)."""
    return (len(shape) == 3 and a.dim() == 3 and a.shape[0] == shape[0] and (b.dim() == 2 or b.shape[0] == 1)
            and shape[0] * shape[1] <= MAX_EXTENT)


def validate_gemm_args(a, b, c, *, alpha, beta, out, config, config_cls,
                       dtypes) -> tuple[tuple, int, float, float]:
    """Every check of a GEMM call, before anything is allocated or written; returns (the result's shape, K,
    alpha, beta), alpha and beta as the float32 values the kernels use (beta == 0.0: C is not read).

    ``a`` (M, K) or (B, M, K) and ``b`` (K, N) or (B, K, N): row-major or column-major matrices, batches that
    broadcast as torch.matmul's do (equal, or one of them 1 or absent). ``dtypes``: the accepted input
    dtypes; when there are several, b, c and out must have a's.
    """
    _check_operand("a", a, dtypes)
    same = (a.dtype,) if len(dtypes) > 1 else dtypes
    _check_operand("b", b, same)
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"b: expected {k} rows to match a's {k} columns (a is {tuple(a.shape)}), got "
                         f"{tuple(b.shape)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
        raise ValueError(f"b: a batch of {b.shape[0]} does not broadcast with a's batch of {a.shape[0]} (a is "
                         f"{tuple(a.shape)}, b {tuple(b.shape)}): the batches must be equal or one of them 1")
    shape = result_shape(a, b)
    m, n = shape[-2:]
    for name, extent, size in (("a", "M (rows)", m), ("a", "K (columns)", k), ("b", "N (columns)", n)):
        if size > MAX_EXTENT:
            raise ValueError(f"{name}: {extent} = {size} is past {MAX_EXTENT}, the largest the GEMM kernels index "
                             "(32-bit sizes and tile coordinates, with a margin for the last tile)")
    # As the kernels take them, in float32: whether C is read is decided on that beta (1e-50 is 0.0).
    alpha, beta = _checks.float32_scalar("alpha", alpha), _checks.float32_scalar("beta", beta)
    if c is not None:
        _checks.tensor("c", c)  # before its shape is read
        _checks.dtype_in("c", c, same)
        if not runs_c_as_expansion(c, shape) and not (c.dim() == 3 and c.shape[0] == 0):  # (a batch of none has no layout)
            _checks.row_major_matrix("c", c if c.dim() == 2 else c[0], shape=shape[-2:])
    elif beta != 0.0:
        raise ValueError(f"c: required when beta != 0 (beta={beta}), got None")
    if out is not None:
        _check_output("out", out, shape, same)
    _checks.config_type(config, config_cls)

    # Device checks come after every structural check, so those are testable with CPU tensors.
    operands = {"a": a, "b": b, "c": c, "out": out}
    for name, t in operands.items():
        if t is not None:
            _checks.cuda_tensor(name, t)
    _checks.same_device(**operands)
    check_out_overlaps(a, b, c, out, beta == 0.0)
    return shape, k, alpha, beta


def runs_c_as_expansion(c, shape: tuple) -> bool:
    """Whether the op runs ``c`` as its row-major expansion to the result's ``shape`` ((M, N) or (B, M, N))
    rather than as the row-major matrices it is: a ``c`` that broadcasts to ``shape`` as ``torch.addmm``'s
    and ``torch.baddbmm``'s input does (a smaller tensor: a bias row (N,) or (1, N), a column (M, 1), a
    scalar, one matrix for a batch) or a view of one (a zero stride along a dim longer than 1, as ``expand``
    makes); or a ``c`` of the result's shape stored otherwise than row by row (a transposed view: torch.addmm
    takes any layout), which runs on a row-major copy. A ValueError naming c when its shape neither is
    ``shape`` nor broadcasts to it."""
    c_shape = tuple(c.shape)
    if c_shape == tuple(shape):
        if any(size > 1 and stride == 0 for size, stride in zip(c_shape, c.stride())):
            return True
        rows, cols = c_shape[-2:]
        return (cols > 1 and c.stride(-1) != 1) or (rows > 1 and c.stride(-2) < cols)
    if len(c_shape) <= len(shape) and all(s in (1, full) for s, full in zip(c_shape[::-1], shape[::-1])):
        return True
    raise ValueError(f"c: expected shape {tuple(shape)} or one that broadcasts to it as torch.addmm's (and "
                     f"torch.baddbmm's) input does (e.g. (N,), (1, N), (M, 1), ()), got {c_shape}")


def expansion_is_rows(c, shape: tuple) -> bool:
    """Whether a ``c`` the op expands (:func:`runs_c_as_expansion`) runs as its expansion to ``shape``, a view, with no
    copy: where that view is one row repeated (a bias (N,) or (1, N), over every row and every batch):
    leading dimension 0, batch stride 0, stride 1 along the columns. Every GEMM kernel takes a row-major C
    at any leading dimension and batch stride, and only reads it, and such a C folds with a batch into one
    matrix as the result does. The other broadcasts run on a row-major copy of the expansion: a column
    (M, 1) or a scalar (column stride 0, which the kernels' C layout, stride 1 along N, does not take),
    one matrix or one row per batch (kept whole, so that the batch still folds where it would), and a
    column-major c of the result's shape."""
    expanded = c.expand(shape)
    if shape[-1] > 1 and expanded.stride(-1) != 1:
        return False
    return all(size == 1 or stride == 0 for size, stride in zip(shape[:-1], expanded.stride()[:-1]))


def index_problem(config, problem: GemmProblem) -> "str | None":
    """Why ``config``'s kernel cannot index ``problem`` with its 32-bit arithmetic (None: it can). The
    DSL's sizes, coordinates and tile counts are Int32, so for every GEMM family:

    - along M, N and K, the tiles (of a cluster, on the Hopper kernel) and one more end at or below 2^31:
      the kernels compute ``M + tile_m - 1`` and coordinates up to the last tile's end (``MAX_EXTENT``
      already keeps this for every config there is);
    - the linear tile index fits, with room for one persistent stride past the end: the 1-D grid of the
      cp.async kernels, the loop counter of the persistent one;
    - the banded tile order's ``raster * tile columns`` fits.
    """
    cluster_m, cluster_n = getattr(config, "cluster_m", 1), getattr(config, "cluster_n", 1)
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    rows = -(-problem.m // (tile_m * cluster_m))  # cluster tiles (tiles, without clusters)
    cols = -(-problem.n // (tile_n * cluster_n))
    k_tiles = -(-problem.k // tile_k)
    limit = _checks.INT32_MAX + 1
    if ((rows * cluster_m + 1) * tile_m <= limit and (cols * cluster_n + 1) * tile_n <= limit
            and (k_tiles + 1) * tile_k <= limit and rows * cols * problem.batch <= UNIT_INDEX_LIMIT
            and config.raster * cols < limit):  # on every call: one expression
        return None
    for extent, size, tile, repeat in (("M", problem.m, tile_m, rows * cluster_m),
                                       ("N", problem.n, tile_n, cols * cluster_n), ("K", problem.k, tile_k, k_tiles)):
        if (repeat + 1) * tile > limit:
            return f"{extent} = {size} in tiles of {tile} runs past 2^31, the kernels' 32-bit coordinates"
    if rows * cols * problem.batch > UNIT_INDEX_LIMIT:
        if problem.batch == 1:
            return f"{rows} x {cols} = {rows * cols} tiles do not fit the kernels' 32-bit tile index"
        return (f"{rows} x {cols} tiles x {problem.batch} matrices = {rows * cols * problem.batch} tiles do not fit "
                "the kernels' 32-bit tile index")
    return (f"raster {config.raster} x {cols} tile columns = {config.raster * cols} does not fit the tile "
            "order's 32-bit arithmetic; use a smaller raster")


def check_out_overlaps(a, b, c, out, beta_zero: bool) -> None:
    """``out`` must not share memory with A or B, and with C only as C itself (in place): the checks that
    depend on where the tensors are, not on their structure."""
    if out is None:
        return
    for name, t in (("a", a), ("b", b)):
        if _checks.overlaps(out, t):
            raise ValueError(f"out: must not overlap input {name} (it is read while out is written)")
    if c is not None and not beta_zero and _checks.overlaps(out, c):
        same_view = out.data_ptr() == c.data_ptr() and out.stride() == c.stride()
        if not same_view:
            raise ValueError("out: must be c itself (in place) or not overlap c, got a partial overlap")


def trivial_result(result, c, *, k: int, beta, beta_zero: bool) -> bool:
    """Handle the calls that need no kernel; True when ``result`` is final.

    An empty output needs nothing. With K == 0 there is no product: D = beta * C (rounded once in the
    output dtype), and with beta == 0 exactly zero (C unread).
    """
    if result.numel() == 0:
        return True
    if k == 0:
        if beta_zero:
            result.zero_()
        else:
            result.copy_(c * float(beta))
        return True
    return False


def unit_strides(t, major: str = "row"):
    """A view with the canonical strides the kernels' layouts expect, even where a size-1 dim let torch
    report something else: a "row" matrix (strides (ld, 1), ld >= the column count, or 0 for a C that
    repeats one row) or a "col" one ((1, ld), ld >= the row count); a batch keeps its batch stride (0: one
    matrix for every batch)."""
    rows, cols = t.shape[-2], t.shape[-1]
    if major == "row":
        strides = (t.stride(-2) if rows > 1 else max(cols, 1), 1)
    else:
        strides = (1, t.stride(-1) if cols > 1 else max(rows, 1))
    if t.dim() == 3:
        strides = (t.stride(0) if t.shape[0] > 1 else rows * cols, *strides)
    if t.stride() == strides:
        return t
    return t.as_strided(t.shape, strides)


def widest_vector(dtype: str) -> int:
    """Elements in the widest access the kernels make, 16 bytes: 4 for "float32", 8 for the 16-bit types."""
    return 4 if dtype == "float32" else 8


def widest_dividing(value: int, widest: int) -> int:
    """The largest power of two up to ``widest`` that divides ``value`` (``widest`` for 0)."""
    v = widest
    while v > 1 and value % v:
        v //= 2
    return v


def operand_alignment(t, major: str, widest: int) -> int:
    """The widest vector (elements, a power of two up to ``widest``) that every access of ``t``'s matrices
    along their contiguous dim can use: the base address, the leading dimension, the contiguous extent and
    (a batch) the batch stride all multiples of it (0, a broadcast batch, is every multiple), so that
    every vector starts aligned and lies wholly inside or wholly outside a matrix (predication works per
    vector)."""
    extent = t.shape[-1] if major == "row" else t.shape[-2]
    lines = t.shape[-2] if major == "row" else t.shape[-1]
    ld = t.stride(-2) if major == "row" else t.stride(-1)
    batch_stride = t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0
    # A tensor's address is a multiple of its element size: in elements, every quantity is an integer.
    return widest_dividing(math.gcd(t.data_ptr() // t.element_size(), ld if lines > 1 else 0, extent, batch_stride),
                           widest)



def make_problem(a, b, c=None, *, beta=0.0, out=None) -> GemmProblem:
    """The problem of validated operands as the kernel takes them (``unit_strides`` views: matrices, or
    batches of one extent whose broadcast operands have batch stride 0): alignments measured on the actual
    pointers and strides, up to 16 bytes for 16-bit types and 4 elements for float32; the majorness of
    ``a`` and ``b``; the batch; the compute capability of their device."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    dtype = _DTYPE_NAMES[a.dtype]
    widest = widest_vector(dtype)
    beta_zero = _checks.float32_scalar("beta", beta) == 0.0  # as the kernel sees it
    c_align = widest
    for t in ([out] if out is not None else []) + ([c] if (c is not None and not beta_zero) else []):
        c_align = min(c_align, operand_alignment(t, "row", widest))
    a_major = operand_major("a", a)
    b_major = operand_major("b", b)
    return GemmProblem(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        beta_zero=beta_zero,
        a_align=operand_alignment(a, a_major, widest),
        b_align=operand_alignment(b, b_major, widest),
        c_align=c_align,
        sm=device_sm(a),
        batch=a.shape[0] if a.dim() == 3 else 1,
        a_major="k" if a_major == "row" else "m",
        b_major="n" if b_major == "row" else "k",
    )
