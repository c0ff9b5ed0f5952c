"""Sweeps: every supported candidate config of registry entries at chosen problems, each compiled, verified
against the reference and timed against the vendor baseline in the same run.

CuTe compiles take seconds each and ``cute.compile`` is not thread-safe, and a compiled executor cannot leave
the process that built it. So each point runs in a worker process: it compiles (in parallel with the other
workers), then takes its GPU's lock to verify and time (``bench.measure``), so timings never overlap. With
several GPUs each worker is bound to one and the locks are per GPU. ``compile_only`` needs no GPU: it
compile-checks the whole space for an arch (the CPU tier's job at scale).

Results go to a CSV, one row per point; points already in the CSV are skipped, so a sweep can resume.
"""

from __future__ import annotations

import csv
import dataclasses
import multiprocessing as mp
import os
import time
import traceback
from typing import Iterable

from .. import registry
from ..runtime import device
from .bench import describe

FIELDS = ["op", "variant", "problem", "config", "arch", "compile_s", "verified", "ours_us", "baseline_us",
          "speedup", "throughput", "ceiling_pct", "wall_us", "baseline_wall_us", "detail"]


@dataclasses.dataclass(frozen=True)
class Point:
    op: str
    variant: str
    problem: object
    config: object

    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.variant, describe(self.problem), describe(self.config))


def plan(specs: Iterable, problem_indices: Iterable[int] | None = None, limit: int | None = None,
         vary: Iterable[str] | None = None) -> list[Point]:
    """The points of a sweep: for each spec and each chosen standard problem, every supported candidate
    (``supports()`` prunes before anything compiles). ``vary``: the config fields the grid varies (e.g.
    num_stages and the tile shape); every other field stays at the problem's default config (None: vary
    them all). ``limit`` keeps an evenly spaced sample."""
    points = []
    vary = None if vary is None else set(vary)
    for spec in specs:
        problems = spec.standard_problems()
        chosen = range(len(problems)) if problem_indices is None else problem_indices
        if vary is not None:
            fields = {f.name for f in dataclasses.fields(spec.config_cls)}
            unknown = vary - fields
            if unknown:
                raise ValueError(f"vary: {spec.op}/{spec.variant} configs have no field(s) {sorted(unknown)}; "
                                 f"they have {sorted(fields)}")
        for i in chosen:
            configs = spec.supported_candidates(problems[i])
            if vary is not None:
                base = spec.default_config(problems[i])
                fixed = [f for f in fields if f not in vary]
                configs = [c for c in configs if all(getattr(c, f) == getattr(base, f) for f in fixed)]
            if limit is not None and len(configs) > limit:
                step = len(configs) / limit
                configs = [configs[int(j * step)] for j in range(limit)]
            points.extend(Point(spec.op, spec.variant, problems[i], c) for c in configs)
    return points


def device_arch(spec, device_index: int) -> str:
    """The arch the spec's own launch compiles for on this device (CuTe: sm_90a, NVRTC: sm_90)."""
    return device.arch(device_index, arch_specific=spec.backend == "cute")


def evaluate(point: Point, *, reps: int = 20, compile_only: bool = False, arch: str = "sm_90a",
             device_index: int = 0, gpu_lock=None, verify_only: bool = False) -> dict:
    """Compile, verify and (unless ``verify_only``) time one point; never raises (a failure is a row that
    says so). Verification needs no lock: only timings must not overlap."""
    row = dict.fromkeys(FIELDS, "")
    row.update(op=point.op, variant=point.variant, problem=describe(point.problem), config=describe(point.config))
    try:
        spec = registry.get(point.op, point.variant)
        if not compile_only:
            import torch

            torch.cuda.set_device(device_index)
            arch = device_arch(spec, device_index)
        row["arch"] = arch
        t0 = time.perf_counter()
        spec.compile(point.config, point.problem, arch)
        row["compile_s"] = f"{time.perf_counter() - t0:.2f}"
        if compile_only:
            row["verified"] = "compiled"
            return row
        from . import bench

        if verify_only:
            import torch

            device = torch.device("cuda", device_index)
            inputs = spec.make_inputs(point.problem, device, None)
            verdict, _ = bench.check(spec, point.problem, point.config, inputs, device)
            row["verified"] = "yes" if verdict else "NO"
            row["detail"] = verdict.detail
            return row
        lock = gpu_lock if gpu_lock is not None else _NoLock()
        with lock:
            try:
                r = bench.measure(spec, point.problem, point.config, reps=reps, device=f"cuda:{device_index}")
            finally:
                # Hand the inputs' memory back before the lock: each worker's caching allocator would
                # otherwise keep its largest problem (GBs for a 2^28 scan) and the next worker runs out.
                import torch

                torch.cuda.empty_cache()
        row["verified"] = "yes" if r.verified else "NO"
        row["detail"] = r.error
        if r.verified:
            row.update(ours_us=f"{r.ours_us:.2f}", baseline_us=f"{r.baseline_us:.2f}", speedup=f"{r.speedup:.3f}",
                       throughput=r.throughput, ceiling_pct=f"{100 * r.ceiling_fraction:.1f}",
                       wall_us=f"{r.wall_us:.2f}", baseline_wall_us=f"{r.baseline_wall_us:.2f}")
    except Exception as e:  # noqa: BLE001 - a failing point is recorded as such and the sweep goes on
        row["verified"] = "ERROR"
        row["detail"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    return row


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _worker(args) -> dict:
    point, reps, compile_only, arch, device_index, locks, verify_only = args
    if compile_only:
        os.environ.setdefault("CUTE_DSL_ARCH", arch)
    lock = None if locks is None else locks[device_index]
    return evaluate(point, reps=reps, compile_only=compile_only, arch=arch, device_index=device_index,
                    gpu_lock=lock, verify_only=verify_only)


def verify_all(points: list[Point], *, jobs: int = 8) -> list[dict]:
    """Compile and verify every point (no timing) in ``jobs`` worker processes spread over the GPUs: the
    tests' way to run every candidate of a family on one ragged problem. Rows in the order of ``points``."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError("verify_all needs a CUDA device")
    tasks = [(p, 0, False, "", i % gpus, None, True) for i, p in enumerate(points)]
    if jobs <= 1:
        return [_worker(t) for t in tasks]
    with mp.get_context("spawn").Pool(processes=jobs) as pool:
        return pool.map(_worker, tasks)


def done_keys(csv_path: str, *, timed: bool = True) -> set:
    """The points ``csv_path`` already holds: for a timed sweep only the timed (or failed) ones, since a
    compile-only row measured nothing; for a compile-only sweep every row."""
    if not os.path.exists(csv_path):
        return set()
    with open(csv_path, newline="") as f:
        return {(r["op"], r["variant"], r["problem"], r["config"]) for r in csv.DictReader(f)
                if not (timed and r["verified"] == "compiled")}


def run(points: list[Point], csv_path: str, *, jobs: int = 1, reps: int = 20, compile_only: bool = False,
        arch: str = "sm_90a", progress=print) -> list[dict]:
    """Evaluate the points not yet in ``csv_path``, appending a row per point as it finishes."""
    done = done_keys(csv_path, timed=not compile_only)
    todo = [p for p in points if p.key() not in done]
    progress(f"sweep: {len(points)} points, {len(points) - len(todo)} already in {csv_path}, {len(todo)} to run")
    if not todo:
        return []
    gpus = 0
    if not compile_only:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise RuntimeError("sweep: no CUDA device; use compile_only=True to compile-check without one")
    new_file = not os.path.exists(csv_path)
    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
    rows = []
    with open(csv_path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()

        bar = _progress_bar(len(todo)) if progress is print else None
        say = bar.write if bar is not None else progress

        def record(row):
            writer.writerow(row)
            f.flush()
            rows.append(row)
            status = row["verified"] if row["verified"] != "yes" else f"{row['ours_us']} us ({row['speedup']}x)"
            say(f"[{len(rows)}/{len(todo)}] {row['op']}/{row['variant']} {row['problem']} | {row['config']}: "
                f"{status} {row['detail'][:120]}")
            if bar is not None:
                bar.update(1)

        try:
            if jobs <= 1:
                for i, p in enumerate(todo):
                    record(evaluate(p, reps=reps, compile_only=compile_only, arch=arch,
                                    device_index=i % max(gpus, 1)))
                return rows
            ctx = mp.get_context("spawn")  # CUDA and the DSL do not survive fork
            with ctx.Manager() as manager:
                locks = None if compile_only else [manager.Lock() for _ in range(gpus)]
                tasks = [(p, reps, compile_only, arch, i % max(gpus, 1), locks, False) for i, p in enumerate(todo)]
                with ctx.Pool(processes=jobs) as pool:
                    for row in pool.imap_unordered(_worker, tasks):
                        record(row)
        finally:
            if bar is not None:
                bar.close()
    return rows


def _progress_bar(total: int):
    """A tqdm bar on stderr (the per-point lines go above it), or None where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="point", dynamic_ncols=True)


def summary(csv_path: str) -> str:
    """Markdown: the fastest verified config per (op, variant, problem), and every failure."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    # A point compiled by a compile-only sweep and then timed by a later one counts once, as timed.
    timed = {(r["op"], r["variant"], r["problem"], r["config"]) for r in rows if r["verified"] != "compiled"}
    rows = [r for r in rows if r["verified"] != "compiled" or (r["op"], r["variant"], r["problem"], r["config"]) not in timed]
    best: dict[tuple, dict] = {}
    failures = []
    for r in rows:
        if r["verified"] == "yes":
            k = (r["op"], r["variant"], r["problem"])
            if k not in best or float(r["ours_us"]) < float(best[k]["ours_us"]):
                best[k] = r
        elif r["verified"] != "compiled":
            failures.append(r)
    lines = ["| op | variant | problem | best config | ours (us) | baseline (us) | speed-up | throughput |",
             "|" + " --- |" * 8]
    for (op, variant, problem), r in sorted(best.items()):
        lines.append(f"| {op} | {variant} | {problem} | {r['config']} | {r['ours_us']} | {r['baseline_us']} | "
                     f"{r['speedup']}x | {r['throughput']} |")
    compiled = sum(r["verified"] == "compiled" for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} points: {sum(r['verified'] == 'yes' for r in rows)} verified and timed, "
                 f"{compiled} compiled only, {len(failures)} failed.")
    for r in failures:
        lines.append(f"- FAILED {r['op']}/{r['variant']} {r['problem']} | {r['config']}: {r['verified']} {r['detail']}")
    return "\n".join(lines)


def write_tuned(points: list[Point], csv_path: str, *, source: str, device_index: int = 0) -> list:
    """Record, for each swept problem, its fastest verified config as the tuned default for this GPU's arch
    (``tuned.record``); returns the files written."""
    from .. import tuned

    with open(csv_path, newline="") as f:
        rows = {(r["op"], r["variant"], r["problem"], r["config"]): r for r in csv.DictReader(f)}
    best: dict[tuple, tuple] = {}
    for p in points:
        r = rows.get(p.key())
        if r is None or r["verified"] != "yes":
            continue
        group = (p.op, p.variant, describe(p.problem))
        if group not in best or float(r["ours_us"]) < float(best[group][1]["ours_us"]):
            best[group] = (p, r)
    arch = tuned.table_arch(device_index)
    written = set()
    for p, r in best.values():
        spec = registry.get(p.op, p.variant)
        if spec.shape_bucket is None:
            continue
        written.add(tuned.record(spec, p.problem, p.config, arch, speedup=float(r["speedup"]), source=source))
    return sorted(written)
