"""Tuned defaults (CPU): recording a winner, reading it back, falling back where it does not apply, and
malformed files reported once, naming the file, with the op running its heuristic."""

import json
import multiprocessing
import re
from pathlib import Path
import warnings

import pytest
import torch

from cute_kernels import registry, tuned
from cute_kernels.ops import scan


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    monkeypatch.setenv("CUTE_KERNELS_TUNED_DIR", str(tmp_path))  # the user's tables in the same folder
    monkeypatch.setattr(tuned, "_tables", {})
    monkeypatch.setattr(tuned, "_choices", {})
    monkeypatch.setattr(tuned, "table_arch", lambda device_index: "sm_90")
    return tmp_path


def test_record_then_choose(table):
    spec = registry.get("scan")
    problem = scan.ScanProblem(1, 1 << 24, torch.float32)
    winner = scan.ScanConfig(384, 24, staged=True)
    assert spec.choose_config(problem, 0) == spec.default_config(problem)  # nothing tuned yet
    path = tuned.record(spec, problem, winner, "sm_90", speedup=1.21, source="test")
    assert path == table / "scan-lookback.json"
    data = json.loads(path.read_text())
    assert data["format"] == tuned.FORMAT and len(data["entries"]) == 1
    assert spec.choose_config(problem, 0) == winner
    # Same bucket (same power of two), same winner; another bucket, the heuristic.
    assert spec.choose_config(scan.ScanProblem(1, (1 << 24) + 12345, torch.float32), 0) == winner
    other = scan.ScanProblem(1, 1 << 20, torch.float32)
    assert spec.choose_config(other, 0) == spec.default_config(other)
    # Recording again replaces the entry of that bucket.
    tuned.record(spec, problem, scan.ScanConfig(256, 32, staged=False), "sm_90", speedup=1.3, source="test")
    assert len(json.loads(path.read_text())["entries"]) == 1


def _record_buckets(path: str, exclusive: bool, start) -> None:
    """A process of its own recording 20 winners into the table at ``path`` once every process is ready."""
    spec = registry.get("scan")
    start.wait()
    for size in range(10, 30):
        problem = scan.ScanProblem(1, 1 << size, torch.float32, exclusive=exclusive)
        tuned.record(spec, problem, scan.ScanConfig(256, 32, staged=False), "sm_90", speedup=1.0, source="test",
                     path=Path(path))


def test_processes_recording_into_one_table_at_once_lose_no_entry(tmp_path):
    """Concurrent sweeps' --write-tuned read, change and rewrite one file: they take turns on it, so every
    winner either of them recorded is in it."""
    path = tmp_path / "scan-lookback.json"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [context.Process(target=_record_buckets, args=(str(path), exclusive, start)) for exclusive in (False, True)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    assert len(json.loads(path.read_text())["entries"]) == 40


def test_sweeps_write_the_users_tables_which_override_the_shipped_ones(tmp_path, monkeypatch):
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(tuned, "TUNED_DIR", shipped)
    monkeypatch.setenv("CUTE_KERNELS_TUNED_DIR", str(user))
    monkeypatch.setattr(tuned, "_tables", {})
    monkeypatch.setattr(tuned, "_choices", {})
    monkeypatch.setattr(tuned, "table_arch", lambda device_index: "sm_90")
    spec = registry.get("scan")
    problem = scan.ScanProblem(1, 1 << 24, torch.float32)
    other = scan.ScanProblem(1, 1 << 20, torch.float32)
    ships, mine = scan.ScanConfig(384, 24, staged=True), scan.ScanConfig(256, 32, staged=False)
    tuned.record(spec, problem, ships, "sm_90", speedup=1.2, source="test", path=shipped / "scan-lookback.json")
    tuned.record(spec, other, ships, "sm_90", speedup=1.2, source="test", path=shipped / "scan-lookback.json")
    assert tuned.record(spec, problem, mine, "sm_90", speedup=1.3, source="test") == user / "scan-lookback.json"
    assert len(json.loads((shipped / "scan-lookback.json").read_text())["entries"]) == 2  # untouched
    assert spec.choose_config(problem, 0) == mine  # the user's entry wins its bucket
    assert spec.choose_config(other, 0) == ships  # the shipped one still applies elsewhere
    # A malformed user table is reported and ignored; the shipped table still applies.
    (user / "scan-lookback.json").write_text("{not json")
    monkeypatch.setattr(tuned, "_tables", {})
    monkeypatch.setattr(tuned, "_choices", {})
    with pytest.warns(tuned.TunedTableWarning, match="user/scan-lookback.json"):
        assert spec.choose_config(problem, 0) == ships


def test_a_tuned_config_the_problem_cannot_take_falls_back(table):
    spec = registry.get("scan")
    problem = scan.ScanProblem(1, 1 << 24, torch.float64)
    tuned.record(spec, problem, scan.ScanConfig(512, 32, staged=True), "sm_90", speedup=1.1, source="test")
    small_smem = scan.ScanProblem(1, 1 << 24, torch.float64, shared_limit=64 * 1024)  # same bucket, less smem
    assert not spec.supports(scan.ScanConfig(512, 32, staged=True), small_smem)
    assert spec.choose_config(small_smem, 0) == spec.default_config(small_smem)


def test_unsupported_winner_is_refused_and_bad_files_are_loud(table):
    spec = registry.get("scan")
    problem = scan.ScanProblem(1, 1 << 24, torch.float32, vector=4)
    with pytest.raises(ValueError, match="refusing to record"):
        tuned.record(spec, problem, scan.ScanConfig(128, 2), "sm_90", speedup=1.0, source="test")
    path = table / "scan-lookback.json"
    path.write_text(json.dumps({"format": 1, "entries": [
        {"arch": "sm_90", "bucket": spec.shape_bucket(problem), "config": {"threads": 100}}]}))
    # Loud, naming the file, the entry and the field, and the op still runs (on its heuristic).
    with pytest.warns(tuned.TunedTableWarning, match="ScanConfig.threads") as caught:
        assert spec.choose_config(problem, 0) == spec.default_config(problem)
    assert len(caught) == 1 and str(path) in str(caught[0].message) and "entry 0" in str(caught[0].message)


def test_config_fields_are_taken_exactly_as_declared():
    """JSON values of the declared type pass as they are; anything else is refused, never converted."""
    config = tuned.config_from_fields(scan.ScanConfig, {"threads": 512, "items_per_thread": 32, "staged": False})
    assert config == scan.ScanConfig(512, 32, staged=False)
    assert type(config.threads) is int and config.staged is False
    with pytest.raises(ValueError, match="no field"):
        tuned.config_from_fields(scan.ScanConfig, {"warps": 4})
    for fields, fragment in [({"threads": "512"}, 'ScanConfig.threads: expected an int .*got "512"'),
                             ({"threads": 256.7}, "ScanConfig.threads: expected an int .*got 256.7"),
                             ({"threads": 256.0}, "ScanConfig.threads: expected an int .*got 256.0"),
                             ({"threads": True}, "ScanConfig.threads: expected an int .*got true"),
                             ({"threads": None}, "ScanConfig.threads: expected an int .*got null"),
                             ({"staged": "False"}, 'ScanConfig.staged: expected a bool .*got "False"'),
                             ({"staged": "yes"}, 'ScanConfig.staged: expected a bool .*got "yes"'),
                             ({"staged": 0}, "ScanConfig.staged: expected a bool .*got 0"),
                             ({"lookback": 1}, "ScanConfig.lookback: expected a str .*got 1"),
                             ({"lookback": ["early"]}, r'ScanConfig.lookback: expected a str .*got \["early"\]')]:
        with pytest.raises(TypeError, match=fragment):
            tuned.config_from_fields(scan.ScanConfig, fields)
    with pytest.raises(TypeError, match="expected a JSON object of fields"):
        tuned.config_from_fields(scan.ScanConfig, [["threads", 512]])


def test_float_and_tuple_fields_are_taken_without_conversion_too():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Shaped:
        scale: float = 1.0
        tiles: tuple[int, ...] = ()
        pair: tuple[int, str] = (0, "")

    fields = {"scale": 2, "tiles": [1, 2], "pair": [3, "x"]}
    assert tuned.config_from_fields(Shaped, fields) == Shaped(2, (1, 2), (3, "x"))
    for fields, fragment in [({"scale": True}, "Shaped.scale: expected a finite float"),
                             ({"scale": "1.5"}, "Shaped.scale: expected a finite float"),
                             ({"scale": float("nan")}, "Shaped.scale: expected a finite float"),
                             ({"tiles": [1, 2.5]}, "Shaped.tiles: expected an int .*got 2.5"),
                             ({"tiles": "12"}, "Shaped.tiles: expected a JSON array"),
                             ({"pair": [3]}, "Shaped.pair: expected a JSON array"),
                             ({"pair": [3, 4]}, "Shaped.pair: expected a str .*got 4")]:
        with pytest.raises(TypeError, match=fragment):
            tuned.config_from_fields(Shaped, fields)


def _entry(bucket, **config):
    return {"arch": "sm_90", "bucket": bucket, "config": config, "speedup": 1.2, "source": "test"}


_PROBLEM = scan.ScanProblem(1, 1 << 24, torch.float32)
_BUCKET = registry.get("scan").shape_bucket(_PROBLEM)
_GOOD = dict(threads=512, items_per_thread=32, staged=False)

# (what the file holds, a fragment of the warning): every way a tuned file can be wrong that a hand edit, a
# merge or a truncated write produces.
_CORRUPTIONS = [
    ("{not json", "not a readable JSON file"),
    (json.dumps({"format": 1, "entries": [_entry(_BUCKET, **_GOOD)]})[:-7], "not a readable JSON file"),
    ("", "not a readable JSON file"),
    (b"\xff\xfe{}", "not a readable JSON file"),
    (json.dumps([1, 2]), "expected a JSON object, got list"),
    (json.dumps({"format": 2, "entries": []}), "format 2, this version reads 1"),
    (json.dumps({"format": "1", "entries": []}), "format '1', this version reads 1"),
    (json.dumps({"format": True, "entries": []}), "format True, this version reads 1"),
    (json.dumps({"entries": []}), "format None"),
    (json.dumps({"format": 1, "entries": {"a": 1}}), 'expected "entries" to be a list'),
    (json.dumps({"format": 1, "op": "scan", "variant": "other", "entries": []}), "variant 'other', not 'lookback'"),
    (json.dumps({"format": 1, "op": "sgemm", "entries": []}), "op 'sgemm', not 'scan': another entry's table"),
    (json.dumps({"format": 1, "entries": [[1, 2]]}), "entry 0: expected a JSON object"),
    (json.dumps({"format": 1, "entries": [{"bucket": _BUCKET, "config": _GOOD}]}), "entry 0: expected 'arch'"),
    (json.dumps({"format": 1, "entries": [{"arch": "sm_90", "bucket": 7, "config": _GOOD}]}), "expected 'bucket'"),
    (json.dumps({"format": 1, "entries": [{"arch": "sm_90", "bucket": _BUCKET, "config": [1]}]}),
     "expected 'config' to be a JSON object"),
    (json.dumps({"format": 1, "entries": [_entry(_BUCKET, **dict(_GOOD, staged="yes"))]}),
     'entry 0 .*ScanConfig.staged: expected a bool .*got "yes"'),
    (json.dumps({"format": 1, "entries": [_entry(_BUCKET, **dict(_GOOD, threads=256.7))]}),
     "ScanConfig.threads: expected an int .*got 256.7"),
    (json.dumps({"format": 1, "entries": [_entry(_BUCKET, **dict(_GOOD, warps=4))]}), "ScanConfig has no field"),
    (json.dumps({"format": 1, "entries": [_entry(_BUCKET, **dict(_GOOD, threads=100))]}), "ScanConfig.threads"),
    (json.dumps({"format": 1, "entries": [_entry("other", **_GOOD), _entry(_BUCKET, **_GOOD),
                                          _entry(_BUCKET, **_GOOD)]}),
     "entry 2 .*a second entry for that arch and bucket"),
    ('{"format": 1, "entries": [{"arch": "sm_90", "bucket": "%s", "config": {"threads": 256, "threads": 512}}]}'
     % _BUCKET, r"the key\(s\) \['threads'\] appear twice"),
]


@pytest.mark.parametrize("content, fragment", _CORRUPTIONS, ids=range(len(_CORRUPTIONS)))
def test_a_malformed_file_is_reported_once_and_the_op_runs_its_heuristic(table, content, fragment):
    spec = registry.get("scan")
    path = table / "scan-lookback.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with pytest.warns(tuned.TunedTableWarning) as caught:
        config = spec.choose_config(_PROBLEM, 0)
    assert config == spec.default_config(_PROBLEM)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(str(path)) and "scan/lookback ignores this file" in message
    assert re.search(fragment, message), message
    # Once: later calls, of this problem or another, run on the heuristic without a word.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec.choose_config(_PROBLEM, 0) == config
        other = scan.ScanProblem(3, 1000, torch.float64)
        assert spec.choose_config(other, 0) == spec.default_config(other)
    # A sweep does not write over it (the file's other entries are someone's results): it says why.
    before = path.read_bytes()
    with pytest.raises(tuned.TunedTableError, match=re.escape(str(path))):
        tuned.record(spec, _PROBLEM, scan.ScanConfig(**_GOOD), "sm_90", speedup=1.1, source="test")
    assert path.read_bytes() == before


def test_a_directory_where_the_file_belongs_is_reported(table):
    spec = registry.get("scan")
    (table / "scan-lookback.json").mkdir()
    with pytest.warns(tuned.TunedTableWarning, match="not a readable JSON file"):
        assert spec.choose_config(_PROBLEM, 0) == spec.default_config(_PROBLEM)


def test_a_well_formed_file_loads_without_a_warning(table):
    spec = registry.get("scan")
    (table / "scan-lookback.json").write_text(json.dumps({"format": 1, "entries": [_entry(_BUCKET, **_GOOD)]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec.choose_config(_PROBLEM, 0) == scan.ScanConfig(**_GOOD)


@pytest.mark.parametrize("spec", [s for s in registry.list() if tuned.path_for(s).is_file()], ids=str)
def test_every_shipped_file_loads_without_a_warning(spec, monkeypatch):
    monkeypatch.setattr(tuned, "_tables", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = tuned._load(spec)
    assert table, f"{tuned.path_for(spec)} holds no entries"


@pytest.mark.parametrize("spec", [s for s in registry.list() if s.shape_bucket is not None], ids=str)
def test_shipped_tables_load_and_apply_to_their_standard_problems(spec):
    """Every file under cute_kernels/tuned/ parses into valid configs from the entry's own sweep space, and
    the standard problems a sweep tuned on the H200 get their recorded winner back from choose()."""
    table = tuned._load(spec)
    candidates = set(spec.candidates())
    for (arch, bucket), config in table.items():
        assert arch.startswith("sm_") and bucket
        assert config in candidates, f"{spec}: tuned {config} for {bucket} is not a candidate"
    for problem in spec.standard_problems():
        config = table.get(("sm_90", spec.shape_bucket(problem)))
        if config is not None:
            assert spec.supports(config, problem)
