"""GPU tier for the 3xTF32 SGEMM (``sgemm/tf32x3_mma``): every ladder tile and k-depth, split-K, every
operand layout and alignment, batches, long K with inputs of one sign (where the tensor core's truncated
sums would drift without the per-k-tile fold), all against float64 with the SGEMM's oracle (twice cuBLAS's
FP32 error, TF32 off), outputs poisoned."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.gemm import Tf32x3GemmConfig, reference
from cute_kernels.ops.gemm import sgemm as S
from cute_kernels.ops.gemm import sgemm_tf32x3 as T
from cute_kernels.runtime import oracle

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("exact_fp32_torch"),
]


def _check(ours, a, b, c=None, alpha=1.0, beta=0.0):
    """``oracle.compare`` in units of ``reference.gemm_scale`` (test_sgemm_gpu's oracle), for any batch."""
    ref = alpha * torch.matmul(a.double(), b.double())
    theirs = torch.matmul(a, b).mul_(alpha)
    if beta != 0.0:
        ref = ref + beta * c.double()
        theirs = theirs + beta * c
    if a.dim() == 3:
        for i in range(a.shape[0]):
            scale = reference.gemm_scale(a[i], b[i], c[i] if beta != 0.0 else None, alpha=alpha, beta=beta)
            verdict = oracle.compare(ours[i], ref[i], theirs[i], scale=scale)
            assert verdict, f"batch {i}: {verdict.detail}"
        return
    scale = reference.gemm_scale(a, b, c if beta != 0.0 else None, alpha=alpha, beta=beta)
    verdict = oracle.compare(ours, ref, theirs, scale=scale)
    assert verdict, verdict.detail


def _operand(rows, cols, major_contiguous_rows: bool, gen, offset=0, positive=False):
    """A (rows, cols) float32 operand: row-major, or the transposed view of a row-major (cols, rows) tensor
    (``major_contiguous_rows``); ``offset`` elements into its storage (misaligned rows and base)."""
    shape = (cols, rows) if major_contiguous_rows else (rows, cols)
    n = shape[0] * shape[1] + offset
    flat = torch.rand(n, generator=gen, device="cuda") if positive else torch.randn(n, generator=gen, device="cuda")
    t = flat[offset:].view(shape)
    return t.t() if major_contiguous_rows else t


LADDER = [config for config, _, _ in T._LADDER]
CONFIGS = LADDER + [
    dataclasses.replace(LADDER[0], tile_k=16),
    dataclasses.replace(LADDER[-1], tile_k=16, num_stages=5),  # more stages than k-tiles at K = 40
    dataclasses.replace(LADDER[-1], num_stages=2),
    dataclasses.replace(LADDER[-1], split_k=4),
    dataclasses.replace(LADDER[1], split_k=2),
    dataclasses.replace(LADDER[0], swizzle=False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k, beta", [(257, 383, 100, 0.0), (1000, 1000, 333, 0.5), (128, 128, 128, 1.0),
                                           (65, 130, 40, -1.0), (33, 64, 3000, 0.0)])
def test_configs(config, m, n, k, beta):
    gen = torch.Generator(device="cuda").manual_seed(m * n + k)
    a, b, c = (torch.randn(*s, generator=gen, device="cuda") for s in ((m, k), (k, n), (m, n)))
    out = torch.full((m, n), float("nan"), device="cuda")
    S.sgemm(a, b, c, alpha=1.5, beta=beta, out=out, config=config)
    _check(out, a, b, c, 1.5, beta)


@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("offset", [0, 1, 2])
@pytest.mark.parametrize("m, n, k", [(300, 200, 129), (64, 1000, 517)])
def test_layouts_and_alignments(a_t, b_t, offset, m, n, k):
    """Column-major operands (K- or M/N-contiguous stages, each with its swizzle) and rows of 4, 8 and 16
    bytes' alignment, through the op with the ladder's configs (each supported one is run)."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k + offset)
    a = _operand(m, k, a_t, gen, offset)
    b = _operand(k, n, b_t, gen, offset)
    for config in [None, *LADDER]:
        out = torch.full((m, n), float("nan"), device="cuda")
        S.sgemm(a, b, out=out, config=config)
        _check(out, a, b)


@pytest.mark.parametrize("m, n, k", [(128, 256, 16384), (520, 130, 8200)])
def test_long_k_of_one_sign(m, n, k):
    """Inputs in [0, 1): every k-tile's partial sum is positive, so truncated MMA sums would all err low
    and add up over K; folded per k-tile into FP32 they stay within the FP32 oracle."""
    gen = torch.Generator(device="cuda").manual_seed(k)
    a = _operand(m, k, False, gen, positive=True)
    b = _operand(k, n, False, gen, positive=True)
    for config in (None, LADDER[-1]):
        out = torch.full((m, n), float("nan"), device="cuda")
        S.sgemm(a, b, out=out, config=config)
        _check(out, a, b)


@pytest.mark.parametrize("batch, m, n, k", [(3, 100, 200, 70), (32, 256, 256, 256)])
def test_batched(batch, m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(batch)
    a = torch.randn(batch, m, k, generator=gen, device="cuda")
    b = torch.randn(batch, k, n, generator=gen, device="cuda")
    c = torch.randn(batch, m, n, generator=gen, device="cuda")
    out = torch.full((batch, m, n), float("nan"), device="cuda")
    S.sgemm(a, b, c, alpha=0.5, beta=2.0, out=out)
    _check(out, a, b, c, 0.5, 2.0)


def test_default_routes_to_it_and_split_k_is_deterministic(monkeypatch):
    """The op takes this entry for M and N above 32 on sm_80+ (its launch is this entry's: the prepare
    the op calls is recorded), and a split config gives the same bits on every call (slices are summed in a
    fixed order)."""
    from cute_kernels.runtime import plans

    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(64, 2048, generator=gen, device="cuda")
    b = torch.randn(2048, 96, generator=gen, device="cuda")
    problem = S._runs_as(reference_problem(a, b))
    assert S._variant_order(problem)[0] is T.SPEC
    from cute_kernels.ops.gemm import op as op_module

    prepared = []
    on_device = op_module.on_device
    monkeypatch.setattr(op_module, "on_device", lambda index, fn, *args: prepared.append(fn) or on_device(index, fn, *args))
    plans.clear_all()
    _check(S.sgemm(a, b), a, b)
    # on_device also runs launches (a split-K one, here); of the sgemm entries' prepares, only this one ran.
    entry_prepares = [spec.prepare for spec in registry.list("sgemm")]
    assert len(entry_prepares) >= 3 and [fn for fn in prepared if fn in entry_prepares] == [T.SPEC.prepare]
    config = dataclasses.replace(LADDER[-1], split_k=4)
    first = S.sgemm(a, b, config=config)
    for _ in range(3):
        assert torch.equal(S.sgemm(a, b, config=config), first)
    _check(first, a, b)


def reference_problem(a, b):
    from cute_kernels.ops.gemm.problem import make_problem

    out = torch.empty(a.shape[0], b.shape[1], device=a.device)
    return make_problem(a, b, None, beta=0.0, out=out)


def test_nan_in_c_does_not_leak_when_beta_is_zero():
    a = torch.randn(200, 300, device="cuda")
    b = torch.randn(300, 100, device="cuda")
    c = torch.full((200, 100), float("nan"), device="cuda")
    out = S.sgemm(a, b, c, beta=0.0, config=Tf32x3GemmConfig())
    assert torch.isfinite(out).all()
    _check(out, a, b)


@pytest.mark.parametrize("config", [None, LADDER[0], LADDER[-1]], ids=lambda c: "default" if c is None else c.short())
def test_non_finite_and_huge_inputs(config):
    """NaNs propagate whatever their bits (0x7fffffff, the GPU's own, which the rounding add carries into
    big's sign, the canonical 0x7fc00000, and a negative one); a huge finite value (3.4e38) stays finite
    where its products are, up to the last magnitude that does not round to infinity (0x7f7fefff); an
    infinity of either sign, and a finite value from 0x7f7ff000 (which rounds to infinity), make their
    rows NaN (where an FFMA GEMM gives an infinity or a finite sum: the documented difference)."""
    m, n, k = 96, 80, 64
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(m, k, generator=gen, device="cuda")
    b = torch.randn(k, n, generator=gen, device="cuda")
    # NaN payloads through int32 views: a Python float would turn them into the canonical 0x7fc00000.
    a.view(torch.int32)[3, 5] = 0x7FFFFFFF
    a[7, 9] = float("nan")
    b.view(torch.int32)[11, 13] = -1  # 0xffffffff
    a[20] = 0.0
    a[20, 0] = 3.4e38
    b[0] = 0.5
    a[30, 2] = float("inf")
    a[31, 2] = float("-inf")
    a[40, 0] = 3.4028e38
    a.view(torch.int32)[41, 0] = 0x7F7FF000  # the first magnitude that rounds to infinity (about 3.4020e38)
    a[42, 0] = -3.4028e38
    a[50] = 0.0
    a.view(torch.int32)[50, 0] = 0x7F7FEFFF  # the last one that does not
    out = torch.full((m, n), 1.0, device="cuda")
    S.sgemm(a, b, out=out, config=config)
    assert torch.isnan(out[3]).all() and torch.isnan(out[7]).all() and torch.isnan(out[:, 13]).all()
    assert all(torch.isnan(out[row]).all() for row in (30, 31, 40, 41, 42))
    ref = torch.matmul(a.double(), b.double())
    clean_cols = [j for j in range(n) if j != 13]
    for row in (20, 50):
        torch.testing.assert_close(out[row, clean_cols].double(), ref[row, clean_cols], rtol=2e-3, atol=0)
    rows = [i for i in range(m) if i not in (3, 7, 20, 30, 31, 40, 41, 42, 50)]
    sub = out[rows][:, clean_cols]
    assert torch.isfinite(sub).all()
    _check(sub.contiguous(), a[rows].contiguous(), b[:, clean_cols].contiguous())
