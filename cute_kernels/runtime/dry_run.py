"""The dry-run switch of ``ck.precompile``: while it is set, an op call compiles and loads everything it
needs (both backends) and launches nothing. One switch, read by every launch path."""

from __future__ import annotations

import contextlib
import contextvars

DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("cute_kernels_dry_run", default=False)


def is_dry_run() -> bool:
    return DRY_RUN.get()


def take_result(dst, src) -> None:
    """``dst.copy_(src)``: a kernel's output taken into the caller's tensor, skipped in a dry run, where the
    kernel wrote nothing (precompile must leave ``out`` as it was)."""
    if not DRY_RUN.get():
        dst.copy_(src)


@contextlib.contextmanager
def dry_run():
    """Launches inside this block are skipped (compiles and loads still happen)."""
    token = DRY_RUN.set(True)
    try:
        yield
    finally:
        DRY_RUN.reset(token)
