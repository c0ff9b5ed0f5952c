"""Property-based tests (hypothesis) of every public op on the GPU: random shapes, strides, offsets and
scalars, each result held to the suite's oracle (oracle.compare against float64, at most twice torch's
own error in units of the family's error scale). Shapes stay small so that an example takes milliseconds
once its kernel is compiled; the distinct compile-time traits they reach are few (dtype, alignment,
beta == 0, kernel sides 1..3)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cute_kernels as ck
from cute_kernels.ops.attention import spec as attention_spec
from cute_kernels.ops.conv3d import reference as conv3d_reference
from cute_kernels.ops.gemm import reference as gemm_reference
from cute_kernels.ops.scan import reference as scan_reference
from cute_kernels.runtime import oracle

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_torch")]

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])  # exact_fp32_torch only sets a flag
dim = st.integers(1, 200)


def randn(shape, dtype, seed, offset=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    flat = torch.randn(n + offset, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return flat[offset:].view(shape)


@SETTINGS
@given(m=dim, n=dim, k=st.integers(0, 200), offset=st.integers(0, 3), beta=st.sampled_from([0.0, 0.5, -1.0]),
       alpha=st.floats(-2, 2, allow_nan=False), seed=st.integers(0, 2**16))
def test_sgemm(m, n, k, offset, beta, alpha, seed):
    a, b = randn((m, k), torch.float32, seed, offset), randn((k, n), torch.float32, seed + 1)
    c = randn((m, n), torch.float32, seed + 2)
    out = ck.sgemm(a, b, c, alpha=alpha, beta=beta)
    ref = alpha * (a.double() @ b.double()) + beta * c.double()
    theirs = torch.addmm(c, a, b, alpha=alpha, beta=beta)
    verdict = oracle.compare(out, ref, theirs, scale=gemm_reference.gemm_scale(a, b, c, alpha=alpha, beta=beta))
    assert verdict, verdict.detail


@SETTINGS
@given(m=dim, n=dim, k=dim, offset=st.integers(0, 8), beta=st.sampled_from([0.0, 0.5]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_hgemm(m, n, k, offset, beta, dtype, seed):
    a, b = randn((m, k), dtype, seed, offset), randn((k, n), dtype, seed + 1)
    c = randn((m, n), dtype, seed + 2) if beta else None
    out = ck.hgemm(a, b, c, alpha=1.5, beta=beta)
    theirs = torch.addmm(c, a, b, alpha=1.5, beta=beta) if beta else torch.mm(a, b) * 1.5
    verdict = gemm_reference.gemm_verdict(out, a, b, c, alpha=1.5, beta=beta, baseline=theirs)
    assert verdict, verdict.detail


@SETTINGS
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), m=st.integers(1, 150), n=st.integers(1, 150),
       d=st.sampled_from([16, 40, 64, 128]), causal=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_attention(batch, heads, m, n, d, causal, dtype, seed):
    q = randn((batch, heads, m, d), dtype, seed)
    k, v = randn((batch, heads, n, d), dtype, seed + 1), randn((batch, heads, n, d), dtype, seed + 2)
    out = ck.attention(q, k, v, causal=causal)
    ref, mag = attention_spec.reference_and_scale(q, k, v, None, causal)
    with torch.nn.attention.sdpa_kernel(attention_spec.sdpa_backends(dtype) + [torch.nn.attention.SDPBackend.MATH]):
        theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    floor = 2 * torch.finfo(dtype).eps if dtype != torch.float32 else None
    verdict = oracle.compare(out, ref, theirs, scale=mag, floor=floor)
    assert verdict, verdict.detail


@SETTINGS
@given(batch=st.integers(0, 2), d=st.integers(3, 24), h=st.integers(3, 24), w=st.integers(3, 40),
       kd=st.integers(1, 3), kh=st.integers(1, 3), kw=st.integers(1, 3), offset=st.integers(0, 3),
       seed=st.integers(0, 2**16))
def test_conv3d(batch, d, h, w, kd, kh, kw, offset, seed):
    shape = (batch, d, h, w) if batch else (d, h, w)
    volume, kernel = randn(shape, torch.float32, seed, offset), randn((kd, kh, kw), torch.float32, seed + 1)
    out = ck.conv3d(volume, kernel)
    v4 = volume if batch else volume[None]
    theirs = conv3d_reference.torch_conv3d(v4, kernel)  # cuDNN with TF32 off, like the op's own tests
    ref = conv3d_reference.conv3d_reference(v4, kernel)
    verdict = oracle.compare(out if batch else out[None], ref, theirs, scale=conv3d_reference.conv3d_scale(v4, kernel))
    assert verdict, verdict.detail


@SETTINGS
@given(rows=st.integers(1, 40), length=st.integers(1, 50_000), offset=st.integers(0, 3), exclusive=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_scan(rows, length, offset, exclusive, dtype, seed):
    if dtype.is_floating_point:
        x = randn((rows, length), dtype, seed, offset)
    else:
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randint(-1000, 1000, (rows * length + offset,), generator=g, device="cuda", dtype=dtype)[offset:]
        x = x.view(rows, length)
    out = ck.scan(x, exclusive=exclusive)
    wide = x.double() if dtype.is_floating_point else x.long()
    ref = torch.cumsum(wide, -1) - (wide if exclusive else 0)
    if not dtype.is_floating_point:
        assert torch.equal(out, ref)
        return
    theirs = torch.cumsum(x, -1) - (x if exclusive else 0)
    verdict = oracle.compare(out, ref, theirs, scale=scan_reference.scan_scale(x))
    assert verdict, verdict.detail
