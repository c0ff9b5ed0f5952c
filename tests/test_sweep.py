"""The sweep machinery: planning from the registry, compile-only runs on the CPU, resuming, the summary;
and on a GPU, a short verified and timed sweep."""

import csv
import dataclasses
import json
import os
import time

import pytest

from cute_kernels import registry
from cute_kernels.tools import sweep


def test_plan_takes_only_supported_configs_and_samples_evenly():
    spec = registry.get("scan")
    points = sweep.plan([spec], [0])
    problem = spec.standard_problems()[0]
    assert points and all(spec.supports(p.config, p.problem) for p in points)
    default = spec.default_config(problem)
    extra = 0 if default in spec.supported_candidates(problem) else 1
    assert len(points) == len(spec.supported_candidates(problem)) + extra
    sample = sweep.plan([spec], [0], limit=4)
    assert len(sample) == 4 and len({p.config for p in sample}) == 4


def test_the_default_config_is_raced_where_the_grid_lacks_it():
    """A default fitted to its problem (a strided scan over 8 float32 columns: a 64-thread CTA) lies outside
    the candidate grid; the sweep races it anyway, first (so a sample keeps it too), and a winner it writes
    is never slower than the op without one."""
    import dataclasses

    spec = registry.get("scan", "columns")
    narrow = dataclasses.replace(spec.standard_problems()[2], inner=8)
    default = spec.default_config(narrow)
    assert default.threads == 64 and default not in spec.candidates()
    original = spec.standard_problems
    try:
        object.__setattr__(spec, "standard_problems", lambda: [narrow])
        points = sweep.plan([spec], [0])
        sample = sweep.plan([spec], [0], limit=3)
    finally:
        object.__setattr__(spec, "standard_problems", original)
    assert points[0].config == default and len(points) == len(spec.supported_candidates(narrow)) + 1
    assert sample[0].config == default


def test_compile_only_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=3)
    rows = sweep.run(points, csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)
    assert [r["verified"] for r in rows] == ["compiled"] * 3
    assert all(float(r["compile_s"]) >= 0 and r["arch"] == "sm_90a" for r in rows)
    assert sweep.run(points, csv_path, compile_only=True, progress=lambda _: None) == []  # all done already
    with open(csv_path, newline="") as f:
        assert len(list(csv.DictReader(f))) == 3
    text = sweep.summary(csv_path)
    assert text.startswith("3 points: 0 verified and timed, 3 compiled only, 0 failed.")  # no empty winners' table


def test_a_compile_only_sweep_for_another_arch_compiles_its_points_again(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    sweep.run(points, csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)
    rows = sweep.run(points, csv_path, compile_only=True, arch="sm_80", progress=lambda _: None)
    assert [r["arch"] for r in rows] == ["sm_80", "sm_80"]
    assert sweep.run(points, csv_path, compile_only=True, arch="sm_80", progress=lambda _: None) == []


def test_compile_only_rows_do_not_count_as_timed(tmp_path):
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    sweep.run(points, csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)
    assert sweep.done_keys(csv_path, timed=False) == {p.key() for p in points}
    assert sweep.done_keys(csv_path, timed=True) == set()  # a timed sweep still has every point to run
    # A later timed row of a point replaces its compile-only row in the summary.
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    timed = dict(rows[0], verified="yes", ours_us="10.0", baseline_us="12.0", speedup="1.2", throughput="1 GB/s",
                 mode="timed")
    with open(csv_path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(rows[0])).writerow(timed)
    assert sweep.done_keys(csv_path, timed=True) == {points[0].key()}
    assert "2 points: 1 verified and timed, 1 compiled only, 0 failed." in sweep.summary(csv_path)


def test_a_failed_compile_only_row_leaves_its_point_to_a_timed_sweep(tmp_path):
    """A compile-only failure measured nothing (and may be another arch's): a timed resume runs its point. A
    timed failure stays done, and so does a failure from an older CSV without the mode column."""
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=3)
    rows = [sweep._point_row(points[0], arch="sm_80", verified="ERROR", detail="NVRTC: error", mode="compile-only"),
            sweep._point_row(points[1], arch="sm_90a", verified="ERROR", detail="a fault", mode="timed"),
            {k: v for k, v in sweep._point_row(points[2], verified="ERROR").items() if k != "mode"}]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    assert sweep.done_keys(csv_path, timed=True) == {points[1].key(), points[2].key()}
    assert sweep.done_keys(csv_path, timed=False) == {p.key() for p in points}
    assert sweep.done_keys(csv_path, timed=False, arch="sm_90a") == {points[1].key(), points[2].key()}


def test_a_timed_row_replaces_a_failed_compile_only_row_and_a_compile_only_sweep_reports_its_own(tmp_path):
    """A compile-only failure that a later timed sweep ran again and timed is no failure of the timed sweep;
    a compile-only sweep (of another arch, after the timed one) reports its own failure all the same."""
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    timed = {"verified": "yes", "ours_us": "10.0", "baseline_us": "12.0", "speedup": "1.2", "throughput": "1 GB/s",
             "mode": "timed", "arch": "sm_90a"}
    rows = [sweep._point_row(points[0], arch="sm_90a", verified="ERROR", detail="NVRTC: error", mode="compile-only"),
            sweep._point_row(points[1], arch="sm_90a", verified="compiled", mode="compile-only"),
            sweep._point_row(points[0], **timed), sweep._point_row(points[1], **timed),
            sweep._point_row(points[1], arch="sm_80", verified="ERROR", detail="NVRTC: sm_80", mode="compile-only")]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    assert sweep.failed_rows(csv_path, points) == []
    assert "2 points: 2 verified and timed, 0 compiled only, 0 failed." in sweep.summary(csv_path, points)
    assert [r["detail"] for r in sweep.failed_rows(csv_path, points, compile_only=True, arch="sm_80")] == ["NVRTC: sm_80"]
    assert "1 points: 0 verified and timed, 0 compiled only, 1 failed." in sweep.summary(
        csv_path, points, compile_only=True, arch="sm_80")
    assert [r["detail"] for r in sweep.failed_rows(csv_path, points, compile_only=True, arch="sm_90a")] == ["NVRTC: error"]


def test_a_sweep_resuming_an_older_csv_rewrites_its_columns(tmp_path, monkeypatch):
    """A CSV written by an older version, with fewer columns in another order: its rows are rewritten under
    today's columns by name (an unknown column kept last), so the points appended line up with them."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=3)
    sweep.run(points[:1], csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)
    with open(csv_path, newline="") as f:
        old = list(csv.DictReader(f))[0]
    old_columns = ["config", "op", "problem", "variant", "verified", "compile_s", "note"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(dict(old, note="kept"))
    assert len(sweep.run(points, csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)) == 2
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == sweep.FIELDS + ["note"]
    assert [(r["op"], r["variant"], r["problem"], r["config"]) for r in rows] == [p.key() for p in points]
    assert rows[0]["note"] == "kept" and rows[0]["arch"] == "" and rows[1]["arch"] == "sm_90a"
    assert all(r["verified"] == "compiled" for r in rows)
    with open(tmp_path / "other.csv", "w") as f:
        f.write("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a sweep's CSV"):
        sweep.run(points, str(tmp_path / "other.csv"), compile_only=True, progress=lambda _: None)


def test_a_resumed_sweep_still_reports_and_fails_on_the_failures_it_resumed(tmp_path):
    """A failed point counts as done (a resume does not run it again), so its failure is read back from the
    CSV: the summary lists it and the exit status is 1, as on the run that recorded it."""
    csv_path = str(tmp_path / "sweep.csv")
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    sweep.run(points, csv_path, compile_only=True, arch="sm_90a", progress=lambda _: None)
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    failed = dict(rows[0], verified="ERROR", detail="RuntimeError: a kernel that faulted")
    with open(csv_path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(rows[0])).writerow(failed)
    assert sweep.run(points, csv_path, compile_only=True, progress=lambda _: None) == []  # nothing left to run
    assert [r["detail"] for r in sweep.failed_rows(csv_path, points)] == ["RuntimeError: a kernel that faulted"]
    assert sweep.failed_rows(csv_path, points[1:]) == []  # another sweep's points: not its failure


def test_a_point_that_fails_is_recorded_not_raised(tmp_path):
    spec = registry.get("scan")
    problem = spec.standard_problems()[0]
    bad = sweep.Point(spec.op, spec.variant, problem, spec.config_cls(threads=128, items_per_thread=2))
    row = sweep.evaluate(bad, compile_only=True)
    assert row["verified"] == "ERROR"


@pytest.mark.gpu
def test_gpu_sweep_verifies_and_times(tmp_path):
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    rows = sweep.run(points, str(tmp_path / "sweep.csv"), reps=5, progress=lambda _: None)
    assert [r["verified"] for r in rows] == ["yes", "yes"]
    assert all(float(r["ours_us"]) > 0 and float(r["speedup"]) > 0 for r in rows)
    assert "| scan | lookback |" in sweep.summary(str(tmp_path / "sweep.csv"))


def test_plots_from_a_sweep_csv(tmp_path):
    """Heatmap per problem and a sizes plot per entry, from rows as the sweep writes them."""
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import sweep_plots

    spec = registry.get("scan")
    csv_path = tmp_path / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS)
        writer.writeheader()
        for p_index, problem in enumerate(spec.standard_problems()[:2]):
            for i, config in enumerate(spec.supported_candidates(problem)[:6]):
                row = dict.fromkeys(sweep.FIELDS, "")
                row.update(op="scan", variant=spec.variant, problem=sweep.describe(problem),
                           config=sweep.describe(config), verified="yes", ours_us=str(10.0 + i + p_index),
                           baseline_us="12.0", speedup=f"{12.0 / (10.0 + i + p_index):.3f}")
                writer.writerow(row)
    paths = sweep_plots.plot(str(csv_path), str(tmp_path / "png"))
    assert len(paths) == 3  # two heatmaps, one sizes plot
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_entry_has_heatmap_axes_of_its_config_fields():
    """The heatmap of any entry's sweep: two axes, each naming fields of its config (the Hopper 3xTF32 GEMM
    has one knob, so one axis and a single column: a sweep of it once stopped here before writing its tuned
    table)."""
    from cute_kernels.tools import sweep_plots

    for spec in registry.list():
        rows, columns = sweep_plots.heatmap_axes(spec)
        names = {f.name for f in dataclasses.fields(spec.config_cls)}
        assert rows and set(rows) <= names and set(columns) <= names, (spec, rows, columns)


@pytest.mark.parametrize("variant", ["tf32x3_wgmma", "simt_cpasync"])
def test_plots_of_one_and_two_axis_entries(tmp_path, variant):
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import sweep_plots

    spec = registry.get("sgemm", variant)
    problem = spec.standard_problems()[0]
    csv_path = tmp_path / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS)
        writer.writeheader()
        for i, config in enumerate(spec.candidates()[:3]):
            row = dict.fromkeys(sweep.FIELDS, "")
            row.update(op="sgemm", variant=variant, problem=sweep.describe(problem), config=sweep.describe(config),
                       verified="yes", ours_us=str(10.0 + i), baseline_us="12.0", speedup=f"{12.0 / (10.0 + i):.3f}")
            writer.writerow(row)
    assert len(sweep_plots.plot(str(csv_path), str(tmp_path / "png"))) == 2


def test_parse_fields_inverts_describe():
    from cute_kernels.tools import sweep_plots

    config = registry.get("scan").candidates()[5]
    fields = sweep_plots.parse_fields(sweep.describe(config))
    assert fields == {"threads": str(config.threads), "items_per_thread": str(config.items_per_thread),
                      "staged": str(config.staged), "lookback": config.lookback, "ramp_ns": str(config.ramp_ns)}


def test_plan_varies_only_the_named_fields():
    spec = registry.get("sgemm", "simt_cpasync")
    problem = spec.standard_problems()[1]
    base = spec.default_config(problem)
    points = sweep.plan([spec], [1], vary=("num_stages", "tile_m", "tile_n", "tile_k"))
    assert points and len(points) < len(spec.supported_candidates(problem))
    assert {p.config.num_stages for p in points} >= {2, 3, 4}
    for p in points:
        assert (p.config.threads_m, p.config.a_smem_major, p.config.raster) == (base.threads_m, base.a_smem_major,
                                                                              base.raster)
    with pytest.raises(ValueError, match="no field"):
        sweep.plan([spec], [1], vary=("stages",))


def test_bench_report_files_from_rows(tmp_path):
    """The report's CSV and speed-up chart, from rows as bench.measure returns them."""
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import bench, report

    rows = [bench.Row("scan", "lookback", "rows=1 length=268435456 dtype=float32 vector=0", "threads=512", 660.0,
                      830.0, "torch.cumsum", 670.0, 840.0, 3250.0, 0.0, True),
            bench.Row("sgemm", "simt", "m=8192 n=8192 k=8192 a_align=4", "tile_m=128", 23100.0, 21700.0,
                      "cuBLAS", 23100.0, 21700.0, 0.0, 47.6, True, bound="fp32"),
            bench.Row("conv3d", "direct", "depth=8", "-", 0.0, 0.0, "cuDNN", 0.0, 0.0, 0.0, 0.0, False, "boom")]
    report.write_csv(rows, str(tmp_path / "b.csv"))
    with open(tmp_path / "b.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["verified"] for r in got] == ["yes", "yes", "NO"] and got[0]["speedup"] == "1.258"
    path = report.speedup_chart(rows, str(tmp_path / "b.png"), title="t")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert report.short_problem(rows[0].problem) == "rows=1 length=268435456 dtype=float32"


@pytest.mark.gpu
@pytest.mark.parametrize("op, variant", [("sgemm", "simt_cpasync"), ("hgemm", "sm80_mma"), ("hgemm", "sm90_wgmma")])
def test_gpu_two_point_gemm_sweep_writes_its_files(op, variant, tmp_path):
    """Issue 7's GPU check: two configs of each GEMM family at a standard size, verified and timed, with the
    CSV, the summary and the pictures written."""
    pytest.importorskip("matplotlib")
    from cute_kernels.tools import sweep_plots

    spec = registry.get(op, variant)
    points = sweep.plan([spec], [0], limit=2)
    csv_path = str(tmp_path / "sweep.csv")
    rows = sweep.run(points, csv_path, jobs=2, reps=3, progress=lambda _: None)
    assert [r["verified"] for r in rows] == ["yes", "yes"], [r["detail"] for r in rows]
    assert f"| {op} | {variant} |" in sweep.summary(csv_path)
    pictures = sweep_plots.plot(csv_path, str(tmp_path / "png"))
    assert pictures and all(p.endswith(".png") for p in pictures)


@pytest.mark.memory_heavy
@pytest.mark.gpu
def test_gpu_bench_of_one_op_writes_report_csv_and_chart(tmp_path):
    import re

    pytest.importorskip("matplotlib")
    from cute_kernels.__main__ import main

    report = tmp_path / "bench.md"
    assert main(["bench", "--op", "scan", "--variant", "lookback", "--reps", "3", "--write", str(report)]) == 0
    text = report.read_text()
    results = text.split("Other libraries")[0]  # the other-library table names the same rows again
    assert results.count("| scan | lookback |") == len(registry.get("scan").standard_problems())
    assert re.search(r"driver \d+\.\d+;", text) and re.search(r"nvidia-cutlass-dsl \d+\.\d+", text)
    with open(tmp_path / "bench.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(registry.get("scan").standard_problems())
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_other_libraries_get_their_own_table():
    from cute_kernels.tools import bench, report

    row = bench.Row("attention", "flash2_mma", "batch=4 d=128 vector=0", "-", 1600.0, 1550.0, "FA2", 1.0, 1.0, 0.0,
                    340.0, True, bound="fp16", others_us={"cuDNN": 800.0, "other": float("nan")})
    text = report.markdown_table([row])
    assert "| attention | flash2_mma | batch=4 d=128 | cuDNN | 800.0 | 0.50x |" in text
    assert "| other | not run (refused the problem, or answered it with non-finite values) | - |" in text
    assert registry.get("attention", "flash2_mma").other_baselines  # cuDNN beside FlashAttention-2


@pytest.mark.gpu
def test_gpu_time_excludes_a_slow_host():
    """A call whose host part (3 ms of sleep) far outlasts the first GPU hold still measures as the GPU time
    of its tiny kernel: the timer sees the start event fired early, drops the sample and holds longer."""
    import time

    import torch

    from cute_kernels.tools import bench

    x = torch.zeros(1024, device="cuda")

    def slow_host(rep):
        time.sleep(0.003)
        x.add_(1.0)

    times = bench.interleaved_times({"slow": slow_host}, reps=5, warmup=1)["slow"]
    assert max(times) < 500.0, times


# ---------------------------------------------------------------------------------------------- torchrun
def test_shares_are_stable_and_cover_every_point_once():
    from cute_kernels.tools import ranks

    points = sweep.plan([registry.get("scan")], None, limit=6) + sweep.plan([registry.get("conv3d")], [0], limit=5)
    for world in (1, 2, 3, 8):
        shares = [ranks.share(points, r, world) for r in range(world)]
        assert sorted(p.key() for s in shares for p in s) == sorted(p.key() for p in points)
        assert shares == [ranks.share(points, r, world) for r in range(world)]  # the same on every call
    # The owner does not depend on the process (sha256, not hash(), which PYTHONHASHSEED salts): a restarted
    # job, or a rank on another host, computes the same shares.
    import subprocess
    import sys

    keys = [p.key() for p in points]
    code = ("import sys; from cute_kernels.tools.ranks import owner; keys = eval(sys.stdin.read()); "
            "print([owner(k, 3) for k in keys])")
    for seed in ("1", "2"):
        child = subprocess.run([sys.executable, "-c", code], input=repr(keys), capture_output=True, text=True,
                               env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert child.stdout.strip() == str([ranks.owner(k, 3) for k in keys])


def _torchrun(tmp_path, *extra, nproc=2):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "cute_kernels", "sweep", "--compile-only", "--arch", "sm_90", "--op", "scan", "--variant", "lookback",
           "--problems", "2",
           "--limit", "6", "--out", str(tmp_path), *extra]
    env = {**os.environ, "CUTE_KERNELS_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _csv_keys(path):
    with open(path, newline="") as f:
        return [(r["op"], r["variant"], r["problem"], r["config"]) for r in csv.DictReader(f)]


@pytest.mark.timeout(900)
def test_torchrun_compile_only_sweep_writes_each_point_once_and_resumes(tmp_path):
    """Two ranks (gloo) share a compile-only sweep: one CSV with every point exactly once, written by rank 0;
    rank 1 keeps its own log. A second run has nothing to do; rows lost with a rank that died (removed here
    from the CSV) are run again, once."""
    points = sweep.plan([registry.get("scan")], [2], limit=6)
    expected = sorted(p.key() for p in points)
    out = _torchrun(tmp_path)
    keys = _csv_keys(tmp_path / "sweep.csv")
    assert sorted(keys) == expected, out
    assert (tmp_path / "sweep.rank1.log").exists() and "on rank 1 of 2" in (tmp_path / "sweep.rank1.log").read_text()
    assert "6 points: 0 verified and timed, 6 compiled only, 0 failed." in (tmp_path / "sweep.md").read_text()

    assert "0 to run" in _torchrun(tmp_path)
    assert sorted(_csv_keys(tmp_path / "sweep.csv")) == expected

    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "sweep.csv", "w", newline="") as f:  # the rows of the points rank 1 owned are lost
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS)
        writer.writeheader()
        from cute_kernels.tools import ranks

        writer.writerows(r for r in rows if ranks.owner((r["op"], r["variant"], r["problem"], r["config"]), 2) == 0)
    out = _torchrun(tmp_path)
    assert sorted(_csv_keys(tmp_path / "sweep.csv")) == expected, out


def test_a_point_whose_worker_gives_no_result_fails_alone(monkeypatch, tmp_path):
    """A pool worker that hangs (or dies) costs its own point after the timeout; the sweep goes on. The
    timeout leaves the other point room to start its worker and compile on a loaded machine."""
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    workers = sweep._Workers(jobs=2, timeout_s=20.0, timed=False)
    try:
        tasks = [(points[0], 1, True, "sm_90", 0), (points[1], 1, True, "sm_90", 0)]
        monkeypatch.setattr(workers.pool, "apply_async", _hang_first(workers.pool.apply_async))
        rows = list(workers.evaluate(tasks))
    finally:
        workers.close()
    by_config = {r["config"]: r for r in rows}
    assert len(rows) == 2
    assert by_config[sweep.describe(points[0].config)]["verified"] == "ERROR"
    assert "no result in 20 s" in by_config[sweep.describe(points[0].config)]["detail"]
    assert by_config[sweep.describe(points[1].config)]["verified"] == "compiled"


def test_a_point_in_its_own_process_is_killed_at_its_deadline(tmp_path, monkeypatch):
    """The timed points' mode (a process per point): a result in time is the row; a process past its
    deadline is killed and its point fails alone. Compile-only tasks stand in for timed ones here."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    points = sweep.plan([registry.get("scan")], [2], limit=2)
    tasks = [(p, 1, True, "sm_90", 0) for p in points]
    rows = list(sweep._Workers(jobs=2, timeout_s=600.0, timed=True).evaluate(tasks))
    assert sorted(r["verified"] for r in rows) == ["compiled", "compiled"]
    rows = list(sweep._Workers(jobs=1, timeout_s=0.01, timed=True).evaluate(tasks))
    assert [r["verified"] for r in rows] == ["ERROR", "ERROR"]
    assert all("the worker was killed" in r["detail"] for r in rows)


def _hang_first(apply_async):
    calls = []

    def patched(fn, args):
        calls.append(1)
        if len(calls) == 1:
            return apply_async(time.sleep, (3600,))  # a worker that never returns
        return apply_async(fn, args)

    return patched


@pytest.mark.gpu
def test_gpu_torchrun_timed_sweep_on_one_rank(tmp_path):
    """The timed path as a torch.distributed job of one rank: every point verified and timed on its GPU."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "cute_kernels",
           "sweep", "--op", "scan", "--variant", "lookback", "--problems", "2", "--limit", "2", "--reps", "3", "--jobs", "2",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CUTE_KERNELS_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["verified"] == "yes" and float(r["ours_us"]) > 0 for r in rows)


def test_a_zoo_sweep_plans_the_entrys_everyday_shapes(tmp_path, monkeypatch):
    """--zoo: the points' problems are the zoo shapes the op runs on that entry (never held-out ones), and
    a compile-only run over a sample of them writes one row per point."""
    spec = registry.get("hgemm", "sm80_mma")
    zoo = [p for entry, p in registry.zoo("hgemm", as_run=True) if entry.key == spec.key]
    held = {repr(p) for _, p in registry.zoo("hgemm", held_out=True)}
    points = sweep.plan([spec], None, limit=1, zoo=True)
    assert {repr(p.problem) for p in points} == {repr(p) for p in zoo} and not held & {repr(p.problem) for p in points}
    assert all(spec.supports(p.config, p.problem) for p in points)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    scan_points = sweep.plan([registry.get("scan")], [0, 8], limit=2, zoo=True)
    rows = sweep.run(scan_points, str(tmp_path / "sweep.csv"), compile_only=True, arch="sm_90", progress=lambda _: None)
    assert len(rows) == 4 and all(r["verified"] == "compiled" for r in rows)


def test_the_job_counter_adds_across_calls_in_the_jobs_store():
    """The count rank 0's progress bar follows: adds from any rank, read at once (one rank here, in a
    process of its own so no process group outlives the test)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("from cute_kernels.tools.ranks import Ranks; r = Ranks.from_env(); r.start(); c = r.counter('t'); "
            "c.add(2); c.add(3); print(c.value()); r.stop()")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "5"


def test_a_zoo_sweep_tunes_what_the_op_runs():
    """A misaligned HGEMM zoo shape the op stages is swept as its aligned twin on the Hopper entry (the
    table its calls read), not in place on the sm80 entry; a bad --problems index names the count."""
    from cute_kernels.ops.gemm.hgemm import _stage_unaligned

    staged = [p for _, p in registry.zoo("hgemm") if _stage_unaligned(p)]
    assert staged
    as_run = registry.zoo("hgemm", as_run=True)
    for p in staged:
        assert all(q.k != p.k or q.n != p.n or q.m != p.m for _, q in as_run)  # replaced by its twin
    twins = [(e, q) for e, q in as_run if q.m in {p.m for p in staged} and q.k % 8 == 0 and q.n % 8 == 0
             and (q.m, q.n, q.k) not in {(p.m, p.n, p.k) for _, p in registry.zoo("hgemm")}]
    assert twins and all(e.variant == "sm90_wgmma" for e, _ in twins)
    with pytest.raises(ValueError, match="problems: hgemm/sm90_wgmma has"):
        sweep.plan([registry.get("hgemm", "sm90_wgmma")], [999], zoo=True)


def test_write_tuned_records_and_logs_each_problems_fastest_verified_config(tmp_path, monkeypatch):
    """The winner per problem is the fastest verified row (a faster unverified one does not count); it goes to
    the user's table and into the log, one line each (what a lent machine's output keeps when its files do
    not come back)."""
    from cute_kernels import tuned

    monkeypatch.setenv("CUTE_KERNELS_TUNED_DIR", str(tmp_path / "tuned"))
    monkeypatch.setattr(tuned, "table_arch", lambda device_index: "sm_90")
    spec = registry.get("sgemm", "tf32x3_mma")
    points = sweep.plan([spec], [0], limit=3)
    assert len(points) == 3
    csv_path = tmp_path / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS)
        writer.writeheader()
        for point, (verified, us) in zip(points, [("yes", 30.0), ("yes", 20.0), ("no", 10.0)]):
            op, variant, problem, config = point.key()
            writer.writerow(dict(op=op, variant=variant, problem=problem, config=config, verified=verified,
                                 ours_us=us, baseline_us=40.0, speedup=40.0 / us))
    logged = []
    written = sweep.write_tuned(points, str(csv_path), source="test", log=logged.append)
    assert written == [tmp_path / "tuned" / "sgemm-tf32x3_mma.json"]
    assert logged == [f"tuned sgemm/tf32x3_mma {points[1].key()[2]}: {points[1].key()[3]} (2.00x)"]
    entries = json.loads(written[0].read_text())["entries"]
    assert [e["config"] for e in entries] == [dataclasses.asdict(points[1].config)]


def test_rows_of_several_runs_rank_by_their_same_run_speed_up():
    """One run's rows compare by GPU time; rows of several runs (or GPUs), whose absolute times drift apart,
    by each one's speed-up against the baseline timed beside it."""
    one_run = [dict(ours_us="20.0", speedup="1.10", run="a", device="H200"),
               dict(ours_us="21.0", speedup="1.20", run="a", device="H200")]
    assert sweep.winner(one_run)["ours_us"] == "20.0"
    resumed = [dict(ours_us="20.0", speedup="1.10", run="a", device="H200"),
               dict(ours_us="22.0", speedup="1.25", run="b", device="H200")]
    assert sweep.winner(resumed)["ours_us"] == "22.0"
    other_gpu = [dict(ours_us="20.0", speedup="1.10", run="a", device="H100"),
                 dict(ours_us="22.0", speedup="1.25", run="a", device="H200")]
    assert sweep.winner(other_gpu)["speedup"] == "1.25"


def test_write_tuned_logs_the_winner_and_names_a_table_it_cannot_write(tmp_path, monkeypatch):
    """A user table the ops cannot read (here an entry naming a config field that no longer exists) stops
    neither the log nor the other winners: the winner is logged, then a TunedTableError names the file."""
    from cute_kernels import tuned

    table_dir = tmp_path / "tuned"
    monkeypatch.setenv("CUTE_KERNELS_TUNED_DIR", str(table_dir))
    monkeypatch.setattr(tuned, "table_arch", lambda device_index: "sm_90")
    spec = registry.get("sgemm", "tf32x3_mma")
    points = sweep.plan([spec], [0], limit=1)
    csv_path = tmp_path / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sweep.FIELDS)
        writer.writeheader()
        op, variant, problem, config = points[0].key()
        writer.writerow(dict(op=op, variant=variant, problem=problem, config=config, verified="yes", ours_us=20.0,
                             baseline_us=40.0, speedup=2.0))
    logged = []
    assert sweep.write_tuned(points, str(csv_path), source="test", log=logged.append)  # a fresh table
    table = table_dir / "sgemm-tf32x3_mma.json"
    data = json.loads(table.read_text())
    data["entries"][0]["config"] = dict(data["entries"][0]["config"], tile_mm=64)  # a field renamed since
    table.write_text(json.dumps(data))
    logged.clear()
    with pytest.raises(tuned.TunedTableError, match="sgemm-tf32x3_mma.json"):
        sweep.write_tuned(points, str(csv_path), source="test", log=logged.append)
    assert logged[0].startswith("tuned sgemm/tf32x3_mma") and "not written" in logged[1]
