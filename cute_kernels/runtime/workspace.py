"""Device buffers a launch needs beside its operands (split-K partial tiles, arrival counters), one set per
stream: the one home of the rule that makes reusing them safe.

Reuse across calls is safe because every use on one stream is ordered by that stream: a launch starts after
the previous launch that used the same buffers has finished. Two streams never share a set. Under CUDA
graph capture a fresh set comes from the graph's memory pool (made, zeroing included, inside the capture),
so a replay, which may run on any stream, never shares buffers with eager calls.
"""

from __future__ import annotations

from typing import Callable

from .bounded import MAX_STREAM_ENTRIES, remember
from .device import current_stream_handle

__all__ = ["StreamWorkspace"]


class StreamWorkspace:
    """``get()``: this launch's buffers for torch's current stream on ``device_index``, made by ``make()``
    on the stream's first use. A kernel that needs counters at zero leaves them at zero when it ends, so
    a set made once with ``torch.zeros`` serves every later launch on its stream."""

    __slots__ = ("device_index", "make", "by_stream")

    def __init__(self, device_index: int, make: Callable[[], tuple]):
        self.device_index, self.make = device_index, make
        self.by_stream: dict[int, tuple] = {}  # stream handle -> buffers; bounded (remember)

    def get(self) -> tuple:
        import torch

        if torch.cuda.is_current_stream_capturing():
            return self.make()
        stream = current_stream_handle(self.device_index)
        buffers = self.by_stream.get(stream)
        if buffers is None:
            buffers = remember(self.by_stream, stream, self.make(), MAX_STREAM_ENTRIES)
        return buffers
