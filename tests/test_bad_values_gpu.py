"""The bad-value classes of tests/test_bad_values_cpu.py where the answer needs a real kernel or real CUDA
memory: a beta that is 0 in float32 keeps NaN in c out of the result, DLPack views of CUDA memory are seen
as aliases, a fake call leaves the CUDA context alive, numpy-bool flags run what they say, and GEMMs at the
largest extent validation accepts run right. Outputs are poisoned before every call."""

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels as ck
from cute_kernels.ops.gemm import reference
from cute_kernels.ops.gemm.problem import MAX_EXTENT
from cute_kernels.runtime import oracle

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_torch")]

NAN = float("nan")


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _gemm_verdict(out, a, b, *, alpha=1.0):
    if a.dtype == torch.float32:
        ref = alpha * (a.double() @ b.double())
        theirs = torch.mm(a, b) * alpha
        return oracle.compare(out, ref, theirs, scale=reference.gemm_scale(a, b, alpha=alpha))
    return reference.gemm_verdict(out, a, b, alpha=alpha, baseline=torch.mm(a, b) * alpha)


@pytest.mark.parametrize("op, dtype", [(ck.sgemm, torch.float32), (ck.hgemm, torch.float16),
                                       (ck.hgemm, torch.bfloat16)], ids=["sgemm", "hgemm-f16", "hgemm-bf16"])
@pytest.mark.parametrize("beta", [1e-50, -1e-46])
@pytest.mark.parametrize("k", [0, 40])
def test_a_beta_that_is_zero_in_float32_keeps_nan_in_c_out(op, dtype, beta, k):
    """beta=1e-50 once counted as non-zero: the kernel reading C ran with beta 0.0 in float32, and 0 * NaN
    put NaN in the result."""
    a, b = _randn(96, k, dtype=dtype), _randn(k, 72, dtype=dtype, seed=1)
    c = torch.full((96, 72), NAN, device="cuda", dtype=dtype)
    out = torch.full_like(c, NAN)
    op(a, b, c, alpha=1.5, beta=beta, out=out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    if k == 0:
        assert torch.equal(out, torch.zeros_like(out))
    else:
        verdict = _gemm_verdict(out, a, b, alpha=1.5)
        assert verdict, verdict.detail


def _cuda_alias_cases():
    def gemm_into_a():
        storage = _randn(2 * 64 * 64)
        a, b = storage[:64 * 64].view(64, 64), _randn(64, 64, seed=2)
        return (lambda out: ck.sgemm(a, b, out=out)), torch.from_dlpack(storage[:64 * 64]).view(64, 64), \
            "out: must not overlap input a"

    def hgemm_into_b():
        storage = _randn(2 * 64 * 64, dtype=torch.float16)
        a, b = _randn(64, 64, dtype=torch.float16, seed=3), storage[64:64 + 64 * 64].view(64, 64)
        return (lambda out: ck.hgemm(a, b, out=out)), torch.from_dlpack(storage[:64 * 64]).view(64, 64), \
            "out: must not overlap input b"

    def attention_into_v():
        q, k, v = (_randn(1, 2, 40, 64, dtype=torch.float16, seed=s) for s in range(3))
        return (lambda out: ck.attention(q, k, v, out=out)), torch.from_dlpack(v), "out: overlaps the memory of v"

    def conv3d_into_volume():
        storage = _randn(2 * 12 ** 3)
        volume, kernel = storage[:12 ** 3].view(12, 12, 12), _randn(3, 3, 3, seed=4)
        return (lambda out: ck.conv3d(volume, kernel, out=out)), \
            torch.from_dlpack(storage[700:1700]).view(10, 10, 10), "out: overlaps the memory of volume"

    def scan_into_x():
        storage = _randn(3000)
        x = storage[:1000]
        return (lambda out: ck.scan(x, out=out)), torch.from_dlpack(storage[1:1001]), "out: overlaps the memory of x"

    return [gemm_into_a, hgemm_into_b, attention_into_v, conv3d_into_volume, scan_into_x]


def _like_apart(t):
    """A tensor of ``t``'s structure (shape, dtype, pointer mod 16) in memory of its own."""
    buffer = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)  # 512-byte aligned
    start = (t.data_ptr() % 16) // t.element_size()
    return buffer[start:start + t.numel()].view(t.shape)


@pytest.mark.parametrize("make", _cuda_alias_cases(), ids=lambda f: f.__name__)
def test_out_aliasing_an_input_through_dlpack_is_refused(make):
    """Also on the repeat-call path: a call of the alias's structure with an out of its own runs first."""
    call, out, message = make()
    call(_like_apart(out))
    before = out.clone()
    with pytest.raises(ValueError, match=f"^{message}"):
        call(out)
    torch.cuda.synchronize()
    assert torch.equal(out, before)


def test_an_exact_in_place_gemm_through_dlpack_runs():
    a, b, c = _randn(64, 48), _randn(48, 40, seed=1), _randn(64, 40, seed=2)
    expected = torch.addmm(c, a, b, beta=0.5)
    out = ck.sgemm(a, b, c, beta=0.5, out=torch.from_dlpack(c))
    torch.cuda.synchronize()
    assert torch.allclose(c, expected, rtol=1e-5, atol=1e-5) and out.data_ptr() == c.data_ptr()


def test_a_fake_call_leaves_the_cuda_context_alive():
    """Fake CUDA tensors once reached the NVRTC launches with null pointers: an illegal address that kills
    the context for the rest of the process. The public ops give fake results under a fake mode, the eager
    entry points refuse fakes, and real calls still run afterwards."""
    from cute_kernels import torch_ops

    with FakeTensorMode():
        fq = torch.empty(1, 2, 40, 64, device="cuda", dtype=torch.float16)
        fx = torch.empty(3, 100, device="cuda")
        fv, fk = torch.empty(6, 6, 6, device="cuda"), torch.empty(3, 3, 3, device="cuda")
        fb = torch.empty(64, 5, device="cuda")
        results = [ck.attention(fq, fq, fq), ck.scan(fx), ck.sgemm(fx[:, :64], fb), ck.conv3d(fv, fk)]
        assert [tuple(r.shape) for r in results] == [(1, 2, 40, 64), (3, 100), (3, 5), (4, 4, 4)]
        for call in (lambda: torch_ops.attention_eager(fq, fq, fq), lambda: torch_ops.scan_eager(fx),
                     lambda: torch_ops.sgemm_eager(fx[:, :64], fb), lambda: torch_ops.conv3d_eager(fv, fk)):
            with pytest.raises(TypeError, match="expected a tensor with real storage"):
                call()
    x = _randn(3, 100)
    out = torch.full_like(x, NAN)
    ck.scan(x, out=out)
    torch.cuda.synchronize()
    assert torch.allclose(out, torch.cumsum(x, -1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("flag", [np.bool_(True), np.bool_(False)])
def test_numpy_bool_flags_run_what_they_say(flag):
    x = _randn(2, 300)
    out = torch.full_like(x, NAN)
    ck.scan(x, exclusive=flag, out=out)
    expected = torch.cumsum(x, -1)
    if flag:
        expected = torch.cat([torch.zeros_like(x[:, :1]), expected[:, :-1]], dim=1)
    torch.cuda.synchronize()
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-4)
    q, k, v = (_randn(1, 2, 33, 64, dtype=torch.float16, seed=s) for s in range(3))
    got = ck.attention(q, k, v, causal=flag, out=torch.full_like(q, NAN))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(flag))
    assert torch.allclose(got, ref, rtol=2e-2, atol=2e-3)


@pytest.mark.memory_heavy
def test_a_gemm_at_the_largest_m_validation_accepts_runs():
    """M = MAX_EXTENT rows (2^31 - 1024) of K = 8: 32 GB of A and 32 GB of out in float16; the rows at both
    ends are checked (a full reference would not fit). 64 GB beside the parallel tier's other workers (up to
    4 GB each) ran an 80 GB H100 out of memory, so the test needs a card of 100 GB."""
    if torch.cuda.get_device_properties(0).total_memory < 100 * 2**30:
        pytest.skip("needs 64 GB for A and out beside the other test workers: a GPU of 100 GB or more")
    m = MAX_EXTENT
    a = torch.empty(m, 8, device="cuda", dtype=torch.float16)
    a[:4096].copy_(_randn(4096, 8, dtype=torch.float16))
    a[-4096:].copy_(_randn(4096, 8, dtype=torch.float16, seed=1))
    b = _randn(8, 8, dtype=torch.float16, seed=2)
    out = torch.full((m, 8), NAN, device="cuda", dtype=torch.float16)
    ck.hgemm(a, b, out=out)
    torch.cuda.synchronize()
    for rows in (slice(0, 4096), slice(m - 4096, m)):
        verdict = reference.gemm_verdict(out[rows], a[rows], b, baseline=torch.mm(a[rows], b))
        assert verdict, verdict.detail
    del a, out


@pytest.mark.memory_heavy
def test_a_gemm_at_the_largest_n_validation_accepts_runs():
    """N = MAX_EXTENT columns in float32 (8 GB per row of K): K = 1, M = 1, so B and out are 8 GB each."""
    n = MAX_EXTENT
    a = _randn(1, 1)
    b = torch.empty(1, n, device="cuda")
    b[:, :4096].copy_(_randn(1, 4096, seed=1))
    b[:, -4096:].copy_(_randn(1, 4096, seed=2))
    out = torch.full((1, n), NAN, device="cuda")
    ck.sgemm(a, b, out=out)
    torch.cuda.synchronize()
    for cols in (slice(0, 4096), slice(n - 4096, n)):
        assert torch.equal(out[:, cols], a * b[:, cols])  # K = 1: one exact product per element
