"""The one bound on the in-memory caches whose keys the caller drives (problem shapes, strides, scalars, streams).

A cache keyed by what a caller passes grows with every new shape a long-running process sees; one keyed by a
finite set (a compiled kernel per config, arch and device; a table per registry entry) does not, and may stay
a plain dict, with a comment at the cache saying why. ``remember`` drops the whole cache when it is full
rather than keeping an LRU order: the hit path stays one plain ``dict.get`` with no bookkeeping, every entry
is cheap to rebuild, and a cache that fills up is a process cycling through more shapes than it holds, which
an LRU would miss on as well. Dropping an entry never frees something still in use: callers hold what they
took out of a cache, and a GPU buffer freed by torch's caching allocator is reused only by later work on the
stream it was allocated on.
"""

from __future__ import annotations

from typing import Hashable, TypeVar

__all__ = ["MAX_ENTRIES", "MAX_STREAM_ENTRIES", "remember"]

MAX_ENTRIES = 4096
# For caches of per-stream GPU buffers (workspaces): each entry holds device memory, and a process runs on a
# few streams (torch's pools hold 32 per priority per device), so a few hundred is already a stream churn.
MAX_STREAM_ENTRIES = 256

V = TypeVar("V")


def remember(cache: dict, key: Hashable, value: V, max_entries: int | None = None) -> V:
    """Store ``value`` under ``key`` in ``cache`` and return it; a new key in a cache that holds
    ``max_entries`` (default ``MAX_ENTRIES``, read at each call) clears it first. Each step is one dict
    operation, so threads that share the cache see it cleared or not, never torn (the GIL makes each of
    them atomic)."""
    if len(cache) >= (MAX_ENTRIES if max_entries is None else max_entries) and key not in cache:
        cache.clear()
    cache[key] = value
    return value


def kept_launch(cache: dict, prepare, config, problem, inputs: dict, out, tensors: tuple):
    """A registry launcher's launch, kept in ``cache`` per config, problem, device and the layout (shape,
    strides, pointer mod 16) of ``tensors``, the ones its tensor maps describe: ``prepare(config, problem,
    inputs, out)`` on first use. The benchmark and sweeps call a launcher over and over on inputs of one
    layout; the ops' plans keep their own launches."""
    key = (config, problem, out.device.index) + tuple((t.shape, t.stride(), t.data_ptr() % 16) for t in tensors)
    launch = cache.get(key)
    if launch is None:
        launch = remember(cache, key, prepare(config, problem, inputs, out))
    return launch
