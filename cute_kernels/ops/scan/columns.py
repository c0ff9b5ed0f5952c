"""The scan's ``columns`` variant: a scan along a strided dim, the columns of a contiguous
(rows, length, inner) array read in place (``legacy_cuda/scan.cu``'s column_reduce and column_scan,
compiled with NVRTC), its launch and its registry entry."""

from __future__ import annotations

import ctypes

import torch

from cute_kernels.runtime import nvrtc

from ...registry import KernelSpec, register
from ...runtime.device import current_stream_handle, sm_count
from ...runtime.workspace import stream_buffer
from .config import (ColumnScanConfig, column_candidates, column_geometry, column_lanes, column_shape_bucket,
                     default_column_config, why_unsupported_columns)
from .entry import SOURCE, cpp, shared_spec_fields
from .problem import ScanProblem


def name_expressions(config: ColumnScanConfig, problem: ScanProblem) -> tuple[str, str]:
    """(column_reduce, column_scan) for ``problem`` with ``config``."""
    cin, cout, op = problem.cpp_types()
    shape = f"{config.threads}, {column_lanes(config, problem)}, {problem.vector_width}, {config.rows}"
    return (f"scan::column_reduce<{cin}, {cout}, {op}, {shape}, {cpp(problem.reverse)}>",
            f"scan::column_scan<{cin}, {cout}, {op}, {shape}, {cpp(problem.exclusive)}, {cpp(problem.reverse)}>")


def compile(config: ColumnScanConfig, problem: ScanProblem, arch: str):  # noqa: A001 - the KernelSpec field
    reason = why_unsupported_columns(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    return nvrtc.compile_cubin(SOURCE, name_expressions(config, problem), arch)


# scan.cu's parameters: column_reduce(x, aggregates, length, inner, column blocks, chunks, rows per chunk),
# column_scan(x, y, aggregates, length, inner, column blocks, chunks, rows per chunk).
_REDUCE_SIGNATURE = (ctypes.c_void_p, ctypes.c_void_p) + (ctypes.c_int64,) * 5
_SCAN_SIGNATURE = (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 5


class ColumnScanLaunch:
    """Both kernels' launches for every call of one structure, packed once; ``launch(x, out)`` (contiguous,
    non-empty) takes the stream's aggregate buffer (``runtime.workspace``: ordered by the stream) and
    enqueues the reduce (when a column has more than one chunk) and the scan on torch's current stream."""

    def __init__(self, config: ColumnScanConfig, problem: ScanProblem, device: int):
        reduce_name, scan_name = name_expressions(config, problem)
        lanes, column_blocks, chunks, rows_per_chunk = column_geometry(config, problem, sm_count(device))
        tiles = problem.rows * column_blocks * chunks
        geometry = (problem.length, problem.inner, column_blocks, chunks, rows_per_chunk)
        self.device = device
        # The aggregates, in the float32 units of the shared buffer (an 8-byte accumulator takes two).
        self.aggregate_words = tiles * lanes * problem.vector_width * problem.acc_dtype.itemsize // 4 if chunks > 1 else 0
        self.scan_slots = [ctype() for ctype in _SCAN_SIGNATURE]
        for slot, value in zip(self.scan_slots, (0, 0, 0, *geometry)):
            slot.value = value
        block = (config.threads, 1, 1)
        self.scan = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, scan_name, device), (tiles, 1, 1), block,
                                       tuple(self.scan_slots))
        self.reduce = None
        if self.aggregate_words:
            self.reduce_slots = [ctype() for ctype in _REDUCE_SIGNATURE]
            for slot, value in zip(self.reduce_slots, (0, 0, *geometry)):
                slot.value = value
            self.reduce = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, reduce_name, device), (tiles, 1, 1), block,
                                             tuple(self.reduce_slots), lock=self.scan.lock)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        stream = current_stream_handle(self.device)
        with self.scan.lock:  # the slots are this launch's until both kernels are enqueued
            x_ptr, y_ptr, aggregates_ptr = self.scan_slots[:3]
            x_ptr.value, y_ptr.value = x.data_ptr(), out.data_ptr()
            if self.reduce is not None:
                # This thread's own: the reduce writes it and the scan reads it, two launches.
                aggregates = stream_buffer("partials", self.device, stream, self.aggregate_words, per_thread=True)
                self.reduce_slots[0].value, self.reduce_slots[1].value = x.data_ptr(), aggregates.data_ptr()
                aggregates_ptr.value = aggregates.data_ptr()
                self.reduce.launch(stream)
            self.scan.launch(stream)


def prepare(config: ColumnScanConfig, problem: ScanProblem, inputs: dict, out: torch.Tensor) -> ColumnScanLaunch:
    return ColumnScanLaunch(config, problem, inputs["x"].device.index)


def launch(config: ColumnScanConfig, problem: ScanProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    prepare(config, problem, inputs, out)(inputs["x"], out)
    return out


def _standard_problems() -> list[ScanProblem]:
    """Issue 25's strided scans: dim 0 of (2^16, 256) and (4096, 4096) float32, and a 3-D middle dim."""
    return [ScanProblem(1, 1 << 16, torch.float32, inner=256), ScanProblem(1, 4096, torch.float32, inner=4096),
            ScanProblem(64, 1024, torch.float32, inner=64)]


COLUMNS_SPEC = register(KernelSpec(
    **shared_spec_fields(),
    variant="columns",
    config_cls=ColumnScanConfig,
    default_config=default_column_config,
    candidates=column_candidates,
    why_unsupported=why_unsupported_columns,
    compile=compile,
    launch=launch,
    prepare=prepare,
    standard_problems=_standard_problems,
    description="scan along a strided dim (scan.cu: column_reduce + column_scan), columns read in place",
    sweep_axes=(("threads", "rows"), ("lanes", "tiles_per_sm")),
    shape_bucket=column_shape_bucket,
    # Each chunk's prefix combines the earlier chunks' aggregates in a fixed order: repeatable bit for bit.
    deterministic=True,
    baseline_name="torch.cumsum along dim (or cumprod, cummax, cummin, logcumsumexp)",
))
