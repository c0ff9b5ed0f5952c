"""The bad-input suite (cute_kernels/tools/bad_inputs.py): every case on the GPU, and on any machine the cases
that must fail before a GPU is touched."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels.tools import bad_inputs


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
    (lambda: ck.conv3d(_cpu(20, 9, 9), _cpu(0, 1, 1)), "kernel"),  # a side of 0
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


def _attention_overlap():
    q, k, v = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    return (lambda out: ck.attention(q, k, v, out=out)), torch.empty_like(q), q


def _conv3d_overlap():
    storage = torch.randn(2 * 12 ** 3, device="cuda")
    vol, ker = storage[:12 ** 3].view(12, 12, 12), torch.randn(3, 3, 3, device="cuda")
    into_vol = storage[:10 ** 3].view(10, 10, 10)  # the right shape, but inside the volume's memory
    return (lambda out: ck.conv3d(vol, ker, out=out)), storage[12 ** 3:12 ** 3 + 10 ** 3].view(10, 10, 10), into_vol


@pytest.mark.gpu
@pytest.mark.parametrize("make", [_attention_overlap, _conv3d_overlap], ids=["attention", "conv3d"])
def test_a_repeat_of_a_validated_call_still_checks_out_overlap(make):
    """Ops remember the structure of calls that passed their checks and run a repeat from its plan
    (runtime.plans); which memory ``out`` overlaps is not structure, so a repeat whose ``out``
    overlaps an input (same dtype, shape, strides and alignment as the good one) must still be refused."""
    call, good_out, bad_out = make()
    call(good_out)
    call(good_out)
    before = bad_out.clone()
    with pytest.raises(ValueError, match="out: overlaps"):
        call(bad_out)
    torch.cuda.synchronize()
    assert torch.equal(bad_out, before)


@pytest.mark.gpu
def test_a_repeat_of_a_validated_attention_call_still_checks_the_scale():
    q, k, v = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    ck.attention(q, k, v, scale=0.5)
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), (1 + 2j, TypeError)):
        with pytest.raises(error, match="scale"):
            ck.attention(q, k, v, scale=bad)
