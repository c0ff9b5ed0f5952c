"""The public ``linear_scan`` op: its checks (shared with the custom op's fake implementation) and the eager
call, which moves a strided dim last, broadcasts ``a`` and ``h0`` and runs the ``linear_scan`` entry. Its
backward lives with the custom op (``torch_ops``)."""

from __future__ import annotations

import torch

from ... import registry
from ...runtime import checks
from ...runtime.autograd import check_writable, mark_written
from ...runtime.device import on_device, shared_memory_limit
from .config import ScanConfig
from .linear import DTYPES, LinearScanProblem, prepare, why_unsupported
from .op import check_dim
from .problem import _vector_width


def split_decay(a) -> tuple[torch.Tensor | None, float]:
    """``a`` as (a tensor, 0.0) or (None, a number): the two ways a decay crosses the custom op's schema
    (the number is checked with the rest of the call)."""
    if isinstance(a, torch.Tensor):
        return a, 0.0
    if type(a) in (float, int):
        return None, float(a)
    raise TypeError(f"a: expected a tensor or a Python number, got {type(a).__name__}")


def other_dims(shape, dim: int) -> tuple[int, ...]:
    """``shape`` without ``dim``: the shape of one start value per recurrence."""
    return tuple(s for i, s in enumerate(shape) if i != dim)


def check_linear_scan_args(a, x, dim, reverse, h0) -> tuple[int, bool, torch.Tensor | float]:
    """The checks of a call that need no memory (so the fake implementation makes them too), in order;
    returns (dim as a non-negative index, reverse, a as a tensor broadcasting to x or a float32 number)."""
    checks.cuda_tensor("x", x)
    checks.dtype_in("x", x, DTYPES)
    dim = check_dim(dim, x.dim())
    reverse = checks.flag("reverse", reverse)
    a_tensor, a_number = split_decay(a)
    if a_tensor is None:
        a_number = checks.float32_scalar("a", a_number, finite=True)
    else:
        checks.cuda_tensor("a", a)
        checks.same_device(x=x, a=a)
        if not a.is_floating_point():
            raise TypeError(f"a: expected a floating-point tensor, got {a.dtype}")
        try:
            shape = torch.broadcast_shapes(a.shape, x.shape)
        except RuntimeError:
            raise ValueError(f"a: shape {tuple(a.shape)} does not broadcast to x's {tuple(x.shape)}") from None
        if shape != x.shape:
            raise ValueError(f"a: shape {tuple(a.shape)} broadcasts past x's {tuple(x.shape)}")
    if h0 is not None:
        if not isinstance(h0, torch.Tensor):
            raise TypeError(f"h0: expected a tensor or None, got {type(h0).__name__}")
        checks.cuda_tensor("h0", h0)
        checks.same_device(x=x, h0=h0)
        if not h0.is_floating_point():
            raise TypeError(f"h0: expected a floating-point tensor, got {h0.dtype}")
        rest = other_dims(x.shape, dim)
        try:
            ok = torch.broadcast_shapes(h0.shape, rest) == rest
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"h0: expected a shape that broadcasts to {rest} (x's shape without dim {dim}), "
                             f"got {tuple(h0.shape)}")
    return dim, reverse, a if a_tensor is not None else a_number


def linear_scan(a, x: torch.Tensor, *, dim: int = -1, reverse: bool = False, h0: torch.Tensor | None = None,
                out: torch.Tensor | None = None, config: ScanConfig | None = None) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + x_t along ``dim`` with h_{-1} = ``h0`` (default 0); ``reverse=True``:
    h_t = a_t * h_{t+1} + x_t from the end (generalised advantage estimation is
    ``linear_scan(gamma * lam, delta, reverse=True)``). ``a``: a tensor broadcasting to x, or a Python number
    (one decay). float32, float16 and bfloat16 ``x`` with float32 state; the result has x's dtype.
    Differentiable in ``a``, ``x`` and ``h0``. A strided ``dim`` runs on a contiguous copy (moved last).
    """
    checks.no_fake(x=x, out=out)
    check_writable("out", out)
    dim, reverse, a = check_linear_scan_args(a, x, dim, reverse, h0)
    if out is not None:
        inputs = {name: t for name, t in (("x", x), ("a", a), ("h0", h0)) if isinstance(t, torch.Tensor)}
        checks.output("out", out, shape=x.shape, dtype=x.dtype, device=x.device, inputs=inputs)
    result = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if x.numel() == 0:
        return result
    last = x.dim() - 1 if x.dim() else 0
    x_run = x.movedim(dim, -1).contiguous() if x.dim() else x.reshape(1)
    rows = x_run.numel() // x_run.shape[-1]
    scalar = not isinstance(a, torch.Tensor)
    a_run = None if scalar else a.expand(x.shape).movedim(dim, -1).to(x.dtype).contiguous()
    h0_run = None if h0 is None else h0.expand(other_dims(x.shape, dim)).to(torch.float32).contiguous().reshape(rows)
    index = x.device.index
    vector = _vector_width(x_run, None, x.dtype)
    if a_run is not None:
        vector = min(vector, _vector_width(a_run, None, x.dtype))
    problem = LinearScanProblem(rows, x_run.shape[-1], x.dtype, reverse, scalar, h0 is not None, vector,
                                shared_memory_limit(index))
    if config is None:
        config = registry.get("linear_scan").choose_config(problem, index)
    else:
        checks.config_type(config, ScanConfig)
        reason = why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config: {config} cannot run {problem}: {reason}")
    moved = dim != last
    y = torch.empty(x_run.shape, dtype=x.dtype, device=x.device) if moved else result.view(x_run.shape)
    run = on_device(index, prepare, config, problem, {"x": x_run}, y)
    on_device(index, run, a_run, a if scalar else 0.0, x_run, h0_run, y)
    if moved:
        result.copy_(y.movedim(-1, dim))
    if out is not None:
        mark_written(out)
    return result
