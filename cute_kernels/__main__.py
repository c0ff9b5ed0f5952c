"""Command line: ``python -m cute_kernels {list,check,precompile,bench,sweep}``.

- ``list``: the registry, one line per (op, variant), with its config space size.
- ``check``: compile every entry's default config (for every standard problem) and a sample of its
  candidates for the given archs; needs no GPU.
- ``precompile``: fill the compile caches (memory and disk) with the kernels this GPU runs for every
  entry's standard problems: the tuned or default config of each, with C read and not read for the GEMMs;
  a later process then loads them instead of compiling.
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


def precompile_plan(spec, device_index: "int | None"):
    """(config, problem) pairs ``precompile`` compiles for ``spec``: for every standard problem the config a
    call runs (tuned for this GPU, else the default) and the default, and for a GEMM both beta flags (a
    plain ``a @ b`` reads no C, the standard SGEMM problems do)."""
    import dataclasses

    plan = []
    for standard in spec.standard_problems():
        problems = [standard]
        if hasattr(standard, "beta_zero"):
            problems.append(dataclasses.replace(standard, beta_zero=not standard.beta_zero))
        for problem in problems:
            configs = [spec.default_config(problem)]
            if device_index is not None:
                configs.insert(0, spec.choose_config(problem, device_index))
            for config in configs:
                if (config, problem) not in plan and spec.supports(config, problem):
                    plan.append((config, problem))
    return plan


def _progress(items, description: str, total: "int | None" = None):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=description, unit="kernel", total=total)


def _precompile_here(work) -> int:
    """Compile ``work``'s kernels in this process, one after another; the failures, each printed, counted."""
    failures = 0
    for spec, arch, config, problem in _progress(work, "precompile"):
        try:
            spec.compile(config, problem, arch)
        except Exception as e:  # noqa: BLE001 - reported per kernel, counted, and turned into the exit code
            failures += 1
            print(f"{spec.op}/{spec.variant} {arch} {config}: FAILED: {type(e).__name__}: {e}", flush=True)
    return failures


def _precompile_in_workers(work, jobs: int) -> int:
    """Compile ``work``'s kernels in ``jobs`` worker processes (no CUDA there), which leave each in the disk
    cache the op's first call in any later process loads; the failures, each printed, counted. A pool that
    cannot run leaves the kernels it did not report to this process."""
    from .tools.sweep import Point, compile_ahead_rows, row_key

    points = [(Point(spec.op, spec.variant, problem, config), arch) for spec, arch, config, problem in work]
    # Each kernel by its point's key and arch, until a worker reports it.
    pending = {(point.key(), arch): item for (point, arch), item in zip(points, work)}
    failures = 0
    try:
        for row in _progress(compile_ahead_rows(points, jobs=jobs), "precompile", total=len(points)):
            pending.pop((row_key(row), row["arch"]), None)
            if row["verified"] != "compiled":
                failures += 1
                print(f"{row['op']}/{row['variant']} {row['arch']} {row['config']}: FAILED: {row['detail']}",
                      flush=True)
    except Exception as e:  # noqa: BLE001 - the workers only save time: what they did not do is done here
        print(f"precompile: the worker processes failed ({type(e).__name__}: {e}); compiling the rest here",
              flush=True)
        failures += _precompile_here(list(pending.values()))
    return failures


def cmd_precompile(args) -> int:
    import torch

    from .tools.sweep import device_arch, launch_arch

    device_index = torch.cuda.current_device() if torch.cuda.is_available() else None
    if device_index is None and not args.arch:
        raise SystemExit("precompile: no CUDA device here; name the target with --arch (e.g. --arch sm_90a)")
    work = []
    for spec in _select(args.op, args.variant):
        # Each entry for the arch its launch looks up (sm_90a for CuTe and wgmma kernels, sm_90 for the
        # other NVRTC kernels), whichever of the two the command line names.
        archs = [launch_arch(spec, a) for a in args.arch] if args.arch else [device_arch(spec, device_index)]
        archs = list(dict.fromkeys(archs))
        work += [(spec, arch, config, problem) for arch in archs for config, problem in precompile_plan(spec, device_index)]
    t_start = time.perf_counter()
    parallel = args.jobs > 1 and len(work) > 1
    failures = _precompile_in_workers(work, args.jobs) if parallel else _precompile_here(work)
    # The attention backward's kernels are no registry entries: each standard problem's backward runs once
    # under the dry-run switch on this GPU (its routing decides which kernels), compiling and loading them.
    backward = sorted({problem for spec in _select(args.op, args.variant) if spec.op == "attention"
                       for problem in spec.standard_problems()}, key=str)
    if backward and args.arch:
        print("precompile: the attention backward's kernels are chosen by running its routing on the GPU, so "
              "they are not compiled for --arch", flush=True)
        backward = []
    for problem in _progress(backward, "precompile attention backward") if backward else ():
        from .ops.attention.backward import precompile_backward

        try:
            precompile_backward(problem, device_index)
        except Exception as e:  # noqa: BLE001 - as above
            failures += 1
            print(f"attention backward {problem}: FAILED: {type(e).__name__}: {e}", flush=True)
    done = len(work) + len(backward) - failures
    backwards = f" and {len(backward)} attention backward(s)" if backward else ""
    print(f"precompile: {len(work)} kernel(s){backwards}; {done} compiled or loaded in "
          f"{time.perf_counter() - t_start:.1f} s, {failures} failure(s)")
    return 1 if failures else 0


def _zoo_chart_path(write: str) -> str:
    """Where ``bench --write FILE.md`` draws the zoo chart: ``FILE-zoo.png`` beside it."""
    return os.path.splitext(write)[0] + "-zoo.png"


def _zoo_chart_link(args) -> str:
    """The zoo chart's link, beside the Markdown that ``--write`` writes the chart next to (when matplotlib
    can draw it)."""
    if not args.write or not _matplotlib_importable():
        return ""
    return f"\n\n![speed-up against problem size, per op]({os.path.basename(_zoo_chart_path(args.write))})"


def _matplotlib_importable() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _have_matplotlib(what: str) -> bool:
    if not _matplotlib_importable():
        print(f"{what}: matplotlib is not installed (pip install matplotlib, or the clone's extra: "
              "pip install -e \".[plots]\")")
        return False
    return True


def cmd_list(args) -> int:
    rows = []
    for spec in _select(args.op, args.variant):
        dtypes = ", ".join(str(d).replace("torch.", "") for d in spec.dtypes)
        rows.append((spec.op, spec.variant, spec.backend, f"[{dtypes}]", f"{len(spec.candidates())} configs",
                     spec.description))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5])
    return 0


def cmd_check(args) -> int:
    failures = 0
    for spec in _select(args.op, args.variant):
        archs = args.arch or DEFAULT_ARCHS[spec.backend]
        for arch in archs:
            if not spec.builds_for(arch):
                print(f"{spec.op}/{spec.variant} {arch}: skipped (its kernels are built for sm_90a only)", flush=True)
                continue
            for config, problem in compile_plan(spec, getattr(args, "sample", 3)):
                t0 = time.perf_counter()
                try:
                    spec.compile(config, problem, arch)
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - reported per entry, counted, and turned into the exit code
                    status = f"FAILED: {type(e).__name__}: {e}"  # the whole message: an NVRTC log is many lines
                    failures += 1
                dt = time.perf_counter() - t0
                print(f"{spec.op}/{spec.variant} {arch} {config} {problem}: {status} ({dt:.1f} s)", flush=True)
    print(f"check: {failures} failure(s)")
    return 1 if failures else 0


def _git_commit() -> str:
    """The commit measured: ``$CUTE_KERNELS_COMMIT``, else git's and the file ``.gpu/commit`` (written beside
    the checkout before it travels to a lent GPU machine, whose own .git may be stale): both named where they
    differ, the file first."""
    env = os.environ.get("CUTE_KERNELS_COMMIT")
    if env:
        return env
    try:
        git = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                      stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        git = None
    try:
        with open(os.path.join(".gpu", "commit")) as f:
            written = f.read().strip()
    except OSError:
        written = None
    if written and written != git:
        return f"{written} (from .gpu/commit" + (f"; git says {git})" if git else ")")
    return git or "unknown"


def _driver_version() -> str:
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        return f"{version // 1000}.{version % 1000 // 10}" if err == driver.CUresult.CUDA_SUCCESS else "unknown"
    except Exception:  # noqa: BLE001 - a header detail, never a reason to fail the report
        return "unknown"


def _zoo_rows(args):
    """The report's zoo rows of the selected entries: (label "zoo" or "held-out", the zoo's entry, problem, the
    op's public call or None, (entry, problem) its kernel runs). Where the op registered its public call, the
    row times that (a staged call's copies included), filed under the entry its kernel runs on."""
    chosen = {spec.key for spec in _select(args.op, args.variant)}
    for label, held_out in (("zoo", False), ("held-out", True)):
        for spec, problem in registry.zoo(held_out=held_out):
            call, *runs_on = registry.zoo_call(spec.op, problem) or (None, spec, problem)
            if runs_on[0].key in chosen:
                yield label, spec, problem, call, tuple(runs_on)


def _compile_report_ahead(args, checkpoint) -> None:
    """Compile the kernels of the report's rows still to measure (each row's entry and problem, in the config
    the op chooses on this GPU) in ``args.jobs`` worker processes, so that measuring them loads each from the
    disk cache: on a cold machine the compiles, one after another, took most of a report's time. The
    attention backward's kernels are chosen by its routing on the GPU, so they compile where measured."""
    import torch

    from .tools.sweep import Point, compile_ahead, device_arch

    index = torch.cuda.current_device()
    todo = [(spec, problem) for spec in _select(args.op, args.variant) for problem in spec.standard_problems()
            if not checkpoint.holds("standard", f"{spec.key} {problem}")]
    if args.zoo:
        todo += [runs_on for label, spec, problem, _, runs_on in _zoo_rows(args)
                 if not checkpoint.holds(label, f"{spec.key} {problem}")]
    points = {}
    for spec, problem in todo:
        try:
            point = Point(spec.op, spec.variant, problem, spec.choose_config(problem, index))
        except Exception:  # noqa: BLE001 - the row that needs it meets the same error and reports it
            continue
        points.setdefault((point.key(), device_arch(spec, index)), point)
    t0 = time.perf_counter()
    try:
        rows = compile_ahead([(point, arch) for (_, arch), point in points.items()], jobs=args.jobs)
    except Exception as e:  # noqa: BLE001 - compiling ahead only saves time: without it each row compiles its own
        print(f"bench: compiling ahead failed ({type(e).__name__}: {e}); each row compiles where it is measured",
              flush=True)
        return
    failed = [row for row in rows if row["verified"] != "compiled"]
    print(f"bench: {len(rows) - len(failed)} of {len(rows)} kernels compiled ahead in {time.perf_counter() - t0:.1f} s "
          f"by {args.jobs} workers" + (f"; {len(failed)} failed (their rows meet it again)" if failed else ""),
          flush=True)


def _took(checkpoint) -> str:
    """`` [12.3 s]``: how long the unit just remembered took to measure (nothing when it came from the file)."""
    return "" if checkpoint.last_seconds is None else f" [{checkpoint.last_seconds:.1f} s]"


def cmd_bench(args) -> int:
    import torch

    if not torch.cuda.is_available():
        written = f" and {args.write} was not written" if args.write else ""
        print(f"bench: no CUDA device here, so nothing can be timed{written}; running the compile check instead.")
        args.sample = 3
        checked = cmd_check(args)
        if args.write:  # said again last: the check's lines have scrolled the first saying away
            print(f"bench: {args.write} was not written (no CUDA device)")
        # The report asked for does not exist: a script reading the status must not take it for written.
        return 1 if args.write else checked
    from .runtime.cute_compile import dsl_version
    from .tools import bench, report
    from .tools.checkpoint import Checkpoint, CheckpointMismatch, dataclass_codec

    identity = {"gpu": torch.cuda.get_device_name(), "commit": _git_commit(), "reps": args.reps, "op": args.op,
                "variant": args.variant, "zoo": args.zoo}
    try:
        checkpoint = Checkpoint(args.checkpoint, identity)
    except CheckpointMismatch as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    bench_row = dataclass_codec(bench.Row)
    if args.jobs > 1:
        _compile_report_ahead(args, checkpoint)
    rows = []
    for spec in _select(args.op, args.variant):
        for problem in spec.standard_problems():
            row = checkpoint.remember("standard", f"{spec.key} {problem}",
                                      lambda: bench.measure(spec, problem, reps=args.reps), bench_row)
            rows.append(row)
            status = f"{row.ours_us:.1f} us vs {row.baseline_us:.1f} us ({row.speedup:.2f}x)" if row.verified else "FAILED"
            print(f"{spec.op}/{spec.variant} {row.problem}: {status}{_took(checkpoint)}", flush=True)
    table = report.markdown_table(rows)
    backward_rows = []
    if args.op in (None, "attention") and args.variant is None:
        from .ops.attention.backward import runs_on_bf16_planes
        from .tools import attention_backward

        backward_row = dataclass_codec(attention_backward.Row, tuples=("problem",), dtypes=("dtype",))

        def show(row):
            backward_rows.append(row)
            print(f"attention backward {attention_backward.markdown([row]).splitlines()[-1]}", flush=True)

        table += ("\n\n## Attention backward\n\n`torch.autograd.grad` through `ck.attention` against the same through "
                  "`scaled_dot_product_attention`, the backward alone (`tools/attention_backward.py`): float32 "
                  "against torch's own backend with TF32 off, float16/bfloat16 against its FLASH_ATTENTION "
                  "backend, its cuDNN backward timed in the same loop; TFLOP/s count 2.5x the forward's FLOPs "
                  "(halved when causal), against the peak of the units the call ran on (float32 as bf16 planes, "
                  "\"(planes)\": a sixth of the 16-bit tensor-core peak, six plane products a product). Each "
                  "problem's gradients are checked against float64 on one group of "
                  "heads first.\n\n" + attention_backward.markdown(attention_backward.measure(
                      reps=args.reps, on_row=show, planes=runs_on_bf16_planes,
                      remember=lambda key, measure: checkpoint.remember("attention backward", key, measure,
                                                                         backward_row))))
    zoo_rows, held_rows = [], []
    if args.zoo:
        for label, spec, problem, call, runs_on in _zoo_rows(args):
            row = checkpoint.remember(
                label, f"{spec.key} {problem}",
                lambda: bench.measure(spec, problem, reps=args.reps, op_call=call, runs_on=runs_on), bench_row)
            (zoo_rows if label == "zoo" else held_rows).append(row)
            status = (f"{row.ours_us:.1f} us vs {row.baseline_us:.1f} us ({row.speedup:.2f}x)" if row.verified
                      else "FAILED")
            print(f"{label} {spec.op}/{row.variant} {row.problem}: {status}{_took(checkpoint)}", flush=True)
        table += ("\n\n## Shape zoo\n\nThe everyday shapes of each op (`registry.zoo()`, each on the entry the op "
                  "runs it on), timed as above: per op and dtype, the geomean and worst ratio against the vendor "
                  "baseline in GPU time and in eager wall per call. A variant marked (op) is the public op's call, "
                  "timed whole (a misaligned HGEMM's padded copies included), under the entry its kernel runs "
                  "on.\n\n" + "\n".join(f"- {line}" for line in report.zoo_summary(zoo_rows))
                  + (_zoo_chart_link(args) if zoo_rows else "") + "\n\n" + report.markdown_table(zoo_rows))
        table += ("\n\n### Held-out shapes\n\nEveryday shapes no default heuristic was fitted on and no tuned table "
                  "holds (`registry.zoo(held_out=True)`), timed the same way.\n\n"
                  + "\n".join(f"- {line}" for line in report.zoo_summary(held_rows, label="held-out"))
                  + "\n\n" + report.markdown_table(held_rows))
    if args.op is None and args.variant is None:
        table += "\n\n" + report.host_sections(checkpoint.remember)
    print(table)
    print(f"bench: this run measured {checkpoint.time_by_section() or 'nothing (every unit was in the checkpoint)'}",
          flush=True)
    if args.write:
        gpu = torch.cuda.get_device_name()
        resumed = (f"- resumed: measured over {checkpoint.runs} runs of the same command on the same GPU and commit "
                   "(`--checkpoint`); each row's ours and baseline come from one loop of one run\n"
                   if checkpoint.resumed else "")
        header = (
            "# Benchmarks\n\n"
            "Generated by `python -m cute_kernels bench --write docs/benchmarks.md`; do not edit by hand.\n\n"
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
            f"- GPU: {gpu}; driver {_driver_version()}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
            f"nvidia-cutlass-dsl {dsl_version()}; Python {platform.python_version()}\n"
            f"- command: `{' '.join(['python -m cute_kernels'] + sys.argv[1:])}`\n"
            f"- commit: {_git_commit()}\n"
            f"{resumed}"
            "- method: every kernel is checked against a float64/exact reference first; then ours and the "
            "baseline are timed alternately with CUDA events (GPU time alone), median of "
            f"{args.reps} calls, rotating through enough input sets that L2 holds none of a call's inputs "
            "(at most 64 sets). Wall/call: host time per call of back-to-back calls, dispatch included: ours is "
            "the public op (ck.<op>) allocating its result where the op's own call runs the row's kernel (the "
            "row's launch for a pinned variant or config), the baseline its own call; median of three runs each, "
            "ours and the baseline in turn.\n\n"
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.write)), exist_ok=True)
        with open(args.write, "w") as f:
            f.write(header + table + "\n")
        stem = os.path.splitext(args.write)[0]
        report.write_csv(rows, stem + ".csv")
        if zoo_rows:
            report.write_csv(zoo_rows, stem + "-zoo.csv")
        if held_rows:
            report.write_csv(held_rows, stem + "-held-out.csv")
        if _have_matplotlib("bench: no chart"):
            report.speedup_chart(rows, stem + ".png", title=f"{gpu}, {_git_commit()}")
            if zoo_rows:
                report.zoo_chart(zoo_rows, _zoo_chart_path(args.write), title=f"shape zoo, {gpu}, {_git_commit()}")
            print(f"wrote {args.write}, {stem}.csv and {stem}.png")
        else:
            print(f"wrote {args.write} and {stem}.csv")
    return 0 if all(r.verified for r in rows + zoo_rows + held_rows + backward_rows) else 1


def cmd_sweep(args) -> int:
    """Every supported candidate config of the selected entries at their standard problems (or the ones
    picked with --problems): compiled in parallel workers, verified, timed against the baseline in the same
    run; rows appended to a CSV (resumable) and a Markdown summary of the winners."""
    from .tools import sweep
    from .tools.ranks import Ranks

    import torch

    if not args.compile_only and not torch.cuda.is_available():
        raise SystemExit("sweep: no CUDA device here, so nothing can be timed; "
                         "use --compile-only (with --arch) to compile-check the sweep space instead")
    if args.arch and len(args.arch) > 1:
        raise SystemExit(f"sweep: one --arch per sweep (its CSV rows are of one arch), got {args.arch}")
    arch = (args.arch or ["sm_90a"])[0]
    specs = _select(args.op, args.variant)
    if args.compile_only:
        # As check: an entry whose kernels exist only as sm_90a builds has nothing to compile for another arch.
        for spec in [s for s in specs if not s.builds_for(arch)]:
            print(f"sweep: {spec.op}/{spec.variant} {arch}: skipped (its kernels are built for sm_90a only)", flush=True)
        specs = [s for s in specs if s.builds_for(arch)]
        if not specs:
            raise SystemExit(f"sweep: every selected entry is built for sm_90a only; nothing to compile for {arch}")
    vary = args.vary.split(",") if args.vary else None
    if vary is not None and args.variant is None:
        # An op's variants have different config classes: --vary sweeps those that have every named field.
        having = [s for s in specs if set(vary) <= s.config_fields()]
        for spec in [s for s in specs if s not in having]:
            print(f"sweep: {spec.op}/{spec.variant}: skipped (its configs have no field(s) "
                  f"{sorted(set(vary) - spec.config_fields())})", flush=True)
        specs = having or specs  # none has them all: plan() names what each lacks
    try:
        points = sweep.plan(specs, args.problems, args.limit, vary=vary, zoo=args.zoo)
    except ValueError as e:  # a --problems index or --vary field the entries lack: the message names it
        raise SystemExit(f"sweep: {e}") from None
    if args.write_tuned and args.compile_only:
        print("sweep: --write-tuned records timed winners; a --compile-only sweep times nothing, so no tuned "
              "table is written", flush=True)
    out_dir = args.out or os.environ.get("OUT") or ".bench_out"
    csv_path = os.path.join(out_dir, "sweep.csv")
    ranks = Ranks.from_env()  # under torchrun: this rank's share of the points, on its GPU
    ranks.start()
    try:
        sweep.run(points, csv_path, jobs=args.jobs, reps=args.reps, compile_only=args.compile_only, arch=arch,
                  ranks=ranks, point_timeout=args.point_timeout)
    finally:
        ranks.stop()
    if ranks.rank != 0:
        # Rank 0 writes the CSV, the summary, the heatmaps and the tuned tables, and its exit status speaks
        # for every rank's rows: a failed point here must not make torchrun stop rank 0 mid-write.
        return 0
    only = {"compile_only": args.compile_only, "arch": arch if args.compile_only else None}
    text = sweep.summary(csv_path, points, **only)
    with open(os.path.join(out_dir, "sweep.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    if not args.compile_only and _have_matplotlib("sweep: no heatmaps"):
        from .tools import sweep_plots

        for path in sweep_plots.plot(csv_path, out_dir):
            print(f"wrote {path}")
    if args.write_tuned and not args.compile_only:
        from . import tuned

        try:
            for path in sweep.write_tuned(points, csv_path, source=f"sweep of {_git_commit()}"):
                print(f"updated {path}")
        except tuned.TunedTableError as e:
            print(f"sweep: {e}", file=sys.stderr)
            return 1
    # Every failure of the sweep's points counts, the resumed runs' too (which this run did not retry).
    return 1 if sweep.failed_rows(csv_path, points, **only) else 0


SUBCOMMANDS = {
    "list": "the registry: one line per (op, variant) with its dtypes and config space size",
    "check": "compile every entry's default configs (and a sample of candidates) for the given archs; no GPU needed",
    "precompile": "fill the compile caches with the kernels this GPU runs for the standard problems (and "
                  "their attention backwards)",
    "bench": "verify and time every entry at its standard problems against the vendor baseline (without a GPU: "
             "the compile check, nothing written)",
    "sweep": "verify and time every supported candidate config at the standard problems (resumable CSV)",
}


def _prog() -> str:
    """The name the user typed: ``cute-kernels`` (the console script) or ``python -m cute_kernels``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m cute_kernels" if name in ("", "__main__.py", "-c") else name


def _arch(value: str) -> str:
    """An ``--arch`` value: sm_XY or sm_XYa, compute capability 8.0 or newer (what the kernels need)."""
    import re

    match = re.fullmatch(r"sm_(\d+)(a?)", value)
    if not match or int(match.group(1)) < 80:
        raise argparse.ArgumentTypeError(f"unknown or unsupported arch {value!r}: expected sm_80 or newer, e.g. "
                                         "sm_80, sm_86, sm_89, sm_90 or sm_90a (the Hopper kernels' arch)")
    return value


def _at_least(low, kind=int):
    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not number >= low:
            raise argparse.ArgumentTypeError(f"expected at least {low}, got {value}")
        return number
    return parse


def _indices(value: str) -> list[int]:
    try:
        indices = [int(i) for i in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated indices such as 0,2, got {value!r}") from None
    if any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"indices count from 0, got {value!r}")
    return indices


ARCH_HELP = {
    "check": "compile for this arch (repeatable; default: sm_80 and sm_90a for the NVRTC entries, sm_90a for "
             "the CuTe ones; entries built for sm_90a only are skipped for other archs)",
    "precompile": "compile for this arch (repeatable) instead of this GPU's, e.g. sm_90a",
    "bench": "with no GPU, the compile check's arch (repeatable; default as check's)",
    "sweep": "with --compile-only, the arch to compile for (one per sweep; default: sm_90a)",
}


def _default_jobs() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def build_parser() -> argparse.ArgumentParser:
    ops = sorted({spec.op for spec in registry.list()})
    variants = sorted({spec.variant for spec in registry.list()})
    parser = argparse.ArgumentParser(prog=_prog(), description="GPU kernels in the CuTe DSL and CUDA C++ behind "
                                     "one registry: list, compile-check, precompile, benchmark and sweep them.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--op", choices=ops, help="only this op (default: every op)")
        p.add_argument("--variant", choices=variants, help="only this variant of the op (default: every variant)")
        if name != "list":
            p.add_argument("--arch", action="append", type=_arch, help=ARCH_HELP[name])
        if name == "check":
            p.add_argument("--sample", type=_at_least(0), default=3,
                           help="extra candidate configs to compile per entry (default: %(default)s)")
        if name == "precompile":
            p.add_argument("--jobs", type=_at_least(1), default=_default_jobs(),
                           help="worker processes that compile in parallel, each leaving its kernels in the disk "
                                "cache (1: one after another in this process; default: %(default)s, half this "
                                "machine's cores, at most 8)")
        if name in ("bench", "sweep"):
            p.add_argument("--reps", type=_at_least(1), default=30 if name == "bench" else 20,
                           help="timed calls per kernel, the median reported (default: %(default)s)")
        if name == "bench":
            p.add_argument("--write", metavar="FILE.md",
                           help="write the Markdown report there, with a CSV and a chart beside it (needs a GPU: "
                                "without one bench runs the compile check, writes nothing and exits 1)")
            p.add_argument("--zoo", action="store_true",
                           help="also time every entry's shape zoo (everyday shapes) and summarise it per op and "
                                "dtype: geomean and worst ratio against the baseline")
            p.add_argument("--jobs", type=_at_least(1), default=_default_jobs(),
                           help="worker processes that compile the report's kernels before anything is timed "
                                "(1: each compiles where it is first measured; default: %(default)s, half this "
                                "machine's cores, at most 8)")
            p.add_argument("--checkpoint", metavar="FILE.jsonl",
                           help="write each measured row there as it comes, and measure only the rows it lacks: "
                                "a report cut short (a time limit) resumes where it stopped; refused if the file "
                                "was started on another GPU or commit, or with other reps or selection")
        if name == "sweep":
            p.add_argument("--problems", type=_indices,
                           help="comma-separated indices into the entry's standard problems (or, with --zoo, its "
                                "zoo shapes; default: all)")
            p.add_argument("--zoo", action="store_true",
                           help="sweep the entry's shape-zoo problems (the everyday shapes the op runs on it) "
                                "instead of its standard problems")
            p.add_argument("--jobs", type=_at_least(1), default=1,
                           help="worker processes, whose CuTe compiles run in parallel (default: %(default)s)")
            p.add_argument("--limit", type=_at_least(1),
                           help="at most this many configs per problem, an even sample (default: all)")
            p.add_argument("--vary", help="comma-separated config fields the grid varies, e.g. "
                                          "num_stages,tile_m,tile_n,tile_k; the others stay at the default config "
                                          "(default: every field)")
            p.add_argument("--out", help="folder for sweep.csv and sweep.md (default $OUT or .bench_out)")
            p.add_argument("--point-timeout", type=_at_least(1.0, float), default=1800.0, metavar="SECONDS",
                           help="with --jobs > 1: a point whose worker gives no result in this time (it died "
                                "or hung) is recorded as failed and the sweep goes on (default: %(default)s)")
            p.add_argument("--compile-only", action="store_true", help="compile every point for --arch; no GPU")
            p.add_argument("--write-tuned", action="store_true",
                           help="record each problem's winner in the user's tuned tables (in "
                                "$CUTE_KERNELS_TUNED_DIR, else ~/.cache/cute_kernels/tuned), which the ops read "
                                "on top of the shipped ones")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"list": cmd_list, "check": cmd_check, "precompile": cmd_precompile, "bench": cmd_bench,
                "sweep": cmd_sweep}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
