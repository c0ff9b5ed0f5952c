"""The autograd rules every op shares (runtime.autograd): a call that would need a backward is refused,
eagerly, through torch.ops and under torch.compile, with one error; an out= torch would not write in place
is refused; a written out= gets its version counter bumped. The refusals come before any device check, so
CPU tensors reach them here; the GPU half (torch.ops forward, version bumps after real writes) is in
tests/test_torch_ops_gpu.py."""

import numpy as np
import pytest
import torch

import cute_kernels as ck


def _calls(requires_grad_arg: str):
    """(op, the call's args, the name of the arg that requires grad) for every public op."""
    def t(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, dtype=dtype).requires_grad_(grad)

    g = requires_grad_arg
    return [
        ("sgemm", lambda: ck.sgemm(t(8, 8, grad=g == "a"), t(8, 8, grad=g == "b")), "a" if g == "a" else "b"),
        ("hgemm", lambda: ck.hgemm(t(8, 8, dtype=torch.float16, grad=g == "a"), t(8, 8, dtype=torch.float16)), "a"),
        ("attention", lambda: ck.attention(t(4, 8), t(4, 8, grad=g == "a"), t(4, 8)), "k"),
        ("conv3d", lambda: ck.conv3d(t(6, 6, 6), t(3, 3, 3, grad=g == "a")), "kernel"),
        ("conv2d", lambda: ck.conv2d(t(6, 6, grad=g == "a"), t(3, 3)), "image"),
        ("conv1d", lambda: ck.conv1d(t(6), t(3, grad=g == "a")), "kernel"),
        ("scan", lambda: ck.scan(t(100, grad=g == "a")), "x"),
    ]


# Every op has a backward: ck.scan (tests/test_scan_gpu.py), the convolutions (tests/test_conv3d_gpu.py), the
# GEMMs (tests/test_gemm_batched_gpu.py), attention (tests/test_attention_backward_gpu.py).


def _meta(*shape, dtype=torch.float16, grad=False):
    """Meta tensors: the custom op's fake implementation runs and autograd records it on a CPU-only torch."""
    return torch.empty(*shape, dtype=dtype, device="meta").requires_grad_(grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_attention_records_a_backward_in_every_dtype(dtype):
    out = ck.attention(_meta(4, 8, dtype=dtype), _meta(4, 8, dtype=dtype, grad=True), _meta(4, 8, dtype=dtype))
    assert out.requires_grad and out.grad_fn is not None


@pytest.mark.parametrize("op, call, name", _calls("a"), ids=lambda v: v if isinstance(v, str) else "")
def test_under_no_grad_the_same_call_is_not_refused_for_grad(op, call, name):
    with torch.no_grad(), pytest.raises(ValueError) as info:
        call()  # CPU tensors: refused for the device instead
    assert "requires grad" not in str(info.value) and "CUDA" in str(info.value)


def test_an_out_that_requires_grad_is_refused_while_grad_mode_is_on():
    out = torch.full((4, 8), float("nan"), requires_grad=True)
    # A differentiable op refuses out= while an argument (out too) requires grad, as torch's ops do.
    with pytest.raises(ValueError, match=r"^out: ck\.attention with out= does not support automatic differentiation"):
        ck.attention(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8), out=out)
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match=r"^out: ck\.sgemm with out= does not support automatic differentiation"):
        ck.sgemm(torch.randn(4, 4), torch.randn(4, 4), out=out)
    assert torch.isnan(out).all()


def test_an_inference_tensor_is_not_written_outside_inference_mode():
    with torch.inference_mode():
        out = torch.full((4, 4), float("nan"))
    with pytest.raises(ValueError, match=r"^out: an inference tensor cannot be written outside"):
        ck.sgemm(torch.randn(4, 4), torch.randn(4, 4), out=out)
    assert torch.isnan(out).all()


def test_the_version_counter_of_out_is_bumped_by_a_write():
    from cute_kernels.runtime import autograd

    out = torch.zeros(3)
    before = out._version
    autograd.mark_written(out)
    assert out._version > before
    with torch.inference_mode():
        frozen = torch.zeros(3)
        autograd.mark_written(frozen)  # inference tensors have no version counter: nothing to bump


def test_a_saved_tensor_overwritten_through_out_fails_the_backward_instead_of_a_wrong_grad():
    """What the bump buys: autograd saved w for the backward of w * w; a write of w that torch did not see
    would give a wrong w.grad silently; after mark_written, backward refuses."""
    from cute_kernels.runtime import autograd

    leaf = torch.randn(4, requires_grad=True)
    w = leaf * 1.0
    loss = (w * w).sum()
    autograd.mark_written(w)  # what an op does after its kernel wrote w as out=
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_torch_compile_traces_the_attention_backward(dtype):
    q, k = _meta(3, 4, 8, dtype=dtype, grad=True), _meta(3, 6, 8, dtype=dtype, grad=True)
    compiled = torch.compile(lambda q, k: ck.attention(q, k, k, causal=True).sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(q, k).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_torch_compile_traces_the_gemm_backward():
    """The GEMMs' backward traces (meta tensors: shapes only), a batch broadcasting over a single b too."""
    a = torch.randn(3, 4, 5, device="meta", requires_grad=True)
    b = torch.randn(6, 5, device="meta", requires_grad=True)
    c = torch.randn(6, device="meta", requires_grad=True)
    compiled = torch.compile(lambda a, b, c: ck.sgemm(a, b.t(), c, beta=1.0).sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(a, b, c).backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape and c.grad.shape == c.shape


def test_scan_records_a_backward_for_an_input_that_requires_grad():
    """ck.scan has a backward: a call on an input that requires grad goes through its custom op, which
    autograd records (meta tensors: the fake implementation gives the forward's shape on a CPU-only torch)."""
    x = torch.randn(4, 5, device="meta", requires_grad=True)
    y = ck.scan(x, dim=0, reverse=True, op="logsumexp")
    assert y.requires_grad and y.grad_fn is not None and y.shape == x.shape
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA"):
        ck.scan(x)  # no gradient needed: the eager op, which refuses a meta tensor for its device


def test_scan_with_grad_refuses_out_config_and_variant():
    x = torch.randn(4, 5, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match=r"^out: ck\.scan with out= does not support automatic differentiation"):
        ck.scan(x, out=torch.empty(4, 5, device="meta"))
    with pytest.raises(TypeError, match="config= is not supported with autograd"):
        ck.scan(x, config=ck.ScanConfig())
    with pytest.raises(TypeError, match="variant= is not supported with autograd"):
        ck.scan(x, variant="lookback")


def test_config_off_the_eager_path_names_the_route_it_took():
    """A config= the custom op cannot carry is refused naming why the call took the custom op (a transform,
    a dispatch mode), not autograd when nothing requires grad."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(3, 4, 5, device="meta")
    with pytest.raises(TypeError, match=r"config= is not supported under a torch\.func transform .*outside the transform"):
        torch.vmap(lambda row: ck.scan(row, config=ck.ScanConfig()))(x)
    with FakeTensorMode(), pytest.raises(TypeError, match="variant= is not supported under a tracer or dispatch mode"):
        ck.scan(torch.empty(4, 5, device="cuda"), variant="lookback")
    with torch.autograd.forward_ad.dual_level(), pytest.raises(TypeError, match="under forward-mode AD"):
        ck.scan(x[0], config=ck.ScanConfig())


@pytest.mark.parametrize("op", ["sum", "logsumexp", "max", "prod"])
def test_torch_compile_traces_the_scans_forward_and_backward(op):
    """torch.compile (aot_eager) traces ck.scan's custom op and its backward (ours for sum and logsumexp, torch's
    rules for the others); meta tensors, so the trace runs on a CPU-only torch."""
    x = torch.randn(4, 8, device="meta", requires_grad=True)
    compiled = torch.compile(lambda t: ck.scan(t, dim=0, op=op, reverse=True).sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(x).backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("op", ["prod", "max", "min"])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_backward_of_an_exclusive_scan_of_one_number(op, reverse):
    """A 0-dim x: the backward differentiates torch's scan, whose exclusive shift (narrow()) takes no 0-dim
    tensor; it runs on the number as a row of one."""
    torch._dynamo.reset()
    x = torch.randn((), device="meta", requires_grad=True)
    compiled = torch.compile(lambda t: ck.scan(t, op=op, exclusive=True, reverse=reverse), fullgraph=True,
                             backend="aot_eager")
    compiled(x).backward()
    assert x.grad is not None and x.grad.shape == ()


@pytest.mark.parametrize("rank", [3, 2, 1])
@pytest.mark.parametrize("padding", ["valid", "same", 1, "pairs", "numpy"])
def test_torch_compile_traces_the_convolutions_forward_and_backward(rank, padding):
    """The input's gradient is our convolution with the flipped kernel, the kernel's our kernel-gradient op;
    meta tensors, so the trace runs on a CPU-only torch."""
    torch._dynamo.reset()  # each case its own compile (the lambda's code object is shared)
    op = {3: ck.conv3d, 2: ck.conv2d, 1: ck.conv1d}[rank]
    shape, kernel_shape = {3: ((2, 6, 7, 8), (3, 2, 4)), 2: ((9, 10), (3, 4)), 1: ((3, 20), (5,))}[rank]
    padding = ((1, 2),) * rank if padding == "pairs" else padding
    x = torch.randn(shape, device="meta", requires_grad=True)
    k = torch.randn(kernel_shape, device="meta", requires_grad=True)
    if padding == "numpy":  # a NumPy integer made inside the compiled code: no graph break
        compiled = torch.compile(lambda x, k: op(x, k, padding=np.int64(1)).sum(), fullgraph=True, backend="aot_eager")
    else:
        compiled = torch.compile(lambda x, k: op(x, k, padding=padding).sum(), fullgraph=True, backend="aot_eager")
    compiled(x, k).backward()
    assert x.grad.shape == x.shape and k.grad.shape == k.shape



def _public_and_torch_ops_calls():
    """(id, call(x)) of every public op and its torch.ops op, ``x`` the tensor that carries a tangent."""
    ops = torch.ops.cute_kernels

    def m(*shape):
        return torch.empty(shape, device="meta")

    return [
        ("sgemm", lambda x: ck.sgemm(x, m(8, 8))),
        ("hgemm", lambda x: ck.hgemm(x.half(), m(8, 8).half())),
        ("attention", lambda x: ck.attention(m(8, 8), x, m(8, 8))),
        ("attention-lse", lambda x: ck.attention(x, m(8, 8), m(8, 8), return_lse=True)[1]),
        ("conv3d", lambda x: ck.conv3d(x.reshape(2, 4, 8), m(1, 3, 3))),
        ("conv2d", lambda x: ck.conv2d(m(8, 8), x[:3, :3])),
        ("conv1d", lambda x: ck.conv1d(x, m(3))),
        ("scan", lambda x: ck.scan(x)),
        ("linear_scan", lambda x: ck.linear_scan(0.5, x)),
        ("linear_scan-a", lambda x: ck.linear_scan(x, m(8, 8))),
        ("torch.ops.sgemm", lambda x: ops.sgemm(x, m(8, 8))),
        ("torch.ops.attention", lambda x: ops.attention(m(8, 8), m(8, 8), x)),
        ("torch.ops.scan", lambda x: ops.scan(x)),
        ("torch.ops.linear_scan", lambda x: ops.linear_scan(None, x, a_number=0.5)),
        ("torch.ops.conv2d", lambda x: ops.conv2d(x, m(3, 3))),
    ]


# torch.func's transforms import modules that use torch.jit.script, which warns it is deprecated.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("call", [c for _, c in _public_and_torch_ops_calls()],
                         ids=[i for i, _ in _public_and_torch_ops_calls()])
def test_forward_mode_ad_is_refused_instead_of_dropping_the_tangent(call):
    """No op has a forward-mode derivative: a dual input (torch.autograd.forward_ad) would give a result
    without a tangent, and torch.func.jvp a zero one. Meta tensors: the custom op's path on a CPU-only
    torch."""
    import torch.autograd.forward_ad as fwAD

    x, tangent = torch.empty(8, 8, device="meta"), torch.empty(8, 8, device="meta")
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match=r"forward-mode AD \(jvp\) is not supported"):
        call(fwAD.make_dual(x, tangent))
    with fwAD.dual_level():  # no tangent: nothing to drop
        call(x)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("call", [c for i, c in _public_and_torch_ops_calls() if not i.startswith("torch.ops")],
                         ids=[i for i, _ in _public_and_torch_ops_calls() if not i.startswith("torch.ops")])
def test_torch_func_differentiating_transforms_are_refused_and_vmap_is_not(call):
    """torch.func.jvp (and jacfwd) would give a zero tangent, torch.func.grad (vjp, jacrev) fails inside
    torch.func on the op's autograd registration: both refused by name. vmap runs the op per sample."""
    x = torch.empty(8, 8, device="meta")
    with pytest.raises(NotImplementedError, match=r"forward-mode AD \(jvp\) is not supported"):
        torch.func.jvp(call, (x,), (x,))
    with pytest.raises(NotImplementedError, match=r"forward-mode AD \(jvp\) is not supported"):
        torch.func.jacfwd(call)(x)
    with pytest.raises(NotImplementedError, match=r"torch\.func\.grad, vjp and jacrev are not supported"):
        torch.func.grad(lambda t: call(t).float().sum())(x)
    with pytest.raises(NotImplementedError, match=r"torch\.func\.grad, vjp and jacrev are not supported"):
        torch.func.vjp(call, x)
    assert torch.func.vmap(call)(torch.empty(2, 8, 8, device="meta")).shape[0] == 2


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_cuda_autograd_kernels_refuse_forward_mode_ad_and_torch_func_grad():
    """torch.ops on CUDA tensors takes the ops' own AutogradCUDA kernels (fake CUDA tensors: no GPU needed)."""
    import torch.autograd.forward_ad as fwAD
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(8, 8, device="cuda")
        with fwAD.dual_level(), pytest.raises(NotImplementedError, match=r"^torch\.ops\.cute_kernels\.sgemm: forward-mode"):
            torch.ops.cute_kernels.sgemm(fwAD.make_dual(a, torch.empty_like(a)), a)
        with pytest.raises(NotImplementedError, match=r"^torch\.ops\.cute_kernels\.scan: torch\.func\.grad"):
            torch.func.grad(lambda t: torch.ops.cute_kernels.scan(t).sum())(a)


def test_a_scan_to_an_integer_dtype_of_an_x_that_requires_grad_is_refused():
    """An int32 result carries no gradient: torch.cumsum refuses the call, and so do we (a detached result
    would silently drop the gradient), by name; allowed where no gradient is asked for."""
    x = torch.randn(8, device="meta", requires_grad=True)
    with pytest.raises(TypeError, match=r"^dtype: torch.int32 carries no gradient"):
        ck.scan(x, dtype=torch.int32)
    with torch.no_grad(), pytest.raises(ValueError, match="expected a CUDA tensor"):  # past the dtype rule
        ck.scan(x, dtype=torch.int32)
