"""``ck.precompile``: compile ahead of time every kernel that given calls of the public ops will need (NVRTC
kernels are also loaded onto the device), so that the first real call does not wait for a compiler.

    seconds = ck.precompile(ck.hgemm, a, b)                      # one call's kernels
    report = ck.precompile_all([(ck.attention, (q, k, v), {"causal": True}), (ck.scan, (x,), {})])

Each call runs the op's own Python path (validation, problem, tuned or default config, compile cache) with
GPU launches switched off, so the inputs are only looked at. An op whose answer needs no kernel (an empty
result, K = 0) still computes it with torch, into ``out`` when one is given.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from .runtime.dry_run import dry_run


def precompile(op: Callable, *args, **kwargs) -> float:
    """Compile and load what ``op(*args, **kwargs)`` needs, without running it; returns the seconds taken
    (mostly compile time on a cold cache, near zero on a warm one)."""
    t0 = time.perf_counter()
    with dry_run():
        op(*args, **kwargs)
    return time.perf_counter() - t0


def precompile_all(calls: Iterable[tuple[Callable, tuple, dict]]) -> list[tuple[str, float]]:
    """``precompile`` each (op, args, kwargs); returns (op name, seconds) per call, for a warm-up report."""
    return [(getattr(op, "__name__", str(op)), precompile(op, *args, **kwargs)) for op, args, kwargs in calls]
