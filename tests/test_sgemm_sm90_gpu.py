"""GPU tier for the Hopper 3xTF32 SGEMM (legacy_cuda/sgemm_sm90.cu, registry entry sgemm/tf32x3_wgmma): FP32
accuracy by the SGEMM's oracle, A and B row-major and column-major, on ragged shapes (M and N edges of the
128 x 128 tile, some with B's 32-column boxes wholly past N or a column-major A's 32-row boxes wholly past M,
which the kernel does not load; K tails of the
32-deep k-tiles), beta and C in place, poisoned results, and the non-finite inputs the split handles as the
sm80-style 3xTF32 kernel does; and ``ck.sgemm`` running it on the large products, plain, through a weight,
with a bias, in place, staged from misaligned rows, batched and with a given config."""

from __future__ import annotations

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.gemm import sgemm_sm90 as S
from test_sgemm_tf32x3_gpu import _check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 GPU"),
    pytest.mark.usefixtures("exact_fp32_torch"),
]


@pytest.mark.parametrize("m, n, k", [(128, 128, 32), (128, 128, 64), (256, 384, 96), (300, 260, 100),
                                     (1, 4, 4), (129, 132, 36), (1000, 1000, 1000), (64, 2048, 2048),
                                     (2048, 2048, 2048)])
@pytest.mark.parametrize("b_layout", ["row", "weight"])
@pytest.mark.parametrize("a_layout", ["row", "transposed"])
def test_matches_the_oracle(m, n, k, b_layout, a_layout):
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    a = _a(m, k, a_layout, gen)
    b = _b(k, n, b_layout, gen)
    out = torch.full((m, n), float("nan"), device="cuda")
    S.sgemm_sm90(a, b, out=out)
    _check(out, a, b)


def _a(m, k, layout, gen):
    if layout == "row":
        return torch.randn(m, k, generator=gen, device="cuda")
    # x.t() @ y: A column-major, its columns padded to 16 bytes as TMA's strides must be
    return torch.randn(k, -(-m // 4) * 4, generator=gen, device="cuda")[:, :m].t()


def _b(k, n, layout, gen):
    if layout == "row":
        return torch.randn(k, n, generator=gen, device="cuda")
    return torch.randn(n, k, generator=gen, device="cuda").t()  # x @ w.t(): B column-major


@pytest.mark.parametrize("b_layout", ["row", "weight"])
def test_beta_c_in_place_and_alpha(b_layout):
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(333, 200, generator=gen, device="cuda")
    b = _b(200, 180, b_layout, gen)
    c = torch.randn(333, 180, generator=gen, device="cuda")
    expect_c = c.clone()
    S.sgemm_sm90(a, b, c, alpha=0.5, beta=2.0, out=c)
    _check(c, a, b, expect_c, 0.5, 2.0)
    # The kernel itself reads no C with beta 0 (its guard, not the wrapper's: c goes in).
    nan_c = torch.full((333, 180), float("nan"), device="cuda")
    out = torch.full((333, 180), float("nan"), device="cuda")
    S.prepare_for(a, b, out, nan_c)(a, b, nan_c, out, 1.0, 0.0)
    assert torch.isfinite(out).all()
    _check(out, a, b)


@pytest.mark.parametrize("b_layout", ["row", "weight"])
def test_long_k_of_one_sign(b_layout):
    """K 16384 of positive inputs: a partial carried over many k-tiles would drift towards zero."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    a = torch.rand(256, 16384, generator=gen, device="cuda")
    b = _b(16384, 256, b_layout, gen).abs()
    _check(S.sgemm_sm90(a, b), a, b)


def test_unloaded_boxes_feed_only_unstored_columns():
    """B's 32-column boxes wholly past N are not loaded: their stage slots hold what earlier tiles left, here
    NaN from a GEMM on every SM first; the columns below N stay finite and right."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    a = torch.randn(2048, 256, generator=gen, device="cuda")
    S.sgemm_sm90(a, torch.full((256, 2048), float("nan"), device="cuda"))  # 256 CTAs: every SM's stages NaN
    a2 = torch.randn(300, 100, generator=gen, device="cuda")
    b2 = torch.randn(100, 260, generator=gen, device="cuda")  # the second column tile loads one box of four
    out = S.sgemm_sm90(a2, b2)
    assert torch.isfinite(out).all()
    _check(out, a2, b2)


@pytest.mark.parametrize("b_layout", ["row", "weight"])
def test_non_finite_inputs(b_layout):
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(96, 64, generator=gen, device="cuda")
    b = _b(64, 80, b_layout, gen)
    a.view(torch.int32)[3, 5] = 0x7FFFFFFF
    b[11, 13] = float("nan")
    a[30, 2] = float("inf")
    out = S.sgemm_sm90(a, b)
    assert torch.isnan(out[3]).all() and torch.isnan(out[:, 13]).all() and torch.isnan(out[30]).all()
    rows = [i for i in range(96) if i not in (3, 30)]
    cols = [j for j in range(80) if j != 13]
    _check(out[rows][:, cols].contiguous(), a[rows].contiguous(), b[:, cols].contiguous())


@pytest.mark.parametrize("layout", ["batches", "shared b", "shared a", "transposed a", "weights",
                                    "interleaved a", "interleaved out", "bias and shared c"])
def test_a_batch_matches_the_oracle(layout):
    """A batch on the grid's second dim: each product its own maps' batch coordinate and result and C batch
    strides; a shared operand (batch stride 0) read by every product; ragged edges and a K tail in each."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    batch, m, n, k = 3, 300, 260, 100
    a = torch.randn(batch, m, k, generator=gen, device="cuda")
    b = torch.randn(batch, k, n, generator=gen, device="cuda")
    if layout == "shared b":
        b = b[0].expand(batch, k, n)
    if layout == "shared a":
        a = a[0].expand(batch, m, k)
    if layout == "transposed a":  # x.mT @ y, columns padded to 16 bytes
        a = torch.randn(batch, k, 304, generator=gen, device="cuda")[..., :m].mT
    if layout == "interleaved a":  # (M, B, K) seen as (B, M, K): the batch stride one row, below the row stride
        a = torch.randn(m, batch, k, generator=gen, device="cuda").transpose(0, 1)
    if layout == "weights":  # x @ w.mT
        b = torch.randn(batch, n, k, generator=gen, device="cuda").mT
    out = torch.full((batch, m, n), float("nan"), device="cuda")
    if layout == "interleaved out":  # rows of every product side by side: batch stride one row
        out = torch.full((m, batch, n), float("nan"), device="cuda").transpose(0, 1)
    c, alpha, beta = None, 1.0, 0.0
    if layout == "bias and shared c":
        c, alpha, beta = torch.randn(m, n, generator=gen, device="cuda").expand(batch, m, n), 0.5, 2.0
    S.sgemm_sm90(a, b, c, alpha=alpha, beta=beta, out=out)
    _check(out, a, b, c, alpha, beta)


@pytest.mark.parametrize("m, n, k", [(64, 64, 32), (65, 60, 100), (300, 260, 100), (1, 4, 4), (1000, 1000, 1000)])
@pytest.mark.parametrize("b_layout", ["row", "weight"])
@pytest.mark.parametrize("a_layout", ["row", "transposed"])
def test_the_64_square_tile_matches_the_oracle(m, n, k, b_layout, a_layout):
    """The 64-square tile (one consumer warpgroup, two CTAs an SM, m64n64k8 wgmmas, two 32 x 32 boxes of a
    row-major B or column-major A): ragged edges, K tails, every layout, a poisoned result."""
    gen = torch.Generator(device="cuda").manual_seed(m * 5 + n * 3 + k)
    a, b = _a(m, k, a_layout, gen), _b(k, n, b_layout, gen)
    out = torch.full((m, n), float("nan"), device="cuda")
    S.prepare_for(a, b, out, config=S.Sm90Tf32x3Config(3, 64))(a, b, None, out, 1.0, 0.0)
    _check(out, a, b)


def test_the_64_square_tile_runs_a_batch_of_small_products_with_beta():
    gen = torch.Generator(device="cuda").manual_seed(41)
    a = torch.randn(256, 64, 512, generator=gen, device="cuda")
    b = torch.randn(256, 512, 64, generator=gen, device="cuda")
    c = torch.randn(64, 64, generator=gen, device="cuda").expand(256, 64, 64)
    out = torch.full((256, 64, 64), float("nan"), device="cuda")
    S.prepare_for(a, b, out, c, S.Sm90Tf32x3Config(4, 64))(a, b, c, out, 0.5, 2.0)
    _check(out, a, b, c, 0.5, 2.0)


@pytest.fixture
def sm90_calls(monkeypatch):
    """The number of launches the Hopper 3xTF32 kernel makes (its launch class's calls)."""
    calls = []
    launch = S.Sm90Tf32x3Launch.__call__

    def counting(self, *args):
        calls.append(self)
        return launch(self, *args)

    monkeypatch.setattr(S.Sm90Tf32x3Launch, "__call__", counting)
    return calls


def test_the_op_runs_large_products_here(sm90_calls):
    gen = torch.Generator(device="cuda").manual_seed(17)
    a = torch.randn(2048, 1024, generator=gen, device="cuda")
    b = torch.randn(1024, 2304, generator=gen, device="cuda")
    _check(ck.sgemm(a, b), a, b)
    w = torch.randn(2304, 1024, generator=gen, device="cuda")
    _check(ck.sgemm(a, w.t()), a, w.t())  # x @ w.t(): the column-major B kernel
    bias = torch.randn(2304, generator=gen, device="cuda")
    _check(ck.sgemm(a, b, bias, alpha=0.5, beta=2.0), a, b, bias.expand(2048, 2304), 0.5, 2.0)
    c = torch.randn(2048, 2304, generator=gen, device="cuda")
    expect_c = c.clone()
    assert ck.sgemm(a, b, c, beta=1.0, out=c) is c
    _check(c, a, b, expect_c, 1.0, 1.0)
    assert len(sm90_calls) == 4


def test_the_op_runs_batches_here(sm90_calls):
    """torch.bmm-like batches of 1024^3 (256 tiles over four products) on the Hopper kernel: full batches, a
    single a repeated over b's batch (batch stride 0), a batch of transposed weights, and a batch's bias."""
    gen = torch.Generator(device="cuda").manual_seed(37)
    a = torch.randn(4, 1024, 1024, generator=gen, device="cuda")
    b = torch.randn(4, 1024, 1024, generator=gen, device="cuda")
    _check(ck.sgemm(a, b), a, b)
    w = torch.randn(1024, 1024, generator=gen, device="cuda")
    _check(ck.sgemm(w, b), w.expand(4, 1024, 1024), b)
    weights = torch.randn(4, 1024, 1024, generator=gen, device="cuda")
    _check(ck.sgemm(a, weights.mT), a, weights.mT)
    bias = torch.randn(1024, generator=gen, device="cuda")
    _check(ck.sgemm(a, b, bias, beta=1.0), a, b, bias.expand(4, 1024, 1024), 1.0, 1.0)
    assert len(sm90_calls) == 4 and {call.tile for call in sm90_calls} == {128}
    small_a = torch.randn(256, 64, 512, generator=gen, device="cuda")
    small_b = torch.randn(256, 512, 64, generator=gen, device="cuda")
    _check(ck.sgemm(small_a, small_b), small_a, small_b)  # a batch of 64 x 64 products: the 64-square tile
    assert len(sm90_calls) == 5 and sm90_calls[-1].tile == 64


def test_unloaded_a_boxes_feed_only_unstored_rows():
    """A column-major A's 32-row boxes wholly past M are not loaded: their stage slots hold NaN from an
    earlier GEMM on every SM; the rows below M stay finite and right."""
    gen = torch.Generator(device="cuda").manual_seed(23)
    b = torch.randn(256, 2048, generator=gen, device="cuda")
    S.sgemm_sm90(torch.full((256, 2048), float("nan"), device="cuda").t(), b)  # 256 CTAs, column-major A
    a2 = torch.randn(100, 300, generator=gen, device="cuda").t()  # the third row tile loads two boxes of four
    b2 = torch.randn(100, 260, generator=gen, device="cuda")
    out = S.sgemm_sm90(a2, b2)
    assert torch.isfinite(out).all()
    _check(out, a2, b2)


def test_the_op_runs_transposed_a_here(sm90_calls):
    """x.t() @ y and x.t() @ w.t() (the weight gradient's products) on the column-major A kernel."""
    gen = torch.Generator(device="cuda").manual_seed(29)
    x = torch.randn(1024, 2048, generator=gen, device="cuda")
    y = torch.randn(1024, 2304, generator=gen, device="cuda")
    _check(ck.sgemm(x.t(), y), x.t(), y)
    w = torch.randn(2304, 1024, generator=gen, device="cuda")
    _check(ck.sgemm(x.t(), w.t()), x.t(), w.t())
    assert len(sm90_calls) == 2 and all(call.a_m_major for call in sm90_calls)


def test_misaligned_rows_run_here_on_aligned_copies(sm90_calls):
    gen = torch.Generator(device="cuda").manual_seed(19)
    a = torch.randn(2047, 2047, generator=gen, device="cuda")
    b = torch.randn(2047, 2049, generator=gen, device="cuda")
    out = torch.full((2047, 2049), float("nan"), device="cuda")
    ck.sgemm(a, b, out=out)
    _check(out, a, b)
    assert len(sm90_calls) == 1


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_given_config(stages, sm90_calls):
    gen = torch.Generator(device="cuda").manual_seed(stages)
    a = torch.randn(260, 200, generator=gen, device="cuda")  # small: only a given config runs it here
    b = torch.randn(200, 300, generator=gen, device="cuda")
    _check(ck.sgemm(a, b, config=S.Sm90Tf32x3Config(stages)), a, b)
    assert len(sm90_calls) == 1
