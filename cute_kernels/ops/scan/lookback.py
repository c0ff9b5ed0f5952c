"""The scan's ``lookback`` variant: the single-pass decoupled look-back kernel of ``legacy_cuda/scan.cu``
(compiled with NVRTC), its workspace, launch plans and launch, and its registry entry."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import weakref

import torch

from cute_kernels.runtime import nvrtc
from cute_kernels.runtime.nvrtc import checked_compile

from ...registry import KernelSpec, register
from ...runtime.bounded import MAX_STREAM_ENTRIES, remember
from ...runtime.device import current_stream_handle, sm_count, stream_capturing
from ...runtime.dry_run import is_dry_run
from .config import _KERNELS, RAMP_GROUPS, ScanConfig, candidates, default_config, shape_bucket
from .config import why_unsupported
from .problem import ScanProblem
from .reference import offsets_baseline
from .entry import SOURCE, cpp, shared_spec_fields

WORKSPACE_HEADER_BYTES = 16  # scan.cu: kWorkspaceHeaderBytes (the two tile counters live there)
# scan.cu tags every status word with the launch's epoch in its upper 30 bits: epochs run 1 .. 2^30 - 1 on
# a workspace, and when they wrap the workspace is zeroed (once per ~10^9 launches).
EPOCH_LIMIT = 1 << 30


def workspace_bytes(tiles: int, acc_dtype: torch.dtype) -> tuple[int, int]:
    """(bytes to allocate, bytes a fresh workspace must have zeroed) of scan.cu's workspace, all of it zeroed:
    the tile counters in a 16-byte header, then TileStates (state_layout), 8 bytes per tile packed, 16 as a
    pair."""
    zeroed = WORKSPACE_HEADER_BYTES + (8 if state_layout(acc_dtype) == "packed" else 16) * tiles
    return zeroed, zeroed


# The accumulator a linear recurrence's states stand for: a map (a, b) of two float32, as a complex64 is.
MAP_STATE_DTYPE = torch.complex64


def state_layout(acc_dtype: torch.dtype) -> str:
    """scan.cu's TileStates for an accumulator: "packed" for 4 bytes (the status and the value in one 8-byte
    word), "pair" for 8 bytes (double, int64, a map: two 8-byte words, each a tagged status and half the
    value's bits)."""
    return "packed" if acc_dtype.itemsize == 4 else "pair"


def state_capacity(nbytes: int, acc_dtype: torch.dtype) -> int:
    """The most tiles a workspace of ``nbytes`` holds states for."""
    return (nbytes - WORKSPACE_HEADER_BYTES) // (8 if state_layout(acc_dtype) == "packed" else 16)


def name_expression(config: ScanConfig, problem: ScanProblem) -> str:
    cin, cout, op = problem.cpp_types()
    if problem.segmented:
        return (f"scan::segmented_scan_kernel<{cin}, {cout}, {op}, {config.threads}, {config.items_per_thread}, "
                f"{problem.vector_width}, {cpp(problem.exclusive)}, {cpp(config.staged)}, {cpp(problem.reverse)}, "
                f"{cpp(config.lookback == 'early')}>")
    kernel = _KERNELS[config.lookback]
    return (f"scan::{kernel}<{cin}, {cout}, {op}, {config.threads}, {config.items_per_thread}, "
            f"{problem.vector_width}, {cpp(problem.rows > 1)}, {cpp(problem.exclusive)}, {cpp(config.staged)}, "
            f"{cpp(problem.reverse)}>")


compile = checked_compile(SOURCE, why_unsupported, name_expression)  # noqa: A001


# scan.cu's kernel parameters: x, y, n, row_len, tile counters, tile states, epoch, first wave, ramp step
# (ns). Public: a probe that launches an instrumented build of the same kernel packs its arguments with it.
KERNEL_SIGNATURE = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)
# segmented_scan_kernel's: x, the segment-start flags, then scan_kernel's from y on.
SEGMENTED_KERNEL_SIGNATURE = KERNEL_SIGNATURE[:1] + (ctypes.c_void_p,) + KERNEL_SIGNATURE[1:]


# (config, dtype, op, segmented, exclusive, reverse, vector width, device) -> (kernel, tile elements, shared bytes, threads
# per CTA, first wave): what a launch needs that does not change from call to call, so the hot path is a dict
# lookup. The first wave is the CTAs the device holds at once (occupancy x SMs), the ramp's unit. Bounded
# (remember): the config holds ramp_ns, a runtime value with some 10^5 settings, not a template argument.
_plans: dict[tuple, tuple] = {}


def _plan(config: ScanConfig, problem: ScanProblem, device: int) -> tuple:
    key = (config, problem.dtype, problem.op, problem.rows > 1, problem.exclusive, problem.reverse,
           problem.vector_width, problem.segmented, device)
    plan = _plans.get(key)
    if plan is None:
        kernel = nvrtc.kernel_for(SOURCE, name_expression(config, problem), device)
        shared_bytes = config.shared_bytes(problem.dtype)
        plan = remember(_plans, key, (kernel, config.tile, shared_bytes, config.block_threads,
                                      first_wave_ctas(kernel, config, shared_bytes, device)))
    return plan


def first_wave_ctas(kernel: nvrtc.LoadedKernel, config: ScanConfig, shared_bytes: int, device: int) -> int:
    """The CTAs of ``kernel`` that ``device`` holds at once (occupancy x SMs): the ramp's first wave."""
    return nvrtc.occupancy(kernel, config.block_threads, shared_bytes) * sm_count(device)


def ramp_step_ns(config: ScanConfig, tiles: int, first_wave: int) -> int:
    """The wait between two of the first wave's ramp groups (scan.cu, claim_tile): none unless the launch
    has at least two waves (a launch of one wave only waits longer for its last CTAs)."""
    return config.ramp_ns // RAMP_GROUPS if tiles >= 2 * first_wave else 0


def planned_ramp_step_ns(config: ScanConfig, problem: ScanProblem, device: int) -> int:
    """The ramp step a launch of ``problem`` with ``config`` on ``device`` passes: for tests and scripts
    that must know the ramp is on (launch() reads the first wave from the plan it already holds)."""
    return ramp_step_ns(config, -(-problem.numel // config.tile), _plan(config, problem, device)[-1])


# One workspace per (device, stream, state layout), grown as needed, and the epoch of its last launch
# (scan.cu: a launch reads only the status words its own epoch wrote, and readies the next launch's tile
# counter, so a launch needs no memset before it). The layouts never share a workspace: a float launch
# would read the halves of an 8-byte launch's values as status words, and one of them could carry the
# right epoch by chance. One lock over "take the next epoch, launch": two threads on one stream (torch's
# default stream is shared by every thread) must not launch with the same epoch, or with epochs out of
# stream order. Under CUDA graph capture a fresh workspace comes from the graph's own memory pool, zeroed
# inside the graph, so every replay starts from zero with the same epoch and never shares state with eager
# calls. (A zeroed torch allocation per call would also be safe but cost ~3 us of host time and a
# second node on the stream.)
@dataclasses.dataclass
class _Workspace:
    buffer: torch.Tensor
    capacity: int  # tiles (state_capacity of the buffer's size)
    epoch: int = 0  # of the last launch; 0: none yet (a zeroed buffer's states read as X in every epoch)


_workspaces: dict[tuple[int, int, str], _Workspace] = {}


def _no_workspace() -> None:
    """What a launch's ``slots_workspace`` gives before its first launch: no workspace."""
    return None

_launch_lock = threading.Lock()


def _zeroed_workspace(nbytes: int, dtype: torch.dtype, device: int) -> _Workspace:
    # Zeroed on torch's current stream, the launch's, so ordered before it (and captured with it in a graph).
    return _Workspace(torch.zeros(nbytes // 8, dtype=torch.int64, device=device), state_capacity(nbytes, dtype))


def _workspace(key: tuple[int, int, str], tiles: int, dtype: torch.dtype, nbytes: int | None = None) -> _Workspace:
    """The workspace of ``key`` = (device, stream, state layout) with room for ``tiles`` tiles' states
    (``nbytes``: their :func:`workspace_bytes`, which a launch works out once)."""
    device = key[0]
    if nbytes is None:
        nbytes = workspace_bytes(tiles, dtype)[0]
    if stream_capturing():
        return _zeroed_workspace(nbytes, dtype, device)
    ws = _workspaces.get(key)
    if ws is None or ws.capacity < tiles or ws.epoch + 1 >= EPOCH_LIMIT:
        nbytes = max(nbytes, 1 << 16, ws.buffer.numel() * 8 if ws is not None else 0)
        # Keyed by the caller's streams, which a process may create without end: bounded (remember).
        ws = remember(_workspaces, key, _zeroed_workspace(nbytes, dtype, device), MAX_STREAM_ENTRIES)
    return ws


class LookBackLaunch:
    """A look-back kernel's launch for every call of one structure, its arguments packed once (``slots``,
    one per kernel parameter; ``workspace_at``: the index of the three workspace parameters, workspace,
    states and epoch). :meth:`enqueue` takes the next epoch of the current stream's workspace
    (laid out for ``acc_dtype``: state_layout), writes the call's values (its first parameters: pointers,
    a scalar decay), workspace and epoch into the slots and enqueues the kernel on that stream."""

    def __init__(self, kernel, tiles: int, block_threads: int, shared_bytes: int, signature, values,
                 workspace_at: int, acc_dtype: torch.dtype, device: int):
        self.tiles, self.acc_dtype, self.device = tiles, acc_dtype, device
        self.state_layout, self.workspace_at = state_layout(acc_dtype), workspace_at
        self.workspace_nbytes = workspace_bytes(tiles, acc_dtype)[0]
        # The workspace whose pointers the slots hold (rewritten when the stream's workspace is another), held
        # weakly: a launch must not keep an evicted workspace, or one a graph capture allocated, alive.
        self.slots_workspace = _no_workspace
        self.slots = [ctype() for ctype in signature]
        for slot, value in zip(self.slots, values):
            slot.value = value
        self.packed = nvrtc.PackedLaunch(kernel, (tiles, 1, 1), (block_threads, 1, 1), tuple(self.slots),
                                         shared_mem=shared_bytes, lock=_launch_lock)

    def enqueue(self, *values) -> None:
        """Launch with ``values`` written into the first slots, in order."""
        stream = current_stream_handle(self.device)
        key = (self.device, stream, self.state_layout)
        slots = self.slots
        with self.packed.lock:  # the module's launch lock: see _Workspace
            # held until the launch is enqueued
            workspace = _workspace(key, self.tiles, self.acc_dtype, self.workspace_nbytes)
            epoch = workspace.epoch + 1
            for slot, value in zip(slots, values):
                slot.value = value
            if workspace is not self.slots_workspace():
                ws = workspace.buffer.data_ptr()
                slots[self.workspace_at].value, slots[self.workspace_at + 1].value = ws, ws + WORKSPACE_HEADER_BYTES
                self.slots_workspace = weakref.ref(workspace)
            slots[self.workspace_at + 2].value = epoch
            try:
                self.packed.launch(stream)
                # Only a launch that ran readied the next counter (a precompile dry run launches nothing).
                if not is_dry_run():
                    workspace.epoch = epoch
            except BaseException:
                # Whether the kernel was enqueued is unknown here (the driver refused it, or an interrupt came
                # after the launch and before the epoch was recorded), and so is which counter the next launch
                # may claim from: the next call starts on a fresh zeroed workspace instead.
                if _workspaces.get(key) is workspace:
                    del _workspaces[key]
                raise


class ScanLaunch(LookBackLaunch):
    """The scan kernel's launch for every call of one structure: ``launch(x, out)`` (contiguous, non-empty)."""

    def __init__(self, config: ScanConfig, problem: ScanProblem, device: int):
        kernel, tile, shared_bytes, block_threads, first_wave = _plan(config, problem, device)
        tiles = -(-problem.numel // tile)
        values = (0, 0, problem.numel, problem.length, 0, 0, 0, first_wave, ramp_step_ns(config, tiles, first_wave))
        self.segmented = problem.segmented
        if problem.segmented:  # the flags' pointer after x's
            super().__init__(kernel, tiles, block_threads, shared_bytes, SEGMENTED_KERNEL_SIGNATURE,
                             values[:1] + (0,) + values[1:], 5, problem.acc_dtype, device)
        else:
            super().__init__(kernel, tiles, block_threads, shared_bytes, KERNEL_SIGNATURE, values, 4,
                             problem.acc_dtype, device)

    def __call__(self, x: torch.Tensor, out: torch.Tensor, starts: torch.Tensor | None = None) -> None:
        """``starts``: a segmented problem's flags, bool or uint8, contiguous, of x's shape."""
        if not self.segmented:
            self.enqueue(x.data_ptr(), out.data_ptr())
            return
        # (A reversed scan reads each element's successor's flag in the kernel: across a row's end the next
        # row's flag lands on an element that starts its reversed row anyway.)
        self.enqueue(x.data_ptr(), starts.data_ptr(), out.data_ptr())


def prepare(config: ScanConfig, problem: ScanProblem, inputs: dict, out: torch.Tensor) -> ScanLaunch:
    """The launch for calls of ``problem`` on ``inputs["x"]``'s device: kernel, grid and ramp fixed."""
    return ScanLaunch(config, problem, inputs["x"].device.index)


def launch(config: ScanConfig, problem: ScanProblem, inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """Scan ``inputs["x"]`` (contiguous, non-empty) into ``out`` (contiguous) on torch's current stream: one
    :func:`prepare`d launch."""
    prepare(config, problem, inputs, out)(inputs["x"], out, inputs.get("segment_starts"))
    return out


# ---- Registry entry ----------------------------------------------------------------------------------------


def _standard_problems() -> list[ScanProblem]:
    return [
        ScanProblem(1, 1 << 28, torch.float32),
        ScanProblem(1, 1 << 24, torch.float32),
        ScanProblem(1, 250_000, torch.float32),
        ScanProblem(1, 1 << 26, torch.float64),
        ScanProblem(1, 1 << 26, torch.int32),
        ScanProblem(4096, 4096, torch.float32),
        ScanProblem(1 << 16, 100, torch.float32),
        ScanProblem(1, 1 << 24, torch.float32, reverse=True),
        ScanProblem(1, 1 << 28, torch.float32, reverse=True),
        ScanProblem(1, 1 << 24, torch.float32, op="max"),
        ScanProblem(1, 1 << 24, torch.float32, op="logsumexp"),
        ScanProblem(1, 1 << 24, torch.bfloat16),
        ScanProblem(1, 1 << 24, torch.float32, segmented=True),
        ScanProblem(1, 1 << 24, torch.float32, reverse=True, segmented=True),
        # issue 25's segmented target: an exclusive sum of 5 * 10^7 elements in segments of 256 on average
        ScanProblem(1, 50_000_000, torch.float32, exclusive=True, segmented=True, mean_segment=256),
    ]


SPEC = register(KernelSpec(
    **shared_spec_fields(),
    variant="lookback",
    config_cls=ScanConfig,
    default_config=default_config,
    candidates=candidates,
    why_unsupported=why_unsupported,
    compile=compile,
    launch=launch,
    prepare=prepare,
    standard_problems=_standard_problems,
    description="single-pass decoupled look-back scan along the last dim (scan.cu), rows as segments",
    sweep_axes=(("threads", "lookback"), ("items_per_thread", "staged")),
    shape_bucket=shape_bucket,
    # Floating-point sums are not bitwise repeatable: a tile's prefix adds whichever predecessor aggregates
    # and inclusive prefixes the look-back finds published, an order that depends on timing (as in CUB).
    # Integer scans are exact, hence identical.
    deterministic=False,
    baseline_name="torch.cumsum (or cumprod, cummax, cummin, logcumsumexp; segments: a chunked doubling scan in torch ops)",
    other_baselines={"torch cumsum less each segment's offset": offsets_baseline},
))
