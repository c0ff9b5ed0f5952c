"""Plans on the GPU (runtime.plans): a repeated call of one structure runs its plan on its own tensors,
values and stream, with the same results as a first call, and still refuses what depends on the values."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.attention import op as attention_op
from cute_kernels.ops.conv3d import op as conv3d_op
from cute_kernels.ops.gemm import hgemm as hgemm_module
from cute_kernels.ops.gemm import sgemm as sgemm_module
from cute_kernels.ops.scan import op as scan_op
from cute_kernels.runtime import plans

pytestmark = pytest.mark.gpu


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, device="cuda", dtype=dtype)


# (name, the op's plans, call, inputs maker): small ragged problems of every op and variant; the float scan
# fits one tile, where its sums are bitwise repeatable.
CASES = [
    ("sgemm", sgemm_module._PLANS, lambda a, b, c: ck.sgemm(a, b, c, alpha=1.5, beta=-0.5),
     lambda: (_randn(67, 33), _randn(33, 45), _randn(67, 45))),
    ("hgemm_sm80", hgemm_module._PLANS, lambda a, b: ck.hgemm(a, b),
     lambda: (_randn(130, 72, dtype=torch.float16), _randn(72, 56, dtype=torch.float16))),
    ("hgemm_sm90", hgemm_module._PLANS, lambda a, b: ck.hgemm(a, b),
     lambda: (_randn(1024, 1024, dtype=torch.bfloat16), _randn(1024, 1024, dtype=torch.bfloat16))),
    ("flash", attention_op._PLANS, lambda q, k, v: ck.attention(q, k, v, causal=True),
     lambda: tuple(_randn(2, 3, 77, 64, dtype=torch.float16) for _ in range(3))),
    ("fused_fp32_split", attention_op._PLANS, lambda q, k, v: ck.attention(q, k, v, scale=0.3),
     lambda: (_randn(50, 40), _randn(700, 40), _randn(700, 40))),
    ("conv3d", conv3d_op._PLANS, lambda vol, ker: ck.conv3d(vol, ker), lambda: (_randn(2, 9, 10, 13), _randn(3, 2, 5))),
    ("scan", scan_op._PLANS, lambda x: ck.scan(x), lambda: (_randn(5, 1000),)),
    ("scan_int", scan_op._PLANS, lambda x: ck.scan(x, exclusive=True),
     lambda: (torch.randint(-100, 100, (40_000,), device="cuda", dtype=torch.int32),)),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_repeat_runs_its_plan_on_its_own_tensors(case):
    """The second call of a structure runs the first call's plan (no new plan), on its own inputs: its
    result is what a first call (a fresh plan) gives for those inputs, bit for bit."""
    _, op_plans, fn, make = case
    torch.manual_seed(0)
    first, second = make(), make()
    plans.clear_all()
    expected = fn(*second).clone()  # a first call: prepared afresh
    plans.clear_all()
    fn(*first)
    assert len(op_plans) == 1
    got = fn(*second)
    assert len(op_plans) == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_plan_launches_on_the_callers_current_stream(case):
    """A plan made on the default stream, repeated on a side stream that sleeps and only then writes the
    inputs: a launch on any other stream would read the old values."""
    _, _, fn, make = case
    torch.manual_seed(1)
    old, new = make(), make()
    inputs = tuple(x.clone() for x in old)
    fn(*inputs)  # the plan
    expected = fn(*new).clone()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for x, value in zip(inputs, new):
            x.copy_(value)
        got = fn(*inputs)
    side.synchronize()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_beta_whose_float32_zero_differs_from_the_plans_takes_the_full_path():
    """beta=1e-50 is 0 in float32: the plan made for beta=0.5 reads C, so a call with 1e-50 must not run it
    (C holds NaN here)."""
    a, b, c = _randn(40, 24), _randn(24, 56), _randn(40, 56)
    ck.sgemm(a, b, c, beta=0.5)
    got = ck.sgemm(a, b, torch.full_like(c, float("nan")), beta=1e-50)
    expected = ck.sgemm(a, b)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["sgemm", "attention", "conv3d", "scan"])
def test_a_repeat_checks_out_writability_and_bumps_its_version(op):
    """Whether ``out`` may be written is no structure: an inference tensor of the planned ``out``'s
    structure is refused on the plan path, untouched; a normal one gets its version bumped per write."""
    q = _randn(1, 2, 33, 64, dtype=torch.float16)
    calls = {
        "sgemm": (lambda out: ck.sgemm(_randn(8, 8), _randn(8, 8), out=out), (8, 8), torch.float32),
        "attention": (lambda out: ck.attention(q, q, q, out=out), q.shape, torch.float16),
        "conv3d": (lambda out: ck.conv3d(_randn(6, 6, 6), _randn(3, 3, 3), out=out), (4, 4, 4), torch.float32),
        "scan": (lambda out: ck.scan(_randn(100), out=out), (100,), torch.float32),
    }
    call, shape, dtype = calls[op]
    out = torch.empty(shape, device="cuda", dtype=dtype)
    call(out)
    version = out._version
    call(out)
    assert out._version > version
    with torch.inference_mode():
        frozen = torch.full(shape, 7.0, device="cuda", dtype=dtype)
    with pytest.raises(ValueError, match="^out: an inference tensor cannot be written"):
        call(frozen)
    torch.cuda.synchronize()
    assert bool((frozen == 7.0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_repeat_that_needs_a_gradient_is_still_recorded(dtype):
    """requires_grad is not structure: a repeat of a planned call that needs a gradient is recorded (its
    output has a grad_fn) in grad mode each time, and not under no_grad, whatever plan the structure has."""
    q = _randn(16, 64, dtype=dtype)
    a, b = _randn(16, 16, dtype=dtype), _randn(16, 16, dtype=dtype)
    gemm = ck.sgemm if dtype == torch.float32 else ck.hgemm
    for op, args in ((ck.attention, (q, q)), (gemm, (b,))):
        first = q if op is ck.attention else a
        op(first, *args)
        assert op(first.clone().requires_grad_(), *args).grad_fn is not None
        with torch.no_grad():  # planned apart from the grad-mode calls
            assert op(first.clone().requires_grad_(), *args).grad_fn is None
        assert op(first.clone().requires_grad_(), *args).grad_fn is not None


def test_the_custom_ops_run_the_plans_too():
    """torch.ops.cute_kernels.* call the eager ops, so a repeat through them runs a plan as well."""
    x = _randn(3, 500)
    plans.clear_all()
    torch.ops.cute_kernels.scan(x, False)
    torch.ops.cute_kernels.scan(_randn(3, 500), False)
    assert len(scan_op._PLANS) == 1
    torch.testing.assert_close(torch.ops.cute_kernels.scan(x, False), ck.scan(x), rtol=0, atol=0)


def test_the_ops_own_keys_keep_structures_apart():
    """The GEMMs', scan's and attention's commonest calls build their key written out (CallPlans.keyed): calls that
    differ in any part of the structure (a pointer's alignment, a transposed or negated operand, a dtype,
    beta's zero-ness, a flag) get plans of their own and the right results; the same structure again gets
    none."""
    torch.manual_seed(0)
    a, b = _randn(64, 48), _randn(48, 40)
    a_offset = _randn(64 * 48 + 1)[1:].view(64, 48)  # 4 bytes past a 32-byte boundary
    a_offset.copy_(a)
    c_full, bias = _randn(64, 40), _randn(40)
    out_plain, out_wide = torch.empty(64, 40, device="cuda"), torch.empty(64, 48, device="cuda")[:, :40]
    plans.clear_all()
    calls = [
        (lambda: ck.sgemm(a, b), lambda: a @ b),
        (lambda: ck.sgemm(a_offset, b), lambda: a @ b),
        (lambda: ck.sgemm(a, b.t().contiguous().t()), lambda: a @ b),
        (lambda: ck.sgemm(a, b, alpha=2.0, beta=1e-50), lambda: 2 * (a @ b)),  # beta 0 in float32, no c needed
        (lambda: ck.sgemm(a, b, c_full, beta=1.0), lambda: a @ b + c_full),
        (lambda: ck.sgemm(a, b, bias, beta=1.0), lambda: a @ b + bias),
        (lambda: ck.sgemm(a, b, c_full, beta=0.0), lambda: a @ b),  # c not read: its own structure
        (lambda: ck.hgemm(a.half(), b.half()), lambda: (a.half().float() @ b.half().float())),
        (lambda: ck.sgemm(a, b, out=out_plain), lambda: a @ b),  # out in the key: its structure
        (lambda: ck.sgemm(a, b, out=out_wide), lambda: a @ b),  # a leading dimension of 48
        (lambda: ck.sgemm(a, b, c_full, beta=1.0, out=out_plain), lambda: a @ b + c_full),
    ]
    for ours, reference in calls:
        torch.testing.assert_close(ours().float(), reference(), rtol=2e-3, atol=2e-3)
    kept = len(sgemm_module._PLANS) + len(hgemm_module._PLANS)
    assert kept == len(calls) - 1  # alpha=2.0, beta=1e-50 is (a, b)'s structure: a value, and 0 in float32
    for ours, _ in calls:
        ours()
    assert len(sgemm_module._PLANS) + len(hgemm_module._PLANS) == kept
    with pytest.raises(ValueError, match="negative bit"):
        ck.sgemm(torch._neg_view(a), b)  # a negated view never finds the plain view's plan
    x = _randn(3, 1000)
    before = len(scan_op._PLANS)
    torch.testing.assert_close(ck.scan(x), torch.cumsum(x, -1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ck.scan(x, exclusive=True), torch.cumsum(x, -1) - x, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ck.scan(x, reverse=True), torch.cumsum(x.flip(-1), -1).flip(-1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ck.scan(x, dim=0), torch.cumsum(x, 0), rtol=1e-4, atol=1e-3)
    scanned = torch.empty_like(x)
    torch.testing.assert_close(ck.scan(x, out=scanned), torch.cumsum(x, -1), rtol=1e-4, atol=1e-3)
    y = x.clone()
    torch.testing.assert_close(ck.scan(y, out=y), torch.cumsum(x, -1), rtol=1e-4, atol=1e-3)  # in place
    assert len(scan_op._PLANS) == before + 5  # out=x has scanned's structure
    q, k, v = (_randn(1, 4, 100, 64, dtype=torch.float16) for _ in range(3))
    k_gqa, v_gqa = k[:, :2].contiguous(), v[:, :2].contiguous()
    attended = torch.empty_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    before = len(attention_op._PLANS)
    for ours, reference in [
        (lambda: ck.attention(q, k, v), lambda: sdpa(q, k, v)),
        (lambda: ck.attention(q, k, v, causal=True), lambda: sdpa(q, k, v, is_causal=True)),
        (lambda: ck.attention(q, k, v, scale=0.5), lambda: sdpa(q, k, v, scale=0.5)),
        (lambda: ck.attention(q, k_gqa, v_gqa), lambda: sdpa(q, k_gqa, v_gqa, enable_gqa=True)),
        (lambda: ck.attention(q, k, v, out=attended), lambda: sdpa(q, k, v)),
    ]:
        for _ in range(2):
            torch.testing.assert_close(ours(), reference(), rtol=2e-3, atol=2e-3)
    assert len(attention_op._PLANS) == before + 5
