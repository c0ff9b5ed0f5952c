"""Sweeps: every supported candidate config of registry entries at chosen problems, each compiled, verified
against the reference and timed against the vendor baseline in the same run.

CuTe compiles take seconds each and ``cute.compile`` is not thread-safe, and a compiled executor cannot leave
the process that built it. So each point runs in a worker process: it compiles (in parallel with the other
workers), then takes its GPU's lock to verify and time (``bench.measure``), so timings never overlap. With
several GPUs each worker is bound to one and the locks are per GPU (file locks: a crashed worker's dies
with it). ``compile_only`` needs no GPU: it
compile-checks the whole space for an arch (the CPU tier's job at scale).

Past one host the sweep is a torch.distributed job (``torchrun ... -m cute_kernels sweep``): each rank owns a
stable share of the points and one GPU, and rank 0 gathers the rows (``run``, ``tools.ranks``). Results go
to a CSV, one row per point; points already in the CSV are skipped, so a sweep can resume.
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
from .ranks import Ranks, share

FIELDS = ["op", "variant", "problem", "config", "arch", "compile_s", "verified", "ours_us", "baseline_us",
          "speedup", "throughput", "ceiling_pct", "wall_us", "baseline_wall_us", "detail", "device", "run", "mode"]
# "device": the GPU a timed row ran on; "run": the sweep run (start time and pid) that wrote the row; "mode":
# "timed" or "compile-only", what the sweep that wrote the row did (a failed compile-only row measured
# nothing either, so a timed resume runs its point; a row without one, from an older version, counts as
# timed unless it says "compiled"). Absolute
# times compare within one run only (this GPU's figures drift ~10% between runs): across runs, rows rank by
# their own same-run speed-up against the baseline (``_faster``).


@dataclasses.dataclass(frozen=True)
class Point:
    op: str
    variant: str
    problem: object
    config: object

    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.variant, describe(self.problem), describe(self.config))


def row_key(row: dict) -> tuple[str, str, str, str]:
    """The ``Point.key`` of the point a CSV row (or a row ``evaluate`` returns) is of."""
    return (row["op"], row["variant"], row["problem"], row["config"])


def plan(specs: Iterable, problem_indices: Iterable[int] | None = None, limit: int | None = None,
         vary: Iterable[str] | None = None, zoo: bool = False) -> list[Point]:
    """The points of a sweep: for each spec and each chosen standard problem, every supported candidate
    (``supports()`` prunes before anything compiles), and the problem's default config where the candidates
    lack it, so that a winner written to the tuned tables is never slower than what the op runs without one
    (a default fitted to the problem, such as a narrow column CTA, can lie outside the grid). ``vary``: the config fields the grid varies (e.g.
    num_stages and the tile shape); every other field stays at the problem's default config (None: vary
    them all). ``limit`` keeps an evenly spaced sample. ``zoo``: the problems are the spec's shapes of its
    op's zoo as the op's kernels run them (``registry.zoo(as_run=True)``: a staged HGEMM as its aligned
    twin, on the entry that runs it) instead of its standard problems, so a sweep's winners fill the tuned
    tables the op reads for the everyday shapes (never the held-out ones)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit: at least 1 config per problem, got {limit}")
    points = []
    vary = None if vary is None else set(vary)
    for spec in specs:
        problems = ([p for entry, p in registry.zoo(spec.op, as_run=True) if entry.key == spec.key] if zoo
                    else spec.standard_problems())
        chosen = range(len(problems)) if problem_indices is None else problem_indices
        if vary is not None:
            fields = spec.config_fields()
            unknown = vary - fields
            if unknown:
                raise ValueError(f"vary: {spec.op}/{spec.variant} configs have no field(s) {sorted(unknown)}; "
                                 f"they have {sorted(fields)}")
        for i in chosen:
            if not 0 <= i < len(problems):
                raise ValueError(f"problems: {spec.op}/{spec.variant} has {len(problems)} "
                                 f"{'zoo' if zoo else 'standard'} problems (indices 0..{len(problems) - 1}), got {i}")
            configs = spec.supported_candidates(problems[i])
            default = spec.default_config(problems[i])
            if default not in configs and spec.supports(default, problems[i]):
                configs.insert(0, default)
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
    """The arch the spec's own launch compiles for on this device (CuTe and the NVRTC entries of sm_90a's
    own instructions: sm_90a; the other NVRTC entries: sm_90), so that what a sweep or ``precompile``
    compiles is what the call looks up in the caches."""
    return launch_arch(spec, device.arch(device_index))


def launch_arch(spec, arch: str) -> str:
    """``arch`` (a target named on the command line, ``sm_90`` or ``sm_90a``) as the spec's launch names it
    (``device_arch``'s rule): the ``a`` suffix from sm_90 on for CuTe and arch-specific entries, none for
    the other NVRTC entries."""
    return device.specific(arch) if spec.backend == "cute" or spec.arch_specific else arch.removesuffix("a")


def _mode(compile_only: bool) -> str:
    """A row's "mode" column."""
    return "compile-only" if compile_only else "timed"


def measured_nothing(row: dict) -> bool:
    """Whether a CSV row is a compile-only sweep's (compiled, or failed there): it timed nothing."""
    return row.get("verified") == "compiled" or row.get("mode") == "compile-only"


def _of_arch(row: dict, arch: str | None) -> bool:
    """Whether a CSV row is of ``arch`` (None: any; a row without one, from an older version, is of every)."""
    return arch is None or row.get("arch") in (None, "", arch)


def _point_row(point: Point, **fields) -> dict:
    """A CSV row of ``point``: its identity, then ``fields`` (the rest empty)."""
    row = dict.fromkeys(FIELDS, "")
    row.update(op=point.op, variant=point.variant, problem=describe(point.problem), config=describe(point.config),
               **fields)
    return row


def evaluate(point: Point, *, reps: int = 20, compile_only: bool = False, arch: str = "sm_90a",
             device_index: int = 0, gpu_lock=None, verify_only: bool = False) -> dict:
    """Compile, verify and (unless ``verify_only``) time one point; never raises (a failure is a row that
    says so). Verification needs no lock: only timings must not overlap."""
    row = _point_row(point, mode=_mode(compile_only))
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
        row["device"] = torch.cuda.get_device_name(device_index)
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


def compile_ahead(points: list[tuple[Point, str]], *, jobs: int, timeout_s: float = 600.0) -> list[dict]:
    """Compile every (point, arch) in ``jobs`` worker processes (no CUDA), so that the disk caches hold the
    kernels a later run of the points loads instead of compiling them one after another: a cold report's
    compiles then take about 1/jobs of their serial time. Compile-only rows, in the order they finish; a
    failure is a row that says so (the run that needs the kernel meets it again)."""
    return list(compile_ahead_rows(points, jobs=jobs, timeout_s=timeout_s))


def compile_ahead_rows(points: list[tuple[Point, str]], *, jobs: int, timeout_s: float = 600.0):
    """``compile_ahead``, each row yielded as its worker finishes it (for a progress bar)."""
    workers = _Workers(jobs, timeout_s, timed=False)
    try:
        yield from workers.evaluate([(point, 0, True, arch, 0) for point, arch in points])
    finally:
        workers.close()


def _worker(args) -> dict:
    point, reps, compile_only, arch, device_index, locks, verify_only = args
    if compile_only:
        # The CuTe DSL's own target: the chip's specific one, whichever form the point's arch takes (an
        # NVRTC entry's sm_90 too, since the worker's next point may be a CuTe kernel).
        os.environ.setdefault("CUTE_DSL_ARCH", device.specific(arch))
    lock = None if locks is None else locks[device_index]  # a list or a dict by GPU index
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


def done_keys(csv_path: str, *, timed: bool = True, arch: str | None = None) -> set:
    """The points ``csv_path`` already holds: for a timed sweep only the timed ones (failed ones included),
    since a compile-only row measured nothing, failed or not; for a compile-only sweep every row, or with
    ``arch`` every row of that arch (a row without one, from an older version, counts)."""
    if not os.path.exists(csv_path):
        return set()
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        _check_key_columns(csv_path, reader.fieldnames or [])
        return {row_key(r) for r in reader
                if not (timed and measured_nothing(r)) and _of_arch(r, arch)}


def _check_key_columns(csv_path: str, header) -> None:
    """A CSV a sweep resumes must name its points (an empty file is a new one)."""
    missing = [name for name in ("op", "variant", "problem", "config") if name not in header]
    if header and missing:
        raise ValueError(f"{csv_path}: not a sweep's CSV (no {', '.join(missing)} column); name another file")



def upgrade_header(csv_path: str) -> list:
    """The columns of a CSV a sweep resumes (its rows are appended under them), after rewriting it with
    today's where an older version wrote fewer (rows appended under a stale header would land in the wrong
    columns): its rows keep their values by column name, a column they lack left empty, a column today's
    lack kept after them. Written beside and renamed over, so an interruption loses nothing."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        header = [name for name in (reader.fieldnames or []) if name]
        if set(FIELDS) <= set(header):
            return header
        _check_key_columns(csv_path, header)
        rows = list(reader)
    columns = FIELDS + [name for name in header if name not in FIELDS]
    temporary = f"{csv_path}.upgrading"
    with open(temporary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: v for k, v in row.items() if k is not None} for row in rows)
    os.replace(temporary, csv_path)
    return columns


class _GpuFileLock:
    """One GPU's timing lock among every process on this host (workers and ranks alike): an flock on a file
    named for the device index, which the kernel releases when its holder exits, however it exits, so a
    worker that crashes while timing does not leave the GPU locked."""

    def __init__(self, device_index: int):
        import tempfile

        self.path = os.path.join(tempfile.gettempdir(), f"cute_kernels_sweep_gpu{device_index}.lock")
        self.fd = None

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None
        return False


def _timed_child(task, conn) -> None:
    point, reps, compile_only, arch, device_index = task
    conn.send(evaluate(point, reps=reps, compile_only=compile_only, arch=arch, device_index=device_index,
                       gpu_lock=_GpuFileLock(device_index)))
    conn.close()


def _failed_row(task, detail: str) -> dict:
    """The row of a task whose worker gave no result: its mode, and a compile-only task's arch (a timed
    one's is the device's, which the dead worker never said)."""
    point, _, compile_only, arch, *_ = task
    return _point_row(point, verified="ERROR", detail=detail, mode=_mode(compile_only),
                      arch=arch if compile_only else "")


class _Workers:
    """The processes one rank evaluates its points in, ``jobs`` at a time: compiles run in parallel, timings
    take their GPU's lock (:class:`_GpuFileLock`). A failure is contained to its point:

    - A timed point runs in a process of its own (a kernel that faults leaves its CUDA context unusable),
      and a process that dies, or gives no result in ``timeout_s`` (waiting for its GPU included), is
      killed and its point recorded as failed; the lock dies with it.
    - Compile-only points run in a pool of ``jobs`` workers (no CUDA); one that gives no result in
      ``timeout_s`` is recorded as failed, and its worker is killed when the pool closes. With
      ``jobs <= 1`` they run in this process, one after another.
    """

    def __init__(self, jobs: int, timeout_s: float, timed: bool):
        self.jobs, self.timeout_s, self.timed = max(jobs, 1), timeout_s, timed
        self.pool = None
        if not timed and jobs > 1:
            self.pool = mp.get_context("spawn").Pool(processes=jobs)

    def evaluate(self, tasks: list):
        """Rows of ``tasks`` ((point, reps, compile_only, arch, device_index) each), as they finish."""
        if self.timed:
            yield from self._in_processes(tasks)
        elif self.pool is None:
            for point, reps, compile_only, arch, device_index in tasks:
                yield evaluate(point, reps=reps, compile_only=compile_only, arch=arch, device_index=device_index)
        else:
            yield from self._in_pool(tasks)

    def _in_processes(self, tasks: list):
        ctx = mp.get_context("spawn")  # CUDA and the DSL do not survive fork
        queue, running = list(tasks), []
        while queue or running:
            while queue and len(running) < self.jobs:
                task = queue.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_timed_child, args=(task, send), daemon=True)
                process.start()
                send.close()
                running.append((process, receive, task, time.monotonic() + self.timeout_s))
            moved = False
            for item in list(running):
                process, receive, task, deadline = item
                row = None
                if receive.poll():
                    try:
                        row = receive.recv()
                    except EOFError:
                        row = _failed_row(task, f"the worker died (exit code {process.exitcode})")
                elif not process.is_alive():
                    row = _failed_row(task, f"the worker died (exit code {process.exitcode})")
                elif time.monotonic() > deadline:
                    process.kill()
                    row = _failed_row(task, f"no result in {self.timeout_s:.0f} s: the worker was killed")
                if row is not None:
                    process.join()
                    receive.close()
                    running.remove(item)
                    moved = True
                    yield row
            if not moved:
                time.sleep(0.05)

    def _in_pool(self, tasks: list):
        queue, running = list(tasks), []
        while queue or running:
            while queue and len(running) < self.jobs:  # one task per worker at a time: deadlines start at launch
                task = queue.pop(0)
                running.append((self.pool.apply_async(_worker, ((*task, None, False),)), task,
                                time.monotonic() + self.timeout_s))
            finished = [item for item in running if item[0].ready()]
            late = [item for item in running if not item[0].ready() and time.monotonic() > item[2]]
            for item in finished:
                running.remove(item)
                yield item[0].get()
            for item in late:
                running.remove(item)
                yield _failed_row(item[1], f"no result in {self.timeout_s:.0f} s: the worker died or hung")
            if not finished and not late:
                time.sleep(0.05)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def run(points: list[Point], csv_path: str, *, jobs: int = 1, reps: int = 20, compile_only: bool = False,
        arch: str = "sm_90a", progress=print, ranks: Ranks | None = None, point_timeout: float = 1800.0) -> list[dict]:
    """Evaluate the points not yet in ``csv_path``, appending a row per point as it finishes.

    ``ranks``: this process's place in a torch.distributed job (``tools.ranks``; None: one rank of one).
    Rank 0 reads which points the CSV holds and tells the others; every rank runs its share of the rest
    (``ranks.share``) in ``jobs`` worker processes on its host (``_Workers``: a failure costs its point
    alone, after ``point_timeout`` seconds at most), timing on its own GPU (``LOCAL_RANK``; a single rank
    uses every GPU it sees). Several ranks hand their rows to rank 0 at the end of every round of 4 points
    per worker each; rank 0 alone writes the CSV, so a job that dies keeps every round it finished and a
    resumed job redoes the rest. Returns the rows written (rank 0) or run (the other ranks)."""
    ranks = ranks or Ranks()
    run_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    done = ranks.broadcast(done_keys(csv_path, timed=not compile_only, arch=arch if compile_only else None)
                           if ranks.rank == 0 else None)
    todo = [p for p in points if p.key() not in done]
    shares = [share(todo, r, ranks.world) for r in range(ranks.world)]
    mine = shares[ranks.rank]
    log = bar = None
    if ranks.rank != 0:  # a rank's own log, beside the CSV; rank 0 reports on the console
        log_path = os.path.join(os.path.dirname(os.path.abspath(csv_path)), f"sweep.rank{ranks.rank}.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        log = open(log_path, "a")  # noqa: SIM115 - closed below

    def say(line: str) -> None:
        if log is not None:
            log.write(line + "\n")
            log.flush()
        else:
            (bar.write if bar is not None else progress)(line)

    say(f"sweep: {len(points)} points, {len(points) - len(todo)} already in {csv_path}, {len(todo)} to run"
        + (f" ({len(mine)} on rank {ranks.rank} of {ranks.world})" if ranks.distributed else ""))
    gpus = []
    if not compile_only:
        import torch

        count = torch.cuda.device_count()
        if count == 0:  # on every rank alike, whether or not it owns points
            raise RuntimeError("sweep: no CUDA device; use compile_only=True to compile-check without one")
        gpus = [ranks.local_rank % count] if ranks.distributed else list(range(count))
    # One rank streams its points; several meet every round of 4 points per worker, to hand rank 0 their rows.
    chunk = max(1, len(mine)) if ranks.world == 1 else 4 * max(jobs, 1)
    rounds = max(-(-len(s) // chunk) for s in shares) if todo else 0
    rows, mine_rows = [], []
    writer = f = workers = None
    counter = ranks.counter("sweep-points-done") if ranks.world > 1 else None  # every rank's finished points
    watcher = None
    try:
        if ranks.rank == 0 and todo:
            new_file = not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
            os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
            columns = FIELDS if new_file else upgrade_header(csv_path)
            f = open(csv_path, "a", newline="")  # noqa: SIM115 - closed below
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            if new_file:
                writer.writeheader()
            bar = _progress_bar(len(todo)) if progress is print else None
            if bar is not None and counter is not None:  # the bar follows every rank's points as they finish
                watcher = _BarWatcher(bar, counter)
        if mine:
            workers = _Workers(jobs, point_timeout, timed=not compile_only)

        def record(row):  # rank 0: one row of any rank, into the CSV
            row["run"] = run_id
            writer.writerow(row)
            f.flush()
            rows.append(row)
            say(_row_line(row, len(rows), len(todo)))
            if bar is not None and (watcher is None or watcher.dead):
                bar.update(1)

        for r in range(rounds):
            batch = mine[r * chunk:(r + 1) * chunk]
            tasks = [(p, reps, compile_only, arch, gpus[(r * chunk + i) % len(gpus)] if gpus else 0)
                     for i, p in enumerate(batch)]
            ran = []
            for row in workers.evaluate(tasks) if tasks else ():
                ran.append(row)
                if counter is not None:
                    counter.add(1)
                if ranks.world == 1:
                    record(row)
                elif ranks.rank != 0:
                    say(_row_line(row, len(mine_rows) + len(ran), len(mine)))
            mine_rows += ran
            if ranks.world > 1:
                for row in ranks.gather(ran):  # rank 0: every rank's rows of this round
                    record(row)
    finally:
        if watcher is not None:
            watcher.stop()
        if workers is not None:
            workers.close()
        if bar is not None:
            bar.close()
        if f is not None:
            f.close()
        if log is not None:
            log.close()
    return rows if ranks.rank == 0 else mine_rows


class _BarWatcher:
    """Rank 0's progress bar kept at the job's count of finished points (``tools.ranks.JobCounter``), read
    twice a second in a thread of its own, so the bar moves as any rank finishes a point, not per round."""

    def __init__(self, bar, counter):
        import threading

        self.bar, self.counter, self.done = bar, counter, threading.Event()
        self.dead = False  # the store went away: rank 0 moves the bar itself again
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        while True:
            stopping = self.done.wait(0.5)
            try:
                self.bar.update(self.counter.value() - self.bar.n)
            except Exception:  # noqa: BLE001 - the store went away with the job
                self.dead = True
                return
            if stopping:
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _row_line(row: dict, n: int, total: int) -> str:
    status = row["verified"] if row["verified"] != "yes" else f"{row['ours_us']} us ({row['speedup']}x)"
    return (f"[{n}/{total}] {row['op']}/{row['variant']} {row['problem']} | {row['config']}: {status} "
            f"{row['detail'][:120]}")


def _progress_bar(total: int):
    """A tqdm bar on stderr (the per-point lines go above it), or None where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="point", dynamic_ncols=True)


def sweep_rows(csv_path: str, points: "list[Point] | None" = None, *, compile_only: bool = False,
               arch: str | None = None) -> list[dict]:
    """The rows of ``points`` (a sweep's own, where the CSV also holds earlier sweeps' rows; None: every
    row), from this run and the runs it resumed. For a timed sweep, a point a compile-only sweep compiled
    (or failed to) and a later one timed counts once, as timed; for a compile-only sweep (``compile_only``),
    only the compile-only rows count, of ``arch`` where given (a row without one, from an older version,
    counts)."""
    if not os.path.exists(csv_path):  # a sweep of no points (all filtered out) writes none
        return []
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if points is not None:
        keys = {p.key() for p in points}
        rows = [r for r in rows if row_key(r) in keys]
    if compile_only:
        return [r for r in rows if measured_nothing(r) and _of_arch(r, arch)]
    timed = {row_key(r) for r in rows if not measured_nothing(r)}
    return [r for r in rows if not measured_nothing(r) or row_key(r) not in timed]


def failed_rows(csv_path: str, points: "list[Point] | None" = None, *, compile_only: bool = False,
                arch: str | None = None) -> list[dict]:
    """The failures among ``sweep_rows``: a resumed sweep does not run its failed points again, and still
    reports them (and exits 1 for them)."""
    return [r for r in sweep_rows(csv_path, points, compile_only=compile_only, arch=arch)
            if r["verified"] not in ("yes", "compiled")]


def winner(rows: list) -> dict:
    """The fastest of one problem's verified rows: by GPU time where one run timed them all, else (rows of
    several runs, whose absolute times drift apart) by each row's same-run speed-up against the baseline."""
    if len({(r.get("run") or "", r.get("device") or "") for r in rows}) == 1:
        return min(rows, key=lambda r: float(r["ours_us"]))
    return max(rows, key=lambda r: float(r["speedup"]))


def summary(csv_path: str, points: "list[Point] | None" = None, *, compile_only: bool = False,
            arch: str | None = None) -> str:
    """Markdown: the fastest verified config per (op, variant, problem), and every failure; of ``points``
    only (a sweep's own, where the CSV also holds earlier sweeps' rows), else of every row; of a
    compile-only sweep, its own compile-only rows (of ``arch``)."""
    rows = sweep_rows(csv_path, points, compile_only=compile_only, arch=arch)
    groups: dict[tuple, list] = {}
    failures = []
    for r in rows:
        if r["verified"] == "yes":
            groups.setdefault((r["op"], r["variant"], r["problem"]), []).append(r)
        elif r["verified"] != "compiled":
            failures.append(r)
    best = {k: winner(group) for k, group in groups.items()}
    lines = []
    if best:  # a compile-only sweep has no winners to table
        lines += ["| op | variant | problem | best config | ours (us) | baseline (us) | speed-up | throughput |",
                  "|" + " --- |" * 8]
        for (op, variant, problem), r in sorted(best.items()):
            lines.append(f"| {op} | {variant} | {problem} | {r['config']} | {r['ours_us']} | {r['baseline_us']} | "
                         f"{r['speedup']}x | {r['throughput']} |")
        lines.append("")
    compiled = sum(r["verified"] == "compiled" for r in rows)
    lines.append(f"{len(rows)} points: {sum(r['verified'] == 'yes' for r in rows)} verified and timed, "
                 f"{compiled} compiled only, {len(failures)} failed.")
    for r in failures:
        lines.append(f"- FAILED {r['op']}/{r['variant']} {r['problem']} | {r['config']}: {r['verified']} {r['detail']}")
    return "\n".join(lines)


def write_tuned(points: list[Point], csv_path: str, *, source: str, device_index: int = 0, log=print) -> list:
    """Record, for each swept problem, its fastest verified config as the tuned default for this GPU's arch
    (``tuned.record``); returns the files written. Each winner is also logged as one line (problem, config,
    speed-up), so that a sweep whose files do not come back (a lent machine returns a few) can be recorded
    from its log."""
    from .. import tuned

    with open(csv_path, newline="") as f:  # a later compile-only row of a point does not hide its timed one
        rows = {row_key(r): r for r in csv.DictReader(f) if not measured_nothing(r)}
    groups: dict[tuple, list] = {}
    for p in points:
        r = rows.get(p.key())
        if r is None or r["verified"] != "yes":
            continue
        groups.setdefault((p.op, p.variant, describe(p.problem)), []).append((p, r))
    best = {}
    for k, group in groups.items():
        chosen = winner([r for _, r in group])
        best[k] = next((p, r) for p, r in group if r is chosen)
    arch = tuned.table_arch(device_index)
    written, failed = set(), []
    for p, r in best.values():
        spec = registry.get(p.op, p.variant)
        if spec.shape_bucket is None:
            continue
        # Logged first: a winner whose table cannot be written is still on record.
        log(f"tuned {p.op}/{p.variant} {describe(p.problem)}: {describe(p.config)} ({float(r['speedup']):.2f}x)")
        try:
            written.add(tuned.record(spec, p.problem, p.config, arch, speedup=float(r["speedup"]), source=source))
        except tuned.TunedTableError as e:
            log(f"tuned: not written: {e} (the ops ignore that table until it is fixed or deleted; the "
                "sweep's winners are logged above and in the CSV)")
            failed.append(str(e))
    if failed:
        raise tuned.TunedTableError(f"{len(failed)} winners not written to the tuned tables: {failed[0]}")
    return sorted(written)
