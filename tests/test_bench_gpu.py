"""bench's race of configs (GPU): the probes' shared loop verifies every config before timing it, times the
passing ones beside the baseline and the caller's other functions, and leaves a failing config untimed."""

import dataclasses

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.scan.linear import LinearScanProblem
from cute_kernels.ops.scan import ScanConfig
from cute_kernels.tools import bench

pytestmark = pytest.mark.gpu


def test_race_configs_times_what_passes_beside_the_baseline_and_others():
    spec = registry.get("linear_scan", "lookback")
    problem = LinearScanProblem(64, 4096)
    rows, inline = ScanConfig(256, 16, False, "rows"), ScanConfig(256, 16, False, "inline")
    add = {"add": lambda inputs, out: torch.add(inputs["a"], inputs["x"], out=out)}
    verdicts, times = bench.race_configs(spec, problem, [rows, inline], reps=5, others=add,
                                         generator=torch.Generator(device="cuda").manual_seed(0))
    assert verdicts[rows] and verdicts[inline]
    assert set(times) == {"baseline", "add", rows, inline}
    assert all(t > 0 for t in times.values())


def test_race_configs_leaves_a_failing_config_untimed():
    entry = registry.get("linear_scan", "lookback")
    problem = LinearScanProblem(64, 4096)
    good, bad = ScanConfig(256, 16, False, "rows"), ScanConfig(128, 8, False, "rows")
    # A config whose launch writes nothing: its poisoned output fails the oracle.
    spec = dataclasses.replace(entry, launch=lambda c, p, i, o: None if c == bad else entry.launch(c, p, i, o))
    verdicts, times = bench.race_configs(spec, problem, [good, bad], reps=3)
    assert verdicts[good] and not verdicts[bad]
    assert bad not in times and good in times
