"""What a scan call is to its configs and compile keys: the dtypes, the problem, the access width, the
validity predicate, and the public op's argument checks."""

from __future__ import annotations

import dataclasses
import torch

from ...runtime import checks
from ...runtime.device import SM90_SHARED_BYTES

# input dtype -> (output dtype, C++ input type, C++ output type); the output follows torch.cumsum.
DTYPES = {
    torch.float32: (torch.float32, "float", "float"),
    torch.float64: (torch.float64, "double", "double"),
    torch.int32: (torch.int64, "int", "long long"),
    torch.int64: (torch.int64, "long long", "long long"),
}


@dataclasses.dataclass(frozen=True)
class ScanProblem:
    rows: int
    length: int
    dtype: torch.dtype = torch.float32
    exclusive: bool = False
    vector: int = 0  # elements per vector access; 0 means the widest (16 bytes), as for fresh allocations
    shared_limit: int = SM90_SHARED_BYTES  # dynamic shared memory a CTA may use on the target device

    @property
    def numel(self) -> int:
        return self.rows * self.length

    @property
    def vector_width(self) -> int:
        return self.vector or 16 // self.dtype.itemsize

    @property
    def out_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]


def _vector_width(x: torch.Tensor, y: torch.Tensor | None) -> int:
    """Elements per access such that x and y (None: a fresh, aligned allocation) are aligned for it: a power
    of two, 16 bytes of input at most."""
    width = 16 // x.element_size()
    out_size = DTYPES[x.dtype][0].itemsize
    while width > 1 and (checks.alignment_bytes(x) < width * x.element_size()
                         or (y is not None and checks.alignment_bytes(y, 32) < width * out_size)):
        width //= 2
    return width


def check_scan_args(x, out) -> torch.dtype:
    """The public op's checks of ``x`` and ``out``, in the order it makes them; returns the output dtype."""
    checks.cuda_tensor("x", x)
    checks.dtype_in("x", x, DTYPES)
    out_dtype = DTYPES[x.dtype][0]
    if out is not None:
        checks.output("out", out, shape=x.shape, dtype=out_dtype, device=x.device, inputs={"x": x},
                      allow_exact_alias=("x",) if x.is_contiguous() else ())
    return out_dtype
