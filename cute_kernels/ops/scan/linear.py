"""The registry op ``linear_scan``: the first-order linear recurrence h_t = a_t h_{t-1} + x_t along the last
dim, as a scan of affine maps on the look-back kernel's inline or early schedule (``legacy_cuda/scan.cu``:
linear_scan_kernel) or, for rows of whole tiles, the rows schedule (linear_scan_rows_kernel: a CTA per row,
no look-back): its problem, config rules, launch, reference and registry entry. The public op is
``linear_op``."""

from __future__ import annotations

import ctypes
import dataclasses

import torch

from ...registry import KernelSpec, register, register_zoo
from ...runtime import nvrtc
from ...runtime.device import MAX_GRID_X, SM90_SHARED_BYTES, current_stream_handle
from .config import RAMPS_NS, ScanConfig
from .entry import SOURCE, cpp
from .lookback import MAP_STATE_DTYPE, LookBackLaunch, first_wave_ctas, ramp_step_ns
from .problem import DTYPES as SCAN_DTYPES
from .reference import chunked_scan, pad_last

# The recurrence's inputs; its state is float32 whatever they are (16-bit inputs give 16-bit results).
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class LinearScanProblem:
    """h_t = a_t h_{t-1} + x_t along the last dim of a contiguous (rows, length) array; ``scalar_a``: one
    decay for every t; ``h0``: a start value per row (else 0)."""

    rows: int
    length: int
    dtype: torch.dtype = torch.float32
    reverse: bool = False
    scalar_a: bool = False
    h0: bool = False
    vector: int = 0  # elements per vector access the tensors' alignment allows; 0: 16 bytes
    shared_limit: int = SM90_SHARED_BYTES
    inner: int = 1  # > 1: along a strided dim of a contiguous (rows, length, inner) array (the columns variant)

    @property
    def numel(self) -> int:
        return self.rows * self.length * self.inner

    @property
    def vector_width(self) -> int:
        width = self.vector or 16 // self.dtype.itemsize
        while width > 1 and self.reverse and self.numel % width:  # reversed vectors are whole (scan.cu)
            width //= 2
        return width


def why_unsupported(config: ScanConfig, problem: LinearScanProblem) -> str | None:
    if problem.dtype not in DTYPES:
        return f"dtype {problem.dtype} is not one of {DTYPES}"
    if problem.inner > 1:
        return "a strided dim (inner > 1) is the columns variant's; the lookback variant scans the last dim"
    if config.staged and problem.vector_width * problem.dtype.itemsize < 4:
        return (f"a staged tile copies 4 bytes or more per cp.async, and a vector of {problem.vector_width} "
                f"{problem.dtype} is {problem.vector_width * problem.dtype.itemsize} bytes")
    if config.staged and shared_bytes(config, problem) > problem.shared_limit:
        return f"a staged tile of a and x needs {shared_bytes(config, problem)} bytes of shared memory, over {problem.shared_limit}"
    if config.lookback == "dedicated":
        return "the dedicated look-back warp sums the tile out of order (the map is not commutative)"
    if config.lookback == "early" and not config.staged:
        return ("the early schedule composes each lane's consecutive maps from the staged tile (a register tile "
                "holds the lanes' vectors 32 apart)")
    if config.items_per_thread % problem.vector_width:
        return f"items_per_thread={config.items_per_thread} is not a multiple of the vector width {problem.vector_width}"
    if config.items_per_thread > 32:
        return "more than 32 items per thread of two inputs do not fit in registers"
    if config.lookback == "rows":
        if problem.rows < 2:
            return "the rows schedule runs a CTA per row: one row would stream through a single SM"
        if config.staged:
            return "the rows schedule keeps two tiles in registers (the next one loading), not in shared memory"
        if config.items_per_thread > 16 or config.threads > 256 or config.items_per_thread > 8 * problem.vector_width:
            return ("the rows schedule's two register tiles of two inputs fit at most 16 items, 8 vector loads "
                    "and 256 threads a CTA (ptxas spills past them)")
        if problem.length % config.tile:
            return (f"the rows schedule takes rows of whole tiles: length {problem.length} is not a multiple of "
                    f"the tile's {config.tile} elements")
        if problem.rows > MAX_GRID_X:
            return f"{problem.rows} rows are more CTAs than one launch's grid holds"
    if -(-problem.numel // config.tile) > MAX_GRID_X:
        return f"{problem.numel} elements need more tiles than one launch's grid holds"
    return None


def shared_bytes(config: ScanConfig, problem: LinearScanProblem) -> int:
    """Dynamic shared memory a CTA needs: with a staged tile, x's tile and (unless a is one number) a's."""
    return config.shared_bytes(problem.dtype) * (1 if problem.scalar_a else 2)


def candidates() -> list[ScanConfig]:
    return ([ScanConfig(t, i, staged, lookback, ramp) for t in (128, 256, 384, 512) for i in (4, 8, 16, 24, 32)
             for staged in (False, True) for lookback in (("inline", "early") if staged else ("inline",))
             for ramp in RAMPS_NS]
            + [ScanConfig(t, i, False, "rows") for t in (128, 256) for i in (4, 8, 16)])


# The rows schedule's tiles in the order the default tries them, by element size: the first that divides a
# row. 256 x 16 wherever it divides; of the 2048-element tiles 128 x 16 for 4-byte elements and 256 x 8 for
# 2-byte ones (docs/notes/scan.md, the rows schedule measured).
ROWS_TILES = {4: ((256, 16), (128, 16), (128, 8), (128, 4)), 2: ((256, 16), (256, 8), (128, 8), (128, 4))}


def takes_rows_schedule(problem: LinearScanProblem) -> bool:
    """Whether the default runs ``problem`` a CTA per row (where a rows tile divides its row length): 64 rows
    or more up to 2^24 elements, or 32 rows or more of at most 16384 elements. A CTA per row streams its
    row alone, so fewer rows leave most SMs idle, and long rows keep each CTA streaming at one SM's rate
    where the look-back spreads a row over every SM; 2^24 elements is the largest batch measured
    (docs/notes/scan.md, the rows schedule measured, with the corners the rule has no measurement for)."""
    if problem.numel > 1 << 24:
        return False
    return problem.rows >= 64 or (problem.rows >= 32 and problem.length <= 16384)


def default_config(problem: LinearScanProblem) -> ScanConfig:
    """Batches of rows (``takes_rows_schedule``) of whole tiles take the rows schedule: a CTA per row, no
    look-back. Other large recurrences (4M elements and up): 384 x 24 staged, the best of the swept tiles at
    2^26 (large tiles win: fewer look-backs). The rest 256 x 16 in registers, the best look-back tile at
    (64, 16384) with the tiles around it within 5% (docs/notes/scan.md#linear-recurrences). Flat arrays take
    the ramp."""
    if takes_rows_schedule(problem):
        for threads, items in ROWS_TILES[problem.dtype.itemsize]:
            config = ScanConfig(threads, items, staged=False, lookback="rows")
            if why_unsupported(config, problem) is None:
                return config
    ramp = 4400 if problem.rows == 1 else 0
    if problem.numel >= 1 << 22:
        config = ScanConfig(384, 24, staged=True, lookback="inline", ramp_ns=ramp)
        if why_unsupported(config, problem) is None:  # vectors cp.async can copy, and the shared memory
            return config
    return ScanConfig(256, 16, staged=False, lookback="inline", ramp_ns=ramp)


def name_expression(config: ScanConfig, problem: LinearScanProblem) -> str:
    c = SCAN_DTYPES[problem.dtype]
    if config.lookback == "rows":
        return (f"scan::linear_scan_rows_kernel<{c}, {c}, {config.threads}, {config.items_per_thread}, "
                f"{problem.vector_width}, {cpp(problem.reverse)}, {cpp(problem.scalar_a)}, {cpp(problem.h0)}>")
    early = config.lookback == "early"
    # kSegmented: rows start inside the array. The early schedule's aggregate folds a_0 h0 into a row's
    # first map only where it tracks row starts, so a single row with h0 takes it too (one row of n).
    segmented = problem.rows > 1 or (early and problem.h0)
    return (f"scan::linear_scan_kernel<{c}, {c}, {config.threads}, {config.items_per_thread}, {problem.vector_width}, "
            f"{cpp(segmented)}, {cpp(config.staged)}, {cpp(problem.reverse)}, {cpp(problem.scalar_a)}, "
            f"{cpp(problem.h0)}, {cpp(early)}>")


compile = nvrtc.checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001

# scan.cu's linear_scan_kernel parameters: a, a_scalar, x, h0, y, n, row_len, then the look-back's tile
# counters, states, epoch, first wave and ramp step (as scan_kernel's).
KERNEL_SIGNATURE = (ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                    ctypes.c_uint32, ctypes.c_uint32)
_WORKSPACE_AT = 7


class LinearScanLaunch(LookBackLaunch):
    """The recurrence's launch for every call of one structure: ``launch(a, a_scalar, x, h0, out)`` (a and h0
    None where the problem has a scalar decay or no h0; tensors contiguous, non-empty)."""

    def __init__(self, config: ScanConfig, problem: LinearScanProblem, device: int):
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        tiles, shared = -(-problem.numel // config.tile), shared_bytes(config, problem)
        first_wave = first_wave_ctas(kernel, config, shared, device)
        values = (0, 0.0, 0, 0, 0, problem.numel, problem.length, 0, 0, 0, first_wave,
                  ramp_step_ns(config, tiles, first_wave))
        super().__init__(kernel, tiles, config.block_threads, shared, KERNEL_SIGNATURE, values, _WORKSPACE_AT,
                         MAP_STATE_DTYPE, device)

    def __call__(self, a, a_scalar: float, x, h0, out) -> None:
        self.enqueue(a.data_ptr() if a is not None else 0, a_scalar, x.data_ptr(),
                     h0.data_ptr() if h0 is not None else 0, out.data_ptr())


# scan.cu's linear_scan_rows_kernel parameters: a, a_scalar, x, h0, y, n, row_len.
ROWS_KERNEL_SIGNATURE = KERNEL_SIGNATURE[:_WORKSPACE_AT]


class LinearRowsLaunch:
    """The rows schedule's launch for every call of one structure (``LinearScanLaunch``'s call): one CTA per
    row, no workspace."""

    def __init__(self, config: ScanConfig, problem: LinearScanProblem, device: int):
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        self.device = device
        self.slots = [ctype() for ctype in ROWS_KERNEL_SIGNATURE]
        for slot, value in zip(self.slots, (0, 0.0, 0, 0, 0, problem.numel, problem.length)):
            slot.value = value
        self.packed = nvrtc.PackedLaunch(kernel, (problem.rows, 1, 1), (config.threads, 1, 1), tuple(self.slots))

    def __call__(self, a, a_scalar: float, x, h0, out) -> None:
        stream = current_stream_handle(self.device)
        slots = self.slots
        with self.packed.lock:  # the slots are written, then copied by the driver at the launch
            slots[0].value = a.data_ptr() if a is not None else 0
            slots[1].value = a_scalar
            slots[2].value = x.data_ptr()
            slots[3].value = h0.data_ptr() if h0 is not None else 0
            slots[4].value = out.data_ptr()
            self.packed.launch(stream)


def prepare(config: ScanConfig, problem: LinearScanProblem, inputs: dict,
            out: torch.Tensor) -> "LinearScanLaunch | LinearRowsLaunch":
    launch_class = LinearRowsLaunch if config.lookback == "rows" else LinearScanLaunch
    return launch_class(config, problem, inputs["x"].device.index)


def launch(config: ScanConfig, problem: LinearScanProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    a = inputs["a"]
    prepare(config, problem, inputs, out)(None if problem.scalar_a else a, float(a) if problem.scalar_a else 0.0,
                                          inputs["x"], inputs.get("h0"), out)
    return out


# ---- Reference and baseline ----------------------------------------------------------------------------


def _compose(earlier: tuple, later: tuple) -> tuple:
    """The map h -> a h + b after another: (a_later a_earlier, a_later b_earlier + b_later)."""
    return later[0] * earlier[0], later[0] * earlier[1] + later[1]


def affine_scan(a: torch.Tensor, x: torch.Tensor, h0: torch.Tensor | None = None, reverse: bool = False) -> torch.Tensor:
    """h along the last dim from torch ops alone, in the inputs' dtype: doubling steps of the map
    composition in chunks (``reference.chunked_scan``; no Python loop over t). In float64 it is the reference; in
    the inputs' precision, the baseline a user could write with torch."""
    a = a.expand_as(x)  # the chunks reshape it
    if reverse:
        a, x = a.flip(-1), x.flip(-1)
    b = x
    if h0 is not None:
        b = x.clone()
        b[..., 0] += a[..., 0] * h0.to(b.dtype)
    h = chunked_scan((a, b), _compose, (1, 0))[1]  # b of the maps composed from the start: h from h = 0
    return h.flip(-1) if reverse else h


def affine_scan_by_cumprod(a: torch.Tensor, x: torch.Tensor, h0: torch.Tensor | None = None,
                           reverse: bool = False, chunk: int = 32) -> torch.Tensor:
    """The recurrence as cumulative torch ops for decays without zeros: in chunks of ``chunk``,
    h = P cumsum(x / P) with P the chunk's cumprod of a, then the chunks' carries by ``affine_scan`` on
    their end maps. Fewer passes than the doubling, yet slower in torch (its cumprod and cumsum along a
    short last dim are; docs/notes/scan.md). P underflows for long chunks of small decays and a zero divides
    by zero, so it is timed beside the baseline in the report, never the oracle's yardstick."""
    a = a.expand_as(x)
    if reverse:
        a, x = a.flip(-1), x.flip(-1)
    length = x.shape[-1]
    pad = -length % chunk
    lead = x.shape[:-1]
    chunks = (length + pad) // chunk
    decay = pad_last(a, pad, 1).reshape(*lead, chunks, chunk).cumprod(-1)
    local = (pad_last(x, pad, 0).reshape(*lead, chunks, chunk) / decay).cumsum(-1) * decay
    ends = affine_scan(decay[..., -1], local[..., -1], h0)
    first = torch.zeros_like(ends[..., :1]) if h0 is None else h0.to(ends.dtype).expand(lead)[..., None]
    starts = torch.cat([first, ends[..., :-1]], -1)[..., None]
    h = (local + decay * starts).reshape(*lead, length + pad)[..., :length]
    return h.flip(-1) if reverse else h


def _full_a(problem: LinearScanProblem, inputs: dict, dtype) -> torch.Tensor:
    a, x = inputs["a"], inputs["x"]
    return torch.full_like(x, float(a), dtype=dtype) if problem.scalar_a else a.to(dtype)


def reference(problem: LinearScanProblem, inputs: dict) -> torch.Tensor:
    x = inputs["x"]
    return affine_scan(_full_a(problem, inputs, torch.float64), x.double(), inputs.get("h0"), problem.reverse)


def baseline(problem: LinearScanProblem, inputs: dict) -> torch.Tensor:
    x = inputs["x"]
    h0 = inputs.get("h0")
    return affine_scan(_full_a(problem, inputs, x.dtype), x, None if h0 is None else h0.to(x.dtype), problem.reverse)


def cumprod_baseline(problem: LinearScanProblem, inputs: dict) -> torch.Tensor:
    """The report's second yardstick (``affine_scan_by_cumprod``: the decays it meets lie in (0.5, 1)), in
    float32 for 16-bit inputs as the kernel's state is: a float16 product of 32 such decays can underflow
    to zero, and x / 0 turns the rest of the row into NaN."""
    x = inputs["x"]
    h0 = inputs.get("h0")
    run = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    h = affine_scan_by_cumprod(_full_a(problem, inputs, run), x.to(run), None if h0 is None else h0.to(run),
                               problem.reverse)
    return h.to(x.dtype)


def make_inputs(problem: LinearScanProblem, device, generator=None) -> dict:
    """x randn; a in (0.5, 1) (a decay: |a| < 1 keeps h bounded), or 0.9 as the scalar; h0 randn."""
    shape = (problem.rows, problem.length) if problem.rows > 1 else (problem.length,)
    x = torch.randn(shape, device=device, generator=generator).to(problem.dtype)
    a = 0.9 if problem.scalar_a else (0.5 + 0.5 * torch.rand(shape, device=device, generator=generator)).to(problem.dtype)
    inputs = {"a": a, "x": x}
    if problem.h0:
        inputs["h0"] = torch.randn(problem.rows, device=device, generator=generator)
    return inputs


def _standard_problems() -> list[LinearScanProblem]:
    """Issue 25's targets: (64, 16384) and (1, 2^26) float32; a scalar decay; a bf16 reversed GAE-like row."""
    return [LinearScanProblem(64, 16384), LinearScanProblem(1, 1 << 26), LinearScanProblem(1, 1 << 24, scalar_a=True),
            LinearScanProblem(64, 4096, torch.bfloat16, reverse=True, h0=True)]


def _zoo_problems() -> list[LinearScanProblem]:
    """Everyday recurrences: one long row from 2^10 to 2^24, batches of rows (RL episodes, SSM channels), a
    scalar decay, and the reversed 16-bit advantage estimate with a start value per row."""
    single = [LinearScanProblem(1, 1 << p) for p in (10, 14, 18, 22, 24)]
    rows = [LinearScanProblem(r, n) for r, n in ((64, 16384), (1024, 1024), (16, 1 << 20), (4096, 256))]
    return single + rows + [LinearScanProblem(1, 1 << 22, scalar_a=True),
                            LinearScanProblem(256, 2048, torch.bfloat16, reverse=True, h0=True)]


def _held_out_problems() -> list[LinearScanProblem]:
    return [LinearScanProblem(300, 7000), LinearScanProblem(1, 3_000_001, scalar_a=True),
            LinearScanProblem(33, 100_003, torch.float16, reverse=True)]


def linear_spec_fields() -> dict:
    """The registry fields both linear_scan entries share (the look-back one here, the strided dims'
    ``linear_columns``)."""
    return dict(op="linear_scan", backend="nvrtc", dtypes=DTYPES, flops=lambda p: 2.0 * p.numel,
                bytes=lambda p: p.numel * p.dtype.itemsize * (2 if p.scalar_a else 3), sources=(SOURCE,),
                bound="bandwidth")


SPEC = register(KernelSpec(
    **linear_spec_fields(),
    variant="lookback",
    config_cls=ScanConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    standard_problems=_standard_problems,
    description="h_t = a_t h_{t-1} + x_t as a single-pass look-back scan of affine maps (scan.cu)",
    sweep_axes=(("threads", "items_per_thread"), ("ramp_ns", "lookback")),
    # The look-back combines whichever predecessors have published: float rounding depends on timing.
    deterministic=False,
    baseline_name="torch ops (doubling of the map composition in 64-element chunks)",
    other_baselines={"torch cumprod/cumsum in 32-element chunks": cumprod_baseline},
))
register_zoo(SPEC.op, _zoo_problems, lambda problem: SPEC, _held_out_problems)
