"""What a scan call is to its configs and compile keys: the operators and dtypes, the problem, the access
width, the validity predicate, and the public op's argument checks."""

from __future__ import annotations

import dataclasses
import torch

from ...runtime import checks
from ...runtime.device import SM90_SHARED_BYTES

# input dtype -> its C++ type in scan.cu.
DTYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "__half",
    torch.bfloat16: "__nv_bfloat16",
    torch.int32: "int",
    torch.int64: "long long",
}

# Integer inputs narrower than int32 (a bool mask's cumsum: compaction's offsets). The kernel reads an int32
# copy; the result has torch's dtype (int64 for sums and products, the input's for max and min).
NARROW_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16)

# op -> (scan.cu's operator template, the torch function whose values it gives, the input dtypes it takes).
OPS = {
    "sum": ("Sum", "torch.cumsum", tuple(DTYPES)),
    "prod": ("Prod", "torch.cumprod", tuple(DTYPES)),
    "max": ("Max", "torch.cummax", tuple(DTYPES)),
    "min": ("Min", "torch.cummin", tuple(DTYPES)),
    "logsumexp": ("LogSumExp", "torch.logcumsumexp", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
}


def out_dtype(dtype: torch.dtype, op: str) -> torch.dtype:
    """The result's dtype, as torch's function for ``op`` gives it: sums and products of integers are
    int64, everything else keeps the input's dtype."""
    if op in ("sum", "prod") and not dtype.is_floating_point:
        return torch.int64
    return dtype


def accumulator(dtype: torch.dtype, op: str) -> torch.dtype:
    """The dtype the scan carries: float32 for 16-bit floats, the output dtype otherwise."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return out_dtype(dtype, op)


@dataclasses.dataclass(frozen=True)
class ScanProblem:
    """A scan along the middle dim of a contiguous (rows, length, inner) array: ``rows`` is the product of
    the dims before the scanned one, ``inner`` of those after it (1: the scanned dim is the last).
    ``segmented``: a flag array beside x restarts the scan (``segment_starts``), on the last dim."""

    rows: int
    length: int
    dtype: torch.dtype = torch.float32
    exclusive: bool = False
    vector: int = 0  # elements per vector access the tensors' alignment allows; 0: 16 bytes (fresh allocations)
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device
    op: str = "sum"
    reverse: bool = False
    inner: int = 1
    segmented: bool = False
    mean_segment: int = 1000  # segmented inputs: a segment starts at each element with probability 1 / this

    @property
    def numel(self) -> int:
        return self.rows * self.length * self.inner

    @property
    def vector_width(self) -> int:
        """Elements per vector access: what alignment allows, and a divisor of what a vector must not
        straddle: a column block's width (``inner``) for strided scans, the whole array for reversed last-dim
        scans (whose vectors are read back to front from the array's end)."""
        width = self.vector or 16 // self.dtype.itemsize
        whole = self.inner if self.inner > 1 else self.numel if self.reverse else 0
        while width > 1 and whole % width:
            width //= 2
        return width

    @property
    def out_dtype(self) -> torch.dtype:
        return out_dtype(self.dtype, self.op)

    @property
    def acc_dtype(self) -> torch.dtype:
        return accumulator(self.dtype, self.op)

    def cpp_types(self) -> tuple[str, str, str]:
        """(input, output, operator) as scan.cu's templates take them."""
        return (DTYPES[self.dtype], DTYPES[self.out_dtype], f"scan::{OPS[self.op][0]}<{DTYPES[self.acc_dtype]}>")


def _vector_width(x: torch.Tensor, y: torch.Tensor | None, out_dtype: torch.dtype) -> int:
    """Elements per access such that x and y (None: a fresh, aligned allocation) are aligned for it: a power
    of two, 16 bytes of input at most."""
    width = 16 // x.element_size()
    out_size = out_dtype.itemsize
    while width > 1 and (checks.alignment_bytes(x) < width * x.element_size()
                         or (y is not None and checks.alignment_bytes(y, 32) < width * out_size)):
        width //= 2
    return width


def check_op(op) -> str:
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"op: expected one of {tuple(OPS)}, got {op!r}")
    return op


# dtype= may also name these (torch.cumsum and cumprod take them, bool not): x is cast to it, read as an int32
# copy, and the result wraps to it at the end, which gives the sums and products that wrap in it.
NARROW_CASTS = tuple(dtype for dtype in NARROW_INTEGERS if dtype != torch.bool)


def check_cast(dtype, x, source: str = "dtype: ") -> torch.dtype:
    """The dtype x is cast to before the scan (``dtype=``, as torch.cumsum takes it, or out's: ``source``
    starts the error naming where it came from), or x's own."""
    if dtype is None:
        return x.dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype or None, got {type(dtype).__name__}")
    if dtype not in DTYPES and dtype not in NARROW_CASTS:
        raise TypeError(f"{source}expected one of ({', '.join(str(d) for d in (*DTYPES, *NARROW_CASTS))}), got {dtype}")
    return dtype


def dtype_from_out(x, op, dtype, out) -> "torch.dtype | None":
    """out's dtype where it is the scan's: torch.cumsum and cumprod compute in out's dtype when no dtype= is
    given (logcumsumexp, cummax and cummin refuse another dtype, as this op does). None otherwise, also
    where out's dtype is the default result's anyway."""
    if (dtype is None and op in ("sum", "prod") and isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor)
            and out.dtype != out_dtype(x.dtype, op)):
        return out.dtype
    return None


def check_scan_args(x, out, op: str = "sum", dtype=None) -> tuple[torch.dtype, torch.dtype]:
    """The public op's checks of ``x``, ``op``, ``dtype`` and ``out``, in the order it makes them; returns
    (the dtype the kernel reads, the output dtype)."""
    op = check_op(op)
    checks.cuda_tensor("x", x)
    from_out = dtype_from_out(x, op, dtype, out)
    if from_out is not None:
        dtype = check_cast(from_out, x, f"out: a {op} scan computes in out's dtype (as torch.cumsum's out); ")
    cast = check_cast(dtype, x)
    input_dtype = cast
    if cast == x.dtype:
        takes = OPS[op][2]
        checks.dtype_in("x", x, takes + (NARROW_INTEGERS if torch.int32 in takes else ()))
    if input_dtype in NARROW_INTEGERS:
        if torch.int32 not in OPS[op][2]:
            raise TypeError(f"dtype: op {op!r} does not take {input_dtype}")
        input_dtype = torch.int32  # read as an int32 copy (so out=x reads the copy)
    elif input_dtype not in OPS[op][2]:
        raise TypeError(f"dtype: op {op!r} does not take {input_dtype}")
    # dtype= names the result's dtype, as torch.cumsum's does (an int32 sum stays int32, an int8 one int8,
    # wrapping).
    result_dtype = cast if dtype is not None else out_dtype(x.dtype, op)
    if out is not None:
        # out may be x itself where x is contiguous: the kernel scans in place, or (a narrow integer, read as
        # an int32 copy) reads a copy made before anything is written.
        in_place = ("x",) if x.is_contiguous() else ()
        checks.output("out", out, shape=x.shape, dtype=result_dtype, device=x.device, inputs={"x": x},
                      allow_exact_alias=in_place)
    return input_dtype, result_dtype
