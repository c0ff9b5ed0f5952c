"""The scan's oracle pieces: the exact (or extended-precision) reference, the per-element error scale of a
prefix sum, and torch's answer (the baseline)."""

from __future__ import annotations

import torch

from .problem import ScanProblem


def scan_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-element error scale of a prefix sum along the last dim: rounding errors of a sum of i random
    terms grow like sqrt(i) times their typical size, plus the size of the partial sum itself."""
    length = x.shape[-1]
    x64 = x.to(torch.float64)
    rms = x64.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(1e-30)
    position = torch.arange(1, length + 1, device=x.device, dtype=torch.float64)
    return position.sqrt() * rms + torch.cumsum(x64, dim=-1).abs()


def scan_reference(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """Exact for integers; float64 sums for float32 input; for float64 input, sums in the CPU's extended
    precision (numpy longdouble: 64-bit significand on x86), since a float64 reference would carry the same
    rounding as the float64 result it judges (torch's own float64 cumsum then has zero error by definition
    and the oracle's bound collapses to its floor)."""
    x = inputs["x"]
    if x.dtype == torch.float64:
        import numpy as np

        wide = x.cpu().numpy().astype(np.longdouble)
        ref = np.cumsum(wide, axis=-1)
        if problem.exclusive:
            ref = ref - wide
        return torch.from_numpy(ref.astype(np.float64)).to(x.device)
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    ref = torch.cumsum(x.to(wide), dim=-1)
    if problem.exclusive:
        ref = ref - x.to(wide)
    return ref


def torch_cumsum(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """torch in the input precision: the error our kernel may have twice of (exclusive: shifted by one)."""
    total = torch.cumsum(inputs["x"], dim=-1)
    if not problem.exclusive:
        return total
    return torch.cat([torch.zeros_like(total[..., :1]), total[..., :-1]], dim=-1)
