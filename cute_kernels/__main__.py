"""Command line: ``python -m cute_kernels {list,check,bench,sweep}``.

- ``list``: the registry, one line per (op, variant), with its config space size.
- ``check``: compile every entry's default config (for every standard problem) and a sample of its
  candidates for the given archs; needs no GPU.
- ``bench``: verify and time every entry at its standard sizes against the vendor baseline, in the same
  run; ``--write docs/benchmarks.md`` records the table with date, GPU, command and commit. With no GPU it
  says so and runs ``check`` instead.
- ``sweep``: every supported candidate config at the standard sizes, compiled in parallel, verified and
  timed; a resumable CSV and a Markdown summary (``--compile-only`` compile-checks the space without a GPU).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time

from . import registry

DEFAULT_ARCHS = {"nvrtc": ("sm_80", "sm_90a"), "cute": ("sm_90a",)}


def _select(op: str | None, variant: str | None):
    specs = registry.list(op)
    if variant is not None:
        specs = [s for s in specs if s.variant == variant]
    if not specs:
        raise SystemExit(f"no registry entry matches op={op!r} variant={variant!r}")
    return specs


def compile_plan(spec, sample: int):
    """(config, problem) pairs that ``check`` compiles: the default for every standard problem, then up to
    ``sample`` more supported candidates for the first standard problem."""
    plan = []
    for problem in spec.standard_problems():
        plan.append((spec.default_config(problem), problem))
    first = spec.standard_problems()[0]
    extra = [c for c in spec.supported_candidates(first) if (c, first) not in plan]
    step = max(1, len(extra) // max(sample, 1))
    plan.extend((c, first) for c in extra[::step][:sample])
    seen, unique = set(), []
    for item in plan:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique


def cmd_list(args) -> int:
    for spec in _select(args.op, args.variant):
        n = len(spec.candidates())
        dtypes = ", ".join(str(d).replace("torch.", "") for d in spec.dtypes)
        print(f"{spec.op:10s} {spec.variant:12s} {spec.backend:6s} [{dtypes}] {n} configs  {spec.description}")
    return 0


def cmd_check(args) -> int:
    failures = 0
    for spec in _select(args.op, args.variant):
        archs = args.arch or DEFAULT_ARCHS[spec.backend]
        for arch in archs:
            for config, problem in compile_plan(spec, args.sample):
                t0 = time.perf_counter()
                try:
                    spec.compile(config, problem, arch)
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - reported per entry, counted, and turned into the exit code
                    status = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    failures += 1
                dt = time.perf_counter() - t0
                print(f"{spec.op}/{spec.variant} {arch} {config} {problem}: {status} ({dt:.1f} s)", flush=True)
    print(f"check: {failures} failure(s)")
    return 1 if failures else 0


def _git_commit() -> str:
    """The commit measured: ``$CUTE_KERNELS_COMMIT``, else git's, else (where the tree travelled without
    .git, as to a lent GPU machine) the file ``.gpu/commit`` written beside the checkout before it went."""
    env = os.environ.get("CUTE_KERNELS_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open(os.path.join(".gpu", "commit")) as f:
            return f.read().strip() + " (from .gpu/commit)"
    except OSError:
        return "unknown"


def _driver_version() -> str:
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"{version // 1000}.{version % 1000 // 10}" if err == driver.CUresult.CUDA_SUCCESS else "unknown"
    except Exception:  # noqa: BLE001 - a header detail, never a reason to fail the report
        return "unknown"


def _dsl_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:  # the GPU machines unpack the DSL without its metadata
        import cutlass

        return getattr(cutlass, "__version__", "unknown")


def cmd_bench(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench: no CUDA device here, so nothing can be timed; running the compile check instead.")
        return cmd_check(args)
    from .tools import bench, report

    rows = []
    for spec in _select(args.op, args.variant):
        for problem in spec.standard_problems():
            row = bench.measure(spec, problem, reps=args.reps)
            rows.append(row)
            status = f"{row.ours_us:.1f} us vs {row.baseline_us:.1f} us ({row.speedup:.2f}x)" if row.verified else "FAILED"
            print(f"{spec.op}/{spec.variant} {row.problem}: {status}", flush=True)
    table = report.markdown_table(rows)
    if args.op is None and args.variant is None:
        table += ("\n\n## Dispatch cost\n\nHost time per call on problems too small for the GPU to matter (back-to-back "
                  "calls, one synchronisation at the end): what Python, argument checks and the launch cost.\n\n"
                  + report.dispatch_table())
    print(table)
    if args.write:
        gpu = torch.cuda.get_device_name()
        header = (
            "# Benchmarks\n\n"
            "Generated by `python -m cute_kernels bench --write docs/benchmarks.md`; do not edit by hand.\n\n"
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
            f"- GPU: {gpu}; driver {_driver_version()}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
            f"nvidia-cutlass-dsl {_dsl_version()}; Python {platform.python_version()}\n"
            f"- command: `{' '.join(['python -m cute_kernels'] + sys.argv[1:])}`\n"
            f"- commit: {_git_commit()}\n"
            "- method: every kernel is checked against a float64/exact reference first; then ours and the "
            "baseline are timed alternately with CUDA events (GPU time alone), median of "
            f"{args.reps} calls, rotating through enough input sets that L2 holds none of a call's inputs "
            "(at most 64 sets). Wall/call: host time per call of back-to-back calls, dispatch included.\n\n"
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.write)), exist_ok=True)
        with open(args.write, "w") as f:
            f.write(header + table + "\n")
        stem = os.path.splitext(args.write)[0]
        report.write_csv(rows, stem + ".csv")
        report.speedup_chart(rows, stem + ".png", title=f"{gpu}, {_git_commit()}")
        print(f"wrote {args.write}, {stem}.csv and {stem}.png")
    return 0 if all(r.verified for r in rows) else 1


def cmd_sweep(args) -> int:
    """Every supported candidate config of the selected entries at their standard problems (or the ones
    picked with --problems): compiled in parallel workers, verified, timed against the baseline in the same
    run; rows appended to a CSV (resumable) and a Markdown summary of the winners."""
    from .tools import sweep

    specs = _select(args.op, args.variant)
    problems = [int(i) for i in args.problems.split(",")] if args.problems else None
    vary = args.vary.split(",") if args.vary else None
    points = sweep.plan(specs, problems, args.limit, vary=vary)
    out_dir = args.out or os.environ.get("OUT") or ".bench_out"
    csv_path = os.path.join(out_dir, "sweep.csv")
    arch = (args.arch or ["sm_90a"])[0]
    rows = sweep.run(points, csv_path, jobs=args.jobs, reps=args.reps, compile_only=args.compile_only, arch=arch)
    text = sweep.summary(csv_path)
    with open(os.path.join(out_dir, "sweep.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    if not args.compile_only:
        from .tools import sweep_plots

        for path in sweep_plots.plot(csv_path, out_dir):
            print(f"wrote {path}")
    if args.write_tuned:
        for path in sweep.write_tuned(points, csv_path, source=f"sweep of {_git_commit()}"):
            print(f"updated {path}")
    bad = [r for r in rows if r["verified"] not in ("yes", "compiled")]
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cute_kernels", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "check", "bench", "sweep"):
        p = sub.add_parser(name)
        p.add_argument("--op")
        p.add_argument("--variant")
        p.add_argument("--arch", action="append", help="compile for this arch (repeatable), e.g. sm_90a")
        p.add_argument("--sample", type=int, default=3, help="extra candidate configs to compile per entry")
        if name in ("bench", "sweep"):
            p.add_argument("--reps", type=int, default=30 if name == "bench" else 20)
        if name == "bench":
            p.add_argument("--write", help="write the Markdown report to this file")
        if name == "sweep":
            p.add_argument("--problems", help="comma-separated indices into the entry's standard problems")
            p.add_argument("--jobs", type=int, default=1, help="worker processes (CuTe compiles run in parallel)")
            p.add_argument("--limit", type=int, help="at most this many configs per problem (an even sample)")
            p.add_argument("--vary", help="comma-separated config fields the grid varies, e.g. "
                                          "num_stages,tile_m,tile_n,tile_k; the others stay at the default config "
                                          "(default: every field)")
            p.add_argument("--out", help="folder for sweep.csv and sweep.md (default $OUT or .bench_out)")
            p.add_argument("--compile-only", action="store_true", help="compile every point for --arch; no GPU")
            p.add_argument("--write-tuned", action="store_true",
                           help="record each problem's winner in cute_kernels/tuned/ (read by the ops' defaults)")
    args = parser.parse_args(argv)
    commands = {"list": cmd_list, "check": cmd_check, "bench": cmd_bench, "sweep": cmd_sweep}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
