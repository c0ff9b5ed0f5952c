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


# scan.cu's column kernels take the inputs' arguments, then (the scan) the result, then the aggregates and
# the geometry: reduce(*inputs, aggregates, length, inner, column blocks, chunks, rows per chunk),
# scan(*inputs, y, aggregates, the same five).
_GEOMETRY = (ctypes.c_int64,) * 5


class ColumnLaunches:
    """The column kernels' two launches for every call of one structure, packed once: ``launch(inputs, out)``
    (the inputs' leading arguments, ``input_types``; ``out`` contiguous, non-empty) takes the stream's
    aggregate buffer (``runtime.workspace``: ordered by the stream; ``aggregate_words`` float32 words, 0 where
    a column is one chunk) and enqueues the reduce (only then) and the scan on torch's current stream. The
    scan's and the linear recurrence's column entries both launch through it."""

    def __init__(self, config: ColumnScanConfig, layout, names: tuple[str, str], input_types: tuple,
                 aggregate_words_per_column: int, device: int):
        """``layout``: the problem's rows, length, inner and vector_width as the geometry reads them;
        ``aggregate_words_per_column``: float32 words of one column's aggregate (an 8-byte accumulator two,
        an affine map two)."""
        lanes, column_blocks, chunks, rows_per_chunk = column_geometry(config, layout, sm_count(device))
        tiles = layout.rows * column_blocks * chunks
        geometry = (layout.length, layout.inner, column_blocks, chunks, rows_per_chunk)
        aggregate_words = tiles * lanes * layout.vector_width * aggregate_words_per_column if chunks > 1 else 0
        reduce_name, scan_name = names
        self.device, self.aggregate_words, self.inputs = device, aggregate_words, len(input_types)
        self.scan_slots = [ctype() for ctype in (*input_types, ctypes.c_void_p, ctypes.c_void_p, *_GEOMETRY)]
        for slot, value in zip(self.scan_slots[self.inputs + 2:], geometry):
            slot.value = value
        block = (config.threads, 1, 1)
        self.scan = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, scan_name, device), (tiles, 1, 1), block,
                                       tuple(self.scan_slots))
        self.reduce = None
        if aggregate_words:
            self.reduce_slots = [ctype() for ctype in (*input_types, ctypes.c_void_p, *_GEOMETRY)]
            for slot, value in zip(self.reduce_slots[self.inputs + 1:], geometry):
                slot.value = value
            self.reduce = nvrtc.PackedLaunch(nvrtc.kernel_for(SOURCE, reduce_name, device), (tiles, 1, 1), block,
                                             tuple(self.reduce_slots), lock=self.scan.lock)

    def __call__(self, inputs: tuple, out: torch.Tensor) -> None:
        stream = current_stream_handle(self.device)
        with self.scan.lock:  # the slots are this launch's until both kernels are enqueued
            for slot, value in zip(self.scan_slots, (*inputs, out.data_ptr())):
                slot.value = value
            if self.reduce is not None:
                # This thread's own: the reduce writes it and the scan reads it, two launches.
                aggregates = stream_buffer("partials", self.device, stream, self.aggregate_words, per_thread=True)
                for slot, value in zip(self.reduce_slots, (*inputs, aggregates.data_ptr())):
                    slot.value = value
                self.scan_slots[self.inputs + 1].value = aggregates.data_ptr()
                self.reduce.launch(stream)
            self.scan.launch(stream)


class ColumnScanLaunch:
    """The scan's column launches for every call of one structure: ``launch(x, out)`` (contiguous, non-empty)."""

    def __init__(self, config: ColumnScanConfig, problem: ScanProblem, device: int):
        self.launches = ColumnLaunches(config, problem, name_expressions(config, problem), (ctypes.c_void_p,),
                                       problem.acc_dtype.itemsize // 4, device)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.launches((x.data_ptr(),), out)


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
