"""conv3d's config, its sweep space and the default heuristic (docs/notes/conv3d.md has the sweeps)."""

from __future__ import annotations

import dataclasses

from ...runtime.checks import INT32_MAX
from ...runtime.config_fields import check_choice, check_fields, check_range, field_error
from ...runtime.device import H200_SM_COUNT
from .problem import COORD_MARGIN, MAX_KERNEL_SIDE, NO_PADS, Conv3dProblem

MAX_ACCUMULATORS = 64  # conv3d.cu: Geometry::kAccumulators (KD * thread_h * thread_w) must not exceed this


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


@dataclasses.dataclass(frozen=True)
class Conv3dConfig:
    """A CTA computes a ``tile_h x tile_w`` tile of output rows x columns through ``depth`` consecutive
    output planes; each thread ``thread_h x thread_w`` outputs of the tile in each of KD planes at once.
    ``stages``: input-plane buffers in shared memory (planes in flight = stages - 1). ``depth`` is a launch
    argument, not a template one: changing it compiles nothing."""

    tile_h: int = 16
    tile_w: int = 128
    thread_h: int = 1
    thread_w: int = 8
    depth: int = 32
    stages: int = 3

    def __post_init__(self):
        check_fields(self)
        check_choice(self, "thread_w", (4, 8), "4 or 8 (whole 128-bit window loads)")
        check_choice(self, "thread_h", (1, 2, 4), "1, 2 or 4")
        # A CTA has at most 1024 threads and a row of them at least tile_w / thread_w >= 8: so at most 1024
        # columns and 128 rows of threads, bounds the thread-count check below implies, named per field here.
        if not 0 < self.tile_w <= 1024 * self.thread_w or self.tile_w % (8 * self.thread_w):
            raise field_error(self, "tile_w", f"a positive multiple of 8 * thread_w = {8 * self.thread_w} (8 threads "
                              f"per 128-bit shared-memory phase) up to 1024 * thread_w = {1024 * self.thread_w}")
        if not 0 < self.tile_h <= 128 * self.thread_h or self.tile_h % self.thread_h:
            raise field_error(self, "tile_h", f"a positive multiple of thread_h = {self.thread_h} up to 128 * thread_h "
                              f"= {128 * self.thread_h}")
        if self.threads % 32 or self.threads > 1024:
            raise ValueError(f"Conv3dConfig: (tile_h / thread_h) * (tile_w / thread_w) = {self.threads} threads; "
                             "expected whole warps and at most 1024")
        check_choice(self, "stages", (2, 3, 4), "2, 3 or 4")
        # The kernel's chunk_depth is an int32 (conv3d::Args): past 2^31 - 1 it wraps and planes go unwritten.
        check_range(self, "depth", 1, INT32_MAX, f"1 to {INT32_MAX} output planes per CTA (the kernel's 32-bit "
                    "chunk_depth)")

    @property
    def threads(self) -> int:
        return (self.tile_h // self.thread_h) * (self.tile_w // self.thread_w)

    def shared_bytes(self, kd: int, kh: int, kw: int) -> int:
        """conv3d.cu's Geometry::kSharedBytes: ``stages`` plane buffers of (tile_h + KH - 1) rows with a pitch
        of tile_w + round_up(KW - 1, 4) floats, and the weights as [KH][KD][round_up(KW, 4)]."""
        plane = (self.tile_h + kh - 1) * (self.tile_w + _round_up(kw - 1, 4))
        weights = kh * kd * _round_up(kw, 4)
        return 4 * (self.stages * plane + weights)

    def compile_key(self) -> tuple:
        """The fields that are template arguments (``depth`` is not)."""
        return (self.tile_h, self.tile_w, self.thread_h, self.thread_w, self.stages)


def grid_shape(config: Conv3dConfig, problem: Conv3dProblem) -> tuple[int, int, int]:
    """(tiles along W, tiles along H, runs of output planes along D) for one batch item."""
    return (-(-problem.out_width // config.tile_w), -(-problem.out_height // config.tile_h),
            -(-problem.out_depth // config.depth))


def why_unsupported(config: Conv3dConfig, problem: Conv3dProblem) -> str | None:
    sides = (problem.kd, problem.kh, problem.kw)
    if not all(1 <= s <= MAX_KERNEL_SIDE for s in sides):
        return f"kernel sides {sides} must each be 1..{MAX_KERNEL_SIDE}"
    if problem.out_depth < 1 or problem.out_height < 1 or problem.out_width < 1:
        what = "volume" if problem.pads == NO_PADS else "padded volume"
        return f"kernel {sides} is larger than the {what} {problem.padded_sides}"
    if problem.pads[4] % problem.in_vec:
        return f"the left padding {problem.pads[4]} is not whole copies of {problem.in_vec} elements"
    if max(problem.padded_sides) > INT32_MAX - COORD_MARGIN:
        return (f"volume sides past 2^31 - 1 - {COORD_MARGIN} do not fit the kernel's 32-bit coordinates (a "
                "tile's rows and columns run that far past the last one)")
    accumulators = problem.kd * config.thread_h * config.thread_w
    if accumulators > MAX_ACCUMULATORS:
        return (f"KD * thread_h * thread_w = {accumulators} accumulators per thread exceed {MAX_ACCUMULATORS} "
                "(they would not fit in registers)")
    smem = config.shared_bytes(*sides)
    if smem > problem.shared_limit:
        return f"{smem} bytes of shared memory exceed the device's {problem.shared_limit}"
    if problem.in_vec not in (1, 2, 4) or problem.out_vec not in (1, 2, 4):
        return f"vector widths must be 1, 2 or 4, got in {problem.in_vec}, out {problem.out_vec}"
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    ctas = tiles_w * tiles_h * chunks * problem.batch
    if ctas > INT32_MAX:
        return f"{ctas} CTAs exceed one launch's grid (2^31 - 1)"
    return None


def candidates() -> list[Conv3dConfig]:
    """The sweep space: 128 to 512 threads per CTA; ``depth`` spans the run lengths the heuristic picks from
    and the shorter runs (1, 2) that give a small volume more CTAs."""
    out = []
    for thread_w in (4, 8):
        for thread_h in (1, 2):
            for tile_w in (32, 64, 128):
                for tile_h in (8, 16, 32):
                    if tile_w % (8 * thread_w) or tile_h % thread_h:
                        continue
                    threads = (tile_h // thread_h) * (tile_w // thread_w)
                    if threads not in (128, 256, 512):
                        continue
                    for depth in (1, 2, 4, 8, 16, 32, 64):
                        for stages in (2, 3):
                            out.append(Conv3dConfig(tile_h, tile_w, thread_h, thread_w, depth, stages))
    return out


# (tile_h, tile_w) shapes the heuristic picks from, best first by the H200 sweep. Every winner computes 4
# columns per thread (thread_w = 4), and 2 rows (thread_h = 2) for kernels up to 5^3; 7^3 kernels win with
# one row.
_DEFAULT_TILES = ((16, 64), (32, 64), (8, 64), (16, 32), (32, 32))
_RESIDENT_THREADS = 512  # per SM: two 256-thread CTAs at <= 128 registers per thread (ptxas: 64-127 here)


def estimated_time(config: Conv3dConfig, problem: Conv3dProblem) -> float:
    """A relative time for the default heuristic: waves of CTAs over the SMs times the plane steps of one
    CTA. A run of ``depth`` output planes takes depth + KD - 1 input planes, the first and last KD - 1 of
    which do part of the FMAs (counted as 0.6 of a step). A last wave that leaves SMs half empty runs its
    CTAs faster (0.6 of a full wave's time: fewer warps share each SM's FMA units)."""
    tiles_w, tiles_h, chunks = grid_shape(config, problem)
    ctas = tiles_w * tiles_h * chunks * problem.batch
    slots = max(1, _RESIDENT_THREADS // config.threads) * H200_SM_COUNT
    full, rest = divmod(ctas, slots)
    last = 0.0 if rest == 0 else (0.6 if 2 * rest <= slots else 1.0)
    return (full + last) * (config.depth + 0.6 * (problem.kd - 1))


def default_config(problem: Conv3dProblem) -> Conv3dConfig:
    # The sweep's lessons (see _DEFAULT_TILES): thread_w = 4 everywhere, thread_h = 2 while the kernel has
    # at most 125 taps (with 7^3 the second row's window costs more registers than it saves loads), 2
    # stages. Among the tiles and runs of 64 .. 4 planes, the lowest estimated_time wins; ties go to the
    # earlier tile and the longer run (fewer halo planes and rows loaded per output).
    thread_h = 2 if problem.kd * problem.kh * problem.kw <= 125 else 1
    best = None
    for tile_h, tile_w in _DEFAULT_TILES:
        for rows in (thread_h, 1):
            for depth in (64, 32, 16, 8, 4, 2, 1):
                config = Conv3dConfig(tile_h, tile_w, rows, 4, depth, 2)
                if why_unsupported(config, problem) is not None:
                    continue
                cost = estimated_time(config, problem)
                if best is None or cost < best[0] - 1e-9:
                    best = (cost, config)
            if best is not None:
                break  # this tile works with the preferred rows per thread (or one): take it
    if best is None:
        # Why the first tile cannot run it: for a problem no tile takes (a side past the direct kernel's)
        # the reason is the same for every tile, and it is what the caller needs to read.
        reason = why_unsupported(Conv3dConfig(*_DEFAULT_TILES[0], thread_h, 4, 4, 2), problem)
        raise ValueError(f"no default tile supports {problem}: {reason}")
    return best[1]
