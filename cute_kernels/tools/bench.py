"""Timing and roofline figures: CUDA events, warm-up, medians, cold L2, the vendor baseline interleaved.

``measure(spec, problem)`` checks the kernel against the reference first (a benchmark of a wrong kernel is
worthless), then times ours and the baseline alternately in the same loop, so clock drift hits both alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import statistics
import time
from typing import Any, Callable

import torch

from .. import registry, torch_ops
from ..runtime import oracle

# H200 ceilings measured on this project's machine (docs/design.md, "Benchmarks"): device-to-device copy,
# dense fp16 tensor cores, fp32 FFMA. Figures are reported as a fraction of these.
# tf32x3: FP32 work done as three TF32 tensor-core products each, so a third of the 495 dense TF32 TFLOP/s.
CEILINGS = {"bandwidth_GBps": 4170.0, "fp16_TFLOPs": 990.0, "fp32_TFLOPs": 67.0, "tf32x3_TFLOPs": 165.0}
COLD_BYTES = 256 << 20  # input sets rotate until this much data lies between two uses of one (L2: 60 MB)
MAX_ROTATION = 64
GPU_HOLD_CYCLES = 200_000  # ~100 us at H200 clocks: the first hold before each timed call (it grows as needed)
MAX_HOLD_CYCLES = 1 << 30  # ~0.5 s


@dataclasses.dataclass
class Row:
    op: str
    variant: str
    problem: str
    config: str
    ours_us: float
    baseline_us: float
    baseline_name: str
    wall_us: float  # per call, Python dispatch included, back to back
    baseline_wall_us: float
    gbps: float
    tflops: float
    verified: bool
    error: str = ""
    bound: str = "bandwidth"
    others_us: dict = dataclasses.field(default_factory=dict)  # spec.other_baselines' medians (nan: failed)
    like_for_like: bool = True  # False: the baseline does more than the problem needs (KernelSpec.baseline_caveat)

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.ours_us if self.ours_us else float("nan")

    @property
    def throughput(self) -> str:
        return f"{self.gbps:.0f} GB/s" if self.bound == "bandwidth" else f"{self.tflops:.1f} TFLOP/s"

    @property
    def ceiling_fraction(self) -> float:
        if self.bound == "bandwidth":
            return self.gbps / CEILINGS["bandwidth_GBps"]
        return self.tflops / CEILINGS[f"{self.bound}_TFLOPs"]


def cold_input_sets(call_bytes: float) -> int:
    """How many input sets a timing loop rotates through so that ``COLD_BYTES`` of other sets lie between two
    uses of one (L2 then holds none of a call's inputs), at most ``MAX_ROTATION``."""
    return max(1, min(MAX_ROTATION, -(-COLD_BYTES // max(1, int(call_bytes)))))


def input_rotation(copies: int) -> Callable[[Callable[[int], object]], Callable[[int], object]]:
    """``rotate(call)`` turns ``call(i)``, a call on input set ``i``, into an ``interleaved_times`` function.
    One counter serves every function so wrapped: the set advances with every call, whichever function
    makes it. (Indexed by the rep instead, the second function of each rep reads the input the first has
    just read, partly still in L2: at 2^24 floats, 2 sets, that warmed half of each side's calls.)"""
    turn = itertools.count()

    def rotate(call):
        def timed(_rep):
            return call(next(turn) % copies)
        return timed

    return rotate


def interleaved_times(fns: dict[str, Callable[[int], object]], *, reps: int = 30, warmup: int = 3,
                      device=None) -> dict[str, list[float]]:
    """Per-call GPU times in microseconds: ``fns[name](rep)`` timed alone between two events, the functions
    alternating (and their order alternating) rep by rep, so drift in clocks hits all alike.

    The GPU is held busy (a sleep kernel) while each call is enqueued, so the figure is GPU time alone:
    otherwise the events around a short kernel measure the host's dispatch. A hold is only good if it
    outlasts the enqueue, and the host can be slower than any fixed guess (a CuTe GEMM call takes ~150 us,
    far more while a sweep compiles on every core), so each sample proves it: if the start event has
    already fired when the call returns, the GPU waited on the host, the sample is dropped and the hold
    grows. Cold caches are the caller's business: pass functions that rotate through enough input sets
    (see ``measure``); flushing L2 by writing a large buffer leaves it full of dirty lines whose write-back
    the next kernel pays (seen: +20 us on a 60 us torch.cumsum).
    """
    names = list(fns)
    for w in range(warmup):
        for name in names:
            fns[name](w)
    torch.cuda.synchronize(device)
    hold = GPU_HOLD_CYCLES
    events = {name: [] for name in names}
    for r in range(reps):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            while True:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(hold)
                start.record()
                fns[name](r)
                host_was_late = start.query()
                end.record()
                if not host_was_late:
                    break
                if hold >= MAX_HOLD_CYCLES:
                    raise RuntimeError(f"timing {name}: the host took longer to enqueue one call than a "
                                       f"{MAX_HOLD_CYCLES}-cycle hold of the GPU")
                hold = min(hold * 4, MAX_HOLD_CYCLES)
            events[name].append((start, end))
    torch.cuda.synchronize(device)
    return {name: [s.elapsed_time(e) * 1e3 for s, e in pairs] for name, pairs in events.items()}


# Back-to-back calls before a wall-time run starts: a GPU left idle between measurements (while the host
# builds the next row) can take milliseconds to reach its working clocks, about a whole run of 200 calls
# of ~10 us; the warm-up keeps that out of the timed calls.
WALL_WARMUP_S = 0.02


def wall_calls(*gpu_us: float) -> int:
    """Back-to-back calls per wall-time run of a row whose calls take ``gpu_us`` of GPU time each: 200 where
    every one is short (the host's dispatch is then the figure, and a run must outlast the clock's grain), 20
    where any is not. Keyed by the slowest, since the run times every function that many times: a fast
    kernel against a baseline of tens of ms must not make 600 of the baseline's calls (docs/notes/method.md,
    "Where a report's time goes")."""
    return 200 if max(gpu_us) < 100 else 20


def wall_us_per_call(fn: Callable[[], object], *, calls: int = 200, device=None) -> float:
    """Host time per call for back-to-back calls, synchronising once at the end: for small problems this
    is the dispatch cost a user sees. ``WALL_WARMUP_S`` of the same calls come first (at least one)."""
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < WALL_WARMUP_S:
        fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / calls * 1e6


def check(spec, problem, config, inputs: dict, device, run: Callable[[dict, Any], Any] | None = None) -> tuple:
    """Run ``config`` once on ``inputs`` into a poisoned output (or ``run(inputs, out)``, e.g. the public
    op) and judge it with the spec's oracle. Returns (verdict, the baseline's output)."""
    base_out = spec.baseline(problem, inputs)
    out = oracle.poisoned_like(base_out)
    if run is None:
        spec.launch(config, problem, inputs, out)
    else:
        run(inputs, out)
    torch.cuda.synchronize(device)
    return spec.verify(problem, inputs, out, base_out), base_out


def race_configs(spec, problem, configs, *, reps: int = 30, device="cuda", generator=None,
                 others: dict[str, Callable[[dict, Any], Any]] | None = None) -> tuple[dict, dict]:
    """A probe's race of several ``configs`` of one entry on ``problem``: each first runs once into a
    poisoned output and is judged by the oracle (``check``); those that pass, the spec's baseline (named
    "baseline") and ``others`` ({name: fn(inputs, out)}, e.g. a same-traffic copy) are then timed in ONE
    ``interleaved_times`` loop, rotating through input sets as ``measure`` does. Returns ({config:
    verdict}, {config or name: median us}); a config that failed has no time."""
    device = torch.device(device)
    copies = cold_input_sets(spec.bytes(problem))
    sets = [spec.make_inputs(problem, device, generator) for _ in range(copies)]
    verdicts = {config: check(spec, problem, config, sets[0], device)[0] for config in configs}
    base_out = spec.baseline(problem, sets[0])
    outs = [oracle.poisoned_like(base_out) for _ in range(copies)]
    del base_out
    rotate = input_rotation(copies)
    fns = {"baseline": rotate(lambda i: spec.baseline(problem, sets[i]))}
    fns.update({name: rotate(lambda i, fn=fn: fn(sets[i], outs[i])) for name, fn in (others or {}).items()})
    fns.update({config: rotate(lambda i, c=config: spec.launch(c, problem, sets[i], outs[i]))
                for config in configs if verdicts[config]})
    times = interleaved_times(fns, reps=reps, device=device)
    return verdicts, {key: statistics.median(samples) for key, samples in times.items()}


def measure(spec, problem, config=None, *, reps: int = 30, device="cuda", generator=None,
            op_call: Callable[[dict, Any], Any] | None = None, runs_on: tuple | None = None) -> Row:
    """Verify, then time one (spec, problem, config) against the spec's vendor baseline.

    Ours and the baseline rotate through the same input sets, as many as it takes to put ``COLD_BYTES``
    between two uses of one set, so L2 holds none of a call's inputs when it starts (up to MAX_ROTATION
    sets: the smallest problems stay partly warm, as they would in a real pipeline).
    ``op_call(inputs, out)``: the public op writing ``out``; given, it is what is verified and timed in GPU
    time instead of ``spec.launch`` (``spec`` still makes the inputs and runs the baseline), and ``runs_on`` =
    (entry, problem) names the kernel it runs for the row's variant and config. Wall per call is the public op
    allocating its result (``torch_ops.public_call``) where the op's own call runs this row's kernel, else
    ours as timed in GPU time.
    """
    device = torch.device(device)
    run_spec, run_problem = runs_on or (spec, problem)
    # The op's own call runs this row's kernel: no config given, and the entry the op routes the problem to.
    op_choice = config is None and registry.route(spec.op, problem) is spec
    config = config or run_spec.choose_config(run_problem, device.index or 0)
    copies = cold_input_sets(spec.bytes(problem))
    sets = [spec.make_inputs(problem, device, generator) for _ in range(copies)]
    verdict, base_out = check(spec, problem, config, sets[0], device, op_call)
    outs = [oracle.poisoned_like(base_out) for _ in range(copies)]
    caveat = spec.baseline_caveat(problem) if spec.baseline_caveat is not None else None
    row = Row(spec.op, run_spec.variant + (" (op)" if op_call else ""), describe(problem), describe(config),
              float("nan"), float("nan"), spec.baseline_name + (f" ({caveat})" if caveat else ""), float("nan"),
              float("nan"), float("nan"), float("nan"), bool(verdict), verdict.detail, spec.bound,
              like_for_like=caveat is None)
    if not verdict:
        return row
    del base_out
    rotate = input_rotation(copies)
    ours = op_call or (lambda inp, out: spec.launch(config, problem, inp, out))
    fns = {"ours": rotate(lambda i: ours(sets[i], outs[i])),
           "baseline": rotate(lambda i: spec.baseline(problem, sets[i]))}
    for name, other in spec.other_baselines.items():
        try:  # a library that refuses this problem (or is missing here) is reported as such, not fatal
            probe = other(problem, sets[0])
        except Exception:  # noqa: BLE001
            probe = float("nan")
        if probe is None:
            continue  # does not apply to this problem
        if not isinstance(probe, torch.Tensor) or (probe.is_floating_point() and not bool(probe.isfinite().all())):
            row.others_us[name] = float("nan")  # refused, or a wrong answer, which is not timed
            continue
        fns[name] = rotate(lambda i, other=other: other(problem, sets[i]))
    times = interleaved_times(fns, reps=reps, device=device)
    row.ours_us = statistics.median(times["ours"])
    row.baseline_us = statistics.median(times["baseline"])
    for name in spec.other_baselines:
        if name in times:
            row.others_us[name] = statistics.median(times[name])
    row.gbps = spec.bytes(problem) / (row.ours_us * 1e-6) / 1e9
    row.tflops = spec.flops(problem) / (row.ours_us * 1e-6) / 1e12
    calls = wall_calls(row.ours_us, row.baseline_us)
    # Wall per call as model code sees it: where the op's own call runs this row's kernel, the public op
    # allocating its result (its checks and plan lookup included), against the baseline's call, which
    # allocates its own, with its settings (a backend, TF32 off) made once as a model makes them
    # (``eager_baseline``); elsewhere (a pinned variant or config) the row's launch.
    public = torch_ops.public_call(spec.op, problem, sets[0]) if op_choice else None
    theirs, settings = (spec.eager_baseline(problem, sets[0]) if spec.eager_baseline is not None
                        else ((lambda: spec.baseline(problem, sets[0])), contextlib.nullcontext))
    row.wall_us, row.baseline_wall_us = interleaved_walls(
        (public or (lambda: ours(sets[0], outs[0])), theirs), calls=calls, device=device,
        settings=(contextlib.nullcontext, settings))
    return row


def interleaved_walls(fns, *, calls: int, tries: int = 3, device=None, settings=None) -> list:
    """``wall_us_per_call`` of each of ``fns``, as the median of ``tries`` runs taken in turn (ours, theirs,
    ours, ...): a host hiccup during one run (the lent machines' hosts are shared) moves one figure of
    three, not the row's ratio. ``settings``: per function, a context manager factory entered around each of
    its runs (not each call)."""
    runs = [[] for _ in fns]
    settings = settings or [contextlib.nullcontext] * len(fns)
    for _ in range(tries):
        for fn, times, setting in zip(fns, runs, settings):
            with setting():
                times.append(wall_us_per_call(fn, calls=calls, device=device))
    return [statistics.median(times) for times in runs]


def describe(obj) -> str:
    """A dataclass as ``field=value`` words (a field whose metadata says ``described: "unless default"``
    only when it differs from its default); anything else as ``str``."""
    if dataclasses.is_dataclass(obj):
        parts = []
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.metadata.get("described") == "unless default" and v == f.default:
                continue
            if isinstance(v, torch.dtype):
                v = str(v).replace("torch.", "")
            parts.append(f"{f.name}={v}")
        return " ".join(parts)
    return str(obj)


def report(text: str, filename: str) -> None:
    """Print a probe's table and, when ``$OUT`` is set (the device tool brings that folder back), write it
    there as ``filename`` too."""
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], filename), "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
