"""Device buffers a launch needs beside its operands, one set per stream: the key-split partials and
arrival counters of attention's fused_fp32, the tile scheduler's counters of its flash3_wgmma, the GEMMs'
split-K partial tiles and counters, and the
convolutions' per-split and per-CTA partial sums (the tiled kernel's kd splits, the kernel gradient). The one home
of the rule that makes reusing them safe.

Reuse across calls is safe because every use on one stream is ordered by that stream: a launch starts after
the previous launch that used the same buffer has finished, whichever op it was. Two streams never share a
buffer. A call that uses one across two launches (a split kernel, then the sum of its partials; a reduce,
then a scan) takes its thread's own (``per_thread``): another thread's launch on the same stream could come
between its two. A caller holds the buffer tensor until its launch is enqueued, since another thread's
larger request replaces a shared one. Counters ("arrivals") are zeroed once, when allocated, and every
kernel that uses them leaves them at zero, so any later launch on the stream finds them so. A buffer grows (a new allocation) when a launch
needs more; the old one is freed by torch's caching allocator after the stream's earlier work. Under CUDA
graph capture a fresh buffer comes from the graph's memory pool (made, zeroing included, inside the
capture), so a replay, which may run on any stream, never shares one with eager calls.

Staging buffers (:func:`staging_buffer`, the zero-padded aligned copies of a misaligned GEMM's operands)
are kept per stream and thread too (a call uses one across copy in, kernel and copy out). Each is
zeroed when allocated and calls copy only into its data region, so its pad rows and columns stay zero: the
key holds the data region's shape as well as the buffer's.
"""

from __future__ import annotations

import threading

from .bounded import MAX_STREAM_ENTRIES, remember
from .device import stream_capturing

__all__ = ["stream_buffer", "staging_buffer", "clear_staging", "KINDS", "STAGING_BYTES"]

# Each kind of buffer: its dtype and whether it is zero at rest (counters) or uninitialised (partials).
KINDS = {"partials": ("float32", False), "arrivals": ("int32", True)}

# (device, stream, kind) -> (the buffer, its element count): the count kept beside it, so that the common
# call (a kept buffer large enough, outside graph capture) is two dict reads and the capture query. Keyed by
# the caller's streams, which a process may create without end: bounded (remember).
_buffers: dict = {}
# The same, per thread (``per_thread``), for calls that use a buffer across two launches: another thread's
# launch on the same stream could come between them. Kept in the thread's own storage, so they go with it.
_thread_buffers = threading.local()


def stream_buffer(kind: str, device: int, stream: int, numel: int, *, per_thread: bool = False):
    """A 1-D buffer of ``kind`` (``KINDS``) with at least ``numel`` elements for launches on ``stream`` (a raw
    stream handle) of ``device``; at least 16 Ki elements, so small launches share one allocation.
    ``per_thread``: this thread's own, for a call that uses it across two launches (a split kernel and the
    sum of its partials). A caller holds the tensor, not only its pointer, until its launches are enqueued:
    another thread's larger request replaces (and frees) a shared buffer."""
    key = (device, stream, kind)
    if not per_thread:
        kept = _buffers.get(key)
        if kept is not None and kept[1] >= numel and not stream_capturing():
            return kept[0]
    import torch

    name, zeroed = KINDS[kind]
    dtype = getattr(torch, name)
    make = torch.zeros if zeroed else torch.empty
    if stream_capturing():
        return make(max(numel, 1), dtype=dtype, device=device)
    if per_thread:
        mine = getattr(_thread_buffers, "buffers", None)
        if mine is None:
            mine = _thread_buffers.buffers = {}
        buf = mine.get(key)
        if buf is None or buf.numel() < numel:
            buf = remember(mine, key, make(max(numel, 1 << 14), dtype=dtype, device=device), MAX_STREAM_ENTRIES)
        return buf
    # The shared buffer was missing or too small (the fast path above): a larger one replaces it.
    buf = make(max(numel, 1 << 14), dtype=dtype, device=device)
    return remember(_buffers, key, (buf, buf.numel()), MAX_STREAM_ENTRIES)[0]


# The device memory the staging buffers may hold together: a new one that would take them past it empties
# the cache first (buffers still in use are safe: see the bounded module). A buffer over a sixteenth of it
# is not kept: its call's GPU time dwarfs the host time a kept buffer saves, and a call needs up to four.
STAGING_BYTES = 256 << 20
_staging: dict = {}


def staging_buffer(role: str, device, stream: int, dtype, shape: tuple, data_shape: tuple):
    """(buffer, data view): a zeroed ``shape`` buffer of ``dtype`` for the staged operand ``role`` ("a", "b",
    "c" or "out") of calls on ``stream`` of ``device`` (a torch.device) from this thread, and its leading
    ``data_shape`` corner, the only part a call writes (the kernel writes all of an "out" buffer, which no
    call reads as an operand). None under CUDA graph capture (a kept buffer would be baked into the graph
    and shared with eager calls) and for a buffer over ``STAGING_BYTES / 16``: the caller copies into fresh
    memory then. The buffers are plain tensors whatever mode the first call ran in (an inference tensor
    could not be written outside inference mode); callers copy detached values into them."""
    import torch

    if device.type == "cuda" and stream_capturing():
        return None
    key = (role, device, stream, threading.get_ident(), dtype, shape, data_shape)
    pair = _staging.get(key)
    if pair is not None:
        return pair
    nbytes = shape[0] * shape[1] * dtype.itemsize
    if 16 * nbytes > STAGING_BYTES:
        return None
    if nbytes + sum(buf.nbytes for buf, _ in _staging.values()) > STAGING_BYTES:
        _staging.clear()
    with torch.inference_mode(False):
        buf = torch.zeros(shape, dtype=dtype, device=device)
        pair = (buf, buf[:data_shape[0], :data_shape[1]])
    return remember(_staging, key, pair, MAX_STREAM_ENTRIES)


def clear_staging() -> None:
    """Free the kept staging buffers (to torch's caching allocator)."""
    _staging.clear()
