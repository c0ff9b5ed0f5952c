"""The GEMM problem and its checks: the problem description, argument validation, the degenerate cases
(empty outputs, K == 0) that never launch a kernel, and the measurement of a call's problem.

Both ``sgemm`` and ``hgemm`` compute ``alpha * a @ b + beta * c`` on row-major matrices with the same
argument rules (docs/design.md, "Public API"); only the dtypes and the widest vector differ.
"""

from __future__ import annotations

import dataclasses

import torch

from ...registry import log2_floor
from ...runtime import checks as _checks
from ...runtime.cute_compile import alignment_elems
from ...runtime.device import capability

__all__ = [
    "GemmProblem",
    "shape_bucket",
    "validate_gemm_args",
    "check_out_overlaps",
    "trivial_result",
    "unit_strides",
    "device_sm",
    "make_problem",
    "MAX_EXTENT",
    "index_problem",
    "is_broadcast_c",
]

# The largest M, N or K the kernels index. Their sizes, tile counts and coordinates are 32-bit (the DSL's
# dynamic extents are Int32): ``(M + tile_m - 1) // tile_m`` and the coordinate one past the last tile of
# a cluster (two tiles of up to 256 on the Hopper kernel) must stay below 2^31, so a margin of 1024 covers
# every config. M = 2^31 - 1 otherwise wraps inside the DSL and fails at launch with a bare CUDA error.
MAX_EXTENT = 2**31 - 1024
# CUDA's largest grid.z (the persistent kernel's grid): the most its linear tile index may run past the end.
_GRID_Z_MAX = 65535

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """Everything about one GEMM call that a config or a compile key may depend on.

    ``dtype``: the element type of A, B, C and D ("float32", "float16" or "bfloat16").
    ``a_align``, ``b_align``, ``c_align``: the widest vector (in elements: 4, 2, 1 for float32; 8, 4, 2, 1
    for 16-bit types -- 16 bytes at most) that every access of A (along K), B (along N) and C/out (along N)
    can use -- base address, leading dimension and contiguous extent all multiples of it (see
    ``runtime.cute_compile.alignment_elems``). ``beta_zero``: C is not read.
    ``sm``: compute capability of the device it runs on (major * 10 + minor: 90 for the H100/H200), which
    decides the variants that can run it (TMA and wgmma need 90); problems made without a device (tests,
    sweeps, compile checks) describe the H200 the project tunes on.
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

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"GemmProblem.{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.dtype not in _DTYPE_NAMES.values():
            raise ValueError(f"GemmProblem.dtype: expected one of {sorted(_DTYPE_NAMES.values())}, got {self.dtype!r}")
        widest = 4 if self.dtype == "float32" else 8
        allowed = tuple(v for v in (1, 2, 4, 8) if v <= widest)
        for name in ("a_align", "b_align", "c_align"):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"GemmProblem.{name}: expected one of {', '.join(map(str, allowed))} for {self.dtype}, "
                    f"got {getattr(self, name)!r}"
                )
        if not isinstance(self.sm, int) or self.sm < 10:
            raise ValueError(f"GemmProblem.sm: expected a compute capability such as 80 or 90, got {self.sm!r}")


def shape_bucket(problem: GemmProblem) -> str:
    """Tuned-config key (see cute_kernels/tuned.py): dtype, the log2 of M, N and K (rounded down), whether C
    is read, and the alignments (they change which configs compile)."""
    return (f"{problem.dtype}:m2^{log2_floor(problem.m)}:n2^{log2_floor(problem.n)}:k2^{log2_floor(problem.k)}:"
            f"{'beta0' if problem.beta_zero else 'beta'}:align{problem.a_align}.{problem.b_align}.{problem.c_align}")


def _check_matrix(name: str, t, dtypes, shape: tuple[int, int] | None = None, *, written: bool = False) -> None:
    _checks.tensor(name, t, written=written)
    _checks.dtype_in(name, t, dtypes)
    _checks.row_major_matrix(name, t, shape=shape)


def validate_gemm_args(a, b, c, *, alpha, beta, out, config, config_cls,
                       dtypes) -> tuple[int, int, int, float, float]:
    """Every check of a GEMM call, before anything is allocated or written; returns (m, n, k, alpha, beta),
    alpha and beta as the float32 values the kernels use (beta == 0.0: C is not read).

    ``dtypes``: the accepted input dtypes; when there are several, b, c and out must have a's.
    """
    _check_matrix("a", a, dtypes)
    same = (a.dtype,) if len(dtypes) > 1 else dtypes
    _check_matrix("b", b, same)
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b: expected {k} rows to match a's {k} columns (a is {tuple(a.shape)}), got {tuple(b.shape)}")
    n = b.shape[1]
    for name, extent, size in (("a", "M (rows)", m), ("a", "K (columns)", k), ("b", "N (columns)", n)):
        if size > MAX_EXTENT:
            raise ValueError(f"{name}: {extent} = {size} is past {MAX_EXTENT}, the largest the GEMM kernels index "
                             "(32-bit sizes and tile coordinates, with a margin for the last tile)")
    # As the kernels take them, in float32: whether C is read is decided on that beta (1e-50 is 0.0).
    alpha, beta = _checks.float32_scalar("alpha", alpha), _checks.float32_scalar("beta", beta)
    if c is not None:
        _checks.tensor("c", c)  # before its shape is read
    if c is not None and is_broadcast_c(c, m, n):
        _checks.dtype_in("c", c, same)
    elif c is not None:
        _check_matrix("c", c, same, (m, n))
    elif beta != 0.0:
        raise ValueError(f"c: required when beta != 0 (beta={beta}), got None")
    if out is not None:
        _check_matrix("out", out, same, (m, n), written=True)
    _checks.config_type(config, config_cls)

    # Device checks come after every structural check, so those are testable with CPU tensors.
    operands = {"a": a, "b": b, "c": c, "out": out}
    for name, t in operands.items():
        if t is not None:
            _checks.cuda_tensor(name, t)
    _checks.same_device(**operands)
    check_out_overlaps(a, b, c, out, beta == 0.0)
    return m, n, k, alpha, beta


def is_broadcast_c(c, m: int, n: int) -> bool:
    """Whether ``c`` broadcasts to (M, N) as ``torch.addmm``'s input does: a smaller tensor (a bias row (N,)
    or (1, N), a column (M, 1), a scalar () or (1, 1)) or an (M, N) view of one (a zero stride along a dim
    longer than 1, as ``expand`` makes); a ValueError naming c when its shape neither is (M, N) nor
    broadcasts to it. The op runs such a C as its (M, N) expansion."""
    shape = tuple(c.shape)
    if shape == (m, n):
        return any(size > 1 and stride == 0 for size, stride in zip(shape, c.stride()))
    if len(shape) <= 2 and all(s in (1, full) for s, full in zip(shape[::-1], (n, m))):
        return True
    raise ValueError(f"c: expected shape ({m}, {n}) or one that broadcasts to it as torch.addmm's input does "
                     f"((N,), (1, N), (M, 1), (1, 1) or ()), got {shape}")


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
            and (k_tiles + 1) * tile_k <= limit and rows * cols <= limit - 1 - _GRID_Z_MAX
            and config.raster * cols < limit):  # on every call: one expression
        return None
    for extent, size, tile, repeat in (("M", problem.m, tile_m, rows * cluster_m),
                                       ("N", problem.n, tile_n, cols * cluster_n), ("K", problem.k, tile_k, k_tiles)):
        if (repeat + 1) * tile > limit:
            return f"{extent} = {size} in tiles of {tile} runs past 2^31, the kernels' 32-bit coordinates"
    if rows * cols > limit - 1 - _GRID_Z_MAX:
        return f"{rows} x {cols} = {rows * cols} tiles do not fit the kernels' 32-bit tile index"
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
    if result.shape[0] == 0 or result.shape[1] == 0:
        return True
    if k == 0:
        if beta_zero:
            result.zero_()
        else:
            result.copy_(c * float(beta))
        return True
    return False


def unit_strides(t):
    """A view with the canonical strides the kernels' layouts expect: stride 1 in the last dim and a row
    stride >= the column count even where a size-1 dim let torch report something else."""
    rows, cols = t.shape
    ld = t.stride(0) if rows > 1 else max(cols, 1)
    if t.stride(1) == 1 and t.stride(0) == ld:
        return t
    return t.as_strided((rows, cols), (ld, 1))


def device_sm(t) -> int:
    """Compute capability (major * 10 + minor) of a CUDA tensor's device; 90 for a CPU tensor (tests)."""
    if not t.is_cuda:
        return 90
    major, minor = capability(t.device.index)
    return 10 * major + minor


def make_problem(a, b, c=None, *, beta=0.0, out=None) -> GemmProblem:
    """The problem of validated tensors (alignments measured on the actual pointers and strides, up to
    16 bytes for 16-bit types and 4 elements for float32; the compute capability of their device)."""
    m, k = a.shape
    n = b.shape[1]
    dtype = _DTYPE_NAMES[a.dtype]
    widest = 4 if dtype == "float32" else 8
    beta_zero = _checks.float32_scalar("beta", beta) == 0.0  # as the kernel sees it
    c_align = widest
    for t in ([out] if out is not None else []) + ([c] if (c is not None and not beta_zero) else []):
        c_align = min(c_align, alignment_elems(t, widest))
    return GemmProblem(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        beta_zero=beta_zero,
        a_align=alignment_elems(a, widest),
        b_align=alignment_elems(b, widest),
        c_align=c_align,
        sm=device_sm(a),
    )
