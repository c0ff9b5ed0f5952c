"""Both scan variants' configs (ScanConfig for the last dim, ColumnScanConfig for strided dims): their sweep
spaces, predicates, default heuristics and tuned-table keys
(docs/notes/scan.md has the measurements behind them)."""

from __future__ import annotations

import dataclasses

import torch

from ...registry import log2_floor
from ...runtime.config_fields import check_choice, check_fields, check_range, field_error
from ...runtime.device import MAX_GRID_X
from .problem import OPS, ScanProblem

# ScanConfig.lookback's look-back schedules, and scan.cu's kernel of each for the scan op.
_KERNELS = {"inline": "scan_kernel", "early": "scan_kernel_early_aggregate", "dedicated": "scan_kernel_lookback_warp"}
LOOKBACKS = tuple(_KERNELS)
# And the schedule without one: a CTA per row walks the row's tiles in order (linear_scan only).
SCHEDULES = LOOKBACKS + ("rows",)
RAMP_GROUPS = 8  # scan.cu: kRampGroups
MAX_RAMP_NS = 100_000  # a ramp is a few microseconds; a larger one is a typo, and would only idle the GPU


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    """Threads per CTA and elements per thread; a tile is ``threads * items_per_thread`` elements."""

    threads: int = 256
    items_per_thread: int = 16
    # Where the tile waits between the scan and the stores: shared memory (filled by cp.async, so the loads
    # in flight are not bounded by the register file) or registers.
    staged: bool = True
    # Who does the decoupled look-back, and when (scan.cu's header describes the three schedules):
    #   "inline": warp 0, after the whole tile is scanned; the other warps wait for it at a CTA barrier;
    #   "early": as inline, but the tile's aggregate is published as soon as the tile has landed (a plain
    #   sum and one more CTA barrier) rather than after the in-tile scan, so successors wait less for it
    #   (with segment flags, each warp's sum from its last head; for a recurrence, staged tiles only, each
    #   warp's maps composed in order);
    #   "dedicated": one extra warp (threads + 32 per CTA) that holds no data, from the moment the data warps
    #   have reduced their vectors to plain sums; the look-back then runs while they scan their vectors;
    #   "rows": nobody: one CTA per row (of whole tiles) scans the row's tiles in order, loading the next
    #   while it scans the current one (linear_scan, register tiles).
    lookback: str = "inline"
    # The first wave's ramp (scan.cu, claim_tile): in a launch of at least two waves, the first wave's CTAs
    # start in 8 groups ramp_ns // 8 nanoseconds apart (the last 7/8 of ramp_ns after the first) instead of
    # all at once, so that its tiles do not land, look back and store in step (and the waves after it with
    # them). 0: no ramp. A runtime argument, not a template one: every ramp runs the same compiled kernel.
    ramp_ns: int = 0

    def __post_init__(self):
        check_fields(self)
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise field_error(self, "threads", "a multiple of 32 from 32 to 1024")
        if self.items_per_thread not in (1, 2) and (self.items_per_thread % 4 or not 4 <= self.items_per_thread <= 64):
            raise field_error(self, "items_per_thread", "1, 2 or a multiple of 4 up to 64 (whole 16-byte vectors "
                              "of float32)")
        check_choice(self, "lookback", SCHEDULES, f"one of {SCHEDULES}")
        check_range(self, "ramp_ns", 0, MAX_RAMP_NS, f"0 to {MAX_RAMP_NS} nanoseconds")

    @property
    def tile(self) -> int:
        return self.threads * self.items_per_thread

    @property
    def block_threads(self) -> int:
        """Threads per CTA: the data threads, plus the look-back warp when it is dedicated."""
        return self.threads + (32 if self.lookback == "dedicated" else 0)

    def shared_bytes(self, dtype: torch.dtype) -> int:
        """Dynamic shared memory a CTA needs: the whole input tile when staged."""
        return self.tile * dtype.itemsize if self.staged else 0


# The ramps a sweep tries (ScanConfig.ramp_ns). On the H200 the best are 3.2-5.6 us (about the time the
# first wave's loads take at copy bandwidth); 7.2 us wins nowhere by more than the noise.
RAMPS_NS = (0, 3200, 4400, 5600)


def why_unsupported_problem(problem: ScanProblem) -> str | None:
    """What no config of either variant can run (the operator and dtype pair)."""
    if problem.op not in OPS:
        return f"op {problem.op!r} is not one of {tuple(OPS)}"
    if problem.dtype not in OPS[problem.op][2]:
        return f"op {problem.op!r} does not take dtype {problem.dtype}"
    return None


def why_unsupported(config: ScanConfig, problem: ScanProblem) -> str | None:
    reason = why_unsupported_problem(problem)
    if reason is not None:
        return reason
    if problem.inner != 1:
        return "the lookback variant scans the last dim (inner == 1); a strided dim is the columns variant's"
    if config.lookback == "rows":
        return "the rows schedule (no look-back) is linear_scan's; the scan takes inline, early or dedicated"
    if problem.segmented and config.lookback == "dedicated":
        return "segment starts take the inline or early schedule (the dedicated warp finds a tile's last head from the row length alone)"
    if config.items_per_thread % problem.vector_width:
        return f"items_per_thread={config.items_per_thread} is not a multiple of the vector width {problem.vector_width}"
    if config.staged and problem.vector_width * problem.dtype.itemsize < 4:
        return (f"a staged tile copies 4 bytes or more per cp.async, and a vector of {problem.vector_width} "
                f"{problem.dtype} is {problem.vector_width * problem.dtype.itemsize} bytes")
    if config.shared_bytes(problem.dtype) > problem.shared_limit:
        return (f"a staged tile of {config.shared_bytes(problem.dtype)} bytes exceeds the device's "
                f"{problem.shared_limit} bytes of shared memory per CTA")
    if config.block_threads > 1024:
        return (f"{config.threads} data threads and the dedicated look-back warp exceed 1024 threads per CTA")
    if not config.staged and config.items_per_thread > 32:
        return "more than 32 items per thread do not fit in registers (stage them in shared memory)"
    tiles = -(-problem.numel // config.tile)
    if tiles > MAX_GRID_X:
        return f"{problem.numel} elements need {tiles} tiles, more than one launch's grid holds"
    return None


def candidates() -> list[ScanConfig]:
    return [ScanConfig(t, i, staged, lookback, ramp)
            for t in (128, 256, 384, 512) for i in (4, 8, 16, 24, 32, 48, 64) for staged in (False, True)
            for lookback in LOOKBACKS for ramp in RAMPS_NS]


def default_config(problem: ScanProblem) -> ScanConfig:
    # The H200 sweep's float32 winners: at 2^28 elements 512 threads x 32 items staged in shared memory
    # (1.24x torch.cumsum; the best register tile, 512 x 32, 1.21x); at 2^24 the two are within 3%; at 250k,
    # 256 x 32 in registers is the fastest. Vector widths (1, 2 or 4 elements) always divide 32 items; a
    # device with less shared memory than the staged tile needs (consumer GPUs: 99 KB, float64 tiles: 128 KB)
    # gets the register tile.
    # The first wave's ramp, for flat scans only (a launch of fewer than two waves ignores it): on the H200
    # 4.4 us takes 0.4-10% off every flat float32, float64 and int32 scan of 2^24 to 2^27 elements and costs
    # batched rows 0-3%, whose tiles mostly start a row and so hardly wait in the look-back.
    ramp_ns = 4400 if problem.rows == 1 else 0
    if problem.segmented:
        # A flag stream beside the values: 128 x 32 staged with the early aggregate (each warp's from its last
        # flagged head), the best of the H200 probe at 5 * 10^7 elements in segments of 256 (256 x 24 within
        # 1%; 256 x 32 and the inline schedule's 384 x 24 6% and 15% slower; docs/notes/scan.md#segments).
        config = ScanConfig(128, 32, staged=True, lookback="early", ramp_ns=ramp_ns)
        if problem.numel >= 1 << 22 and why_unsupported(config, problem) is None:
            return config
        return ScanConfig(256, 16, staged=False, ramp_ns=ramp_ns)
    if problem.dtype.itemsize == 8 and problem.rows == 1:
        # Flat scans of 8-byte elements, whose tile states are tagged pairs (one 16-byte read per look-back
        # step): the H200 probe (scripts/probes/scan_probe.py --size N:float64) had 256 x 8 in registers
        # publishing early fastest below 2^22 (2^16: 1.21x torch.cumsum, 2^20: 1.20x; 32 per thread is a
        # chain of few, slow tiles) and 256 x 16 staged inline above it (2^24: 1.18x against the float32
        # choice's 1.04x; 2^26: 1.21x, where the tuned table has its own entry). Measured on float64 sums;
        # int64 takes the same tiles, unmeasured; batched rows keep the general choice.
        config = (ScanConfig(256, 16, staged=True) if problem.numel >= 1 << 22
                  else ScanConfig(256, 8, staged=False, lookback="early", ramp_ns=ramp_ns))
        if why_unsupported(config, problem) is None:
            return config
    if problem.numel >= 1 << 22:
        config = ScanConfig(512, 32, staged=True, ramp_ns=ramp_ns)
        if why_unsupported(config, problem) is None:  # shared memory, and vectors cp.async can copy
            return config
    return ScanConfig(256, 32, staged=False, ramp_ns=ramp_ns)


def shape_bucket(problem: ScanProblem) -> str:
    """Tuned-config key: dtype, flat or batched, log2 of the element count, exclusive, vector width."""
    size = log2_floor(problem.numel)
    key = (f"{str(problem.dtype).removeprefix('torch.')}:{'rows' if problem.rows > 1 else 'flat'}:2^{size}:"
           f"{'exclusive' if problem.exclusive else 'inclusive'}:vec{problem.vector_width}")
    return key + _variant_suffix(problem)


def _variant_suffix(problem: ScanProblem) -> str:
    """The operator and direction in a tuned-table key (nothing for a forward sum, the original key)."""
    return (("" if problem.op == "sum" else f":{problem.op}") + (":reverse" if problem.reverse else "")
            + (":segmented" if problem.segmented else ""))


# ---- The columns variant (a strided dim) ---------------------------------------------------------------
MAX_CHUNKS = 128  # a column's chunks: column_scan combines up to this many aggregates per column from L2


@dataclasses.dataclass(frozen=True)
class ColumnScanConfig:
    """A column tile is ``lanes`` threads across columns (each a vector of them) by ``threads // lanes`` row
    groups of ``rows`` rows per step; ``tiles_per_sm`` sets how many chunks a column is cut into (the
    chains of chunks times the chunks aim at that many tiles per SM, up to MAX_CHUNKS per column). 0
    lanes: as many as cover ``inner`` (at most 32)."""

    threads: int = 256
    rows: int = 8
    lanes: int = 0
    tiles_per_sm: int = 8

    def __post_init__(self):
        check_fields(self)
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise field_error(self, "threads", "a multiple of 32 from 32 to 1024")
        check_choice(self, "rows", (1, 2, 4, 8, 16), "1, 2, 4, 8 or 16")
        check_choice(self, "lanes", (0, 1, 2, 4, 8, 16, 32), "0 (fit inner), 1, 2, 4, 8, 16 or 32")
        check_range(self, "tiles_per_sm", 1, 64, "1 to 64")


MAX_ROW_GROUPS = 32  # threads // lanes: each thread combines the row groups' totals one by one per step


def column_lanes(config: ColumnScanConfig, problem: ScanProblem) -> int:
    """Threads across a tile's columns: the config's, or the fewest powers of two whose vectors cover
    ``inner`` (at most 32), so that a narrow inner dim does not leave most lanes idle, and enough that the
    row groups are at most MAX_ROW_GROUPS."""
    if config.lanes:
        return config.lanes
    return _covering_lanes(problem, max(1, config.threads // MAX_ROW_GROUPS))


def _covering_lanes(problem, lanes: int = 1) -> int:
    """``lanes`` doubled until their vectors cover ``inner`` (or reach 32 lanes)."""
    vectors = -(-problem.inner // problem.vector_width)
    while lanes < min(vectors, 32):
        lanes *= 2
    return lanes


def column_geometry(config: ColumnScanConfig, problem: ScanProblem, sms: int) -> tuple[int, int, int, int]:
    """(lanes, column blocks, chunks, rows per chunk) of a launch on a device of ``sms`` SMs."""
    lanes = column_lanes(config, problem)
    width = lanes * problem.vector_width
    column_blocks = -(-problem.inner // width)
    chains = problem.rows * column_blocks
    step = (config.threads // lanes) * config.rows
    chunks = max(1, min(MAX_CHUNKS, -(-config.tiles_per_sm * sms // chains), -(-problem.length // step),
                         MAX_GRID_X // chains))
    rows_per_chunk = -(-(-(-problem.length // chunks)) // step) * step
    return lanes, column_blocks, -(-problem.length // rows_per_chunk), rows_per_chunk


def why_unsupported_columns(config: ColumnScanConfig, problem: ScanProblem) -> str | None:
    reason = why_unsupported_problem(problem)
    if reason is not None:
        return reason
    if problem.inner == 1:
        return "the columns variant scans a strided dim (inner > 1); the last dim is the lookback variant's"
    if problem.segmented:
        return "segment starts run on the lookback variant (a strided dim's segments are scanned moved last)"
    return column_layout_problem(config, problem)


def column_layout_problem(config: ColumnScanConfig, problem) -> str | None:
    """What keeps a column tile of ``config`` from ``problem`` (any problem with rows, inner and a
    vector_width: the scan's or the linear recurrence's): whole row groups, at most MAX_ROW_GROUPS of them,
    a grid one launch holds."""
    lanes = column_lanes(config, problem)
    if config.threads % lanes:
        return f"{config.threads} threads are not whole row groups of {lanes} lanes"
    if config.threads // lanes > MAX_ROW_GROUPS:
        return f"{config.threads} threads in row groups of {lanes} lanes are more than {MAX_ROW_GROUPS} row groups"
    if problem.rows * -(-problem.inner // (lanes * problem.vector_width)) > MAX_GRID_X:
        return f"{problem.rows} x {problem.inner} columns need more tiles than one launch's grid holds"
    return None


def column_candidates() -> list[ColumnScanConfig]:
    return [ColumnScanConfig(threads, rows, lanes, tiles)
            for threads in (128, 256, 512) for rows in (4, 8, 16) for lanes in (0, 16, 32) for tiles in (4, 8, 16)]


def fit_column_config(config: ColumnScanConfig, problem) -> ColumnScanConfig:
    """``config`` with a CTA no wider than a narrow inner dim can use: at most MAX_ROW_GROUPS row groups of
    the fewest lanes whose vectors cover ``inner``, 8 rows a step. A 256-thread CTA has at least 8 lanes a
    row group, so over 8 float32 columns (2 vectors) 6 of its 8 lanes would idle; measured on an H100,
    (64, 4096, 8) float32 and bfloat16 linear scans run 2.9x and 9x faster on 64- and 32-thread CTAs
    (docs/notes/scan.md). ``problem``: anything with inner and vector_width."""
    threads = min(config.threads, MAX_ROW_GROUPS * _covering_lanes(problem))
    if config.lanes or threads == config.threads:
        return config
    return dataclasses.replace(config, threads=threads, rows=8)


def default_column_config(problem: ScanProblem) -> ColumnScanConfig:
    return fit_column_config(ColumnScanConfig(), problem)


def column_shape_bucket(problem: ScanProblem) -> str:
    """Tuned-config key of a strided scan: dtype, log2 of the scanned length and of the inner size."""
    return (f"{str(problem.dtype).removeprefix('torch.')}:2^{log2_floor(problem.length)}x2^{log2_floor(problem.inner)}:"
            f"{'exclusive' if problem.exclusive else 'inclusive'}:vec{problem.vector_width}" + _variant_suffix(problem))
