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


def _gemm_overlap(op, dtype):
    def make():
        storage = torch.randn(3 * 64 * 64, device="cuda", dtype=dtype)
        a, b = storage[:64 * 64].view(64, 64), torch.randn(64, 64, device="cuda", dtype=dtype)
        # 2048 elements on: the alignment of the good out's, and half of a's rows
        into_a = storage[64 * 32:64 * 96].view(64, 64)
        return (lambda out: op(a, b, out=out)), storage[64 * 128:].view(64, 64), into_a, "out: must not overlap input a"
    return make


def _gemm_c_overlap():
    storage = torch.randn(3 * 64 * 64, device="cuda")
    a, b, c = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda"), storage[:64 * 64].view(64, 64)
    return ((lambda out: ck.sgemm(a, b, c, beta=1.0, out=out)), storage[64 * 128:].view(64, 64),
            storage[64 * 32:64 * 96].view(64, 64), "out: must be c itself")


def _scan_overlap():
    storage = torch.randn(3072, device="cuda")
    x = storage[:1024]
    return (lambda out: ck.scan(x, out=out)), storage[2048:3072], storage[8:1032], "out: overlaps the memory of x"


def _linear_scan_overlap():
    storage = torch.rand(3072, device="cuda")
    a, x = storage[:1024], torch.randn(1024, device="cuda")
    return ((lambda out: ck.linear_scan(a, x, out=out)), storage[2048:3072], storage[8:1032],
            "out: overlaps the memory of a")


def _named(make, message="out: overlaps"):
    return lambda: (*make(), message)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [
    _named(_attention_overlap), _named(_conv3d_overlap), _gemm_overlap(ck.sgemm, torch.float32),
    _gemm_overlap(ck.hgemm, torch.float16), _gemm_c_overlap, _scan_overlap, _linear_scan_overlap,
], ids=["attention", "conv3d", "sgemm", "hgemm", "gemm-c", "scan", "linear_scan"])
def test_a_repeat_of_a_validated_call_still_checks_out_overlap(make):
    """Ops remember the structure of calls that passed their checks and run a repeat from its plan
    (runtime.plans), whose overlap checks compare data pointers against the spans of the first call's tensors
    (checks.OutGuard); which memory ``out`` overlaps is not structure, so a repeat whose ``out`` overlaps an
    input (same dtype, shape, strides and alignment as the good one) must still be refused, with the full
    check's message, and a good ``out`` again after it still runs."""
    call, good_out, bad_out, message = make()
    call(good_out)
    expected = good_out.clone()
    call(good_out)
    before = bad_out.clone()
    with pytest.raises(ValueError, match=message):
        call(bad_out)
    torch.cuda.synchronize()
    assert torch.equal(bad_out, before)
    good_out.fill_(float("nan"))
    call(good_out)
    torch.cuda.synchronize()
    torch.testing.assert_close(good_out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("first", ["fresh", "after-a-good-call"])
def test_scan_in_place_needs_x_of_outs_element_size(first):
    """An int32 sum's result is int64: an int32 view of ``out`` at its start is not ``x`` in place (each
    int64 written would overwrite two int32 not yet read), neither on a first call nor on a repeat."""
    out = torch.zeros(4096, dtype=torch.int64, device="cuda")
    x = out.view(torch.int32)[:4096]
    x.copy_(torch.arange(4096, dtype=torch.int32, device="cuda"))
    if first == "after-a-good-call":
        apart_x, apart_out = x.clone(), torch.empty_like(out)
        ck.scan(apart_x, out=apart_out)
        assert torch.equal(apart_out, torch.cumsum(apart_x, 0))
    before = out.clone()
    with pytest.raises(ValueError, match="out: overlaps the memory of x"):
        ck.scan(x, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, before)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["scan", "sgemm-c", "sgemm-bias-row-of-out"])
def test_a_repeat_in_place_is_still_allowed(op):
    """``out`` may be exactly the input an op reads in place (scan's x, a GEMM's c): the plan's pointer
    guard lets a repeat through where the first call went, and the result is the fresh call's. A bias row
    that is out's own first row (``c = out[:1]``) is not exactly out: the guard is not clear, the full check
    admits it as in place, and the row is copied before the kernel writes over it, on every repeat."""
    if op == "sgemm-bias-row-of-out":
        a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
        row = torch.randn(1, 64, device="cuda")
        ref = a.double() @ b.double() + row.double()
        for _ in range(3):
            out = torch.full((64, 64), float("nan"), device="cuda")
            out[:1] = row
            assert ck.sgemm(a, b, out[:1], beta=1.0, out=out) is out
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)
    elif op == "scan":
        x = torch.randn(4096, device="cuda")
        ref = torch.cumsum(x.double(), 0)
        for _ in range(3):
            y = x.clone()
            assert ck.scan(y, out=y) is y
            torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-3)
    else:
        a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
        c0 = torch.randn(64, 64, device="cuda")
        ref = a.double() @ b.double() + c0.double()
        for _ in range(3):
            c = c0.clone()
            assert ck.sgemm(a, b, c, beta=1.0, out=c) is c
            torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_a_repeat_of_a_validated_attention_call_still_checks_the_scale():
    q, k, v = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    ck.attention(q, k, v, scale=0.5)
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), (1 + 2j, TypeError)):
        with pytest.raises(error, match="scale"):
            ck.attention(q, k, v, scale=bad)
