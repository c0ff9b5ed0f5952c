"""linear_scan's ``columns`` variant: the recurrence along a strided dim, the columns of a contiguous
(rows, length, inner) array read in place (``legacy_cuda/scan.cu``'s linear_column_reduce and
linear_column_scan: the scan's column kernels over affine maps, in the rows' order), its launch and its
registry entry. Without it such a call moves the dim last (copies of a and x, and of the result back)."""

from __future__ import annotations

import ctypes

import torch

from ...registry import KernelSpec, register
from ...runtime import nvrtc
from .columns import ColumnLaunches
from .config import ColumnScanConfig, column_candidates, column_lanes, column_layout_problem, fit_column_config
from .entry import SOURCE, cpp
from .linear import DTYPES, LinearScanProblem, affine_scan, linear_spec_fields

# A row group's loads hold its kRows rows of maps (two floats an element): 4 rows keep a 16-bit tile of 8
# columns a lane at most ~124 registers, two CTAs of 256 threads an SM (8 rows: ~200). A narrow inner dim
# gets a narrower CTA of 8 rows a step (fit_column_config).
DEFAULT_CONFIG = ColumnScanConfig(threads=256, rows=4)
# The row groups' maps meet in static shared memory, 8 bytes a column per thread: kept within the 48 KB a
# kernel's static shared memory may take on every arch.
STATIC_SHARED_BYTES = 48 * 1024


def why_unsupported(config: ColumnScanConfig, problem: LinearScanProblem) -> str | None:
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} is not one of {DTYPES}"
    if problem.inner == 1:
        return "the columns variant scans a strided dim (inner > 1); the last dim is the lookback variant's"
    if problem.inner % column_vector(problem):
        return f"inner {problem.inner} is not a multiple of the vector width {column_vector(problem)}"
    if config.threads * column_vector(problem) * 8 > STATIC_SHARED_BYTES:
        return (f"{config.threads} threads of {column_vector(problem)} columns hold {config.threads * column_vector(problem) * 8} "
                f"bytes of maps in shared memory, over {STATIC_SHARED_BYTES}")
    return column_layout_problem(config, _Layout(problem))


def column_vector(problem: LinearScanProblem) -> int:
    """Elements a lane reads at once along its columns: the alignment's vector (``problem.vector``, 16
    bytes where it is 0), which divides inner (the host measures it so)."""
    return problem.vector or 16 // problem.dtype.itemsize


class _Layout:
    """The fields the column geometry reads (rows, length, inner, vector_width), with the column vector."""

    __slots__ = ("rows", "length", "inner", "vector_width")

    def __init__(self, problem: LinearScanProblem):
        self.rows, self.length, self.inner = problem.rows, problem.length, problem.inner
        self.vector_width = column_vector(problem)


def name_expressions(config: ColumnScanConfig, problem: LinearScanProblem) -> tuple[str, str]:
    """(linear_column_reduce, linear_column_scan) for ``problem`` with ``config``."""
    c = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}[problem.dtype]
    layout = _Layout(problem)
    shape = f"{config.threads}, {column_lanes(config, layout)}, {layout.vector_width}, {config.rows}"
    flags = f"{cpp(problem.reverse)}, {cpp(problem.scalar_a)}, {cpp(problem.h0)}"
    return (f"scan::linear_column_reduce<{c}, {shape}, {flags}>", f"scan::linear_column_scan<{c}, {shape}, {flags}>")


def compile(config: ColumnScanConfig, problem: LinearScanProblem, arch: str):  # noqa: A001 - the KernelSpec field
    reason = why_unsupported(config, problem)
    if reason is not None:
        raise ValueError(f"config {config} does not support {problem}: {reason}")
    return nvrtc.compile_cubin(SOURCE, name_expressions(config, problem), arch)


# linear_column_reduce's and linear_column_scan's leading arguments: a, a_scalar, x, h0.
_INPUT_TYPES = (ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
_AFFINE_WORDS = 2  # an aggregate map is two float32 words


class LinearColumnsLaunch:
    """The recurrence's column launches for every call of one structure: ``launch(a, a_scalar, x, h0, out)``
    (as the lookback variant's: a and h0 None where the problem has a scalar decay or no h0; tensors
    contiguous, in the problem's (rows, length, inner) layout)."""

    def __init__(self, config: ColumnScanConfig, problem: LinearScanProblem, device: int):
        self.launches = ColumnLaunches(config, _Layout(problem), name_expressions(config, problem), _INPUT_TYPES,
                                       _AFFINE_WORDS, device)

    def __call__(self, a, a_scalar: float, x, h0, out) -> None:
        self.launches((a.data_ptr() if a is not None else 0, a_scalar, x.data_ptr(),
                       h0.data_ptr() if h0 is not None else 0), out)


def prepare(config: ColumnScanConfig, problem: LinearScanProblem, inputs: dict, out) -> LinearColumnsLaunch:
    return LinearColumnsLaunch(config, problem, inputs["x"].device.index)


def launch(config: ColumnScanConfig, problem: LinearScanProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    a = inputs["a"]
    prepare(config, problem, inputs, out)(None if problem.scalar_a else a, float(a) if problem.scalar_a else 0.0,
                                          inputs["x"], inputs.get("h0"), out)
    return out


# ---- Inputs, reference and baseline: (rows, length, inner) arrays scanned along dim 1 -----------------------


def make_inputs(problem: LinearScanProblem, device, generator=None) -> dict:
    """x randn of shape (rows, length, inner); a in (0.5, 1), or 0.9 as the scalar; h0 (rows, inner) randn."""
    shape = (problem.rows, problem.length, problem.inner)
    x = torch.randn(shape, device=device, generator=generator).to(problem.dtype)
    a = 0.9 if problem.scalar_a else (0.5 + 0.5 * torch.rand(shape, device=device, generator=generator)).to(problem.dtype)
    inputs = {"a": a, "x": x}
    if problem.h0:
        inputs["h0"] = torch.randn(problem.rows, problem.inner, device=device, generator=generator)
    return inputs


def _along_dim1(problem: LinearScanProblem, inputs: dict, dtype) -> torch.Tensor:
    """``affine_scan`` of the inputs in ``dtype`` along dim 1 (moved last, then back)."""
    x = inputs["x"]
    a = torch.full_like(x, float(inputs["a"]), dtype=dtype) if problem.scalar_a else inputs["a"].to(dtype)
    h0 = inputs.get("h0")
    h = affine_scan(a.movedim(1, -1), x.to(dtype).movedim(1, -1), None if h0 is None else h0.to(dtype),
                    problem.reverse)
    return h.movedim(-1, 1)


def reference(problem: LinearScanProblem, inputs: dict) -> torch.Tensor:
    return _along_dim1(problem, inputs, torch.float64)


def baseline(problem: LinearScanProblem, inputs: dict) -> torch.Tensor:
    return _along_dim1(problem, inputs, inputs["x"].dtype).contiguous()


def _standard_problems() -> list[LinearScanProblem]:
    """Along a strided dim: rewards laid (T, envs) scanned over T (a reversed advantage estimate), and
    (B, T, D) sequences scanned over T, float32 and bf16 with a start value per sequence and channel."""
    return [LinearScanProblem(1, 4096, torch.float32, reverse=True, scalar_a=True, inner=1024),
            LinearScanProblem(16, 2048, torch.float32, inner=1024),
            LinearScanProblem(8, 4096, torch.bfloat16, h0=True, inner=512)]


SPEC = register(KernelSpec(
    **linear_spec_fields(),
    variant="columns",
    config_cls=ColumnScanConfig,
    default_config=lambda problem: fit_column_config(DEFAULT_CONFIG, _Layout(problem)),
    candidates=column_candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    prepare=prepare,
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    standard_problems=_standard_problems,
    description="h_t = a_t h_{t-1} + x_t along a strided dim: the scan's column kernels over affine maps (scan.cu)",
    sweep_axes=(("threads", "rows"), ("lanes", "tiles_per_sm")),
    # Each chunk's prefix and each step combine in a fixed order: repeatable bit for bit.
    deterministic=True,
    baseline_name="torch ops (doubling of the map composition in 64-element chunks, along the dim)",
))
