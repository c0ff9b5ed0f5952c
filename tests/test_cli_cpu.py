"""The command line (CPU): every subcommand and option explains itself, and the GPU commands say what to do
on a machine without a GPU instead of failing with a traceback."""

import dataclasses
import re

import pytest
import torch

from cute_kernels import __main__ as cli
from cute_kernels import registry


@pytest.mark.parametrize("command", list(cli.SUBCOMMANDS))
def test_every_subcommand_and_option_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert cli.SUBCOMMANDS[command] in " ".join(text.split())
    for op in {spec.op for spec in registry.list()}:
        assert op in text  # --op lists the ops



def test_every_option_has_help_text():
    import argparse

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(cli.SUBCOMMANDS)
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings}: no help text"


def test_an_unknown_op_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["list", "--op", "matmul"])
    assert "choose from" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_sweep_without_a_gpu_points_to_compile_only():
    with pytest.raises(SystemExit, match="--compile-only"):
        cli.main(["sweep", "--op", "scan"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_bench_write_without_a_gpu_says_nothing_was_written(tmp_path, capsys):
    target = tmp_path / "report.md"
    # linear_scan: the op whose compile check (what bench runs without a GPU) is the shortest.
    # The compile check passes, but the report asked for does not exist: the status says so.
    assert cli.main(["bench", "--op", "linear_scan", "--write", str(target)]) == 1
    out = capsys.readouterr().out
    assert f"{target} was not written" in out and "check: 0 failure(s)" in out
    assert out.rstrip().splitlines()[-1] == f"bench: {target} was not written (no CUDA device)"  # last, not scrolled away
    assert not target.exists()


@pytest.mark.parametrize(("argv0", "name"), [("/usr/local/bin/cute-kernels", "cute-kernels"),
                                              ("/site-packages/cute_kernels/__main__.py", "python -m cute_kernels")])
def test_the_command_names_itself_in_its_help(argv0, name, monkeypatch, capsys):
    """The help names what the user typed: the console script, or the module run by python -m."""
    monkeypatch.setattr("sys.argv", [argv0, "--help"])
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")


def test_check_prints_a_failed_compile_s_whole_log(monkeypatch, capsys):
    """An NVRTC failure's log is many lines, the first rarely the one that matters: check prints all of it."""
    spec = registry.get("scan", "lookback")
    log = "scan.cu(10): error: first\nscan.cu(20): error: second\nscan.cu(30): error: the one that matters"

    def fail(config, problem, arch):
        raise RuntimeError(log)

    monkeypatch.setattr(cli, "_select", lambda op, variant: [dataclasses.replace(spec, compile=fail)])
    assert cli.main(["check", "--op", "scan", "--variant", "lookback", "--arch", "sm_80"]) == 1
    out = capsys.readouterr().out
    assert all(line in out for line in log.splitlines()) and "check: " in out and "failure(s)" in out


def test_bench_refuses_a_checkpoint_of_another_gpu_before_measuring(tmp_path, monkeypatch, capsys):
    """A checkpoint started on another GPU (or commit, reps, selection) stops the bench before any row is
    measured, with a message naming the difference; the file is left as it was."""
    import json

    from cute_kernels.tools import bench

    path = tmp_path / "report.jsonl"
    path.write_text(json.dumps({"identity": {"gpu": "NVIDIA H200", "commit": "abc1234", "reps": 30,
                                             "op": "scan", "variant": None, "zoo": False}}) + "\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("CUTE_KERNELS_COMMIT", "abc1234")
    monkeypatch.setattr(bench, "measure", lambda *args, **kwargs: pytest.fail("measured"))
    assert cli.main(["bench", "--op", "scan", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gpu: 'NVIDIA H200' there, 'NVIDIA H100 80GB HBM3' here" in err and "commit" not in err
    assert len(path.read_text().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["check", "--arch", "foo"], "--arch: unknown or unsupported arch 'foo'"),
    (["check", "--arch", "sm_75"], "--arch: unknown or unsupported arch 'sm_75'"),
    (["check", "--sample", "-1"], "--sample: expected at least 0"),
    (["sweep", "--compile-only", "--problems", "x"], "--problems: expected comma-separated indices"),
    (["sweep", "--compile-only", "--problems", "-1"], "--problems: indices count from 0"),
    (["sweep", "--compile-only", "--limit", "0"], "--limit: expected at least 1"),
    (["sweep", "--compile-only", "--jobs", "0"], "--jobs: expected at least 1"),
    (["sweep", "--compile-only", "--point-timeout", "0"], "--point-timeout: expected at least 1.0"),
    (["bench", "--reps", "zero"], "--reps: expected a number"),
])
def test_bad_option_values_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--op", "scan", "--variant", "columns", "--compile-only", "--vary", "bogus"],
     "sweep: vary: scan/columns configs have no field(s) ['bogus']"),
    (["sweep", "--op", "scan", "--variant", "columns", "--compile-only", "--problems", "99"],
     "sweep: problems: scan/columns has"),
])
def test_sweep_values_the_entries_lack_are_one_line_errors(argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        cli.main(argv)


def test_check_skips_sm90a_only_entries_on_other_archs(capsys):
    """Their sm_80 build would be a trap-only body: nothing is checked, so nothing is said to pass."""
    assert cli.main(["check", "--op", "attention", "--variant", "flash3_wgmma", "--arch", "sm_80"]) == 0
    assert "attention/flash3_wgmma sm_80: skipped (its kernels are built for sm_90a only)" in capsys.readouterr().out
    assert {spec.key for spec in registry.list() if spec.arch_specific} == {
        ("attention", "flash3_wgmma"), ("sgemm", "tf32x3_wgmma"), ("hgemm", "sm90_wgmma")}


def test_sweep_compile_only_skips_sm90a_only_entries_on_other_archs(tmp_path, monkeypatch, capsys):
    """As check: an sm_90a-only entry has nothing to compile for sm_80, so its points are not planned (they
    would fail with a DSL traceback, or 'compile' a trap-only body); an op with none left says so."""
    from cute_kernels.tools import sweep

    planned = []
    monkeypatch.setattr(sweep, "plan", lambda specs, *a, **k: planned.extend(s.key for s in specs) or [])
    assert cli.main(["sweep", "--op", "hgemm", "--compile-only", "--arch", "sm_80", "--out", str(tmp_path)]) == 0
    assert "hgemm/sm90_wgmma sm_80: skipped (its kernels are built for sm_90a only)" in capsys.readouterr().out
    assert ("hgemm", "sm90_wgmma") not in planned and ("hgemm", "sm80_mma") in planned
    with pytest.raises(SystemExit, match="every selected entry is built for sm_90a only"):
        cli.main(["sweep", "--op", "attention", "--variant", "flash3_wgmma", "--compile-only", "--arch", "sm_80"])


def test_sweep_vary_over_an_op_takes_the_variants_with_those_fields(tmp_path, monkeypatch, capsys):
    """README's `sweep --op hgemm --vary num_stages,tile_m,tile_n,tile_k`: the GEMV variant's configs have
    none of those fields, so it is skipped by name and the tile variants are swept."""
    from cute_kernels.tools import sweep

    planned = []
    monkeypatch.setattr(sweep, "plan", lambda specs, *a, **k: planned.extend(s.key for s in specs) or [])
    argv = ["sweep", "--op", "hgemm", "--vary", "num_stages,tile_m,tile_n,tile_k", "--compile-only", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    assert "hgemm/gemv: skipped (its configs have no field(s)" in capsys.readouterr().out
    assert set(planned) == {("hgemm", "sm80_mma"), ("hgemm", "sm90_wgmma")}


def test_list_aligns_its_columns(capsys):
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {line.index(" nvrtc ") if " nvrtc " in line else line.index(" cute ") for line in lines}
    assert len(starts) == 1, lines


def test_sweep_summary_counts_its_own_points(tmp_path):
    """A resumed CSV holds earlier sweeps' rows too: the summary counts this sweep's points."""
    from cute_kernels.tools import sweep

    spec = registry.get("scan", "columns")
    points = sweep.plan([spec], [0], limit=2)
    csv_path = tmp_path / "sweep.csv"
    sweep.run(points, str(csv_path), compile_only=True, arch="sm_90a")
    sweep.run(sweep.plan([spec], [1], limit=3), str(csv_path), compile_only=True, arch="sm_90a")
    assert "2 points: 0 verified and timed, 2 compiled only" in sweep.summary(str(csv_path), points)
    assert "5 points" in sweep.summary(str(csv_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU messages")
def test_precompile_without_a_gpu_asks_for_an_arch():
    with pytest.raises(SystemExit, match="--arch"):
        cli.main(["precompile", "--op", "scan"])


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_precompile_fills_the_keys_the_launches_look_up(jobs, tmp_path, monkeypatch):
    """An NVRTC entry's launch compiles plain-arch kernels for sm_90 and wgmma ones for sm_90a (``kernel_for``);
    ``precompile --arch sm_90a`` stores each under that arch, so the call finds it on disk, whether compiled
    here or in worker processes (``--jobs``)."""
    from cute_kernels.ops.scan.lookback import name_expression
    from cute_kernels.runtime import nvrtc
    from cute_kernels.tools.sweep import launch_arch

    scan, flash3 = registry.get("scan", "lookback"), registry.get("attention", "flash3_wgmma")
    hgemm_sm80 = registry.get("hgemm", "sm80_mma")
    assert [launch_arch(scan, a) for a in ("sm_90a", "sm_90", "sm_80")] == ["sm_90", "sm_90", "sm_80"]
    assert [launch_arch(flash3, a) for a in ("sm_90a", "sm_90")] == ["sm_90a", "sm_90a"]
    assert [launch_arch(hgemm_sm80, a) for a in ("sm_90", "sm_80")] == ["sm_90a", "sm_80"]
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    assert cli.main(["precompile", "--op", "scan", "--variant", "lookback", "--arch", "sm_90a", "--jobs", jobs]) == 0
    nvrtc.clear_memory_cache()  # as a new process: only the disk holds them
    for problem in scan.standard_problems():
        name = name_expression(scan.default_config(problem), problem)
        assert nvrtc.compile_cubin(scan.sources[0], [name], "sm_90").from_disk


def test_the_gemv_tma_kernel_compiles_for_the_arch_its_launch_reads(tmp_path, monkeypatch):
    """The gemv entry is not arch-specific, but its TMA kernel is (``prepare`` loads it for sm_90a): a compile
    asked for sm_90 (what ``precompile --arch sm_90`` asks of the entry) stores it under sm_90a."""
    from cute_kernels.ops.gemm import gemv
    from cute_kernels.ops.gemm.problem import GemmProblem
    from cute_kernels.runtime import nvrtc

    gemv_spec = registry.get("hgemm", "gemv")
    problem = GemmProblem(m=12, n=4096, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k")
    config = gemv.GemvConfig(tensor_cores=True, tma_stages=gemv.TMA_DEFAULT_STAGES)
    assert gemv.why_unsupported(config, problem) is None and gemv._on_tma(config, problem)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    gemv_spec.compile(config, problem, "sm_90")
    nvrtc.clear_memory_cache()
    assert nvrtc.compile_cubin(gemv.SOURCE, [gemv.name_expression(config, problem)], "sm_90a").from_disk
    plain = gemv.GemvConfig(tensor_cores=True)  # the other kernels keep the arch they are asked for
    gemv_spec.compile(plain, problem, "sm_90")
    nvrtc.clear_memory_cache()
    assert nvrtc.compile_cubin(gemv.SOURCE, [gemv.name_expression(plain, problem)], "sm_90").from_disk


def test_every_arch_specific_nvrtc_entry_compiles_for_the_a_target(tmp_path, monkeypatch):
    """An entry built for sm_90a alone compiles for sm_90a when a tool names sm_90 (check, precompile), as its
    launch looks it up; the sgemm Hopper entry had no such rule and built a trap-only sm_90 body."""
    from cute_kernels.ops.gemm import sgemm_sm90
    from cute_kernels.runtime import nvrtc

    spec = registry.get("sgemm", "tf32x3_wgmma")
    problem = spec.standard_problems()[0]
    config = spec.default_config(problem)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    spec.compile(config, problem, "sm_90")
    nvrtc.clear_memory_cache()
    assert nvrtc.compile_cubin(sgemm_sm90.SOURCE, [sgemm_sm90._name_expression(config, problem)], "sm_90a").from_disk


def _pretend_h200(monkeypatch):
    """A machine that says it has one H200 (sm_90), for the bench's host-side steps; nothing launches."""
    from cute_kernels.runtime import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    monkeypatch.setattr(device, "capability", lambda index=None: (9, 0))
    monkeypatch.setenv("CUTE_KERNELS_COMMIT", "abc1234")


def test_bench_compiles_the_rows_it_will_measure_ahead_in_workers(tmp_path, monkeypatch):
    """With --jobs > 1 the report first compiles, in worker processes, every kernel of the rows it still has
    to measure (standard and zoo rows alike; a row the checkpoint holds is skipped, a kernel two rows share is
    compiled once), each in the config the op chooses on this GPU and for the arch its launch looks up."""
    import json

    from cute_kernels.tools import bench, sweep

    _pretend_h200(monkeypatch)
    spec = registry.get("scan", "lookback")
    standard = spec.standard_problems()
    held = f"{spec.key} {standard[-1]}"  # the last: the first row's measure stops the run before it is read
    path = tmp_path / "report.jsonl"
    path.write_text(json.dumps({"identity": {"gpu": "NVIDIA H200", "commit": "abc1234", "reps": 30, "op": "scan",
                                             "variant": "lookback", "zoo": True}}) + "\n"
                    + json.dumps({"section": "standard", "key": held, "value": None}) + "\n")
    asked = []
    monkeypatch.setattr(sweep, "compile_ahead", lambda points, jobs: asked.append((points, jobs)) or [])

    class Stop(Exception):
        pass

    def measure(*args, **kwargs):
        raise Stop  # the compiles came first: nothing more to see
    monkeypatch.setattr(bench, "measure", measure)
    with pytest.raises(Stop):
        cli.main(["bench", "--op", "scan", "--variant", "lookback", "--zoo", "--jobs", "3",
                  "--checkpoint", str(path)])
    (points, jobs), = asked
    assert jobs == 3
    zoo = [runs_on for label, _, _, _, runs_on in cli._zoo_rows(cli.build_parser().parse_args(
        ["bench", "--op", "scan", "--variant", "lookback", "--zoo"]))]
    expected = {(sweep.describe(p), sweep.describe(spec.choose_config(p, 0)))
                for _, p in [(spec, p) for p in standard[:-1]] + zoo}
    assert zoo and {(sweep.describe(point.problem), sweep.describe(point.config)) for point, _ in points} == expected
    assert len(points) == len(expected)  # each kernel once
    assert {arch for _, arch in points} == {"sm_90"}  # the scan's NVRTC launch looks up plain sm_90


def test_precompile_in_workers_counts_and_names_each_failure(monkeypatch, capsys):
    """A kernel a worker fails to compile is a line naming it and a nonzero exit; the others still compile."""
    from cute_kernels.tools import sweep

    def rows(points, jobs):
        assert jobs == 2 and len(points) > 1
        for i, (point, arch) in enumerate(points):
            yield sweep._point_row(point, arch=arch, verified="compiled" if i else "ERROR",
                                   detail="" if i else "CompileError: out of registers")
    monkeypatch.setattr(sweep, "compile_ahead_rows", rows)
    assert cli.main(["precompile", "--op", "scan", "--variant", "lookback", "--arch", "sm_90a", "--jobs", "2"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAILED") == 1 and "scan/lookback sm_90 " in out and "CompileError: out of registers" in out
    assert "1 failure(s)" in out


def test_precompile_compiles_here_what_a_failed_pool_left(tmp_path, monkeypatch, capsys):
    """Worker processes only save time: a pool that breaks after reporting one kernel is one line, and this
    process compiles every kernel the pool did not report (and only those)."""
    from cute_kernels.tools import sweep

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    spec = registry.get("scan", "lookback")

    def rows(points, jobs):
        point, arch = points[0]
        yield sweep._point_row(point, arch=arch, verified="compiled")
        raise OSError("a worker's pipe broke")
    monkeypatch.setattr(sweep, "compile_ahead_rows", rows)
    here = []
    original = cli._precompile_here
    monkeypatch.setattr(cli, "_precompile_here", lambda work: here.extend(work) or original(work))
    assert cli.main(["precompile", "--op", "scan", "--variant", "lookback", "--arch", "sm_90a", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "the worker processes failed (OSError: a worker's pipe broke); compiling the rest here" in out
    plan = cli.precompile_plan(spec, None)
    assert len(plan) > 1 and [(config, problem) for _, _, config, problem in here] == plan[1:]
    assert "0 failure(s)" in out


def test_kernels_compiled_ahead_are_in_the_disk_cache(tmp_path, monkeypatch):
    """compile_ahead's workers (other processes, no CUDA) leave each kernel in the disk cache a later process
    reads: here two scan kernels, which this process then loads with NVRTC switched off."""
    from cute_kernels.runtime import nvrtc
    from cute_kernels.tools import sweep

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    spec = registry.get("scan", "lookback")
    problem = spec.standard_problems()[0]
    configs = spec.supported_candidates(problem)[:2]
    rows = sweep.compile_ahead([(sweep.Point("scan", "lookback", problem, c), "sm_90") for c in configs], jobs=2)
    assert [row["verified"] for row in rows] == ["compiled", "compiled"]
    monkeypatch.setattr(nvrtc, "_memory_cache", {})
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *args: pytest.fail("compiled again"))
    for config in configs:
        assert spec.compile(config, problem, "sm_90").from_disk


def test_a_report_whose_compiling_ahead_fails_measures_anyway(monkeypatch, capsys):
    """Compiling ahead only saves time: a pool that cannot start is a line in the log, and the rows are
    measured (and compile) as without it."""
    from cute_kernels.tools import bench, sweep

    _pretend_h200(monkeypatch)

    def broken(points, jobs):
        raise OSError("no shared memory for the pool")
    monkeypatch.setattr(sweep, "compile_ahead", broken)

    class Measured(Exception):
        pass

    def measure(*args, **kwargs):
        raise Measured
    monkeypatch.setattr(bench, "measure", measure)
    with pytest.raises(Measured):
        cli.main(["bench", "--op", "scan", "--variant", "lookback", "--jobs", "2"])
    assert "compiling ahead failed (OSError: no shared memory for the pool)" in capsys.readouterr().out
