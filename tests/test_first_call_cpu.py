"""tools.first_call (CPU): every case's child program is valid Python, timed and profiled alike."""

import ast
import importlib.util
from pathlib import Path

import pytest

from cute_kernels.tools import first_call

PROBE = Path(__file__).resolve().parents[1] / "scripts" / "probes" / "first_call_profile.py"


def _probe():
    spec = importlib.util.spec_from_file_location("first_call_profile", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", first_call.CASES, ids=[f"{c[0]}-{c[1]}" for c in first_call.CASES])
def test_child_programs_parse(case):
    _, _, setup, ours, theirs = case
    for call in (ours, theirs):
        code = first_call.child_code(setup, first_call._TIMED.format(call=call))
        ast.parse(code)
        assert code.index(setup) < code.index(call)  # inputs made before the timed call
    ast.parse(first_call.child_code(setup, _probe()._PROFILED.format(call=ours)))


def test_torch_side_runs_without_our_warm_up_thread(monkeypatch):
    """Each child's environment: ours keep the caller's warm-up switch, torch's has it off (its process imports
    cute_kernels for the prelude, and our background imports must not run beside torch's first call)."""
    seen = []

    class Done:
        returncode, stdout, stderr = 0, "[0.5, 0.25]\n", ""

    def run(args, env, **kwargs):
        seen.append((args[-1], env.get("CUTE_KERNELS_WARM_UP")))
        return Done()

    monkeypatch.delenv("CUTE_KERNELS_WARM_UP", raising=False)
    monkeypatch.setattr(first_call.subprocess, "run", run)
    monkeypatch.setattr(first_call, "CASES", first_call.CASES[:1])
    (row,) = first_call.measure()
    _, _, _, ours, theirs = first_call.CASES[0]
    assert [switch for _, switch in seen] == [None, None, "0"]
    assert ours in seen[0][0] and ours in seen[1][0] and theirs in seen[2][0]
    assert row["warm_s"] == 0.5 and row["torch_steady_s"] == 0.25
