"""The scan's oracle pieces: the exact (or extended-precision) reference, the per-element error scale of a
prefix sum, and torch's answer (the baseline), for every operator, direction and dim. A problem's tensors
are viewed as (rows, length, inner) and scanned along the middle dim (``scan_dim``)."""

from __future__ import annotations

import torch

from .problem import ScanProblem


def scan_dim(problem: ScanProblem, x: torch.Tensor) -> int:
    """The dim of ``x`` (as the registry makes it: (length,), (rows, length) or (rows, length, inner)) that
    ``problem`` scans."""
    return 1 if problem.inner > 1 else x.dim() - 1


def _identity(op: str, dtype: torch.dtype) -> float | int:
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dtype.is_floating_point:
        return float("inf") if op == "min" else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if op == "min" else info.min


def torch_scan(x: torch.Tensor, dim: int, op: str, *, exclusive: bool = False, reverse: bool = False) -> torch.Tensor:
    """``op``'s torch function along ``dim`` in x's dtype (with flips for ``reverse`` and a shift by one,
    the identity first, for ``exclusive``): torch's answer, and in float64 the reference."""
    t = x.flip(dim) if reverse else x
    if op == "sum":
        y = torch.cumsum(t, dim)
    elif op == "prod":
        y = torch.cumprod(t, dim)
    elif op == "max":
        y = torch.cummax(t, dim).values
    elif op == "min":
        y = torch.cummin(t, dim).values
    else:
        y = torch.logcumsumexp(t, dim)
    if exclusive:
        first = torch.full_like(y.narrow(dim, 0, 1), _identity(op, y.dtype))
        y = torch.cat([first, y.narrow(dim, 0, y.shape[dim] - 1)], dim)
    return y.flip(dim) if reverse else y


def scan_scale(x: torch.Tensor, dim: int = -1, reverse: bool = False) -> torch.Tensor:
    """Per-element error scale of a prefix sum along ``dim`` (from the end for ``reverse``): rounding errors
    of a sum of i random terms grow like sqrt(i) times their typical size, plus the size of the partial sum
    itself."""
    dim = dim % x.dim()
    if reverse:
        return scan_scale(x.flip(dim), dim).flip(dim)
    length = x.shape[dim]
    x64 = x.to(torch.float64)
    rms = x64.pow(2).mean(dim=dim, keepdim=True).sqrt().clamp_min(1e-30)
    shape = [1] * x.dim()
    shape[dim] = length
    position = torch.arange(1, length + 1, device=x.device, dtype=torch.float64).reshape(shape)
    return position.sqrt() * rms + torch.cumsum(x64, dim=dim).abs()


def scan_reference(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """Exact for integers and for max/min; float64 for float inputs (computed in float64 from the input's
    values); for a float64 sum or product, in the CPU's extended precision (numpy longdouble: 64-bit
    significand on x86), since a float64 reference would carry the same rounding as the float64 result it
    judges."""
    x = inputs["x"]
    dim = scan_dim(problem, x)
    if x.dtype == torch.float64 and problem.op in ("sum", "prod"):
        import numpy as np

        wide = x.cpu().numpy().astype(np.longdouble)
        if problem.reverse:
            wide = np.flip(wide, axis=dim)
        ref = (np.cumsum if problem.op == "sum" else np.cumprod)(wide, axis=dim)
        if problem.exclusive:
            first = np.full_like(np.take(ref, [0], axis=dim), 0 if problem.op == "sum" else 1)
            ref = np.concatenate([first, np.take(ref, np.arange(ref.shape[dim] - 1), axis=dim)], axis=dim)
        if problem.reverse:
            ref = np.flip(ref, axis=dim)
        return torch.from_numpy(np.ascontiguousarray(ref).astype(np.float64)).to(x.device)
    if problem.op in ("max", "min"):
        return torch_scan(x, dim, problem.op, exclusive=problem.exclusive, reverse=problem.reverse)
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    return torch_scan(x.to(wide), dim, problem.op, exclusive=problem.exclusive, reverse=problem.reverse)


def error_scale(problem: ScanProblem, inputs: dict):
    """The oracle's per-element scale: the prefix-sum scale for float sums; None (the reference's largest
    magnitude) for the other float operators; integers are compared exactly."""
    x = inputs["x"]
    if not x.dtype.is_floating_point or problem.op != "sum":
        return None
    return scan_scale(x, scan_dim(problem, x), problem.reverse)


def torch_baseline(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """torch in the input precision: the error our kernel may have twice of."""
    x = inputs["x"]
    return torch_scan(x, scan_dim(problem, x), problem.op, exclusive=problem.exclusive, reverse=problem.reverse)
