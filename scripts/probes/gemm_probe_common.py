"""What the SGEMM and HGEMM GPU probes share: timing against the vendor baseline, the worker's
compile/error plumbing, and the driver (a spawn pool of workers that compile concurrently and take turns on
the GPU under one lock, a table on stdout, a CSV in ``$OUT``).

Imported by the GEMM probes in scripts/probes/ as a sibling module (a script's own folder is on
``sys.path``, and spawned workers inherit it). Kernels are reached through their registry entries
(``spec.config_cls``, ``spec.why_unsupported``, ``spec.compile``) and the public ops.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import os
import statistics
import time
import traceback

__all__ = ["problem_dims", "timed_pair", "compile_variants", "probe_row", "run_probe", "shape_probe_args",
           "cold_operand_sets", "checked_ways_times"]


def problem_dims(size) -> tuple[int, int, int]:
    """(m, n, k) of a timed size: an int is a square problem, a string "MxNxK" any other shape."""
    if isinstance(size, int):
        return size, size, size
    m, n, k = (int(d) for d in size.split("x"))
    return m, n, k


def shape_probe_args(description: str, default_shapes: str):
    """The shape probes' command line (--dtype, repeatable --shape MxNxK, --reps): (args, the torch dtype)."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--shape", action="append", help=f"MxNxK (repeatable; default: {default_shapes})")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    return args, getattr(torch, args.dtype)


def cold_operand_sets(dtype, shapes: tuple, result_elements: int) -> list[tuple]:
    """As many sets of randn operands of ``shapes`` (on the GPU) as keep L2 from holding a call's inputs
    between turns (``bench.cold_input_sets``, counting the result's ``result_elements`` too)."""
    import torch

    from cute_kernels.tools.bench import cold_input_sets

    elements = sum(math.prod(shape) for shape in shapes) + result_elements
    return [tuple(torch.randn(*shape, device="cuda", dtype=dtype) for shape in shapes)
            for _ in range(cold_input_sets(elements * dtype.itemsize))]


def checked_ways_times(ways: dict, sets: list, reference, baseline_result, reps: int) -> tuple[dict, dict]:
    """Each way (a function of one input set) run on ``sets[0]`` and judged by the registry's oracle against
    ``reference`` with ``baseline_result``'s error as the yardstick; the verified ways timed in one
    interleaved loop, rotating through ``sets`` so that L2 holds none of a call's inputs. Returns (verdicts,
    median us of each verified way)."""
    from cute_kernels.runtime import oracle
    from cute_kernels.tools.bench import input_rotation, interleaved_times

    verdicts = {name: oracle.compare(fn(*sets[0]), reference, baseline_result) for name, fn in ways.items()}
    rotate = input_rotation(len(sets))
    times = interleaved_times({name: rotate(lambda i, fn=fn: fn(*sets[i])) for name, fn in ways.items()
                               if verdicts[name]}, reps=reps, device="cuda")
    return verdicts, {name: statistics.median(t) for name, t in times.items()}


def timed_pair(ours, baseline, *, reps: int, flops: float, device) -> tuple[float, float, float, float]:
    """(ms ours, ms baseline, TFLOP/s ours, TFLOP/s baseline): medians of ``cute_kernels.tools.bench
    .interleaved_times`` (warm-up first, the two alternating rep by rep, GPU time alone)."""
    from cute_kernels.tools.bench import interleaved_times

    times = interleaved_times({"ours": lambda rep: ours(), "baseline": lambda rep: baseline()}, reps=reps,
                              device=device)
    us_ours, us_base = statistics.median(times["ours"]), statistics.median(times["baseline"])
    return us_ours / 1e3, us_base / 1e3, flops / us_ours / 1e6, flops / us_base / 1e6


def compile_variants(spec, config, problems, arch: str) -> float:
    """Compile ``config`` through its registry entry ``spec`` for every problem (compile-time variant) it
    supports; returns the seconds taken."""
    t0 = time.time()
    for problem in problems:
        if spec.supports(config, problem):
            spec.compile(config, problem, arch)
    return round(time.time() - t0, 1)


def probe_row(name: str, body) -> dict:
    """Run ``body(row)`` for one config; an exception becomes an ERROR row so the other configs go on."""
    row = {"name": name}
    try:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        body(row)
    except Exception as exc:  # report, keep the other configs going
        row["check"] = "ERROR"
        row["detail"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    return row


def run_probe(*, op: str, description: str, probe_configs, time_sizes, worker, columns, jobs: int,
              timeout_s: int, quick_help: str) -> int:
    """Parse the probes' common arguments, run ``worker(name, kwargs, sizes, gpu_lock, reps, quick,
    compile_only)`` for each ``(name, kwargs[, sizes])`` of ``probe_configs`` in a spawn pool, print the
    table and write ``$OUT/{op}_probe.csv``. ``columns(sizes)``: the table's timing columns for the sizes run.
    Exit status 0 when every row checked ok."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--jobs", type=int, default=min(jobs, os.cpu_count() or 1))
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--only", nargs="*", help="config names to run")
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU needed")
    args = parser.parse_args()

    configs = probe_configs[:4] if args.quick else probe_configs
    if args.only:
        configs = [c for c in configs if c[0] in args.only]
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    gpu_lock = manager.Lock()
    t0 = time.time()
    with ctx.Pool(processes=args.jobs) as pool:
        results = [
            pool.apply_async(worker, (e[0], e[1], e[2] if len(e) > 2 else time_sizes, gpu_lock, args.reps,
                                      args.quick, args.compile_only))
            for e in configs
        ]
        rows = [r.get(timeout=timeout_s) for r in results]

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"# {op} probe on {gpu}, torch {torch.__version__}, {time.time() - t0:.0f} s")
    cols = ["name", "config", "compile_s", "check"]
    sizes = sorted({size for e in configs for size in (e[2] if len(e) > 2 else time_sizes)},
                   key=lambda size: (math.prod(problem_dims(size)), str(size)))
    cols += columns(sizes)
    cols += ["detail"]
    shown = [c for c in cols if any(c in row for row in rows)]
    print(" | ".join(shown))
    for row in rows:
        print(" | ".join(str(row.get(c, "")) for c in shown))
    out_dir = os.environ.get("OUT")
    if out_dir:
        keys = sorted({k for row in rows for k in row}, key=lambda k: (k not in cols, cols.index(k) if k in cols else 0, k))
        with open(os.path.join(out_dir, f"{op}_probe.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    return 0 if all(r.get("check") == "ok" for r in rows) else 1
