"""runtime.plans on the CPU: what a call's structure is (the key), which calls have none, the bound, and
who clears the plans."""

import numpy as np
import pytest
import torch

from cute_kernels import registry, tuned
from cute_kernels.runtime import cute_compile, nvrtc
from cute_kernels.runtime.plans import CallPlans

key = CallPlans.key


def test_same_structure_same_key_other_values_too():
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    assert key(a, 1.5, None, True) == key(b, -2.0, None, True)
    assert key(a, 1.5) == key(a, 0.0)  # float values are the plan's to check, not structure


@pytest.mark.parametrize("first, second", [
    (True, 1), (False, 0), (True, np.bool_(True)), (1, 1.0), (None, 0.0), ("flash2_mma", "fused_fp32"),
], ids=["bool-int", "false-zero", "bool-numpy", "int-float", "none-float", "variants"])
def test_values_of_other_kinds_are_structure(first, second):
    """True == 1 and hash alike in Python: a key must still tell them apart (a flag the full checks refuse
    must not find a plan made for a bool)."""
    assert key(first) != key(second)


def test_every_tensor_property_a_check_reads_is_in_the_key():
    base = torch.randn(64, 32)
    storage = torch.empty(4096)
    variants = {
        "dtype": base.double(),
        "shape": torch.randn(64, 33),
        "strides": torch.randn(32, 64).t(),
        "alignment": storage[1:2049].view(64, 32),
        "negative bit": torch._neg_view(base),
    }
    assert key(storage[:2048].view(64, 32)) == key(base)  # 32-byte aligned both
    for name, t in variants.items():
        assert key(t) != key(base), name


def test_a_call_that_needs_a_gradient_is_refused_before_any_plan():
    """requires_grad is not structure: the public op refuses such a call before the op (and its plans)
    sees it, whatever plan its structure has."""
    import cute_kernels as ck

    # A call with out= whose inputs require grad is refused, as torch's differentiable ops refuse it.
    q = torch.randn(4, 8, requires_grad=True)
    out = torch.full((4, 8), float("nan"))
    with pytest.raises(ValueError, match=r"^out: ck\.attention with out= does not support automatic differentiation"):
        ck.attention(q, q.detach(), q.detach(), out=out)
    assert torch.isnan(out).all()


def test_the_flat_key_keeps_values_apart():
    """One flat tuple for all values: a tensor's six parts cannot be read as other values' parts."""
    t = torch.randn(2)
    assert key(t, None) != key(None, t) and key(1.0, None) != key(None, 1.0)
    assert key("a", "b") != key(("a", "b"))


def test_calls_without_a_structure_get_no_plan():
    """A tensor subclass (a FakeTensor among them) has no key; an unhashable value has a key that no plan
    can be stored or found under: both take the op's full path."""

    class Sub(torch.Tensor):
        pass

    assert key(torch.randn(3).as_subclass(Sub)) is None
    calls = CallPlans("test")
    unhashable = key(torch.randn(3), [1, 2])
    calls.remember(unhashable, "plan")
    assert calls.get(unhashable) is None and len(calls) == 0
    calls.remember(None, "plan")
    assert calls.get(None) is None and len(calls) == 0


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: sparse CSR and nested tensors are beta/prototype
@pytest.mark.parametrize("make", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr, torch.Tensor.to_mkldnn,
                                  lambda t: torch.nested.nested_tensor([t])],
                         ids=["sparse_coo", "sparse_csr", "mkldnn", "nested"])
def test_tensors_without_strides_or_storage_have_no_key(make):
    """Their strides or data pointer raise: no key (the full path's checks name the argument), not a crash."""
    t = make(torch.randn(4, 4))
    assert key(torch.randn(2), t, 1.0) is None


def test_plans_are_bounded():
    calls = CallPlans("test", max_entries=3)
    for i in range(3):
        calls.remember(key(torch.randn(i + 1)), i)
    assert len(calls) == 3
    calls.remember(key(torch.randn(1)), "again")  # a known key replaces, it does not clear
    assert len(calls) == 3
    calls.remember(key(torch.randn(9)), "new")
    assert len(calls) == 1


def _filled() -> CallPlans:
    calls = CallPlans("test")
    calls.remember(key(torch.randn(2)), "plan")
    assert len(calls) == 1
    return calls


def test_clearing_a_compile_or_kernel_cache_clears_every_plan():
    calls = _filled()
    cute_compile.CompileCache().clear()
    assert len(calls) == 0
    calls = _filled()
    nvrtc.clear_memory_cache()
    assert len(calls) == 0


def test_writing_a_tuned_table_clears_every_plan(tmp_path):
    """A plan holds the config chosen when it was made; a new winner must reach the next call."""
    spec = registry.get("scan")
    problem = spec.standard_problems()[0]
    calls = _filled()
    tuned.record(spec, problem, spec.default_config(problem), "sm_90", speedup=1.0, source="test",
                 path=tmp_path / "scan.json")
    assert len(calls) == 0


def test_every_op_keeps_its_plans_by_structure():
    """Each public op's module holds one CallPlans (the ones the ops' fast path reads)."""
    from cute_kernels.ops.attention import op as attention_op
    from cute_kernels.ops.conv3d import op as conv3d_op
    from cute_kernels.ops.gemm import hgemm, sgemm
    from cute_kernels.ops.scan import op as scan_op

    for module in (sgemm, hgemm, attention_op, conv3d_op, scan_op):
        assert isinstance(module._PLANS, CallPlans), module.__name__


def test_a_structure_is_prepared_once_and_never_under_a_dispatch_mode():
    """CallPlans.plan: the first call of a structure prepares (with the call's own arguments), a repeat
    finds that plan; under any dispatch mode every call prepares afresh and nothing is kept."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    calls = CallPlans("test")
    prepared = []

    def prepare(x, flag):
        prepared.append((x.shape, flag))
        return ("plan", len(prepared))

    a, b = torch.randn(3), torch.randn(3)
    assert calls.plan((a, True), prepare, a, True) == ("plan", 1)
    assert calls.plan((b, True), prepare, b, True) == ("plan", 1)  # same structure: no prepare
    assert calls.plan((b, False), prepare, b, False) == ("plan", 2)
    with Passing():
        assert calls.plan((a, True), prepare, a, True) == ("plan", 3)
        assert calls.keyed(("own", 1), prepare, a, True) == ("plan", 4)
    assert len(calls) == 2 and prepared[-1] == (a.shape, True)
    assert calls.keyed(("own", 1), prepare, a, True) == ("plan", 5)  # an op's own key: kept as plan's are
    assert calls.keyed(("own", 1), prepare, b, True) == ("plan", 5)
    assert len(calls) == 3


@pytest.mark.parametrize("t, canonical", [
    (torch.empty(3, 4), True), (torch.empty(3, 4).t(), False), (torch.empty(1, 4).as_strided((1, 4), (9, 1)), False),
    (torch.empty(2, 0, 3), True), (torch.empty(()), True), (torch.empty(6)[::2], False),
])
def test_canonical_strides_are_a_fresh_tensors_exactly(t, canonical):
    """A plan allocates its result with empty_like(input) only where that is the fresh contiguous tensor."""
    from cute_kernels.runtime.checks import has_canonical_strides

    assert has_canonical_strides(t) is canonical
    if canonical:
        assert torch.empty_like(t).stride() == t.stride() == torch.empty(t.shape).stride()
