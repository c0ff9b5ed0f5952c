"""The report's checkpoint (CPU): units measured once and read back on resume, rows round-tripping through
JSON (NaN times, dtypes, tuples), and a file from another run refused before anything is written."""

import json
import math

import pytest
import torch

from cute_kernels.tools import attention_backward, bench, first_call
from cute_kernels.tools.checkpoint import Checkpoint, CheckpointMismatch, dataclass_codec

IDENTITY = {"gpu": "NVIDIA H200", "commit": "abc1234", "reps": 30, "op": None, "variant": None, "zoo": True}


def _bench_row(ours_us=10.0, verified=True, other_us=7.0):
    return bench.Row("hgemm", "sm90_wgmma", "m=64 n=4096 k=4096", "cfg", ours_us, 8.0, "cuBLAS", 15.0, 14.0,
                     1000.0, 3.5, verified, "" if verified else "boom", "fp16", {"cuDNN": other_us}, False)


def test_a_resumed_run_measures_only_the_missing_units(tmp_path):
    path = str(tmp_path / "report.jsonl")
    codec = dataclass_codec(bench.Row)
    first = Checkpoint(path, IDENTITY)
    assert not first.resumed
    measured = []

    def measure(value):
        def run():
            measured.append(value)
            return _bench_row(ours_us=value)
        return run

    assert first.remember("standard", "a", measure(1.0), codec).ours_us == 1.0
    assert first.remember("zoo", "a", measure(2.0), codec).ours_us == 2.0  # same key, another section
    # A run cut here: a second one reads both back and measures only the new unit.
    second = Checkpoint(path, IDENTITY)
    assert second.resumed and second.runs == 2
    again = second.remember("standard", "a", measure(9.0), codec)
    assert again == _bench_row(ours_us=1.0)
    assert second.remember("standard", "b", measure(3.0), codec).ours_us == 3.0
    assert measured == [1.0, 2.0, 3.0]
    assert Checkpoint(path, IDENTITY).runs == 3


def test_rows_round_trip_with_nan_times_dtypes_and_tuples(tmp_path):
    path = str(tmp_path / "report.jsonl")
    bench_codec = dataclass_codec(bench.Row)
    backward_codec = dataclass_codec(attention_backward.Row, tuples=("problem",), dtypes=("dtype",))
    failed = _bench_row(ours_us=float("nan"), verified=False, other_us=float("nan"))
    backward = attention_backward.Row(torch.bfloat16, (4, 16, 16, 4096, 64, True), 1.5, 2.5, None, {}, True, "",
                                      on_planes=False)
    writer = Checkpoint(path, IDENTITY)
    writer.remember("standard", "failed", lambda: failed, bench_codec)
    writer.remember("attention backward", "bf16", lambda: backward, backward_codec)
    writer.remember("dispatch", "table", lambda: "| op |\n| --- |")
    reader = Checkpoint(path, IDENTITY)

    def never():
        raise AssertionError("measured again")

    row = reader.remember("standard", "failed", never, bench_codec)
    assert math.isnan(row.ours_us) and not row.verified and row.error == "boom"
    assert math.isnan(row.others_us["cuDNN"]) and row.speedup != row.speedup
    back = reader.remember("attention backward", "bf16", never, backward_codec)
    assert back == backward and back.dtype is torch.bfloat16 and isinstance(back.problem, tuple)
    assert reader.remember("dispatch", "table", never) == "| op |\n| --- |"


def test_a_file_started_elsewhere_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "report.jsonl"
    Checkpoint(str(path), IDENTITY).remember("standard", "a", lambda: 1)
    before = path.read_text()
    for field, other in (("gpu", "NVIDIA H100 80GB HBM3"), ("commit", "def5678"), ("reps", 10), ("zoo", False)):
        with pytest.raises(CheckpointMismatch, match=field):
            Checkpoint(str(path), dict(IDENTITY, **{field: other}))
    assert path.read_text() == before


def test_no_path_measures_every_time_and_writes_nothing(tmp_path):
    checkpoint = Checkpoint(None, IDENTITY)
    calls = []
    for _ in range(2):
        checkpoint.remember("standard", "a", lambda: calls.append(1) or len(calls))
    assert calls == [1, 1] and not checkpoint.resumed and not list(tmp_path.iterdir())


def test_each_line_is_whole_json(tmp_path):
    """One unit per line, written whole: a command killed between units leaves a file every later run can read."""
    path = tmp_path / "report.jsonl"
    checkpoint = Checkpoint(str(path), IDENTITY)
    for key in "abc":
        checkpoint.remember("zoo", key, lambda key=key: key * 2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"identity": IDENTITY}
    assert [(line["section"], line["key"], line["value"]) for line in lines[1:]] == [
        ("zoo", "a", "aa"), ("zoo", "b", "bb"), ("zoo", "c", "cc")]


def test_each_unit_says_how_long_it_took_and_the_run_sums_it_by_section(tmp_path, monkeypatch):
    """The seconds a unit took to measure go into its line and the run's time by section (what to cut when
    the report outgrows a call); a unit read back from the file took none."""
    clock = iter([0.0, 2.5, 10.0, 14.0, 20.0, 21.0])
    monkeypatch.setattr("cute_kernels.tools.checkpoint.time.perf_counter", lambda: next(clock))
    path = tmp_path / "report.jsonl"
    checkpoint = Checkpoint(str(path), IDENTITY)
    checkpoint.remember("standard", "a", lambda: 1)
    assert checkpoint.last_seconds == 2.5
    checkpoint.remember("standard", "b", lambda: 2)
    checkpoint.remember("zoo", "a", lambda: 3)
    assert checkpoint.time_by_section() == "standard: 2 in 6 s; zoo: 1 in 1 s"
    assert [json.loads(line)["seconds"] for line in path.read_text().splitlines()[1:]] == [2.5, 4.0, 1.0]
    resumed = Checkpoint(str(path), IDENTITY)
    assert resumed.remember("zoo", "a", lambda: 9) == 3 and resumed.last_seconds is None
    assert resumed.time_by_section() == ""


def test_first_call_cases_go_through_the_checkpoint_one_by_one():
    """With every case remembered, first_call.measure starts no child process and keeps the cases' order."""
    keys = []

    def remember(key, measure):
        keys.append(key)
        return {"op": key}

    rows = first_call.measure(remember=remember)
    assert keys == [f"{op} {problem}" for op, problem, *_ in first_call.CASES]
    assert [row["op"] for row in rows] == keys
