"""The scan's shape zoo (registry.register_zoo): everyday shapes and held-out ones, each on the variant the
op runs it on (a strided dim on ``columns``, the last dim on ``lookback``)."""

from __future__ import annotations

import torch

from ...registry import KernelSpec, register_zoo
from .columns import COLUMNS_SPEC
from .lookback import SPEC
from .problem import ScanProblem


def zoo_problems() -> list[ScanProblem]:
    """The shape zoo (issue 22): one row from 2^10 to 2^26 elements (the report's standard problems hold
    2^24 and 2^28), many short rows and a few long ones, other dtypes, operators and directions, strided
    dims, and segmented scans (issue 25)."""
    single = [ScanProblem(1, 1 << p, torch.float32) for p in (10, 12, 14, 16, 18, 20, 22, 26)]
    rows = [ScanProblem(r, n, torch.float32) for r, n in ((64, 1 << 14), (1024, 1024), (16, 1 << 20), (1 << 20, 16))]
    others = [ScanProblem(1, 1 << 20, torch.int32), ScanProblem(1, 1 << 16, torch.float64),
              ScanProblem(1, 1 << 20, torch.float32, reverse=True), ScanProblem(1, 1 << 20, torch.float32, op="max"),
              ScanProblem(16, 4096, torch.bfloat16, op="logsumexp")]
    # Strided dims (the columns variant): dim 0 of a square matrix, the sequence dim of (batch, seq, hidden).
    strided = [ScanProblem(1, 1024, torch.float32, inner=1024), ScanProblem(8, 512, torch.float32, inner=768)]
    # Segmented scans (segment_starts, about one start per 1000 elements): packed sequences of one long row,
    # a batch of rows, reversed, and other operators and dtypes.
    segmented = [ScanProblem(1, 1 << 20, torch.float32, segmented=True), ScanProblem(64, 1 << 14, torch.float32, segmented=True),
                 ScanProblem(1, 1 << 20, torch.float32, reverse=True, segmented=True),
                 ScanProblem(16, 1 << 16, torch.bfloat16, op="max", segmented=True),
                 ScanProblem(1, 1 << 20, torch.int32, segmented=True)]
    return single + rows + others + strided + segmented


def held_out_problems() -> list[ScanProblem]:
    """Held-out shapes (registry.register_zoo): lengths that are not powers of two, rows of odd lengths."""
    return [ScanProblem(1, 3_000_000, torch.float32), ScanProblem(300, 7000, torch.float32),
            ScanProblem(7, 300_001, torch.float32), ScanProblem(1, 5_000_000, torch.int32),
            ScanProblem(1, 1_000_000, torch.float16, op="max", reverse=True),
            ScanProblem(1, 3000, torch.float32, inner=300), ScanProblem(3, 20_000, torch.float32, inner=96)]


def entry_for(problem: ScanProblem) -> KernelSpec:
    return COLUMNS_SPEC if problem.inner > 1 else SPEC


register_zoo(SPEC.op, zoo_problems, entry_for, held_out_problems)
