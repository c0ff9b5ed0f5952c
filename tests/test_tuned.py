"""Tuned defaults (CPU): recording a winner, reading it back, falling back where it does not apply."""

import json

import pytest
import torch

from cute_kernels import registry, tuned
from cute_kernels.ops import scan


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
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
    (table / "scan-lookback.json").write_text(json.dumps({"format": 1, "entries": [
        {"arch": "sm_90", "bucket": spec.shape_bucket(problem), "config": {"threads": 100}}]}))
    with pytest.raises(ValueError, match="ScanConfig.threads"):
        spec.choose_config(problem, 0)


def test_config_fields_are_typed():
    config = tuned.config_from_fields(scan.ScanConfig, {"threads": "512", "items_per_thread": 32, "staged": "False"})
    assert config == scan.ScanConfig(512, 32, staged=False)
    with pytest.raises(ValueError, match="no field"):
        tuned.config_from_fields(scan.ScanConfig, {"warps": 4})


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
