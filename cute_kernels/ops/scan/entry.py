"""What both scan variants' registry entries share: the source file, the template-flag spelling, the
inputs the registry makes for a problem, the bytes it moves, and the op-wide entry fields (oracle and
baseline)."""

from __future__ import annotations

import torch

from .problem import DTYPES, ScanProblem
from .reference import error_scale, scan_reference, torch_baseline

SOURCE = "scan.cu"


def cpp(flag: bool) -> str:
    return "true" if flag else "false"


def make_inputs(problem: ScanProblem, device, generator=None) -> dict:
    """x of shape (length,), (rows, length) or (rows, length, inner): randn, or integers in [-1000, 1000);
    for products, factors near 1 (randn's would overflow or vanish within a few hundred elements); for a
    segmented problem, random segment starts beside it."""
    if problem.inner > 1:
        shape = (problem.rows, problem.length, problem.inner)
    else:
        shape = (problem.rows, problem.length) if problem.rows > 1 else (problem.length,)
    if problem.dtype.is_floating_point:
        x = torch.randn(shape, dtype=torch.float32, device=device, generator=generator)
        if problem.op == "prod":
            x = 1 + x / 64
        x = x.to(problem.dtype)
    else:
        low, high = (-3, 4) if problem.op == "prod" else (-1000, 1000)
        x = torch.randint(low, high, shape, dtype=problem.dtype, device=device, generator=generator)
    inputs = {"x": x}
    if problem.segmented:  # segments of mean_segment elements on average
        inputs["segment_starts"] = torch.rand(shape, device=device, generator=generator) < 1 / problem.mean_segment
    return inputs


def scan_bytes(problem: ScanProblem) -> float:
    return problem.numel * (problem.dtype.itemsize + problem.out_dtype.itemsize + (1 if problem.segmented else 0))


def shared_spec_fields() -> dict:
    """The fields of lookback.py's and columns.py's entries that are the op's, not the variant's."""
    return dict(op="scan", backend="nvrtc", dtypes=tuple(DTYPES), make_inputs=make_inputs, reference=scan_reference,
                baseline=torch_baseline, flops=lambda p: float(p.numel), bytes=scan_bytes, sources=(SOURCE,),
                bound="bandwidth", error_scale=error_scale)
