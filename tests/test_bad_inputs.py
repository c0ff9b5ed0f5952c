"""The bad-input suite (cute_kernels/bad_inputs.py): every case on the GPU, and on any machine the cases
that must fail before a GPU is touched."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels import bad_inputs


def _ids(case):
    return f"{case.op}-{case.name}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", bad_inputs.cases(), ids=_ids)
def test_case(case):
    outcome = bad_inputs.run_case(case)
    assert not outcome.startswith("WRONG"), outcome
    assert outcome.startswith("ok" if case.expect == "ok" else "error")


def _cpu(*shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype)


@pytest.mark.parametrize("call, arg", [
    (lambda: ck.sgemm(_cpu(4, 4), _cpu(4, 4)), "a"),
    (lambda: ck.sgemm(_cpu(4, 4), _cpu(5, 4)), "b"),
    (lambda: ck.sgemm(_cpu(8, 4).t(), _cpu(8, 4)), "a"),
    (lambda: ck.sgemm(_cpu(4, 4), _cpu(4, 4), beta=1.0), "c"),
    (lambda: ck.hgemm(_cpu(4, 4), _cpu(4, 4)), "a"),
    (lambda: ck.hgemm(_cpu(4, 4, dtype=torch.float16), _cpu(4, 4)), "b"),
    (lambda: ck.sgemm([[1.0]], _cpu(1, 1)), "a"),
    (lambda: ck.attention(_cpu(8, 64), _cpu(8, 64), _cpu(8, 64)), "q"),
    (lambda: ck.conv3d(_cpu(4, 8, 8), _cpu(5, 3, 3)), "kernel"),
    (lambda: ck.conv3d(_cpu(8, 8), _cpu(3, 3, 3)), "volume"),
    (lambda: ck.conv3d(_cpu(9, 9, 9), _cpu(8, 1, 1)), "kernel"),
    (lambda: ck.scan(_cpu(10)), "x"),
    (lambda: ck.scan("x"), "x"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_errors_before_any_gpu_work_name_the_argument(call, arg):
    with pytest.raises((TypeError, ValueError), match=f"^{arg}:"):
        call()


def test_the_suite_covers_every_public_op():
    assert {c.op for c in bad_inputs.cases()} == {"sgemm", "hgemm", "attention", "conv3d", "scan"}
    for op in ("sgemm", "hgemm", "attention", "conv3d", "scan"):
        expects = {c.expect for c in bad_inputs.cases() if c.op == op}
        assert "ok" in expects and len(expects) >= 3, (op, expects)  # right answers and several named errors
