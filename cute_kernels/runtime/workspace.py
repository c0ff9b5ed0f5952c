"""Device buffers a launch needs beside its operands, one set per stream: the key-split partials and
arrival counters of attention's fused_fp32, the tile scheduler's counters of its flash3_wgmma, the GEMMs'
split-K partial tiles and counters, and the
convolutions' per-split and per-CTA partial sums (the tiled kernel's kd splits, the kernel gradient). The one home
of the rule that makes reusing them safe.

Reuse across calls is safe because every use on one stream is ordered by that stream: a launch starts after
the previous launch that used the same buffer has finished, whichever op it was. Two streams never share a
buffer. Counters ("arrivals") are zeroed once, when allocated, and every kernel that uses them leaves them
at zero, so any later launch on the stream finds them so. A buffer grows (a new allocation) when a launch
needs more; the old one is freed by torch's caching allocator after the stream's earlier work. Under CUDA
graph capture a fresh buffer comes from the graph's memory pool (made, zeroing included, inside the
capture), so a replay, which may run on any stream, never shares one with eager calls.
"""

from __future__ import annotations

from .bounded import MAX_STREAM_ENTRIES, remember

__all__ = ["stream_buffer", "KINDS"]

# Each kind of buffer: its dtype and whether it is zero at rest (counters) or uninitialised (partials).
KINDS = {"partials": ("float32", False), "arrivals": ("int32", True)}

# (device, stream, kind) -> the buffer. Keyed by the caller's streams, which a process may create without
# end: bounded (remember).
_buffers: dict = {}


def stream_buffer(kind: str, device: int, stream: int, numel: int):
    """A 1-D buffer of ``kind`` (``KINDS``) with at least ``numel`` elements for launches on ``stream`` (a raw
    stream handle) of ``device``; at least 16 Ki elements, so small launches share one allocation."""
    import torch

    name, zeroed = KINDS[kind]
    dtype = getattr(torch, name)
    make = torch.zeros if zeroed else torch.empty
    if torch.cuda.is_current_stream_capturing():
        return make(max(numel, 1), dtype=dtype, device=device)
    key = (device, stream, kind)
    buf = _buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = remember(_buffers, key, make(max(numel, 1 << 14), dtype=dtype, device=device), MAX_STREAM_ENTRIES)
    return buf
