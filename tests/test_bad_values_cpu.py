"""Bad argument values that once gave silent wrong answers or crashes (issue 20, classes 3, 4, 6, 7, 8, 9),
checked without a GPU: every call is refused with an error naming the argument, before any allocation or
write, and a poisoned ``out`` is left as it was.

- 3: scalars are decided in float32, the precision the kernels take them in (``checks.float32_scalar``).
- 4: aliasing is decided by addresses, not storage objects (DLPack views).
- 6: boolean arguments take bools (numpy bools too), nothing else (``checks.flag``).
- 7: views with the negative or conjugate bit are refused (``checks.tensor``).
- 8: fake tensors and fake modes are refused before anything reads a pointer (``checks.no_fake``); meta
  tensors by the device checks.
- 9: extents and tile counts stay within the kernels' 32-bit indexing (``gemm.problem``; conv3d's and
  attention's sides, with a tile of margin).

Where an op's device check comes before the check under test, ``device_checks_pass`` lets CPU tensors
through it (the rest of ``checks.tensor`` still runs); the launch is never reached on a refused call.
"""

import math

import numpy as np
import pytest
from scan_stub import route_scan_to_stub
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import cute_kernels as ck
from cute_kernels import registry, torch_ops
from cute_kernels.ops.attention import op as attention_op
from cute_kernels.ops.attention.problem import LOG2E, _check_scale
from cute_kernels.ops.conv3d import op as conv3d_op
from cute_kernels.ops.gemm import hgemm as hgemm_op
from cute_kernels.ops.gemm import sgemm as sgemm_op
from cute_kernels.ops.scan import op as scan_op
from cute_kernels.runtime.plans import CallPlans
from cute_kernels.ops.conv3d.problem import COORD_MARGIN
from cute_kernels.ops.gemm import op as gemm_op
from cute_kernels.ops.gemm.hgemm_sm80 import candidates as sm80_candidates
from cute_kernels.ops.gemm.hgemm_sm90 import candidates as sm90_candidates
from cute_kernels.ops.gemm.problem import MAX_EXTENT, GemmProblem, index_problem
from cute_kernels.ops.gemm.sgemm import candidates as sgemm_candidates
from cute_kernels.ops.gemm.sgemm_tf32x3 import candidates as tf32x3_candidates
from cute_kernels.ops.gemm.sgemm_config import GemmConfig
from cute_kernels.runtime import checks

NAN = float("nan")
F16 = torch.float16


@pytest.fixture
def device_checks_pass(monkeypatch):
    """CPU tensors pass the CUDA-device check (only that part of ``checks.cuda_tensor``), and every op's
    repeat-call memory starts empty, so each call takes the full checks first."""
    real_tensor = checks.tensor
    monkeypatch.setattr(checks, "cuda_tensor", lambda name, t: real_tensor(name, t))
    for module in (sgemm_op, hgemm_op, attention_op, conv3d_op, scan_op):
        monkeypatch.setattr(module, "_PLANS", CallPlans(module.__name__))


def poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, NAN, dtype=dtype)


def untouched(t):
    return bool(torch.isnan(t).all())


class RecordingSpec:
    """A GEMM registry entry that records its launches instead of running a kernel."""

    config_cls = GemmConfig

    def __init__(self):
        self.launched = []
        self.prepared = 0

    @staticmethod
    def why_unsupported(config, problem):
        return None

    def prepare(self, config, problem, inputs, out):
        """A launch that records (problem, this call's operands and scalars as the kernel gets them)."""
        self.prepared += 1

        def launch(a, b, c, out, alpha, beta):
            self.launched.append((problem, {"a": a, "b": b, "c": None if problem.beta_zero else c, "alpha": alpha,
                                            "beta": beta}))

        return launch


@pytest.fixture
def gemm_harness(device_checks_pass, monkeypatch):
    """(run, spec): ``run(a, b, c, alpha=, beta=, out=)`` is the GEMM front end (validation, the repeat-call
    path, the trivial cases, the problem) on CPU tensors with a recording launch."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    spec = RecordingSpec()
    plans = CallPlans("test")

    def run(a, b, c=None, *, alpha=1.0, beta=0.0, out=None):
        return gemm_op.run_gemm(a, b, c, alpha=alpha, beta=beta, out=out, config=GemmConfig(),
                                policy=gemm_op.GemmPolicy((torch.float32,), (spec,)), plans=plans)

    return run, spec


# ---------------------------------------------------------------------------------------------- class 3
@pytest.mark.parametrize("value, expected", [
    (1.0, 1.0), (0.1, float(np.float32(0.1))), (1e-50, 0.0), (-1e-46, 0.0), (1e-45, float(np.float32(1e-45))),
    (3.4028235e38, checks.FLOAT32_MAX), (np.float64(2.5), 2.5), (np.int64(3), 3.0), (7, 7.0),
])
def test_float32_scalar_is_the_value_the_kernel_receives(value, expected):
    assert checks.float32_scalar("alpha", value) == expected
    assert type(checks.float32_scalar("alpha", value)) is float


@pytest.mark.parametrize("value, error", [
    (1e39, ValueError), (-1e39, ValueError), (3.4028236e38, ValueError), (10**39, ValueError),
    (10**400, ValueError), (True, TypeError), (np.bool_(True), TypeError), (1 + 0j, TypeError),
    ("1.0", TypeError), (torch.tensor(1.0), TypeError), (None, TypeError),
])
def test_float32_scalar_refuses_what_the_kernel_cannot_take(value, error):
    with pytest.raises(error, match="^alpha: "):
        checks.float32_scalar("alpha", value)


def test_float32_scalar_keeps_inf_and_nan_unless_finite_is_asked():
    assert checks.float32_scalar("beta", float("inf")) == float("inf")
    assert math.isnan(checks.float32_scalar("beta", NAN))
    for value in (float("inf"), NAN):
        with pytest.raises(ValueError, match="^scale: expected a finite number"):
            checks.float32_scalar("scale", value, finite=True)


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, F16)], ids=["sgemm", "hgemm"])
@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [1e39, -1e39, 10**39])
def test_gemm_scalars_that_overflow_float32_are_refused(op, dtype, name, value):
    """torch refuses them as "cannot be converted to type float without overflow"; the kernels would get
    inf. Refused with the structural checks, before the device checks (so CPU tensors get there)."""
    a, b, c = torch.ones(4, 8, dtype=dtype), torch.ones(8, 3, dtype=dtype), torch.ones(4, 3, dtype=dtype)
    out = poisoned(4, 3, dtype=dtype)
    with pytest.raises(ValueError, match=f"^{name}: .* cannot be converted to float32 without overflow"):
        op(a, b, c, out=out, **{"alpha": 1.0, "beta": 0.5, name: value})
    assert untouched(out)


@pytest.mark.parametrize("beta", [1e-50, -1e-46, 0.0, -0.0])
def test_a_beta_that_is_zero_in_float32_never_reads_c(gemm_harness, beta):
    """beta == 0 is decided on the float32 beta the kernel multiplies by: 1e-50 is 0.0 there, so the kernel
    that never loads C runs (NaN in c cannot leak), and c may even be left out."""
    run, spec = gemm_harness
    a, b, c = torch.randn(6, 5), torch.randn(5, 7), poisoned(6, 7)
    run(a, b, c, beta=beta)
    run(a, b, None, beta=beta)
    for problem, inputs in spec.launched:
        assert problem.beta_zero and inputs["c"] is None and inputs["beta"] == 0.0


def test_the_repeat_call_key_decides_beta_zero_in_float32(gemm_harness):
    """A beta that rounds to 0 and one that does not have different keys, in either order: a repeat must not
    take the other's "C is not read" decision."""
    run, spec = gemm_harness
    a, b, c = torch.randn(6, 5), torch.randn(5, 7), torch.randn(6, 7)
    for beta in (1e-50, 0.5, 1e-50, 0.5, 1e-30):
        run(a, b, c, beta=beta)
    assert [p.beta_zero for p, _ in spec.launched] == [True, False, True, False, False]
    assert [i["beta"] for _, i in spec.launched] == [0.0, 0.5, 0.0, 0.5, float(np.float32(1e-30))]
    assert all((i["c"] is None) == p.beta_zero for p, i in spec.launched)


def test_a_beta_that_is_zero_in_float32_shares_the_zero_betas_plan(gemm_harness):
    """The key holds beta's float32 zero-ness: 1e-50 and 0.0 are one structure, 0.5 another, and each keeps
    its plan (a 1e-50 plan kept under a "non-zero" key made every later beta=0.5 call prepare afresh)."""
    run, spec = gemm_harness
    a, b, c = torch.randn(6, 5), torch.randn(5, 7), torch.randn(6, 7)
    for beta in (1e-50, 0.0, -1e-46, 0.5, 0.5, 1e-50, 0.25):
        run(a, b, c, beta=beta)
    assert spec.prepared == 2
    assert [p.beta_zero for p, _ in spec.launched] == [True, True, True, False, False, True, False]


def test_the_kernel_gets_float32_scalars_and_a_repeat_still_checks_them(gemm_harness):
    run, spec = gemm_harness
    a, b, c = torch.randn(6, 5), torch.randn(5, 7), torch.randn(6, 7)
    out = poisoned(6, 7)
    run(a, b, c, alpha=0.1, beta=0.3, out=out)
    assert spec.launched[-1][1]["alpha"] == float(np.float32(0.1))
    assert spec.launched[-1][1]["beta"] == float(np.float32(0.3))
    for name in ("alpha", "beta"):
        with pytest.raises(ValueError, match=f"^{name}: .* without overflow"):
            run(a, b, c, out=out, **{"alpha": 0.1, "beta": 0.3, name: 1e39})
    assert len(spec.launched) == 1 and untouched(out)


def test_k_zero_with_a_beta_that_is_zero_in_float32_gives_zeros_not_nan(gemm_harness):
    """K == 0 needs no kernel: D = beta * C, with beta 0 in float32 exactly zero, C unread (its NaN must
    not become 0 * NaN)."""
    run, spec = gemm_harness
    out = poisoned(4, 3)
    run(torch.empty(4, 0), torch.empty(0, 3), poisoned(4, 3), beta=1e-50, out=out)
    assert torch.equal(out, torch.zeros(4, 3)) and not spec.launched


@pytest.mark.parametrize("scale, message", [
    (1e39, "cannot be used without overflow"),
    (3e38, "cannot be used without overflow"),  # finite in float32, but scale * log2(e) is not
    (-3e38, "cannot be used without overflow"),
    (float("inf"), "expected a finite number"),
    (NAN, "expected a finite number"),
    (True, "expected a real number"),
    ("0.5", "expected a real number"),
])
def test_attention_scales_the_kernel_cannot_use_are_refused(device_checks_pass, scale, message):
    q = k = v = torch.randn(1, 2, 8, 64, dtype=F16)
    out = poisoned(1, 2, 8, 64, dtype=F16)
    with pytest.raises((TypeError, ValueError), match=f"^scale: .*{message}"):
        ck.attention(q, k, v, scale=scale, out=out)
    assert untouched(out)


def test_attention_scales_at_the_float32_edge_pass():
    edge = checks.FLOAT32_MAX / LOG2E
    assert _check_scale(edge * (1 - 1e-7)) == edge * (1 - 1e-7)
    assert _check_scale(1e-50) == 1e-50  # underflows to 0 in float32: uniform attention, which is right
    assert _check_scale(None) is None


# ---------------------------------------------------------------------------------------------- class 4
def _dlpack(t):
    """Another storage object over ``t``'s memory, as CuPy or JAX would hand it over."""
    view = torch.from_dlpack(t)
    assert view.data_ptr() == t.data_ptr() and view.untyped_storage() is not t.untyped_storage()
    return view


def test_overlap_is_decided_by_addresses_not_storage_objects():
    base = torch.zeros(100)
    tail = _dlpack(base[50:])  # its storage starts at base[50]: the storage pointers differ
    assert tail.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert checks.overlaps(base[:60], tail) and checks.overlaps(tail, base[:60])
    assert not checks.overlaps(base[:50], tail)
    assert checks.overlaps(base, torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(base)))
    numpy_view = torch.from_numpy(base.numpy()[10:20])
    assert checks.overlaps(base[15:16], numpy_view) and not checks.overlaps(base[20:], numpy_view)
    strided = _dlpack(base.view(10, 10)[:, 3])  # column 3: a span from element 3 to element 93
    assert checks.overlaps(strided, base[93:94]) and not checks.overlaps(strided, base[94:])
    assert not checks.overlaps(base[:0], _dlpack(base))


def _views_of(storage: torch.Tensor, shape: tuple, strides: tuple, rng) -> "list[torch.Tensor]":
    """Views of one structure (shape, strides, dtype) at random offsets of ``storage``: the tensors one
    plan's calls may bring."""
    reach = sum((size - 1) * stride for size, stride in zip(shape, strides)) + 1
    return [storage.as_strided(shape, strides, int(offset))
            for offset in rng.integers(0, storage.numel() - reach + 1, size=24)]


@pytest.mark.parametrize("out_layout, in_layout", [
    (((4, 6), (6, 1)), ((3, 8), (8, 1))),
    (((4, 6), (6, 1)), ((4, 6), (6, 1))),  # out's own structure: exactly x where allowed
    (((5, 3), (1, 5)), ((6, 2), (10, 1))),  # column-major out; rows of an input with a gap between them
    (((2, 3, 4), (24, 4, 1)), ((7,), (3,))),  # an input with a stride over a batched out
    (((0, 6), (6, 1)), ((3, 8), (8, 1))),  # an empty out meets nothing
    (((4, 6), (6, 1)), ((0,), (1,))),  # nor does an empty input
    (((4, 6), (6, 1)), ((1, 6), (6, 1))),  # out's strides, not its shape (a bias row inside out): not exactly out
], ids=["rows", "same-structure", "column-major", "strided-input", "empty-out", "empty-input", "row-of-out"])
@pytest.mark.parametrize("may_be", [False, True], ids=["no-alias", "alias-allowed"])
def test_a_plans_pointer_overlap_guard_agrees_with_the_full_check(out_layout, in_layout, may_be):
    """``checks.OutGuard``, taken from one call's tensors, judges every later call of the same structure as
    ``no_overlap`` does: clear exactly where the full check passes (out meets no input, or is exactly one it
    may be), whatever the offsets; for these layouts it is never stricter."""
    rng = np.random.default_rng(0)
    storage = torch.zeros(160)
    outs = _views_of(storage, *out_layout, rng)
    xs = _views_of(storage, *in_layout, rng)
    if in_layout[1] == out_layout[1]:  # some calls pass x at out's start (out itself where the shapes agree)
        xs[::2] = [storage.as_strided(*in_layout, o.storage_offset()) for o in outs[::2]]
    others = _views_of(storage, (5,), (2,), rng)
    guard = checks.OutGuard(outs[0], (xs[0], None, others[0]), may_be=(may_be, False, False))
    clear_count = refused = 0
    for out in outs:
        for x, other in zip(xs, others):
            clear = guard.clear(out, x, None, other)
            try:
                checks.no_overlap("out", out, {"x": x, "h0": None, "other": other}, ("x",) if may_be else ())
                passes = True
            except ValueError:
                passes = False
            assert clear == passes, (out.storage_offset(), x.storage_offset(), other.storage_offset())
            clear_count += clear
            refused += not clear
    empty = 0 in out_layout[0] or 0 in in_layout[0]
    assert clear_count and (refused or empty)  # both outcomes occur: the cases test something


def test_a_view_of_another_element_size_is_not_exactly_out():
    """An int32 view of an int64 ``out`` with out's start, shape and strides is not out itself: writing
    out's element i overwrites the view's elements 2i and 2i + 1, which a scan in place may not yet have
    read (``ck.scan(out.view(torch.int32)[:n], out=out)``)."""
    out = torch.zeros(8, dtype=torch.int64)
    x = out.view(torch.int32)[:8]
    assert x.data_ptr() == out.data_ptr() and x.shape == out.shape and x.stride() == out.stride()
    with pytest.raises(ValueError, match="out: overlaps the memory of x"):
        checks.no_overlap("out", out, {"x": x}, ("x",))
    assert not checks.OutGuard(out, (x,), may_be=(True,)).clear(out, x)
    same_size = out.view(torch.float64)  # another dtype of the same size: element i is element i
    checks.no_overlap("out", out, {"x": same_size}, ("x",))
    assert checks.OutGuard(out, (same_size,), may_be=(True,)).clear(out, same_size)


def _gemm_alias_cases():
    def into_a():
        storage = torch.randn(64)
        a, b = storage[:32].view(4, 8), torch.randn(8, 4)
        return (lambda out: ck.sgemm(a, b, out=out)), _dlpack(storage[16:32]).view(4, 4), "must not overlap input a"

    def into_b():
        a, storage = torch.randn(4, 8, dtype=F16), torch.randn(64, dtype=F16)
        b = storage[:32].view(8, 4)
        return (lambda out: ck.hgemm(a, b, out=out)), _dlpack(storage[8:24]).view(4, 4), "must not overlap input b"

    def partial_c():
        a, b, storage = torch.randn(4, 8), torch.randn(8, 4), torch.randn(64)
        c = storage[:16].view(4, 4)
        return (lambda out: ck.sgemm(a, b, c, beta=1.0, out=out)), _dlpack(storage[4:20]).view(4, 4), \
            "must be c itself"
    return [into_a, into_b, partial_c]


@pytest.mark.parametrize("make", _gemm_alias_cases(), ids=["sgemm-a", "hgemm-b", "sgemm-c"])
def test_gemm_out_aliasing_an_input_through_dlpack_is_refused(device_checks_pass, make):
    call, out, message = make()
    before = out.clone()
    with pytest.raises(ValueError, match=f"^out: {message}"):
        call(out)
    assert torch.equal(out, before)


def test_an_exact_in_place_gemm_through_dlpack_is_still_allowed(gemm_harness):
    """out = c exactly (same address and strides), as another storage object: in place, which is safe."""
    run, spec = gemm_harness
    a, b, c = torch.randn(4, 8), torch.randn(8, 4), torch.randn(4, 4)
    run(a, b, c, beta=1.0, out=_dlpack(c))
    assert len(spec.launched) == 1


def test_a_repeat_call_checks_dlpack_aliases_too(gemm_harness):
    run, spec = gemm_harness
    storage = torch.randn(100)
    a, b = storage[:32].view(4, 8), torch.randn(8, 4)
    run(a, b, out=storage[48:64].view(4, 4))  # apart from a: validated and remembered
    alias = _dlpack(storage[16:32]).view(4, 4)  # the same structure (16-byte aligned), inside a
    before = alias.clone()
    with pytest.raises(ValueError, match="^out: must not overlap input a"):
        run(a, b, out=alias)
    assert len(spec.launched) == 1 and torch.equal(alias, before)


def test_nvrtc_ops_refuse_out_aliasing_an_input_through_dlpack(device_checks_pass):
    # conv3d checks out before the device checks: this part needs no patch at all
    storage = torch.randn(2 * 12 ** 3)
    volume, kernel = storage[:12 ** 3].view(12, 12, 12), torch.randn(3, 3, 3)
    cases = [
        (lambda out: ck.conv3d(volume, kernel, out=out), _dlpack(storage[500:1500]).view(10, 10, 10),
         "out: overlaps the memory of volume"),
    ]
    x = storage[:1000]
    cases.append((lambda out: ck.scan(x, out=out), _dlpack(storage[500:1500]), "out: overlaps the memory of x"))
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=F16) for _ in range(3))
    cases.append((lambda out: ck.attention(q, k, v, out=out), _dlpack(k), "out: overlaps the memory of k"))
    for call, out, message in cases:
        before = out.clone()
        with pytest.raises(ValueError, match=f"^{message}"):
            call(out)
        assert torch.equal(out, before)


# ---------------------------------------------------------------------------------------------- class 6
@pytest.mark.parametrize("value", ["False", "True", "", 0, 1, 1.0, None, torch.tensor(False), [False]])
@pytest.mark.parametrize("op", ["scan", "attention"])
def test_flags_take_bools_only(device_checks_pass, op, value):
    """``exclusive="False"`` once ran an exclusive scan (a non-empty string is true)."""
    if op == "scan":
        x, out = torch.randn(3, 100), poisoned(3, 100)
        call, name = (lambda: ck.scan(x, exclusive=value, out=out)), "exclusive"
    else:
        q = k = v = torch.randn(1, 2, 8, 64, dtype=F16)
        out = poisoned(1, 2, 8, 64, dtype=F16)
        call, name = (lambda: ck.attention(q, k, v, causal=value, out=out)), "causal"
    with pytest.raises(TypeError, match=f"^{name}: expected a bool"):
        call()
    assert untouched(out)


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), (np.bool_(True), True),
                                             (np.bool_(False), False)])
def test_flag_accepts_python_and_numpy_bools(value, expected):
    assert checks.flag("exclusive", value) is expected


def test_scan_runs_the_scan_a_numpy_bool_asks_for(device_checks_pass, monkeypatch):
    """np.bool_ flags come back as Python bools: the problem (a compile key) says exactly True/False."""
    launched = []
    route_scan_to_stub(monkeypatch, lambda variant, problem: lambda x, out: launched.append(problem))
    for value in (np.bool_(True), np.bool_(False), True):
        ck.scan(torch.randn(100), exclusive=value, reverse=value)
    assert [p.exclusive for p in launched] == [True, False, True] == [p.reverse for p in launched]
    assert all(type(p.exclusive) is bool and type(p.reverse) is bool for p in launched)


def test_scan_measures_the_problem_and_picks_the_variant_from_the_dim(device_checks_pass, monkeypatch):
    """(rows, length, inner) around the scanned dim; a strided dim runs columns, the last lookback; the flags,
    operator and cast dtype reach the problem."""
    seen = []
    route_scan_to_stub(monkeypatch, lambda variant, problem: seen.append((variant, problem)) or (lambda x, out: None))
    x = torch.randn(2, 3, 4, 5)
    for dim, variant, shape in ((-1, "lookback", (24, 5, 1)), (2, "columns", (6, 4, 5)), (0, "columns", (1, 2, 60)),
                                (1, "columns", (2, 3, 20))):
        ck.scan(x, dim=dim, op="max", reverse=True, exclusive=True)
        got_variant, problem = seen[-1]
        assert (got_variant, (problem.rows, problem.length, problem.inner)) == (variant, shape), dim
        assert (problem.op, problem.reverse, problem.exclusive, problem.dtype) == ("max", True, True, torch.float32)
    ck.scan(torch.randint(0, 5, (7,), dtype=torch.int32), dtype=torch.float64)
    assert seen[-1][1].dtype == torch.float64 and seen[-1][1].out_dtype == torch.float64
    ck.scan(torch.randn(5, 1), dim=0)  # a trailing dim of 1: the last-dim kernel over 5 elements
    assert seen[-1][0] == "lookback" and (seen[-1][1].rows, seen[-1][1].length, seen[-1][1].inner) == (1, 5, 1)


def test_scan_refuses_the_other_variants_config_even_for_an_empty_input(device_checks_pass):
    """The variant follows from the dim (a strided dim: columns; the last: lookback), and a config of the
    other variant is refused by type, also when the input is empty and nothing would run."""
    for x, dim, wrong, right in ((torch.randn(0, 5), -1, ck.ColumnScanConfig(), "ScanConfig"),
                                 (torch.randn(0, 5), 0, ck.ScanConfig(), "ColumnScanConfig")):
        with pytest.raises(TypeError, match=rf"^config: expected a {right} or None, got {type(wrong).__name__}"):
            ck.scan(x, dim=dim, config=wrong)
    with pytest.raises(TypeError, match=r"^config: expected a ScanConfig or ColumnScanConfig or None, got Conv3dConfig"):
        ck.scan(torch.randn(0, 5), config=ck.Conv3dConfig())


# ---------------------------------------------------------------------------------------------- class 7
def _neg_view(t):
    view = torch._neg_view(t)
    assert view.is_neg()
    return view


def _conj_imag(t):
    """A float32 view with the negative bit: the imaginary part of a lazily conjugated complex tensor."""
    z = torch.complex(torch.zeros_like(t), t)
    view = z.conj().imag
    assert view.is_neg() and view.dtype == torch.float32
    return view


def _views_cases():
    """(op id, argument, call(args) -> result, args): args maps argument names to tensors."""
    f32 = lambda *s: torch.randn(*s)  # noqa: E731
    f16 = lambda *s: torch.randn(*s, dtype=F16)  # noqa: E731
    return [
        ("sgemm", lambda a: ck.sgemm(a["a"], a["b"], a["c"], beta=0.5, out=a["out"]),
         {"a": f32(4, 8), "b": f32(8, 3), "c": f32(4, 3), "out": poisoned(4, 3)}),
        ("hgemm", lambda a: ck.hgemm(a["a"], a["b"], a["c"], beta=0.5, out=a["out"]),
         {"a": f16(4, 8), "b": f16(8, 3), "c": f16(4, 3), "out": poisoned(4, 3, dtype=F16)}),
        ("attention", lambda a: ck.attention(a["q"], a["k"], a["v"], out=a["out"]),
         {"q": f16(1, 2, 8, 64), "k": f16(1, 2, 8, 64), "v": f16(1, 2, 8, 64), "out": poisoned(1, 2, 8, 64, dtype=F16)}),
        ("conv3d", lambda a: ck.conv3d(a["volume"], a["kernel"], out=a["out"]),
         {"volume": f32(6, 6, 6), "kernel": f32(3, 3, 3), "out": poisoned(4, 4, 4)}),
        ("scan", lambda a: ck.scan(a["x"], out=a["out"]), {"x": f32(3, 50), "out": poisoned(3, 50)}),
    ]


def _view_params():
    for op, call, args in _views_cases():
        for name in args:
            kinds = [("neg_view", _neg_view)]
            if args[name].dtype == torch.float32:
                kinds.append(("conj_imag", _conj_imag))
            for kind, make in kinds:
                yield pytest.param(call, args, name, make, id=f"{op}-{name}-{kind}")


@pytest.mark.parametrize("call, args, name, make", list(_view_params()))
def test_views_with_the_negative_bit_are_refused(device_checks_pass, call, args, name, make):
    """Such a view reads as the negated memory: a kernel would read (or write) the memory's values. Every
    input and every out is refused, naming it and the resolve that fixes an input."""
    args = dict(args)
    args[name] = make(args[name].clone())
    fix = "a kernel would write through it" if name == "out" else rf"pass {name}\.resolve_neg\(\)"
    with pytest.raises(ValueError, match=f"^{name}: expected a tensor without the negative bit.*{fix}"):
        call(args)
    assert untouched(args["out"])  # the poisoned out, or the negated view of it: -NaN is NaN


def test_a_complex_view_with_the_conjugate_bit_is_refused_as_such():
    z = torch.randn(4, 4, dtype=torch.complex64).conj()
    with pytest.raises(ValueError, match=r"^a: expected a tensor without the conjugate bit.*a\.resolve_conj\(\)"):
        ck.sgemm(z, torch.randn(4, 4))
    with pytest.raises(ValueError, match="^out: expected a tensor without the conjugate bit"):
        checks.output("out", z, shape=(4, 4), dtype=z.dtype, device=z.device, inputs={})


def _other_layouts(t):
    """(layout, ``t`` in it) for the tensors without strides or storage torch makes: reading their strides
    or data pointer raises without naming anything."""
    yield "sparse_coo", t.to_sparse()
    if t.dim() == 2:
        yield "sparse_csr", t.to_sparse_csr()
    if t.dtype == torch.float32 and torch.backends.mkldnn.is_available():
        yield "mkldnn", t.to_mkldnn()
    yield "nested", torch.nested.nested_tensor([t])


def _layout_params():
    for op, call, args in _views_cases():
        for name in args:
            for layout, _ in _other_layouts(args[name]):
                yield pytest.param(call, args, name, layout, id=f"{op}-{name}-{layout}")


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: sparse CSR and nested tensors are beta/prototype
@pytest.mark.parametrize("call, args, name, layout", list(_layout_params()))
def test_tensors_of_other_layouts_are_refused_by_name(device_checks_pass, call, args, name, layout):
    """Sparse, mkldnn and nested tensors are refused naming the argument (plans' keys have none for them,
    tests/test_plans_cpu.py, so every call takes these checks), and nothing is written."""
    args = dict(args)
    original = args["out"]
    args[name] = dict(_other_layouts(args[name]))[layout]
    got = "a nested tensor" if layout == "nested" else str(args[name].layout)  # mkldnn's is torch._mkldnn
    with pytest.raises(ValueError, match=f"^{name}: expected a strided \\(dense\\) tensor, got {got}"):
        call(args)
    assert untouched(original)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: sparse CSR and nested tensors are beta/prototype
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "nested"])
def test_other_layouts_are_refused_by_name_on_the_commonest_calls_too(device_checks_pass, layout):
    """The calls whose plan key an op writes out itself (two matrices, a scan of one tensor, attention of
    three; no out=) read strides and pointers first: a tensor without them takes the full checks, which
    name it, not torch's own error."""
    def other(t):
        return dict(_other_layouts(t))[layout]

    m, q = torch.randn(8, 8), torch.randn(1, 2, 16, 64, dtype=torch.float16)
    calls = [("a", lambda: ck.sgemm(other(m), m)), ("b", lambda: ck.hgemm(m.half(), other(m.half()))),
             ("x", lambda: ck.scan(other(m)))]
    if layout != "sparse_csr":  # CSR is 2-D only
        calls.append(("q", lambda: ck.attention(other(q), q, q)))
    for name, call in calls:
        with pytest.raises(ValueError, match=f"^{name}: expected a strided \\(dense\\) tensor"):
            call()


def test_a_repeat_call_does_not_take_a_negated_view_for_the_plain_one(gemm_harness):
    run, spec = gemm_harness
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    run(a, b)
    with pytest.raises(ValueError, match="^a: expected a tensor without the negative bit"):
        run(_neg_view(a), b)
    with pytest.raises(ValueError, match="^b: expected a tensor without the negative bit"):
        run(a, _neg_view(b))
    assert len(spec.launched) == 1


# ---------------------------------------------------------------------------------------------- class 8
def _calls_on(device, ops) -> dict:
    """Well-formed calls of every op (``ops``: the public functions, or the eager entry points) on tensors
    made on ``device`` when the call runs, by id."""
    def t(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=device)

    def in_place():
        c = t(8, 6)
        return ops.sgemm(t(8, 4), t(4, 6), c, beta=1.0, out=c)

    return {
        "sgemm": lambda: ops.sgemm(t(8, 4), t(4, 6)),
        "sgemm-out": lambda: ops.sgemm(t(8, 4), t(4, 6), out=t(8, 6)),
        "sgemm-c-in-place": in_place,
        "hgemm-out": lambda: ops.hgemm(t(8, 4, dtype=F16), t(4, 6, dtype=F16), out=t(8, 6, dtype=F16)),
        "attention": lambda: ops.attention(*(t(1, 2, 8, 64, dtype=F16) for _ in range(3))),
        "conv3d": lambda: ops.conv3d(t(6, 6, 6), t(3, 3, 3), out=t(4, 4, 4)),
        "scan": lambda: ops.scan(t(3, 50), out=t(3, 50)),
    }


class _Eager:
    """The eager entry points under the public names: what the public ops call when nothing traces them."""
    sgemm, hgemm = staticmethod(torch_ops.sgemm_eager), staticmethod(torch_ops.hgemm_eager)
    attention, conv3d = staticmethod(torch_ops.attention_eager), staticmethod(torch_ops.conv3d_eager)
    scan = staticmethod(torch_ops.scan_eager)


CALL_IDS = list(_calls_on("cpu", ck))


@pytest.mark.parametrize("call_id", CALL_IDS)
def test_the_eager_path_refuses_fake_tensors_before_any_pointer_is_read(call_id):
    """A launch on a fake's null pointer kills the CUDA context, and a GEMM with out= once reported a false
    overlap (every fake's pointer is 0): the eager entry points check for fakes first. Fake CUDA tensors
    need no GPU."""
    with FakeTensorMode():
        with pytest.raises(TypeError, match=r"^\w+: expected a tensor with real storage, got .*FakeTensor"):
            _calls_on("cuda", _Eager)[call_id]()
    x = torch.randn(3, 50)
    with FakeTensorMode():  # a real tensor under a fake mode: what the op would allocate is fake
        with pytest.raises(RuntimeError, match="cannot run under an active FakeTensorMode"):
            _Eager.scan(x)


@pytest.mark.parametrize("call, shape, dtype", [
    (lambda t: ck.sgemm(t(8, 4), t(4, 6), t(8, 6), beta=0.5), (8, 6), torch.float32),
    (lambda t: ck.hgemm(t(8, 4, dtype=F16), t(4, 6, dtype=F16)), (8, 6), F16),
    (lambda t: ck.attention(*(t(1, 2, 8, 64, dtype=F16) for _ in range(3)), causal=True), (1, 2, 8, 64), F16),
    (lambda t: ck.conv3d(t(6, 6, 6), t(3, 3, 3)), (4, 4, 4), torch.float32),
    (lambda t: ck.scan(t(3, 50, dtype=torch.int32)), (3, 50), torch.int64),
], ids=["sgemm", "hgemm", "attention", "conv3d", "scan"])
def test_the_public_ops_under_a_fake_mode_give_fake_results_and_launch_nothing(call, shape, dtype):
    """Under a plain FakeTensorMode the public ops go to their custom op, whose fake implementation runs
    the eager checks and gives the result's shape and dtype; nothing launches (a launch would need CUDA)."""
    def t(*s, dtype=torch.float32):
        return torch.empty(s, dtype=dtype, device="cuda")

    with FakeTensorMode():
        result = call(t)
    assert checks.is_fake(result) and tuple(result.shape) == shape and result.dtype == dtype


def test_fake_tensors_keep_the_eager_checks_after_their_mode_is_gone():
    with FakeTensorMode():
        a, b = torch.empty(8, 4, device="cuda"), torch.empty(5, 6, device="cuda")
    with pytest.raises(ValueError, match="^b: expected 4 rows to match a's 4 columns"):
        ck.sgemm(a, b)
    with pytest.raises(TypeError, match="^exclusive: expected a bool"):
        ck.scan(a, exclusive="False")


def test_make_fx_records_the_op_and_runs_its_checks():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        a, b = torch.empty(8, 4, device="cuda"), torch.empty(4, 6, device="cuda")
    graph = make_fx(lambda a, b: ck.sgemm(a, b, alpha=2.0), tracing_mode="fake", _allow_non_fake_inputs=True)(a, b)
    assert "torch.ops.cute_kernels.sgemm.default" in graph.code
    with pytest.raises(ValueError, match="^a: expected a CUDA tensor"):  # CPU inputs: refused as eager does
        make_fx(lambda a, b: ck.sgemm(a, b), tracing_mode="fake")(torch.randn(8, 4), torch.randn(4, 6))


def test_a_fake_call_never_takes_a_real_calls_validated_path(gemm_harness):
    """A fake tensor's structure (device cuda:0 or cpu, pointer 0 mod 16) can equal a real one's: the fake
    check runs on every call, before the repeat-call key."""
    run, spec = gemm_harness
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    run(a, b)
    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
    with pytest.raises(TypeError, match="^a: expected a tensor with real storage"):
        run(fa, fb)
    assert len(spec.launched) == 1


@pytest.mark.parametrize("call, name", [
    (lambda t: ck.sgemm(t(8, 4), t(4, 6), out=t(8, 6)), "a"),
    (lambda t: ck.conv3d(t(6, 6, 6), t(3, 3, 3), out=t(4, 4, 4)), "volume"),  # out is checked first: no false overlap
    (lambda t: ck.scan(t(3, 50), out=t(3, 50)), "x"),
    (lambda t: ck.attention(t(8, 64), t(8, 64), t(8, 64), out=t(8, 64)), "q"),
], ids=["sgemm", "conv3d", "scan", "attention"])
def test_meta_tensors_are_refused_by_the_device_checks_not_as_overlaps(call, name):
    def meta(*shape):
        return torch.empty(shape, device="meta")

    with pytest.raises(ValueError, match=f"^{name}: expected a CUDA tensor, got .* on meta .*no memory"):
        call(meta)


# ---------------------------------------------------------------------------------------------- class 9
def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")  # no memory behind it


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, F16)], ids=["sgemm", "hgemm"])
@pytest.mark.parametrize("m, n, k, message", [
    (2**31 - 1, 3, 1, r"^a: M \(rows\) = 2147483647 is past 2147482624"),
    (MAX_EXTENT + 1, 3, 1, r"^a: M \(rows\) = 2147482625 is past"),
    (3, 2**31 - 1, 1, r"^b: N \(columns\) = 2147483647 is past"),
    (1, 3, 2**31 - 1, r"^a: K \(columns\) = 2147483647 is past"),
])
def test_gemm_extents_past_the_kernels_32_bit_indexing_are_refused(op, dtype, m, n, k, message):
    """M = 2^31 - 1 passed validation and failed inside the DSL with a bare CUDADialectError: the tile
    count ``(M + tile_m - 1) // tile_m`` wraps in Int32."""
    with pytest.raises(ValueError, match=message):
        op(_meta(m, k, dtype=dtype), _meta(k, n, dtype=dtype))


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, F16)], ids=["sgemm", "hgemm"])
def test_gemm_extents_at_the_limit_pass_validation(op, dtype):
    for m, n, k in ((MAX_EXTENT, 3, 1), (3, MAX_EXTENT, 1), (1, 3, MAX_EXTENT)):
        with pytest.raises(ValueError, match="^a: expected a CUDA tensor"):  # the next check: the device
            op(_meta(m, k, dtype=dtype), _meta(k, n, dtype=dtype))


def _all_gemm_configs():
    return [*sgemm_candidates(), *tf32x3_candidates(), *sm80_candidates(), *sm90_candidates()]


def test_every_gemm_config_indexes_every_extent_up_to_the_limit():
    """MAX_EXTENT leaves room for every config's tile, cluster and raster: a problem of one long side at the
    limit fits each of them (the sweeps' spaces hold every tile shape and raster the families use)."""
    for config in _all_gemm_configs():
        for m, n, k in ((MAX_EXTENT, 1, 1), (1, MAX_EXTENT, 1), (1, 1, MAX_EXTENT), (2**20, 2**20, 2**20)):
            problem = GemmProblem(m=m, n=n, k=k)
            assert index_problem(config, problem) is None, (config, problem)


@pytest.mark.parametrize("m, n, config, message", [
    (2**21, 2**21, GemmConfig(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8),
     "tiles do not fit the kernels' 32-bit tile index"),
    (1, 2**30 + 1, GemmConfig(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8, raster=64),
     "raster 64 x 33554433 tile columns"),
])
def test_tile_counts_past_int32_are_refused_for_the_config(m, n, config, message):
    problem = GemmProblem(m=m, n=n, k=8)
    assert message in index_problem(config, problem)
    with pytest.raises(ValueError, match=f"^config: .* cannot run .*{message}"):
        gemm_op.choose_variant((registry.get("sgemm", "simt_cpasync"),), problem, config, device_index=0)
    assert message in registry.get("sgemm", "simt_cpasync").why_unsupported(config, problem)  # the entry's one predicate
    smaller = GemmConfig(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8, raster=8)
    if "raster" in message:  # the same tiles in a narrower band fit
        assert index_problem(smaller, problem) is None


def test_index_problem_counts_the_hopper_kernels_clusters():
    from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config

    config = HgemmSm90Config(tile_m=256, tile_n=128, consumer_warpgroups=2, cluster_m=2)
    edge = 2**31 - 512  # clusters of two 256-row tiles end at 2^31 - 256: one more tile still fits
    assert index_problem(config, GemmProblem(m=edge, n=1, k=64, dtype="float16", a_align=8, b_align=8,
                                             c_align=8)) is None
    assert "M = " in index_problem(config, GemmProblem(m=edge + 1, n=1, k=64, dtype="float16", a_align=8,
                                                       b_align=8, c_align=8))


@pytest.mark.parametrize("call, message", [
    (lambda: ck.conv3d(_meta(1, 1, 2**31 - 1 - COORD_MARGIN + 1), _meta(1, 1, 1)), r"^volume: sides .* past 2\^31 - 1 - "),
    (lambda: ck.conv3d(_meta(1, 2**31 - 100, 4), _meta(1, 3, 3)), r"^volume: sides .* past 2\^31 - 1 - "),
    (lambda: ck.attention(_meta(2**31 - 1000, 64, dtype=F16), _meta(8, 64, dtype=F16), _meta(8, 64, dtype=F16)),
     r"^q: too large"),
    (lambda: ck.attention(_meta(8, 64, dtype=F16), _meta(2**31 - 1000, 64, dtype=F16),
                          _meta(2**31 - 1000, 64, dtype=F16)), r"^k: too large"),
], ids=["conv3d-width", "conv3d-height", "attention-m", "attention-n"])
def test_the_nvrtc_ops_refuse_sides_their_32_bit_coordinates_would_wrap(device_checks_pass, call, message):
    """conv3d's last tile addresses up to a tile (8192 columns at most) past the volume's last column, in
    int: a width within that of 2^31 once wrapped negative and passed the kernel's bounds tests. attention
    adds a query tile to a row index (m0 + kBlockM)."""
    with pytest.raises(ValueError, match=message):
        call()


def test_conv3d_sides_at_the_limit_pass_validation():
    with pytest.raises(ValueError, match="^volume: expected a CUDA tensor"):  # the next check: the device
        ck.conv3d(_meta(1, 1, 2**31 - 1 - COORD_MARGIN), _meta(1, 1, 1))


def test_a_plans_overlap_check_raises_the_full_checks_message_and_takes_its_alias():
    """checks.PlanOverlaps (every plan's out check but the GEMMs'): clear calls pass, an exact alias it
    allows passes, and a partial overlap raises no_overlap's own message."""
    storage = torch.zeros(64)
    x, good, partial = storage[:16], storage[32:48], storage[8:24]
    plan_check = checks.PlanOverlaps(("x", "segment_starts"), ("x",))
    plan_check.check(good, x, None)
    plan_check.check(x, x, None)  # out is x itself: allowed
    with pytest.raises(ValueError, match="out: overlaps the memory of x"):
        plan_check.check(partial, x, None)
    with pytest.raises(ValueError, match="out: overlaps the memory of x"):
        checks.PlanOverlaps(("x",)).check(x, x)  # no alias allowed
