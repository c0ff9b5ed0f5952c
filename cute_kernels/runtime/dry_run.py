"""The dry-run switch of ``ck.precompile``: while it is set, an op call compiles and loads everything it
needs (both backends) and launches nothing. One switch, read by every launch path."""

from __future__ import annotations

import contextlib
import contextvars

DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("cute_kernels_dry_run", default=False)


def is_dry_run() -> bool:
    return DRY_RUN.get()


@contextlib.contextmanager
def dry_run():
    """Launches inside this block are skipped (compiles and loads still happen)."""
    token = DRY_RUN.set(True)
    try:
        yield
    finally:
        DRY_RUN.reset(token)
