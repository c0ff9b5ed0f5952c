"""The public ``scan`` op: checks its arguments, builds the problem, picks a variant and a config, and
launches on ``x``'s device."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks, device
from ...runtime.device import shared_memory_limit
from .config import ScanConfig
from .problem import ScanProblem, check_scan_args, _vector_width


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
    checks.no_fake(x=x, out=out)  # before anything reads a pointer
    out_dtype = check_scan_args(x, out)
    exclusive = checks.flag("exclusive", exclusive)
    spec = registry.for_call("scan", variant)
    checks.config_type(config, spec.config_cls)
    index = x.device.index
    length = x.shape[-1] if x.dim() else 1
    rows = x.numel() // length if length else 0
    x_c = x if x.is_contiguous() else x.contiguous()
    vector = _vector_width(x_c, out)
    problem = ScanProblem(rows, length, x.dtype, exclusive, vector, shared_memory_limit(index))
    if config is None:
        config = spec.choose_config(problem, index)
    elif x.numel():
        reason = spec.why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)  # fresh: 16-byte aligned, as assumed
    if x.numel() == 0:
        return out
    return device.on_device(index, spec.launch, config, problem, {"x": x_c}, out)
