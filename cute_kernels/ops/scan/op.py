"""The public ``scan`` op: a call of a structure seen before runs its plan; a new one is checked, given a
variant (``lookback`` for the last dim, ``columns`` for a strided one), a config and a packed launch, and
becomes a plan (``runtime.plans``)."""

from __future__ import annotations

import math

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import on_device, shared_memory_limit
from ...runtime.plans import CallPlans
from .config import ColumnScanConfig, ScanConfig
from .problem import ScanProblem, _vector_width, check_scan_args, out_dtype

_PLANS = CallPlans("scan")


class ScanPlan:
    """Every call of one structure: the result's shape, dtype and device, how ``x`` becomes the contiguous
    tensor of the scan's input dtype the kernel reads (as it is, or copied), whether ``out`` may be ``x``
    itself, and the variant's launch (None: empty). Per call it checks which memory ``out`` overlaps and
    whether it may be written, allocates and launches."""

    __slots__ = ("shape", "dtype", "device", "device_index", "copy_x", "input_dtype", "like_x", "launch")

    def __init__(self, x, input_dtype, out_dtype, launch):
        self.shape, self.dtype, self.device, self.device_index = tuple(x.shape), out_dtype, x.device, x.device.index
        self.input_dtype = input_dtype
        self.copy_x, self.launch = not x.is_contiguous() or input_dtype != x.dtype, launch
        # Then empty_like(x) is the result: the cheapest allocation.
        self.like_x = out_dtype == x.dtype and checks.has_canonical_strides(x)

    def __call__(self, x, out):
        if out is None:  # fresh: 16-byte aligned
            result = torch.empty_like(x) if self.like_x else torch.empty(*self.shape, dtype=self.dtype, device=self.device)
        else:
            checks.no_overlap("out", out, {"x": x}, ("x",) if not self.copy_x else ())
            check_writable("out", out)
            result = out
        if self.launch is None:
            return result
        # (Not x.to(memory_format=contiguous_format): to() returns a transposed 2-D x as it is, its
        # suggested memory format being "contiguous" already.)
        x_run = (x if x.dtype == self.input_dtype else x.to(self.input_dtype)).contiguous() if self.copy_x else x
        on_device(self.device_index, self.launch, x_run, result)
        if out is not None:
            mark_written(out)
        return result


def check_dim(dim, ndim: int) -> int:
    """``dim`` as a non-negative index of a tensor of ``ndim`` dims (a 0-d tensor scans as one element:
    -1 and 0), or a clear error. A SymInt passes: torch.compile makes an int argument symbolic once it has
    seen two values of it, and the comparisons below guard on it."""
    if type(dim) is not int and not isinstance(dim, torch.SymInt):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__}")
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise ValueError(f"dim: expected a dim in [{-size}, {size - 1}] of a {ndim}-d tensor, got {dim}")
    return dim % size


def scan_problem(x, dim: int, input_dtype, exclusive, reverse, op, out, index: int) -> ScanProblem:
    """The problem of scanning ``x`` (as ``input_dtype``, contiguous) along ``dim``; the access width from
    the tensors the kernel will read and write (a cast or copied ``x`` is a fresh, aligned allocation)."""
    shape = tuple(x.shape) or (1,)
    rows, length, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    read = x if x.is_contiguous() and input_dtype == x.dtype else torch.empty(0, dtype=input_dtype, device=x.device)
    return ScanProblem(rows, length, input_dtype, exclusive, _vector_width(read, out, out_dtype(input_dtype, op)),
                       shared_memory_limit(index), op, reverse, inner)


def prepare_scan(x, dim, exclusive, reverse, op, dtype, out, config, variant) -> ScanPlan:
    """The plan of a scan call, after every check of it (nothing allocated or written before they pass):
    the problem measured, the variant and config chosen (or the given ones checked), the kernel loaded and
    its launch packed."""
    checks.no_fake(x=x, out=out)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    input_dtype, result_dtype = check_scan_args(x, out, op, dtype)
    dim = check_dim(dim, x.dim())
    exclusive = checks.flag("exclusive", exclusive)
    reverse = checks.flag("reverse", reverse)
    if variant is None:  # the last dim, or a strided one (elements after it in memory)
        variant = "columns" if math.prod(tuple(x.shape)[dim + 1:]) > 1 else "lookback"
    spec = registry.for_call("scan", variant)
    checks.config_type(config, (ScanConfig, ColumnScanConfig))
    checks.config_type(config, spec.config_cls)  # also for an empty x, which runs nothing
    if x.numel() == 0:
        return ScanPlan(x, input_dtype, result_dtype, None)
    index = x.device.index
    problem = scan_problem(x, dim, input_dtype, exclusive, reverse, op, out, index)
    if config is None:
        reason = spec.why_unsupported(spec.default_config(problem), problem)
        if reason is not None:
            raise ValueError(f"variant: {variant!r} cannot run {problem}: {reason}")
        config = spec.choose_config(problem, index)
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    launch = on_device(index, spec.prepare, config, problem, {"x": x}, out)
    return ScanPlan(x, input_dtype, result_dtype, launch)


def scan(x: torch.Tensor, *, dim: int = -1, exclusive: bool = False, reverse: bool = False, op: str = "sum",
         dtype: torch.dtype | None = None, out: torch.Tensor | None = None, config=None,
         variant: str | None = None) -> torch.Tensor:
    """Inclusive scan of ``x`` along ``dim`` under ``op``, like torch's cumulative functions:

    - ``op="sum"``: ``torch.cumsum``; ``"prod"``: ``torch.cumprod``; ``"max"`` / ``"min"``: the values of
      ``torch.cummax`` / ``torch.cummin``; ``"logsumexp"``: ``torch.logcumsumexp`` (float inputs).
    - dtypes: float32/float64 keep theirs; float16/bfloat16 accumulate in float32 and give their own dtype;
      int32/int64 sums and products give int64 (wrapping as torch's int64 does), max/min keep the dtype.
      ``dtype=`` casts ``x`` first, as torch.cumsum's does.
    - ``dim``: any dim; a strided one (not the last) is scanned in place, its columns read as they lie.
    - ``exclusive=True``: each result leaves its own element out (the first is the operator's identity:
      0, 1, -inf/+inf or the integer limits, -inf for logsumexp). ``reverse=True``: from the end of ``dim``
      (``flip(cumsum(flip(x)))`` without the flips).
    - ``out`` may be ``x`` itself when the dtypes match and ``x`` is contiguous; ``out`` must be
      contiguous. A non-contiguous ``x`` is copied to a contiguous one first.
    - Gradients: through ``cute_kernels.scan`` (the public function), see its docs.

    Before capturing a call in a CUDA graph, warm up with the same structure (dtype, dim, flags, shape class
    and alignment), so that nothing compiles or loads during the capture.
    """
    plan = _PLANS.plan((x, out, (dim,) if type(dim) is int else dim, exclusive, reverse, op, dtype, config, variant),
                       prepare_scan, x, dim, exclusive, reverse, op, dtype, out, config, variant)
    return plan(x, out)
