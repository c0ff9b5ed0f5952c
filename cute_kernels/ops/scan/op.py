"""The public ``scan`` op: a call of a structure seen before runs its plan; a new one is checked, given a
variant, a config and a packed launch, and becomes a plan (``runtime.plans``)."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import on_device, shared_memory_limit
from ...runtime.plans import CallPlans
from .config import ScanConfig
from .problem import ScanProblem, check_scan_args, _vector_width

_PLANS = CallPlans("scan")


class ScanPlan:
    """Every call of one structure: the result's shape, dtype and device, whether ``x`` is copied to a
    contiguous tensor first, whether ``out`` may be ``x`` itself, and the variant's launch (None: empty).
    Per call it checks which memory ``out`` overlaps and whether it may be written, allocates and launches."""

    __slots__ = ("shape", "dtype", "device", "device_index", "copy_x", "like_x", "launch")

    def __init__(self, x, out_dtype, copy_x, launch):
        self.shape, self.dtype, self.device, self.device_index = tuple(x.shape), out_dtype, x.device, x.device.index
        self.copy_x, self.launch = copy_x, launch
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
        x_run = x.contiguous() if self.copy_x else x
        on_device(self.device_index, self.launch, x_run, result)
        if out is not None:
            mark_written(out)
        return result


def prepare_scan(x, exclusive, out, config, variant) -> ScanPlan:
    """The plan of a scan call, after every check of it (nothing allocated or written before they pass):
    the problem measured, the config chosen (or the given one checked), the kernel loaded and its launch
    packed."""
    checks.no_fake(x=x, out=out)  # before anything reads a pointer
    check_writable("out", out)  # as torch refuses an in-place write to an inference tensor: first
    out_dtype = check_scan_args(x, out)
    exclusive = checks.flag("exclusive", exclusive)
    spec = registry.for_call("scan", variant)
    checks.config_type(config, spec.config_cls)
    copy_x = not x.is_contiguous()
    if x.numel() == 0:
        return ScanPlan(x, out_dtype, copy_x, None)
    index = x.device.index
    length = x.shape[-1] if x.dim() else 1
    x_c = x.contiguous() if copy_x else x
    problem = ScanProblem(x.numel() // length, length, x.dtype, exclusive, _vector_width(x_c, out),
                          shared_memory_limit(index))
    if config is None:
        config = spec.choose_config(problem, index)
    else:
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    launch = on_device(index, spec.prepare, config, problem, {"x": x_c}, out)
    return ScanPlan(x, out_dtype, copy_x, launch)


def scan(x: torch.Tensor, *, exclusive: bool = False, out: torch.Tensor | None = None,
         config: ScanConfig | None = None, variant: str | None = None) -> torch.Tensor:
    """Prefix sum of ``x`` along its last dimension, like ``torch.cumsum(x, -1)``.

    float32/float64 keep their dtype; int32/int64 give int64. ``exclusive=True`` shifts the sums by one
    (the first element of each row is 0). ``out`` may be ``x`` itself when the dtypes match. A
    non-contiguous ``x`` is copied to a contiguous one first; ``out`` must be contiguous. No autograd.
    Before capturing a call in a CUDA graph, warm up with the same dtype, exclusive flag, batching (one row
    or several), size class (above or below 2^22 elements) and alignment, so that nothing compiles or loads
    during the capture.
    """
    plan = _PLANS.plan((x, out, exclusive, config, variant), prepare_scan, x, exclusive, out, config, variant)
    return plan(x, out)
