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
