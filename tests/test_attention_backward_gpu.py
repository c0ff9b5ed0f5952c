"""GPU tier for the attention backward (issue 23), float32 and 16-bit: dq, dk, dv of ``ck.attention`` against float64
autograd of the masked softmax with the key/value heads expanded (``spec.attention_mask``), the oracle at
twice torch's error in the same dtype (float32: its math backend's backward, TF32 off; 16-bit: SDPA's
backward) plus a floor of 8 eps of the dtype, of each gradient's magnitude; grouped-query heads (dk, dv summed over each group), causal, windows and sinks,
ragged M, N and d; a gradient through return_lse's lse; gradcheck; torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import cute_kernels as ck
from cute_kernels.ops.attention import spec as aspec
from cute_kernels.runtime import oracle
from test_torch_ops_gpu import _poison_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("vectors", [False, True], ids=["elements", "vectors"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [8, 16, 40, 64, 72, 100, 128, 256, 512])
def test_the_delta_kernel(d, dtype, vectors, generator):
    """D = rowsum(dO O) - dlse and the staged [lse2 | D] rows of every head, against torch in float64, for
    every lanes-a-row shape (1 to 32 lanes, two vectors a lane at d 512 in 16-bit), a head dim that is not
    whole vectors (100 in 16-bit: element loads), O with a head stride past its rows, rows past a CTA's
    last, and (``elements``) O one element past a 16-byte boundary, which takes the element loads at every d."""
    from cute_kernels.ops.attention import backward
    from cute_kernels.runtime.device import current_stream_handle
    batch, heads, m = 2, 3, 77
    offset = 0 if vectors else 1
    storage = torch.randn(offset + batch * heads * (m + 5) * d, generator=generator, device="cuda").to(dtype)
    out = storage[offset:].view(batch, heads, m + 5, d)[:, :, :m]  # heads (m + 5) * d apart
    grad_out = torch.randn(batch, heads, m, d, generator=generator, device="cuda").to(dtype)
    grad_lse = torch.randn(batch, heads, m, generator=generator, device="cuda")
    lse = torch.randn(batch, heads, m, generator=generator, device="cuda")
    lse[0, 0, 3] = float("-inf")
    stage_rows = backward._stage_rows(batch * heads, m, out.device)
    lanes, vector = backward.delta_shape(out, grad_out)
    assert (vector > 1) == (vectors and d % (16 // out.element_size()) == 0)
    delta = backward._delta(out, grad_out, grad_lse, batch, heads, 0, current_stream_handle(0), lse, stage_rows)
    expected = (grad_out.double() * out.double()).sum(-1) - grad_lse.double()
    torch.testing.assert_close(delta.view(batch, heads, m).double(), expected, rtol=1e-5, atol=1e-5 * d ** 0.5)
    staged = stage_rows.view(batch, heads, 2, -1)[..., :m]
    torch.testing.assert_close(staged[:, :, 1], delta.view(batch, heads, m), rtol=0, atol=0)
    lse2 = torch.where(lse == float("-inf"), float("inf"), lse * math.log2(math.e))
    torch.testing.assert_close(staged[:, :, 0], lse2, rtol=1e-6, atol=1e-6)


def _masked_attention(q, k, v, scale, causal, window, num_sinks):
    """Attention by autograd-able torch ops in q's dtype: heads expanded, masked, a row seeing no key 0."""
    if q.dim() > 2 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    mask = aspec.attention_mask(q.shape[-2], k.shape[-2], q.device, causal, window, num_sinks)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        p = torch.where(mask.any(-1, keepdim=True), p, torch.zeros((), dtype=p.dtype, device=p.device))
    return p @ v


def _gradients(fn, tensors, grad):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    return torch.autograd.grad(fn(*leaves), leaves, grad)


CASES = [  # (batch, heads, kv_heads, m, n, d, causal, window, num_sinks)
    (1, 2, 2, 37, 45, 64, False, None, 0),
    (2, 4, 2, 64, 64, 32, True, None, 0),
    (1, 8, 1, 70, 33, 40, False, None, 0),  # multi-query, ragged d
    (1, 2, 2, 96, 96, 128, True, (16, 16), 0),
    (1, 2, 1, 80, 100, 64, False, (0, None), 0),
    (2, 2, 2, 65, 65, 64, True, (8, 0), 2),
    (1, 1, 1, 40, 40, 256, False, (128, 0), 0),
    # Several 64-row tiles (the 16-bit kernels' unmasked tiles, pipeline buffers and ragged edges):
    (2, 2, 2, 256, 256, 64, False, None, 0),
    (1, 4, 2, 200, 300, 128, True, None, 0),
    (1, 4, 1, 300, 260, 96, True, (100, 20), 3),
    (1, 2, 2, 320, 320, 32, False, (64, 64), 0),
    (1, 2, 2, 70, 70, 64, False, (0, 0), 0),  # each row sees its own key alone
    (1, 2, 1, 90, 90, 64, True, (3, 0), 40),  # more sinks than the window is wide
    # Windows with M != N and rows past a left edge of 128, and grouped heads of ratios 4 and 8 with more
    # than one kv head (dK/dV summed over each group, not over all heads):
    (1, 2, 2, 160, 200, 64, False, (0, 0), 0),
    (1, 2, 1, 200, 150, 64, True, (128, 0), 0),
    (1, 4, 2, 150, 180, 128, False, (16, 16), 0),
    (1, 8, 2, 96, 64, 32, True, None, 0),
    (1, 16, 2, 64, 80, 64, False, None, 0),
]


def _torch_same_precision(q, k, v, grad, scale, causal, window, num_sinks):
    """torch's gradients in q's dtype: float32 by autograd of the masked softmax (TF32 off); 16-bit by SDPA
    (its flash or efficient backward, the boolean mask when there is more than a causal one), heads
    expanded."""
    if q.dtype == torch.float32:
        with oracle.fp32_matmuls():
            return _gradients(lambda q, k, v: _masked_attention(q, k, v, scale, causal, window, num_sinks),
                              (q, k, v), grad)

    def sdpa(q, k, v):
        if q.dim() > 2 and k.shape[-3] != q.shape[-3]:
            group = q.shape[-3] // k.shape[-3]
            k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
        mask = None
        if window is not None or num_sinks:
            mask = aspec.attention_mask(q.shape[-2], k.shape[-2], q.device, causal, window, num_sinks)
        # Not cuDNN's backend: its backward fails on some strided views (mha_graph.execute on the H200).
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                  scale=scale)

    # Contiguous copies (the same values): torch's flash/efficient backward faults on misaligned views
    # (CUDA "misaligned address" on an offset-by-one view, 2.11 on the H200).
    return _gradients(sdpa, (q.contiguous(), k.contiguous(), v.contiguous()), grad.contiguous())


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 16-bit gradients run on sm_90 through the wgmma kernels where they apply (no window, d <= 128); "mma" forces
# the mma.sync kernels there too, so both are tested on a Hopper GPU. float32 runs on sm_90 as bf16 planes on
# the wgmma kernels where they apply (no window, d <= 64: "default"), elsewhere the 3xTF32 mma.sync kernels up
# to d = 64 ("tf32x3" forces them where the planes would run) and the FFMA ones past it ("ffma" everywhere).
PATHS = [(torch.float32, path) for path in ("default", "tf32x3", "ffma")] + [
    (dtype, path) for dtype in DTYPES[1:] for path in ("default", "mma")]
# Larger problems for the wgmma kernels' rings and tiles: many steps per CTA (query heads of a group times
# query tiles), ragged edges on both sides, a padded head dim.
SM90_CASES = [
    (1, 8, 2, 700, 650, 128, True, None, 0),
    (2, 4, 4, 600, 520, 64, False, None, 0),
    (1, 4, 1, 333, 333, 80, True, None, 0),
    (1, 2, 2, 1024, 1024, 128, False, None, 0),
]


@pytest.fixture
def kernel_path(request, monkeypatch):
    """Pins the backward's kernels: "mma" makes the 16-bit wgmma kernels decline every call, "tf32x3" the float32
    planes on them, "ffma" both float32 tensor-core paths."""
    from cute_kernels.ops.attention import backward
    if request.param == "mma":
        monkeypatch.setattr(backward, "sm90_backward_why_not", lambda *args: "forced onto the mma.sync kernels")
    if request.param in ("tf32x3", "ffma"):
        monkeypatch.setattr(backward, "SM90_FP32_PLANES", False)
    if request.param == "ffma":
        monkeypatch.setattr(backward, "FP32_TENSOR_CORES", False)
    return request.param


def _expect_path(q, k, v, grad, window, path):
    """On an sm_90 device the default 16-bit path must be the wgmma one wherever it applies."""
    from cute_kernels.ops.attention import backward
    if path != "default" or q.dtype == torch.float32 or torch.cuda.get_device_capability() != (9, 0):
        return
    applies = window is None and q.shape[-1] <= 128
    reason = backward.sm90_backward_why_not(q, k, v, grad, q, k, v, window)
    assert (reason is None) == applies, reason


def _case_id(c):
    return "x".join(map(str, c[:6])) + f"-c{int(c[6])}-w{c[7]}-s{c[8]}"


@pytest.mark.parametrize(
    ("case", "dtype", "kernel_path"),
    [pytest.param(case, dtype, path, id=f"{_case_id(case)}-{str(dtype).removeprefix('torch.')}-{path}")
     for case in CASES + SM90_CASES for dtype, path in PATHS if dtype != torch.float32 or case in CASES],
    indirect=["kernel_path"])
def test_gradients_against_float64(case, dtype, kernel_path, generator):
    batch, heads, kv_heads, m, n, d, causal, window, num_sinks = case

    def rand(h, rows):
        return torch.randn(batch, h, rows, d, generator=generator, device="cuda").to(dtype)

    q, k, v = rand(heads, m), rand(kv_heads, n), rand(kv_heads, n)
    grad = torch.randn(batch, heads, m, d, generator=generator, device="cuda").to(dtype)
    _expect_path(q, k, v, grad, window, kernel_path)
    _check_gradients(q, k, v, grad, causal, window, num_sinks)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_keys_past_n_with_strongly_negative_scores(dtype, generator):
    """Every score near -32 (a negative scale on aligned q and k), so each row's lse is near -26 and
    exp2(-lse2) overflows 16-bit: the keys a kernel reads past N (zeros from TMA) must be masked wherever
    they could meet a row's lse, or dS there is inf and dQ NaN. Ragged N, every path, against float64."""
    q = (1 + 0.1 * torch.randn(1, 2, 100, 64, generator=generator, device="cuda")).to(dtype)
    k = (1 + 0.1 * torch.randn(1, 2, 200, 64, generator=generator, device="cuda")).to(dtype)
    v = torch.randn(1, 2, 200, 64, generator=generator, device="cuda").to(dtype)
    grad = torch.randn(1, 2, 100, 64, generator=generator, device="cuda").to(dtype)
    scale = -0.5
    ours = _gradients(lambda q, k, v: ck.attention(q, k, v, scale=scale), (q, k, v), grad)
    exact = _gradients(lambda q, k, v: _masked_attention(q, k, v, scale, False, None, 0),
                       (q.double(), k.double(), v.double()), grad.double())
    theirs = _torch_same_precision(q, k, v, grad, scale, False, None, 0)
    for name, mine, e, t in zip(("dq", "dk", "dv"), ours, exact, theirs):
        assert torch.isfinite(mine).all(), name
        verdict = oracle.compare(mine, e, t, scale=e.abs().amax().clamp_min(1e-30))
        assert verdict, f"{name}: {verdict.detail}"


def test_more_batch_heads_than_grid_y(generator):
    """65536 (batch, head) pairs: past grid.y, along which the wgmma kernels run them, so the call takes the
    mma.sync kernels (batch and heads along grid.x there); against float64 as every case."""
    from cute_kernels.ops.attention import backward
    q, k, v, grad = (torch.randn(32768, 2, 16, 64, generator=generator, device="cuda").half() for _ in range(4))
    if torch.cuda.get_device_capability() == (9, 0):
        assert "grid.y" in backward.sm90_backward_why_not(q, k, v, grad, q, k, v, None)
    _check_gradients(q, k, v, grad, True, None, 0)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
@pytest.mark.parametrize("case", SM90_CASES[:2], ids=lambda c: "x".join(map(str, c[:6])))
def test_16bit_gradients_are_bitwise_repeatable(case, dtype, generator):
    """Both 16-bit paths sum dK and dV (over query heads and tiles) and dQ in a fixed order: no atomics."""
    batch, heads, kv_heads, m, n, d, causal, _, _ = case
    q = torch.randn(batch, heads, m, d, generator=generator, device="cuda").to(dtype)
    k, v = (torch.randn(batch, kv_heads, n, d, generator=generator, device="cuda").to(dtype) for _ in range(2))
    grad = torch.randn(batch, heads, m, d, generator=generator, device="cuda").to(dtype)
    run = lambda: _gradients(lambda q, k, v: ck.attention(q, k, v, causal=causal), (q, k, v), grad)  # noqa: E731
    for name, x, y in zip(("dq", "dk", "dv"), run(), run()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).removeprefix("torch."))
@pytest.mark.parametrize("rank", [3, 2])
def test_gradients_of_3d_and_2d_inputs_against_float64(rank, dtype, generator):
    """(H, S, d) inputs (grouped heads) and (S, d) ones take the backward that (B, H, S, d) ones take:
    checked against float64 as those are."""
    heads, kv_heads = (4, 2) if rank == 3 else (1, 1)
    q = torch.randn(heads, 100, 64, generator=generator, device="cuda").to(dtype)
    k, v = (torch.randn(kv_heads, 120, 64, generator=generator, device="cuda").to(dtype) for _ in range(2))
    grad = torch.randn(heads, 100, 64, generator=generator, device="cuda").to(dtype)
    if rank == 2:
        q, k, v, grad = q[0], k[0], v[0], grad[0]
    _check_gradients(q, k, v, grad, True, None, 0, label=f"{rank}-D ")


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=lambda t: str(t).removeprefix("torch."))
def test_16bit_gradients_past_d128_are_repeatable_under_deterministic_algorithms(dtype, generator):
    """Past d 128 a 16-bit backward runs the float32 FFMA kernels on float32 copies, whose dQ adds tiles
    with atomics unless torch is asked for deterministic algorithms; asked, two calls give the same bits."""
    q = torch.randn(1, 2, 150, 256, generator=generator, device="cuda").to(dtype)
    k, v = (torch.randn(1, 2, 130, 256, generator=generator, device="cuda").to(dtype) for _ in range(2))
    grad = torch.randn(1, 2, 150, 256, generator=generator, device="cuda").to(dtype)
    run = lambda: _gradients(lambda q, k, v: ck.attention(q, k, v, causal=True), (q, k, v), grad)  # noqa: E731
    previous, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)  # as the fixture below: torch's own ops only warn
        first, second = run(), run()
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)
    for name, x, y in zip(("dq", "dk", "dv"), first, second):
        assert torch.equal(x, y), name


def _check_gradients(q, k, v, grad, causal, window, num_sinks, label=""):
    """dq, dk, dv of ck.attention against float64 autograd, torch's same-precision backward as the baseline."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    _poison_allocator()  # dq, dk, dv come from memory reading NaN, so a row the backward leaves unwritten shows
    ours = _gradients(lambda q, k, v: ck.attention(q, k, v, causal=causal, window=window, num_sinks=num_sinks),
                      (q, k, v), grad)
    exact = _gradients(lambda q, k, v: _masked_attention(q, k, v, scale, causal, window, num_sinks),
                       (q.double(), k.double(), v.double()), grad.double())
    theirs = _torch_same_precision(q, k, v, grad, scale, causal, window, num_sinks)
    for name, mine, e, t in zip(("dq", "dk", "dv"), ours, exact, theirs):
        assert mine.shape == e.shape and mine.dtype == q.dtype, name
        scale_e = e.abs().amax()  # a gradient's magnitude: its largest element
        if scale_e == 0 and name != "dv":
            # Identically zero only by cancellation (a window of one key: dS = P (dP - D) with dP = D), so a
            # correct kernel leaves the rounding of dP and D, scaled as dQ = scale dS K (dK = scale dS^T Q).
            scale_e = _cancelled_term_magnitude(q, k, v, grad, scale, k if name == "dq" else q)
        verdict = oracle.compare(mine, e, t, scale=scale_e.clamp_min(1e-30))
        assert verdict, f"{label}{name}: {verdict.detail}"


def _cancelled_term_magnitude(q, k, v, grad, scale, other):
    """scale * max|dP| * max|other|: the size of the terms whose difference a zero dQ or dK is (dP = dO V^T)."""
    group = q.shape[1] // v.shape[1]
    dp = grad.double() @ v.double().repeat_interleave(group, dim=1).transpose(-1, -2)
    return scale * dp.abs().amax() * other.double().abs().amax()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_layouts_and_the_element_copy_path(dtype, generator):
    """(B, S, H, d) views (flash-attn's layout) take the 16-byte path; an offset view (and, 16-bit, d = 40: rows
    of 80 bytes) the element-by-element one; each against float64 with torch's same-precision backward."""
    for shape, d, offset in (((2, 70, 4, 64), 64, 0), ((1, 65, 2, 40), 40, 0), ((1, 48, 2, 64), 64, 1)):
        def rand():
            flat = torch.randn(shape[0] * shape[1] * shape[2] * d + offset, generator=generator, device="cuda")
            return flat.to(dtype)[offset:].view(shape[0], shape[1], shape[2], d).transpose(1, 2)
        q, k, v, grad = rand(), rand(), rand(), rand()
        scale = 1.0 / math.sqrt(d)
        ours = _gradients(lambda q, k, v: ck.attention(q, k, v, causal=True), (q, k, v), grad)
        exact = _gradients(lambda q, k, v: _masked_attention(q, k, v, scale, True, None, 0),
                           (q.double(), k.double(), v.double()), grad.double())
        theirs = _torch_same_precision(q, k, v, grad, scale, True, None, 0)
        for name, mine, e, t in zip(("dq", "dk", "dv"), ours, exact, theirs):
            verdict = oracle.compare(mine, e, t, scale=e.abs().amax().clamp_min(1e-30))
            assert verdict, f"{shape} d={d} offset={offset} {name}: {verdict.detail}"


@pytest.fixture(params=[False, True], ids=["atomic-dq", "deterministic"])
def deterministic(request):
    """torch's deterministic-algorithms flag (warn_only, so the float64 reference's cuBLAS calls still run):
    on, the FP32 backward runs its two kernels; off, the dK/dV kernel adds dQ by atomics."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(request.param, warn_only=True)
    yield request.param
    torch.use_deterministic_algorithms(previous, warn_only=warn_only)


@pytest.mark.parametrize("case", [(1, 4, 2, 200, 300, 128, True, None, 0), (1, 4, 1, 300, 260, 96, True, (100, 20), 3),
                                  (2, 2, 2, 256, 256, 64, False, None, 0), (1, 1, 1, 40, 40, 256, False, (128, 0), 0)],
                         ids=lambda c: "x".join(map(str, c[:6])))
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["ffma", "tf32x3"])
def test_float32_both_dq_paths_and_repeatability(case, deterministic, tensor_cores, generator, monkeypatch):
    """Both FFMA paths and the 3xTF32 mma.sync kernels (d <= 128; no atomics) against float64; dk and dv
    bitwise repeatable in all, dq too in the deterministic one and on tensor cores."""
    from cute_kernels.ops.attention import backward
    monkeypatch.setattr(backward, "FP32_TENSOR_CORES", tensor_cores)
    monkeypatch.setattr(backward, "SM90_FP32_PLANES", False)  # the mma.sync kernels (the planes: below)
    batch, heads, kv_heads, m, n, d, causal, window, num_sinks = case
    q = torch.randn(batch, heads, m, d, generator=generator, device="cuda")
    k, v = (torch.randn(batch, kv_heads, n, d, generator=generator, device="cuda") for _ in range(2))
    grad = torch.randn(batch, heads, m, d, generator=generator, device="cuda")
    _check_gradients(q, k, v, grad, causal, window, num_sinks, label="deterministic " if deterministic else "atomic ")

    def run():
        return _gradients(lambda q, k, v: ck.attention(q, k, v, causal=causal, window=window, num_sinks=num_sinks),
                          (q, k, v), grad)
    first, second = run(), run()
    for name, x, y in zip(("dq", "dk", "dv"), first, second):
        if name != "dq" or deterministic or (tensor_cores and d <= 64):
            assert torch.equal(x, y), name


# A causal key's dV and dK sum a term per query row that sees it: a few large ones near the diagonal, many
# small ones far below. Summed large-first, each late addition rounds at the running sum's full size; float32
# at S 2048 d 96 then missed the oracle (dV 2.36e-6 of its scale against a bound of 1.97e-6), which the
# shorter cases above cannot show. The dK/dV kernels walk the query tiles last first.
@pytest.mark.parametrize(("d", "kernel_path"), [(96, "ffma"), (64, "tf32x3")], indirect=["kernel_path"],
                         ids=["ffma-d96", "tf32x3-d64"])
def test_float32_long_causal_sequences_sum_the_small_terms_first(d, kernel_path, generator):
    q, k, v, grad = (torch.randn(1, 4, 2048, d, generator=generator, device="cuda") for _ in range(4))
    _check_gradients(q, k, v, grad, True, None, 0)


@pytest.mark.parametrize("limit_kb", [163, 99])
def test_float32_tensor_cores_where_shared_memory_allows(limit_kb, generator, monkeypatch):
    """The 3xTF32 kernels run up to d = 64 in 99 KB per block as in 163 KB; d = 128 runs on FFMA (faster
    there): the routing and the results."""
    from cute_kernels.ops.attention import backward
    monkeypatch.setattr(backward, "shared_memory_limit", lambda device: limit_kb * 1024)
    monkeypatch.setattr(backward, "SM90_FP32_PLANES", False)  # the mma.sync kernels, as on other GPUs
    for d, expected in ((64, True), (128, False)):
        reason = backward.fp32_tensor_core_why_not(d, torch.cuda.current_device(), limit_kb * 1024)
        assert (reason is None) == expected, reason
        q = torch.randn(1, 4, 150, d, generator=generator, device="cuda")
        k, v = (torch.randn(1, 2, 170, d, generator=generator, device="cuda") for _ in range(2))
        grad = torch.randn(1, 4, 150, d, generator=generator, device="cuda")
        _check_gradients(q, k, v, grad, True, None, 0, label=f"{limit_kb} KB d={d} ")


@pytest.mark.parametrize("limit_kb", [163, 99])
def test_float32_shapes_for_gpus_with_less_shared_memory(limit_kb, deterministic, generator, monkeypatch):
    """The FP32 kernels' fallback shapes (sm_80's 163 KB per block, sm_86/89/120's 99 KB) run on this GPU by
    lowering the limit the launch reads: every head dim they serve, several tiles, causal, GQA, a window with
    sinks, ragged edges; against float64 with torch's float32 backward as the baseline."""
    from cute_kernels.ops.attention import backward
    monkeypatch.setattr(backward, "shared_memory_limit", lambda device: limit_kb * 1024)
    monkeypatch.setattr(backward, "FP32_TENSOR_CORES", False)
    monkeypatch.setattr(backward, "SM90_FP32_PLANES", False)
    cases = [(1, 4, 2, 150, 170, 128, True, None, 0), (1, 2, 2, 130, 100, 64, False, (40, 8), 3),
             (1, 2, 1, 100, 90, 32, False, None, 0)]
    if limit_kb == 163:
        cases.append((1, 2, 2, 100, 75, 256, True, None, 0))
    fallbacks = 0
    for batch, heads, kv_heads, m, n, d, causal, window, num_sinks in cases:
        head_dim = backward.padded_head_dim(d)
        fallbacks += backward.bwd_fp32_shapes(head_dim, limit_kb * 1024) != backward.bwd_fp32_shapes(head_dim)
        q = torch.randn(batch, heads, m, d, generator=generator, device="cuda")
        k, v = (torch.randn(batch, kv_heads, n, d, generator=generator, device="cuda") for _ in range(2))
        grad = torch.randn(batch, heads, m, d, generator=generator, device="cuda")
        _check_gradients(q, k, v, grad, causal, window, num_sinks, label=f"{limit_kb} KB d={d} ")
    assert fallbacks >= 2


def test_a_gradient_through_the_lse(generator):
    q, k, v = (torch.randn(1, 2, 48, 64, generator=generator, device="cuda") for _ in range(3))

    def loss(q, k, v, ours):
        if ours:
            out, lse = ck.attention(q, k, v, causal=True, return_lse=True)
        else:
            s = (q @ k.transpose(-1, -2)) / 8.0
            s = s.masked_fill(~aspec.attention_mask(48, 48, q.device, True), float("-inf"))
            out, lse = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
        return out.sum() + 0.5 * lse.sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = torch.autograd.grad(loss(*leaves, True), leaves)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    exact = torch.autograd.grad(loss(*leaves64, False), leaves64)
    for mine, e in zip(ours, exact):
        torch.testing.assert_close(mine.double(), e, rtol=1e-4, atol=1e-4 * float(e.abs().max()))


@pytest.mark.parametrize("heads, kv_heads, kwargs", [
    (1, 1, dict(causal=True)),
    (4, 2, dict()),  # grouped-query: two query heads a key/value head
    (2, 2, dict(window=(3, 2))),
    (2, 1, dict(causal=True, window=(4, 0), num_sinks=2)),
], ids=["causal", "gqa", "window", "mqa-causal-window-sinks"])
def test_gradcheck_through_float32(generator, heads, kv_heads, kwargs):
    """Finite differences against the backward on small float32 cases: plain causal, grouped-query heads,
    a sliding window, and a causal window with sinks over one key/value head."""
    q = torch.randn(1, heads, 9, 32, generator=generator, device="cuda").requires_grad_()
    k, v = (torch.randn(1, kv_heads, 9, 32, generator=generator, device="cuda").requires_grad_() for _ in range(2))
    assert torch.autograd.gradcheck(lambda q, k, v: ck.attention(q, k, v, **kwargs), (q, k, v), eps=1e-2,
                                    atol=2e-2, rtol=2e-2)


def test_double_backward_is_refused(generator):
    x = torch.randn(1, 2, 16, 64, generator=generator, device="cuda").requires_grad_()
    out = ck.attention(x, x, x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=False)
    assert g.shape == x.shape
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(ck.attention(x, x, x).sum(), x, create_graph=True)


def test_a_training_step_under_torch_compile(generator):
    q, k, v = (torch.randn(2, 4, 64, 64, generator=generator, device="cuda").requires_grad_() for _ in range(3))

    def step(q, k, v):
        return ck.attention(q, k, v, causal=True).square().mean()

    eager = torch.autograd.grad(step(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# float32 on the 16-bit wgmma kernels as three bf16 planes (backward.SM90_FP32_PLANES; past d 64 two consumers
# sharing 64 kept rows, alternate steps each): every unwindowed case up to d 128, and long sequences, where the
# tensor core's truncating sums would drift without the per-step fold.
PLANE_CASES = [c for c in CASES + SM90_CASES if c[7] is None and c[5] <= 128] + [
    (1, 2, 2, 2048, 2048, 64, False, None, 0), (1, 4, 1, 1500, 1700, 64, True, None, 0),
    (1, 2, 1, 130, 140, 36, True, None, 0),  # bf16 rows of 72 bytes: the planes' rows padded for TMA
    (1, 2, 2, 2048, 2048, 128, False, None, 0), (1, 4, 1, 1500, 1700, 128, True, None, 0),
    (2, 3, 3, 200, 170, 96, True, None, 0),  # d 96 on the d 128 kernels: TMA reads zeros past d
    (1, 4, 2, 333, 250, 128, False, None, 0)]  # not causal, ragged: keys past N, rows past M, grouped heads


# attention_sm90.cu's kernels (the planes' split and the wgmma backward) run on sm_90 only.
_SM90_ONLY = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="attention_sm90.cu's kernels run on sm_90 only")


@_SM90_ONLY
@pytest.mark.parametrize("case", PLANE_CASES, ids=_case_id)
def test_float32_on_the_wgmma_kernels_as_bf16_planes(case, generator, monkeypatch):
    """float32 gradients from the wgmma kernels on bf16 planes, each step's products folded into FP32 sums:
    against float64 with torch's float32 backward as the oracle's baseline, from contiguous tensors and
    (B, S, H, d) views; bitwise repeatable (no atomics)."""
    from cute_kernels.ops.attention import backward
    monkeypatch.setattr(backward, "SM90_FP32_PLANES", True)
    batch, heads, kv_heads, m, n, d, causal, window, num_sinks = case

    def rand(h, rows, strided):
        if strided:
            return torch.randn(batch, rows, h, d, generator=generator, device="cuda").transpose(1, 2)
        return torch.randn(batch, h, rows, d, generator=generator, device="cuda")

    for strided in (False, True):
        q, k, v = rand(heads, m, strided), rand(kv_heads, n, strided), rand(kv_heads, n, strided)
        grad = rand(heads, m, strided)
        assert backward.sm90_backward_why_not(q, k, v, grad, q, k, v, None) is None
        _check_gradients(q, k, v, grad, causal, None, 0, label=f"planes strided={strided} ")

    def run():
        return _gradients(lambda q, k, v: ck.attention(q, k, v, causal=causal), (q, k, v), grad)
    for name, x, y in zip(("dq", "dk", "dv"), run(), run()):
        assert torch.equal(x, y), name


@_SM90_ONLY
def test_the_split_kernel_writes_the_reference_planes(generator):
    """split_planes_kernel's planes bit for bit the torch-op split's (whose exactness the CPU tier checks), from
    2-D, 3-D, 4-D and (B, S, H, d) views, a head dim of 36 (padded rows), huge, tiny, subnormal, infinite and
    NaN values (the NaNs where the reference has them)."""
    from cute_kernels.ops.attention import backward
    from cute_kernels.runtime.device import current_stream_handle

    wide = torch.randn(2, 300, 3, 36, generator=generator, device="cuda") * torch.logspace(-30, 30, 36, device="cuda")
    wide[0, 0, 0, :4] = torch.tensor([float("inf"), float("nan"), 1e-40, -3e38])
    for t in (wide.transpose(1, 2), torch.randn(5, 64, generator=generator, device="cuda"),
              torch.randn(4, 70, 64, generator=generator, device="cuda")):
        got = backward._split_planes(t, t.device.index, current_stream_handle(t.device.index))
        expected = backward.bf16_planes_reference(t)
        assert got.shape == expected.shape and torch.equal(got.isnan(), expected.isnan())
        # Bit for bit elsewhere (signed zeros, subnormals, infinities); NaN payloads may differ.
        bits = [x.masked_fill(x.isnan(), 0).view(torch.int16) for x in (got, expected)]
        assert torch.equal(*bits)
