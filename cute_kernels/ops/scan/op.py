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
from ...runtime.dry_run import take_result
from .config import ColumnScanConfig, ScanConfig
from .problem import NARROW_INTEGERS, ScanProblem, _vector_width, check_scan_args, out_dtype

_PLANS = CallPlans("scan")


class ScanPlan:
    """Every call of one structure: the result's shape, dtype and device, how ``x`` becomes the contiguous
    tensor of the scan's input dtype the kernel reads (as it is, or copied), whether ``out`` may be ``x``
    itself, and the variant's launch (None: empty). Per call it checks which memory ``out`` overlaps and
    whether it may be written, allocates and launches."""

    __slots__ = ("shape", "dtype", "device", "device_index", "copy_x", "input_dtype", "cast_dtype", "like_x", "launch",
                 "moved_dim", "kernel_dtype", "plain", "out_guard", "clamp")

    def __init__(self, x, input_dtype, result_dtype, launch, moved_dim: int | None = None, kernel_dtype=None,
                 clamp: tuple | None = None):
        self.shape, self.dtype, self.device, self.device_index = tuple(x.shape), result_dtype, x.device, x.device.index
        self.input_dtype = input_dtype
        # dtype= of a narrow integer: x is cast to it first (as torch casts it: a float past its range
        # converts as torch's own conversion does), then read as int32.
        narrow = result_dtype in NARROW_INTEGERS and x.dtype != result_dtype
        self.cast_dtype = result_dtype if narrow else input_dtype
        # What the kernel writes (integer sums and products: int64); a narrower result (torch.cumsum's dtype=
        # int32) is a copy of it, which wraps as a sum in that dtype would.
        self.kernel_dtype = kernel_dtype or result_dtype
        # An exclusive max or min into a narrow integer result: the int32 kernel's identity (its limits)
        # clamped to the result's before the narrowing copy, which would wrap it (int8's max starts at -128).
        self.clamp = clamp
        # moved_dim: a segmented scan of a strided dim runs on copies with that dim moved last.
        self.moved_dim = moved_dim
        self.copy_x = (not x.is_contiguous() or input_dtype != x.dtype or self.cast_dtype != x.dtype
                       or moved_dim is not None)
        self.launch = launch
        # Then empty_like(x) is the result: the cheapest allocation.
        self.like_x = result_dtype == x.dtype and checks.has_canonical_strides(x)
        # x read as it is into a result like it: the commonest call, whose path below is the shortest.
        self.plain = launch is not None and not self.copy_x and self.like_x and self.kernel_dtype == result_dtype
        # out may be x itself where x is contiguous (check_scan_args' rule, so a repeat takes what a first
        # call takes): read as it is, or through a copy (moved, or a narrow integer's int32 one) made first.
        in_place = x.is_contiguous()
        self.out_guard = checks.PlanOverlaps(("x", "segment_starts"), ("x",) if in_place else ())

    def __call__(self, x, out, starts=None):
        if out is None and starts is None and self.plain:
            result = torch.empty_like(x)
            on_device(self.device_index, self.launch, x, result)
            return result
        if out is None:  # fresh: 16-byte aligned
            result = torch.empty_like(x) if self.like_x else torch.empty(self.shape, dtype=self.dtype, device=self.device)
        else:
            self.out_guard.check(out, x, starts)
            check_writable("out", out)
            result = out
        if self.launch is None:
            return result
        # Cast first where dtype= names a narrow integer, also from an int32 x (its max or min in int16 is
        # that of the int16 values).
        x_run = (x if x.dtype == self.input_dtype == self.cast_dtype
                 else x.to(self.cast_dtype).to(self.input_dtype))
        if self.moved_dim is not None:
            x_run, starts = x_run.movedim(self.moved_dim, -1), starts.movedim(self.moved_dim, -1)
            y = torch.empty(x_run.shape, dtype=self.kernel_dtype, device=self.device)
        elif self.kernel_dtype != self.dtype:
            y = torch.empty(self.shape, dtype=self.kernel_dtype, device=self.device)
        else:
            y = result
        # (Not x.to(memory_format=contiguous_format): to() returns a transposed 2-D x as it is, its
        # suggested memory format being "contiguous" already.)
        x_run = x_run.contiguous() if self.copy_x else x
        if starts is None:
            on_device(self.device_index, self.launch, x_run, y)
        else:
            on_device(self.device_index, self.launch, x_run, y, starts.contiguous())
        if self.clamp is not None and y is not result:
            y.clamp_(*self.clamp)
        if self.moved_dim is not None:
            take_result(result, y.movedim(-1, self.moved_dim))
        elif y is not result:
            take_result(result, y)
        if out is not None:
            mark_written(out)
        return result


def check_dim(dim, ndim: int) -> int:
    """``dim`` as a non-negative index of a tensor of ``ndim`` dims (a 0-d tensor scans as one element:
    -1 and 0), or a clear error. A SymInt passes: torch.compile makes an int argument symbolic once it has
    seen two values of it, and the comparisons below guard on it."""
    value = checks.integer(dim)  # a NumPy integer too, as torch.cumsum takes it
    if value is None:
        raise TypeError(f"dim: expected an int, got {type(dim).__name__}")
    dim = value
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise ValueError(f"dim: expected a dim in [{-size}, {size - 1}] of a {ndim}-d tensor, got {dim}")
    return dim % size


def scan_problem(x, dim: int, input_dtype, exclusive, reverse, op, out, index: int, starts=None) -> ScanProblem:
    """The problem of scanning ``x`` (as ``input_dtype``, contiguous) along ``dim``; the access width from
    the tensors the kernel will read and write (a cast or copied ``x`` is a fresh, aligned allocation).
    With segment ``starts`` the scan runs on the last dim (a strided dim moved there, on copies)."""
    shape = tuple(x.shape) or (1,)
    rows, length, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    segmented = starts is not None
    read = x if x.is_contiguous() and input_dtype == x.dtype else torch.empty(0, dtype=input_dtype, device=x.device)
    if segmented and inner > 1:  # moved last: fresh copies of x, the flags and the result
        rows, inner, out, starts = rows * inner, 1, None, None
        read = torch.empty(0, dtype=input_dtype, device=x.device)
    vector = _vector_width(read, out, out_dtype(input_dtype, op))
    if starts is not None and starts.is_contiguous():  # a vector's flags are one access of `vector` bytes
        while vector > 1 and checks.alignment_bytes(starts) < vector:
            vector //= 2
    return ScanProblem(rows, length, input_dtype, exclusive, vector, shared_memory_limit(index), op, reverse, inner,
                       segmented)


def check_segment_starts(starts, x) -> None:
    """``segment_starts``: None, or a bool tensor of x's shape on x's device."""
    if starts is None:
        return
    checks.cuda_tensor("segment_starts", starts)
    checks.same_device(x=x, segment_starts=starts)
    if starts.dtype != torch.bool:
        raise TypeError(f"segment_starts: expected a bool tensor, got {starts.dtype}")
    if starts.shape != x.shape:
        raise ValueError(f"segment_starts: expected x's shape {tuple(x.shape)}, got {tuple(starts.shape)}")


def prepare_scan(x, dim, exclusive, reverse, op, dtype, out, config, variant, starts=None) -> ScanPlan:
    """The plan of a scan call, after every check of it (nothing allocated or written before they pass):
    the problem measured, the variant and config chosen (or the given ones checked), the kernel loaded and
    its launch packed."""
    checks.no_fake(x=x, out=out, segment_starts=starts)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    input_dtype, result_dtype = check_scan_args(x, out, op, dtype)
    dim = check_dim(dim, x.dim())
    exclusive = checks.flag("exclusive", exclusive)
    reverse = checks.flag("reverse", reverse)
    check_segment_starts(starts, x)
    strided = math.prod(tuple(x.shape)[dim + 1:]) > 1
    if variant is None:  # the last dim, or a strided one (elements after it in memory); segments: the last
        variant = "columns" if strided and starts is None else "lookback"
    spec = registry.for_call("scan", variant)
    checks.config_type(config, (ScanConfig, ColumnScanConfig))
    checks.config_type(config, spec.config_cls)  # also for an empty x, which runs nothing
    moved_dim = dim if strided and starts is not None else None
    if x.numel() == 0:
        return ScanPlan(x, input_dtype, result_dtype, None)
    index = x.device.index
    # The kernel writes `out` itself unless the result is a narrowing copy of what it writes (ScanPlan).
    kernel_out = out if result_dtype == out_dtype(input_dtype, op) else None
    problem = scan_problem(x, dim, input_dtype, exclusive, reverse, op, kernel_out, index, starts)
    if config is None:
        reason = spec.why_unsupported(spec.default_config(problem), problem)
        if reason is not None:
            raise ValueError(f"variant: {variant!r} cannot run {problem}: {reason}")
        config = spec.choose_config(problem, index)
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    launch = on_device(index, spec.prepare, config, problem, {"x": x}, kernel_out)
    clamp = None
    if exclusive and op in ("max", "min") and result_dtype in NARROW_INTEGERS:
        limits = torch.iinfo(result_dtype) if result_dtype != torch.bool else None
        clamp = (0, 1) if limits is None else (limits.min, limits.max)
    return ScanPlan(x, input_dtype, result_dtype, launch, moved_dim, problem.out_dtype, clamp)


def scan(x: torch.Tensor, *, dim: int = -1, exclusive: bool = False, reverse: bool = False, op: str = "sum",
         segment_starts: torch.Tensor | None = None, dtype: torch.dtype | None = None,
         out: torch.Tensor | None = None, config=None, variant: str | None = None) -> torch.Tensor:
    """Inclusive scan of ``x`` along ``dim`` under ``op``, like torch's cumulative functions:

    - ``op="sum"``: ``torch.cumsum``; ``"prod"``: ``torch.cumprod``; ``"max"`` / ``"min"``: the values of
      ``torch.cummax`` / ``torch.cummin``; ``"logsumexp"``: ``torch.logcumsumexp`` (float inputs).
    - dtypes: float32/float64 keep theirs; float16/bfloat16 accumulate in float32 and give their own dtype;
      int32/int64 sums and products give int64 (wrapping as torch's int64 does), max/min keep the dtype;
      bool, uint8, int8 and int16 are read as int32 copies, with the same result dtypes (a mask's cumsum).
      ``dtype=`` casts ``x`` first and is the result's dtype, as torch.cumsum's is (an int32 sum wraps in int32;
      int8, uint8 and int16 too, read as int32 copies).
    - ``dim``: any dim; a strided one (not the last) is scanned in place, its columns read as they lie.
    - ``exclusive=True``: each result leaves its own element out (the first is the operator's identity:
      0, 1, -inf/+inf or the integer limits, -inf for logsumexp). ``reverse=True``: from the end of ``dim``
      (``flip(cumsum(flip(x)))`` without the flips).
    - ``segment_starts``: a bool tensor of x's shape; True marks the first element of a segment (in memory
      order), and the scan restarts there (a reversed scan restarts at each segment's last element). Each
      row along ``dim`` is a segment of its own anyway. A strided ``dim`` runs on copies moved last.
    - ``out`` may be ``x`` itself when the dtypes match and ``x`` is contiguous; ``out`` must be
      contiguous. A non-contiguous ``x`` is copied to a contiguous one first. Without ``dtype=``, an ``out``
      of another dtype is a sum's or product's dtype (as torch.cumsum's and cumprod's ``out``); the other
      operators take only their own result's dtype, as torch's do.
    - Gradients: through ``cute_kernels.scan`` (the public function), see its docs.

    Before capturing a call in a CUDA graph, warm up with the same structure (dtype, dim, flags, shape class
    and alignment), so that nothing compiles or loads during the capture.
    """
    if (type(x) is _TENSOR and (out is None or type(out) is _TENSOR) and segment_starts is None and config is None
            and variant is None and dtype is None and type(dim) is int and type(exclusive) is bool
            and type(reverse) is bool and type(op) is str):
        # The commonest calls (a plain tensor, flags as bools, a plain out or none, nothing else given), their
        # key written out (with out, six parts longer).
        try:
            key = (_PLAIN_CALL, x.dtype, x.device, x.shape, x.stride(), x.data_ptr() & 31, x.is_neg(), dim,
                   exclusive, reverse, op)
            if out is not None:
                key += (out.dtype, out.device, out.shape, out.stride(), out.data_ptr() & 31, out.is_neg())
        except RuntimeError:  # a tensor without strides or storage (sparse, nested): the full path names it
            key = None
        if key is not None:
            return _PLANS.keyed(key, prepare_scan, x, dim, exclusive, reverse, op, dtype, out, config, variant,
                                segment_starts)(x, out, segment_starts)
    plan = _PLANS.plan((x, out, (dim,) if type(dim) is int else dim, exclusive, reverse, op, dtype, config,
                        variant, segment_starts),
                       prepare_scan, x, dim, exclusive, reverse, op, dtype, out, config, variant, segment_starts)
    return plan(x, out, segment_starts)


_TENSOR = torch.Tensor
_PLAIN_CALL = object()  # the marker of scan's own key (CallPlans.keyed)
