"""The torch.library custom ops (CPU): schemas exist, fake implementations give torch's shapes and dtypes,
and the public functions route to the custom op when torch.compile traces them."""

import warnings

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels import torch_ops

OPS = ("sgemm", "hgemm", "attention", "conv3d", "conv2d", "conv1d", "scan", "linear_scan")
# Schema arguments that carry a Python parameter in another form: linear_scan's decay, a tensor or a number,
# crosses as a (tensor or None) and a float.
# A convolution's padding, a name or sizes, crosses as the name (or "sizes") and the sizes.
SCHEMA_ONLY = {"linear_scan": {"a_number"}, "conv3d": {"padding_sizes"}, "conv2d": {"padding_sizes"},
               "conv1d": {"padding_sizes"}}


def fake_cases():
    """(op name, public call, expected shape, expected dtype) on fake CUDA tensors."""
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16

    def t(*shape, dtype=f32):
        return torch.empty(shape, dtype=dtype, device="cuda")

    return [
        ("attention", lambda: ck.attention(t(2, 3, 17, 64, dtype=f16), t(2, 3, 9, 64, dtype=f16),
                                           t(2, 3, 9, 64, dtype=f16), window=(4, None), num_sinks=2), (2, 3, 17, 64), f16),
        ("sgemm", lambda: ck.sgemm(t(37, 5), t(5, 11)), (37, 11), f32),
        ("sgemm", lambda: ck.sgemm(t(4, 3), t(3, 2), t(4, 2), alpha=2.0, beta=0.5), (4, 2), f32),
        ("hgemm", lambda: ck.hgemm(t(64, 16, dtype=f16), t(16, 8, dtype=f16)), (64, 8), f16),
        ("hgemm", lambda: ck.hgemm(t(3, 7, dtype=bf16), t(7, 9, dtype=bf16)), (3, 9), bf16),
        ("attention", lambda: ck.attention(t(2, 3, 17, 64, dtype=f16), t(2, 3, 9, 64, dtype=f16),
                                           t(2, 3, 9, 64, dtype=f16), causal=True), (2, 3, 17, 64), f16),
        ("attention", lambda: ck.attention(t(5, 33), t(7, 33), t(7, 33), scale=0.5), (5, 33), f32),
        ("attention", lambda: ck.attention(t(2, 32, 17, 128, dtype=bf16), t(2, 8, 9, 128, dtype=bf16),
                                           t(2, 8, 9, 128, dtype=bf16), enable_gqa=True), (2, 32, 17, 128), bf16),
        ("attention", lambda: ck.attention(t(6, 17, 64), t(1, 9, 64), t(1, 9, 64)), (6, 17, 64), f32),
        ("conv3d", lambda: ck.conv3d(t(10, 11, 12), t(3, 4, 5)), (8, 8, 8), f32),
        ("conv3d", lambda: ck.conv3d(t(2, 5, 5, 5), t(5, 5, 5)), (2, 1, 1, 1), f32),
        ("conv2d", lambda: ck.conv2d(t(10, 12), t(3, 5)), (8, 8), f32),
        ("conv2d", lambda: ck.conv2d(t(4, 7, 7), t(7, 1)), (4, 1, 7), f32),
        ("conv1d", lambda: ck.conv1d(t(100), t(7)), (94,), f32),
        ("conv1d", lambda: ck.conv1d(t(3, 9), t(1)), (3, 9), f32),
        ("conv3d", lambda: ck.conv3d(t(2, 10, 11, 12), t(3, 4, 5), padding="same"), (2, 10, 11, 12), f32),
        ("conv3d", lambda: ck.conv3d(t(2, 2, 2), t(3, 3, 3), padding=1), (2, 2, 2), f32),
        ("conv3d", lambda: ck.conv3d(t(10, 11, 12), t(3, 4, 5), padding=(1, 0, 2)), (10, 8, 12), f32),
        ("conv2d", lambda: ck.conv2d(t(30, 40), t(4, 5), padding=(1, 2)), (29, 40), f32),
        ("conv1d", lambda: ck.conv1d(t(100), t(6), padding="same"), (100,), f32),
        ("conv3d", lambda: ck.conv3d(t(10, 11, 12), t(3, 4, 5), padding=(np.int64(1),)), (10, 10, 10), f32),
        ("conv2d", lambda: ck.conv2d(t(30, 40), t(4, 5), padding=np.int32(2)), (31, 40), f32),
        ("scan", lambda: ck.scan(t(3, 1000, dtype=torch.int32)), (3, 1000), torch.int64),
        # dtype= names the result's dtype, as torch.cumsum's does: an int32 sum stays int32.
        ("scan", lambda: ck.scan(t(3, 1000, dtype=torch.int64), dtype=torch.int32), (3, 1000), torch.int32),
        ("scan", lambda: ck.scan(t(99, dtype=torch.float64), exclusive=True), (99,), torch.float64),
        ("scan", lambda: ck.scan(t(4, 9), dim=0, segment_starts=t(4, 9, dtype=torch.bool)), (4, 9), f32),
        ("scan", lambda: ck.scan(t(4, 9, dtype=torch.bool)), (4, 9), torch.int64),
        ("scan", lambda: ck.scan(t(4, 9, dtype=torch.int8), op="max", dim=0), (4, 9), torch.int8),
        ("scan", lambda: ck.scan(t(4, 9), dtype=torch.int8), (4, 9), torch.int8),
        ("scan", lambda: ck.scan(t(4, 9, dtype=torch.int8), op="prod", dtype=torch.uint8, dim=0), (4, 9), torch.uint8),
        ("scan", lambda: ck.scan(t(4, 9, dtype=torch.int16), dtype=torch.int16), (4, 9), torch.int16),
        ("linear_scan", lambda: ck.linear_scan(0.5, t(4, 9, dtype=bf16), dim=0, h0=t(9)), (4, 9), bf16),
        ("linear_scan", lambda: ck.linear_scan(t(4, 1), t(4, 9), reverse=True), (4, 9), f32),
        # a 0-d CPU tensor decay: its value unknown while tracing, it crosses the schema on x's device
        ("linear_scan", lambda: ck.linear_scan(torch.tensor(0.5, dtype=torch.float64), t(4, 9)), (4, 9), f32),
    ]


def test_every_public_op_is_a_custom_op():
    for name in OPS:
        assert hasattr(torch.ops.cute_kernels, name), name
        assert getattr(ck, name).custom_op is not None


@pytest.fixture
def compiling(monkeypatch):
    """What the public functions see while torch.compile traces them."""
    monkeypatch.setattr(torch_ops, "_is_compiling", lambda: True)


@pytest.mark.parametrize("case", fake_cases(), ids=lambda c: c[0])
def test_traced_calls_go_through_the_custom_op_with_torch_shapes(case, compiling):
    name, call, shape, dtype = case
    with FakeTensorMode():
        result = call()
    assert tuple(result.shape) == shape and result.dtype == dtype and result.device.type == "cuda"


def test_traced_out_is_filled_and_config_is_refused(compiling):
    # meta tensors: a CPU-only torch cannot copy between fake CUDA tensors
    a, b = torch.empty(8, 4, device="meta"), torch.empty(4, 6, device="meta")
    out = torch.empty(8, 6, device="meta")
    assert ck.sgemm(a, b, out=out) is out
    with FakeTensorMode():
        a, b = torch.empty(8, 4, device="cuda"), torch.empty(4, 6, device="cuda")
        with pytest.raises(TypeError, match="config"):
            ck.sgemm(a, b, config=ck.GemmConfig())
        with pytest.raises(TypeError, match="config"):
            ck.scan(torch.empty(5, device="cuda"), config=ck.ScanConfig())


def test_eager_calls_keep_the_eager_validation():
    with pytest.raises((TypeError, ValueError), match="a"):
        ck.sgemm(torch.ones(2, 2), torch.ones(2, 2))  # CPU tensors


def test_compiled_out_takes_eagers_shape_rule_and_in_place_calls_trace_whole():
    """Under torch.compile(fullgraph=True) an out= is checked as eager checks it (a wrong shape is refused,
    not broadcast by copy_), the check breaks no graph, and out=c in place traces (the custom op's result
    is a fresh tensor, so the copy is safe). Meta tensors: a CPU-only torch cannot trace fake CUDA copies."""
    a, b, c = (torch.empty(8, 8, device="meta") for _ in range(3))
    in_place = torch.compile(lambda a, b, c: ck.sgemm(a, b, c, beta=1.0, out=c), fullgraph=True, backend="eager")
    assert in_place(a, b, c).shape == (8, 8)
    wrong = torch.compile(lambda a, b, o: ck.sgemm(a, b, out=o), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"out: expected shape \(8, 8\), got \(8, 4\)"):
        wrong(a, b, torch.empty(8, 4, device="meta"))


@pytest.mark.parametrize("name", OPS)
def test_schema_defaults_are_the_python_functions(name):
    """torch.ops.cute_kernels.<op>(required tensors) means what ck.<op>(required tensors) means."""
    import inspect

    schema = getattr(torch.ops.cute_kernels, name).default._schema
    python = inspect.signature(getattr(ck, name)).parameters
    for argument in schema.arguments:
        if argument.name in SCHEMA_ONLY.get(name, ()):
            continue
        assert argument.name in python, f"{name}: schema argument {argument.name} is no parameter of ck.{name}"
        default = python[argument.name].default
        if default is inspect.Parameter.empty:
            assert not argument.has_default_value(), f"{name}.{argument.name}: required in Python only"
        else:
            assert argument.has_default_value() and argument.default_value == default, \
                f"{name}.{argument.name}: schema default {argument.default_value!r}, Python's {default!r}"


@pytest.mark.parametrize("kv_heads, v_heads, name", [(3, 3, "k"), (2, 4, "v"), (0, 0, "k")])
def test_traced_grouped_query_heads_are_checked(kv_heads, v_heads, name, compiling):
    """The fake implementation runs the eager checks: k's heads must divide q's, v's must be k's."""
    with FakeTensorMode():
        q = torch.empty(1, 8, 16, 64, device="cuda")
        k, v = torch.empty(1, kv_heads, 16, 64, device="cuda"), torch.empty(1, v_heads, 16, 64, device="cuda")
        with pytest.raises(ValueError, match=f"^{name}: "):
            ck.attention(q, k, v)


@pytest.mark.parametrize("starts, message", [
    (lambda: torch.empty(4, 9, dtype=torch.uint8, device="cuda"), r"^segment_starts: expected a bool tensor"),
    (lambda: torch.empty(4, 8, dtype=torch.bool, device="cuda"), r"^segment_starts: expected x's shape \(4, 9\)")])
def test_traced_segment_starts_are_checked(starts, message, compiling):
    with FakeTensorMode():
        with pytest.raises((TypeError, ValueError), match=message):
            ck.scan(torch.empty(4, 9, device="cuda"), segment_starts=starts())


def test_traced_enable_gqa_must_be_a_bool(compiling):
    with FakeTensorMode():
        q = torch.empty(1, 8, 16, 64, device="cuda")
        k = torch.empty(1, 2, 16, 64, device="cuda")
        with pytest.raises(TypeError, match="enable_gqa"):
            ck.attention(q, k, k, enable_gqa=1)


def test_traced_attention_takes_no_keys_no_heads_and_huge_windows(compiling):
    """As SDPA: N = 0 gives q's shape (rows that see no key), H = 0 an empty result; a window side or sink
    count past 2^63 (past every row count, so unbounded) crosses the int64 schema."""
    def t(*shape):
        return torch.empty(shape, dtype=torch.bfloat16, device="cuda")

    with FakeTensorMode():
        out, lse = ck.attention(t(2, 4, 7, 64), t(2, 2, 0, 64), t(2, 2, 0, 64), return_lse=True)
        assert tuple(out.shape) == (2, 4, 7, 64) and tuple(lse.shape) == (2, 4, 7)
        assert tuple(ck.attention(t(2, 0, 7, 64), t(2, 0, 9, 64), t(2, 0, 9, 64)).shape) == (2, 0, 7, 64)
        out = ck.attention(t(1, 2, 7, 64), t(1, 2, 9, 64), t(1, 2, 9, 64), window=(2**70, 0), num_sinks=2**64)
        assert tuple(out.shape) == (1, 2, 7, 64)
    with pytest.raises(ValueError, match="k: expected a number of heads that divides q's 4"):
        with FakeTensorMode():
            ck.attention(t(2, 4, 7, 64), t(2, 0, 9, 64), t(2, 0, 9, 64))


def test_traced_padding_names_are_checked(compiling):
    """An unknown padding name is the eager op's error on the custom-op path too (not a failure in the
    schema's encoding)."""
    with FakeTensorMode():
        for padding in ("sizes", "pairs", "full"):
            with pytest.raises(ValueError, match=r"^padding: expected 'valid', 'same'"):
                ck.conv2d(torch.empty(9, 9, device="cuda"), torch.empty(3, 3, device="cuda"), padding=padding)


def test_traced_return_lse_gives_the_output_and_a_float32_lse(compiling):
    """return_lse crosses its own custom op (attention_lse: two results); out= takes the first."""
    def t(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, dtype=dtype, device="cuda")

    with FakeTensorMode():
        out, lse = ck.attention(t(2, 8, 17, 64), t(2, 2, 9, 64), t(2, 2, 9, 64), causal=True, return_lse=True)
        assert tuple(out.shape) == (2, 8, 17, 64) and out.dtype == torch.bfloat16
        assert tuple(lse.shape) == (2, 8, 17) and lse.dtype == torch.float32
        _, lse = ck.attention(t(5, 33, dtype=torch.float32), t(7, 33, dtype=torch.float32), t(7, 33, dtype=torch.float32),
                              window=(1, 1), return_lse=True)
        assert tuple(lse.shape) == (5,)
        with pytest.raises(TypeError, match="return_lse"):
            ck.attention(t(5, 33), t(7, 33), t(7, 33), return_lse=1)
    q = torch.empty(4, 16, device="meta")
    out = torch.empty(4, 16, device="meta")
    result, lse = ck.attention(q, q, q, return_lse=True, out=out)
    assert result is out and tuple(lse.shape) == (4,)


# torch.func's transforms import modules that use torch.jit.script, which warns it is deprecated (torch's
# own code, not ours).
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_calls_under_a_dispatch_mode_or_torch_func_transform_are_not_plain_eager():
    """Only a plain eager call skips the custom op's dispatch (the public functions' and the CUDA kernels'
    fast path): under a dispatch mode or a torch.func transform a torch.Tensor may be a wrapper without
    storage of its own, which that dispatch unwraps."""
    x = torch.randn(3, 4)
    assert torch_ops._plain_eager_call((x,), {})
    assert not torch_ops._plain_eager_call((x.requires_grad_(),), {})
    with torch.no_grad():
        assert torch_ops._plain_eager_call((x,), {})
    x = x.detach()
    seen = []

    def record(t):
        seen.append(torch_ops._plain_eager_call((t,), {}))
        return t * 2

    torch.func.vmap(record)(x)
    torch.func.grad(lambda t: record(t).sum())(x)
    torch.func.functionalize(record)(x)
    with FakeTensorMode():
        record(torch.empty(2))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        record(fwAD.make_dual(x, torch.ones_like(x)))
    assert seen == [False] * 5


def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("call, error, message", [
    (lambda o: o.sgemm(_meta(8, 5, dtype=torch.float64), _meta(5, 8)), TypeError, r"^a: expected dtype"),
    (lambda o: o.sgemm(_meta(8, 5), _meta(6, 8)), ValueError, r"^b: expected 5 rows"),
    (lambda o: o.sgemm(_meta(8), _meta(8, 8)), ValueError, r"^a: expected a 2-D matrix"),
    (lambda o: o.sgemm(_meta(8, 8), _meta(8, 8), None, 1.0, 1.0), ValueError, r"^c: required when beta != 0"),
    (lambda o: o.hgemm(_meta(8, 8), _meta(8, 8)), TypeError, r"^a: expected dtype"),
    (lambda o: o.attention(_meta(8, 32), _meta(8, 32, dtype=torch.int32), _meta(8, 32)), TypeError, r"^k: "),
    (lambda o: o.attention(_meta(8, 32), _meta(8, 16), _meta(8, 16)), ValueError, r"^k: expected head dim"),
    (lambda o: o.attention(*(_meta(8, 32),) * 3, None, False, [1, 1], -5), ValueError, r"^num_sinks: "),
    (lambda o: o.conv3d(_meta(4, 4, 4), _meta(9, 3, 3)), ValueError, r"^kernel: shape \(9, 3, 3\) is larger"),
    (lambda o: o.conv3d(_meta(8, 8, 8, dtype=torch.int64), _meta(3, 3, 3)), TypeError, r"^volume: expected dtype"),
    (lambda o: o.conv2d(_meta(8), _meta(3, 3)), ValueError, r"^image: expected a \(H, W\)"),
    (lambda o: o.conv1d(_meta(8), _meta(9)), ValueError, r"^kernel: "),
    (lambda o: o.scan(_meta(4, 4), op="sum "), ValueError, r"^op: expected one of"),
    (lambda o: o.scan(_meta(4, 4), op="mean"), ValueError, r"^op: expected one of"),
    (lambda o: o.scan(_meta(4, 4, dtype=torch.complex64)), TypeError, r"^x: expected dtype"),
    (lambda o: o.scan(_meta(4, 4, dtype=torch.bool), op="logsumexp"), TypeError, r"^x: expected dtype"),
    (lambda o: o.scan(_meta(4, 4), dtype=torch.bool), TypeError, r"^dtype: expected one of"),  # as torch.cumsum
    (lambda o: o.scan(_meta(4, 4), op="logsumexp", dtype=torch.int8), TypeError, r"^dtype: op 'logsumexp' does not take"),
    (lambda o: o.scan(_meta(4, 4), segment_starts=_meta(2, dtype=torch.bool)), ValueError, r"^segment_starts: "),
    (lambda o: o.linear_scan(None, _meta(4, 4, dtype=torch.int32), a_number=0.5), TypeError, r"^x: expected dtype"),
    (lambda o: o.linear_scan(None, _meta(4, 4), a_number=float("inf")), ValueError, r"^a: expected a finite number"),
    (lambda o: o.linear_scan(_meta(7, 7), _meta(4, 4)), ValueError, r"^a: shape \(7, 7\)"),
], ids=lambda v: "" if callable(v) or isinstance(v, (str, type)) else str(v))
def test_meta_tensors_skip_only_the_device_checks(call, error, message):
    """Meta tensors stand for CUDA tensors in shape propagation: the fake implementation lets them through
    the device checks and keeps every structural, dtype and option check."""
    with pytest.raises(error, match=message):
        call(torch.ops.cute_kernels)


@pytest.mark.parametrize("call, error, message", [
    (lambda: ck.sgemm(_meta(8, 5, dtype=torch.float64), _meta(6, 8)), TypeError, r"^a: expected dtype"),
    (lambda: ck.scan(_meta(4, 4), op="mean"), ValueError, r"^op: expected one of"),
    (lambda: ck.attention(_meta(8, 32), _meta(9, 32), _meta(8, 32)), ValueError, r"^v: expected 9 rows"),
    (lambda: ck.linear_scan(_meta(7, 7), _meta(4, 4)), ValueError, r"^a: shape \(7, 7\)"),
], ids=["sgemm", "scan", "attention", "linear_scan"])
def test_public_ops_on_meta_fakes_keep_the_checks(call, error, message):
    with FakeTensorMode(), pytest.raises(error, match=message):
        call()


def test_meta_tensors_that_pass_the_checks_get_the_results_shape():
    ops = torch.ops.cute_kernels
    assert ops.sgemm(_meta(8, 5), _meta(5, 3)).shape == (8, 3)
    assert ops.conv2d(_meta(2, 9, 9), _meta(3, 3), "same").shape == (2, 9, 9)
    assert ops.scan(_meta(4, 4, dtype=torch.int32)).dtype == torch.int64
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):  # the eager op still refuses meta
        torch_ops.scan_eager(_meta(4, 4))


def _scalar_cases():
    """(id, call on fake CUDA tensors, error, message): scalars the schema would convert (a bool to a float
    or an int) or fail on with an error of its own; eager refuses them by name."""

    def t(*shape):
        return torch.empty(shape, device="cuda")

    q = lambda: t(2, 4, 8, 32)  # noqa: E731
    return [
        ("sgemm-alpha-bool", lambda: ck.sgemm(t(8, 8), t(8, 8), alpha=True), TypeError, r"^alpha: expected a real"),
        ("sgemm-beta-bool", lambda: ck.sgemm(t(8, 8), t(8, 8), t(8, 8), beta=True), TypeError, r"^beta: expected a real"),
        ("hgemm-alpha-str", lambda: ck.hgemm(t(8, 8).half(), t(8, 8).half(), alpha="1"), TypeError, r"^alpha: "),
        ("sgemm-alpha-tensor", lambda: ck.sgemm(t(8, 8), t(8, 8), alpha=torch.tensor(2.0)), TypeError, r"^alpha: "),
        ("sgemm-alpha-huge-int", lambda: ck.sgemm(t(8, 8), t(8, 8), alpha=10**400), ValueError,
         r"^alpha: expected a number within float32's range"),
        ("attention-scale-bool", lambda: ck.attention(q(), q(), q(), scale=True), TypeError, r"^scale: expected a real"),
        ("attention-num_sinks-bool", lambda: ck.attention(q(), q(), q(), window=(1, 1), num_sinks=True), TypeError,
         r"^num_sinks: expected an int"),
        ("attention-num_sinks-float", lambda: ck.attention(q(), q(), q(), window=(1, 1), num_sinks=2.0), TypeError,
         r"^num_sinks: expected an int"),
        ("scan-dim-bool", lambda: ck.scan(t(4, 16), dim=True), TypeError, r"^dim: expected an int, got bool"),
        ("linear_scan-dim-bool", lambda: ck.linear_scan(0.5, t(4, 16), dim=False), TypeError, r"^dim: expected an int"),
        ("linear_scan-a-huge-int", lambda: ck.linear_scan(10**400, t(4, 16)), ValueError,
         r"^a: expected a number within float32's range"),
    ]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in _scalar_cases()], ids=[c[0] for c in _scalar_cases()])
def test_traced_scalars_are_checked_before_the_schema_converts_them(call, error, message, compiling):
    with FakeTensorMode(), pytest.raises(error, match=message):
        call()


def test_a_traced_scan_takes_a_numpy_integer_dim_as_eager_does(compiling):
    """torch.cumsum takes a NumPy integer dim, and so do eager and the traced call (the schema converts it)."""
    import numpy as np

    with FakeTensorMode():
        assert ck.scan(torch.empty(4, 16, device="cuda"), dim=np.int64(0)).shape == (4, 16)


def test_a_linear_scan_decay_past_float64_is_refused_by_name_on_the_autograd_path():
    """A call that needs a gradient crosses the custom op, whose schema takes the decay as a float."""
    with pytest.raises(ValueError, match=r"^a: expected a number within float32's range"):
        ck.linear_scan(10**400, torch.randn(4, 16, requires_grad=True))
    with pytest.raises(TypeError, match=r"^dim: expected an int, got bool"):
        ck.linear_scan(0.5, torch.randn(4, 16, requires_grad=True), dim=True)


def test_compiled_scalars_keep_their_values_and_bools_are_refused():
    """Under torch.compile the type checks trace (no graph break) and new float values recompile or
    generalize; a bool is refused with eager's error. Meta tensors: a CPU-only torch."""
    a = torch.empty(8, 8, device="meta")
    f = torch.compile(lambda a, alpha, dim: (ck.sgemm(a, a, alpha=alpha), ck.scan(a, dim=dim)), fullgraph=True,
                      backend="eager")
    for alpha, dim in ((2.0, 0), (3.0, 1), (0.5, -1)):
        assert all(r.shape == (8, 8) for r in f(a, alpha, dim))
    with pytest.raises(Exception, match=r"alpha: expected a real number, got bool"):
        f(a, True, 0)


def test_compiled_gemm_out_takes_what_eager_takes():
    """A GEMM's out may be row-major matrices sliced from wider rows, eagerly and compiled alike; a
    column-major one is refused by both."""
    m = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    f = torch.compile(lambda a, b, o: ck.sgemm(a, b, out=o), fullgraph=True, backend="eager")
    out = m(8, 16)[:, :8]
    assert f(m(8, 8), m(8, 8), out) is out
    # Dynamo before torch 2.13 reports the traced exception's format pieces, not the formatted message.
    with pytest.raises(Exception, match=r"expected row-major storage"):
        f(m(8, 8), m(8, 8), m(8, 8).t())


@pytest.mark.parametrize("make_args", [
    lambda m: (m(8, 8), m(8, 8), m(8, 8).requires_grad_()),
    lambda m: (m(8, 8).requires_grad_(), m(8, 8), m(8, 8)),
], ids=["out-requires-grad", "input-requires-grad"])
def test_compiled_out_refuses_a_differentiable_call_as_eager_does(make_args, compiling):
    m = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    a, b, out = make_args(m)
    with pytest.raises(ValueError, match=r"^out: ck\.sgemm with out= does not support automatic differentiation"):
        ck.sgemm(a, b, out=out)
    with torch.no_grad():  # an optimizer's update: allowed, as eager allows it
        assert ck.sgemm(a, b, out=out) is out


def test_traced_out_refuses_an_inference_tensor_as_eager_does():
    with torch.inference_mode():
        out = torch.empty(8, 8, device="meta")
    with FakeTensorMode():
        a = torch.empty(8, 8, device="meta")
        with pytest.raises(ValueError, match=r"^out: an inference tensor cannot be written outside"):
            ck.sgemm(a, a.requires_grad_(), out=out)


def _backward_args(**changes):
    """torch.ops.cute_kernels.attention_backward's arguments of a well-formed (2, 8, 32) call, with changes."""
    q = _meta(2, 8, 32)
    args = dict(q=q, k=_meta(2, 8, 32), v=_meta(2, 8, 32), out=_meta(2, 8, 32), lse=_meta(2, 8), grad_out=_meta(2, 8, 32),
                grad_lse=None, scale=None, causal=False, window=None, num_sinks=0)
    args.update(changes)
    return tuple(args.values())


@pytest.mark.parametrize("op, args, error, message", [
    ("conv3d_kernel_grad", lambda: (_meta(1, 4, 4, 4, dtype=torch.float64), _meta(1, 2, 2, 2), [3, 3, 3], [0] * 6),
     TypeError, r"^volume: expected dtype"),
    ("conv3d_kernel_grad", lambda: (_meta(4, 4, 4), _meta(2, 2, 2), [3, 3, 3], [0] * 6), ValueError,
     r"^volume: expected a \(N, D, H, W\)"),
    ("conv3d_kernel_grad", lambda: (_meta(1, 4, 4, 4), _meta(1, 9, 9, 9), [3, 3, 3], [0] * 6), ValueError,
     r"^grad: expected shape \(1, 2, 2, 2\)"),
    ("conv3d_kernel_grad", lambda: (_meta(1, 4, 4, 4), _meta(1, 2, 2, 2), [3, 3, 3], [0, 0]), TypeError, r"^pads: "),
    ("conv3d_kernel_grad", lambda: (_meta(1, 4, 4, 4), _meta(1, 2, 2, 2), [3, 3, 3], [0, 0, 0, 0, 0, -1]), ValueError,
     r"^pads: expected 6 ints >= 0"),
    ("conv3d_kernel_grad", lambda: (_meta(1, 4, 4, 4), _meta(1, 1, 1, 1), [5, 3, 3], [0] * 6), ValueError,
     r"^kernel_sides: .* larger than the padded volume"),
    ("attention_backward", lambda: _backward_args(q=_meta(2, 8, 32, dtype=torch.float64)), TypeError, r"^q: "),
    ("attention_backward", lambda: _backward_args(k=_meta(2, 8, 16)), ValueError, r"^k: expected head dim"),
    ("attention_backward", lambda: _backward_args(out=_meta(2, 8, 16)), ValueError, r"^out: expected shape"),
    ("attention_backward", lambda: _backward_args(grad_out=_meta(2, 8, 32, dtype=torch.float16)), TypeError,
     r"^grad_out: expected dtype torch\.float32"),
    ("attention_backward", lambda: _backward_args(lse=_meta(3)), ValueError, r"^lse: expected shape \(2, 8\)"),
    ("attention_backward", lambda: _backward_args(lse=_meta(2, 8, dtype=torch.float16)), TypeError,
     r"^lse: expected dtype torch\.float32"),
    ("attention_backward", lambda: _backward_args(grad_lse=_meta(2, 9)), ValueError, r"^grad_lse: expected shape"),
    ("attention_backward", lambda: _backward_args(num_sinks=-1), ValueError, r"^num_sinks: "),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("^") else "")
def test_the_backward_custom_ops_check_their_arguments(op, args, error, message):
    """The ops the backward passes call are anyone's through torch.ops: inconsistent arguments are refused
    by name (meta tensors: the fake implementation; the CUDA kernel runs the same checks first)."""
    with pytest.raises(error, match=message):
        getattr(torch.ops.cute_kernels, op)(*args())


def test_the_backward_custom_ops_take_well_formed_arguments():
    dq, dk, dv = torch.ops.cute_kernels.attention_backward(*_backward_args(grad_lse=_meta(2, 8)))
    assert dq.shape == dk.shape == dv.shape == (2, 8, 32)
    grad = torch.ops.cute_kernels.conv3d_kernel_grad(_meta(1, 4, 4, 4), _meta(1, 4, 4, 4), [3, 3, 3], [1] * 6)
    assert grad.shape == (3, 3, 3)
    with pytest.raises(ValueError, match="^volume: expected a CUDA tensor"):  # the real op on CPU tensors
        torch.ops.cute_kernels.conv3d_kernel_grad(torch.randn(1, 4, 4, 4), torch.randn(1, 2, 2, 2), [3, 3, 3], [0] * 6)


@pytest.mark.parametrize("padding, sizes, message", [
    ("pairs", [1, 1, 1, 1, 1, 1, 5], "needs pairs of sizes"),  # a size left over
    ("valid", [5, 5, 5], "takes no sizes"),
    ("sizes", None, "needs sizes"),
])
def test_a_direct_torch_ops_conv_call_with_malformed_padding_is_refused(padding, sizes, message):
    """The schema carries padding as (kind, sizes); a direct call may give a pair the Python op never makes,
    which was read in part (a trailing size dropped, sizes beside "valid" ignored) or failed unnamed."""
    m = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    with pytest.raises(ValueError, match=rf"^padding_sizes: .*{message}"):
        torch.ops.cute_kernels.conv3d(m(8, 8, 8), m(3, 3, 3), padding, sizes)


def test_the_kernel_gradient_of_an_empty_batch_past_the_kernel_side_limit_is_zeros(monkeypatch):
    """Past MAX_KERNEL_SIDE the kernel's gradient is torch's convolution of the volume with the output's
    gradient, whose batch of none gave no channel to index (an IndexError); it is zeros, as below the limit."""
    from cute_kernels.runtime import checks

    monkeypatch.setattr(checks, "cuda_tensor", lambda name, t: t)
    grad = torch.ops.cute_kernels.conv3d_kernel_grad(torch.zeros(0, 20, 5, 5), torch.zeros(0, 5, 3, 3), [16, 3, 3],
                                                     [0] * 6)
    assert grad.shape == (16, 3, 3) and not grad.any()


@pytest.mark.parametrize("call", [lambda a, b: ck.sgemm(a, b), lambda a, b: ck.scan(a, dim=0),
                                  lambda a, b: ck.linear_scan(0.5, a)], ids=["sgemm", "scan", "linear_scan"])
def test_torch_jit_trace_records_the_custom_op(call):
    """torch.jit.trace sees torch ops only: the eager path's allocation, not its launch (a ctypes or TVM-FFI
    call), so a trace of the eager path would return uninitialised memory on new inputs. A traced call goes
    through the custom op, which the trace records."""
    a, b = torch.empty(8, 8, device="meta"), torch.empty(8, 8, device="meta")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python values it cannot see
        traced = torch.jit.trace(call, (a, b), check_trace=False)
    assert "cute_kernels::" in str(traced.graph)


def test_out_is_allowed_in_inference_mode_with_grad_enabled():
    """Inference mode records no graph even under enable_grad, and torch.mm(a_requiring_grad, b, out=o) is
    accepted there."""
    from cute_kernels.torch_ops import _out_may_be_written

    a = torch.randn(4, 4, requires_grad=True)
    with torch.inference_mode():
        out = torch.empty(4, 4)
        with torch.enable_grad():
            _out_may_be_written("ck.sgemm", {"a": a, "out": out})
    with pytest.raises(ValueError, match="does not support automatic differentiation"):
        _out_may_be_written("ck.sgemm", {"a": a, "out": torch.empty(4, 4)})


def test_the_linear_scan_custom_op_reads_like_the_function():
    """torch.ops.cute_kernels.linear_scan(a, x) with a decay tensor, as ck.linear_scan(a, x); a number
    crosses as a_number, last and by name."""
    ops = torch.ops.cute_kernels
    assert ops.linear_scan(_meta(4, 1), _meta(4, 9)).shape == (4, 9)
    assert ops.linear_scan(None, _meta(4, 9), reverse=True, a_number=0.5).shape == (4, 9)
