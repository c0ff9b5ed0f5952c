"""GPU tier for the GEMMs of real models (issue 24): batched operands (``a`` (B, M, K) @ ``b`` (B, K, N), a
single matrix broadcasting over the batch), transposed operands (column-major views such as ``w.t()``: the
four layouts NN, NT, TN, TT), torch.addmm/baddbmm broadcasting of ``c``, and gradients through ``ck.sgemm``
and ``ck.hgemm``.

The oracle is the GEMMs' own: against float64, per element in units of ``reference.gemm_scale`` (with the
sqrt(K) growth for FP32 results, without for 16-bit ones), at most twice torch's error on the same product
in the same dtype (TF32 off) plus the floor of a few eps. Outputs start poisoned (NaN), so an element the
kernel skips fails."""

from __future__ import annotations

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.gemm import GemmConfig, GemvConfig, HgemmConfig, HgemmSm90Config, reference
from test_torch_ops_gpu import _poison_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_torch"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

OPS = [(ck.sgemm, torch.float32), (ck.hgemm, torch.float16), (ck.hgemm, torch.bfloat16)]
OP_IDS = ["sgemm", "hgemm-fp16", "hgemm-bf16"]
LAYOUTS = ["NN", "NT", "TN", "TT"]  # a then b: N row-major, T a column-major (transposed) view
# The Hopper kernels (wgmma, TMA: the sm_90 HGEMM, the TMA GEMV) run on sm_90 alone.
_SM90_ONLY = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                                reason="the Hopper kernels need sm_90")


def _operand(rows, cols, transposed, batch, gen, dtype):
    """A (rows, cols) matrix (or a batch of them) drawn randn in FP32 and rounded; ``transposed``: stored
    column-major, i.e. the transposed view of a row-major (cols, rows) tensor."""
    shape = (cols, rows) if transposed else (rows, cols)
    if batch is not None:
        shape = (batch, *shape)
    t = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    return t.transpose(-1, -2) if transposed else t


def _assert_gemm(out, a, b, c=None, alpha=1.0, beta=0.0):
    """The oracle (module docstring, ``reference.gemm_verdict``) for ``out = alpha * a @ b + beta * c``."""
    baseline = torch.matmul(a, b) * alpha if a.dtype == torch.float32 else (torch.matmul(a.float(), b.float()) * alpha)
    if c is not None and beta != 0.0:
        baseline = baseline + beta * c.to(baseline.dtype)
    verdict = reference.gemm_verdict(out, a, b, c, alpha=alpha, beta=beta, baseline=baseline.to(out.dtype))
    assert verdict, verdict.detail


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


# ---------------------------------------------------------------------------------------------- layouts
@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
def test_a_batch_past_the_grid_runs_in_chunks(op, dtype, generator):
    """70000 products that do not fold into one GEMM (a batch of b): chunks of at most 65535, each its
    slices, into one result; and a batch of both with a batched c into out."""
    batch = 70000
    a = _operand(3, 40, False, None, generator, dtype)
    b = _operand(40, 8, False, batch, generator, dtype)
    _assert_gemm(op(a, b), a.expand(batch, 3, 40), b)
    a3 = _operand(5, 16, True, batch, generator, dtype)
    b3 = _operand(16, 8, False, batch, generator, dtype)
    c = _operand(5, 8, False, batch, generator, dtype)
    out = _poisoned((batch, 5, 8), dtype)
    assert op(a3, b3, c, alpha=1.5, beta=0.5, out=out) is out
    _assert_gemm(out, a3, b3, c, alpha=1.5, beta=0.5)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("batch", [None, 3])
def test_a_column_major_c(op, dtype, batch, generator):
    """torch.addmm takes c in any layout: a transposed view of the result's shape runs from a row-major copy."""
    a = _operand(130, 72, False, batch, generator, dtype)
    b = _operand(72, 200, False, None, generator, dtype)
    c = _operand(130, 200, True, batch, generator, dtype)
    out = _poisoned((*(() if batch is None else (batch,)), 130, 200), dtype)
    assert op(a, b, c, alpha=1.5, beta=0.5, out=out) is out
    _assert_gemm(out, a, b, c, alpha=1.5, beta=0.5)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m, n, k", [(100, 72, 56), (257, 130, 97), (1, 64, 200), (96, 1, 40), (1024, 1024, 1032)])
def test_four_layouts(op, dtype, layout, m, n, k, generator):
    a = _operand(m, k, layout[0] == "T", None, generator, dtype)
    b = _operand(k, n, layout[1] == "T", None, generator, dtype)
    out = _poisoned((m, n), dtype)
    assert op(a, b, alpha=1.5, out=out) is out
    _assert_gemm(out, a, b, alpha=1.5)


def _check_hgemm_layout(dtype, layout, config, m, n, k, batch, generator):
    """ck.hgemm with ``config`` on operands of ``layout`` (N: row-major, T: a column-major view; a then b),
    alpha and beta both non-trivial, into a poisoned out, against float64."""
    a = _operand(m, k, layout[0] == "T", batch, generator, dtype)
    b = _operand(k, n, layout[1] == "T", batch, generator, dtype)
    c = _operand(m, n, False, batch, generator, dtype)
    shape = (m, n) if batch is None else (batch, m, n)
    out = _poisoned(shape, dtype)
    ck.hgemm(a, b, c, alpha=0.75, beta=-0.5, out=out, config=config)
    _assert_gemm(out, a, b, c, alpha=0.75, beta=-0.5)


@_SM90_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", [HgemmSm90Config(cluster_m=2), HgemmSm90Config(tile_m=64, tile_n=128,
                                    consumer_warpgroups=1, num_stages=6), HgemmSm90Config(cluster_n=2),
                                    HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3,
                                                    ctas_per_sm=2)],
                         ids=["128x256c2x1", "64x128", "128x256c1x2", "128x128o2"])
@pytest.mark.parametrize("batch", [None, 3])
def test_hopper_kernel_takes_every_layout(dtype, layout, config, batch, generator):
    """The wgmma variant itself (its config pins it) on each majorness of A and B, batched too: TMA and
    the descriptors read the operands as they lie. M and N leave partial tiles and partial clusters."""
    m, n, k = 328, 264, 192
    _check_hgemm_layout(dtype, layout, config, m, n, k, batch, generator)


@_SM90_ONLY
@pytest.mark.parametrize("single", ["a", "b", "a-batch-of-one"])
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_hopper_kernel_repeats_a_single_operand_over_the_batch(single, layout, generator):
    """One matrix for every batch (batch stride 0 in its TMA descriptor), with the other operand strided;
    ``x @ w`` folds into one GEMM before any kernel sees a batch, so ``a`` here is a strided batch."""
    dtype, batch, m, n, k = torch.float16, 4, 200, 136, 160
    a = _operand(m, k, layout[0] == "T", None if single == "a" else batch, generator, dtype)
    b = _operand(k, n, layout[1] == "T", None if single == "b" else batch, generator, dtype)
    if single == "a-batch-of-one":
        a = a[:1]
    if single == "b":
        a = _operand(m + 8, k, layout[0] == "T", batch, generator, dtype)[:, :m]  # no fold
    out = _poisoned((batch, m, n), dtype)
    ck.hgemm(a, b, out=out, config=HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1))
    _assert_gemm(out, a, b)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 1000, 520), (3, 200, 72), (64, 96, 64)])
def test_decode_rows_times_a_transposed_weight(op, dtype, m, n, k, generator):
    """F.linear in a decode step, x @ w.t() (run as its transpose, op.SwappedLaunch), with a bias."""
    x = _operand(m, k, False, None, generator, dtype)
    w = _operand(n, k, False, None, generator, dtype)
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    assert op(x, w.t(), bias, alpha=1.5, beta=1.0, out=out) is out
    _assert_gemm(out, x, w.t(), bias, alpha=1.5, beta=1.0)


@_SM90_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(24, 4096, 4096), (32, 1024, 4096), (64, 2048, 4096), (64, 4096, 512),
                                     (40, 2200, 96)])
def test_decode_rows_run_on_the_hopper_kernel_as_they_lie(dtype, m, n, k, generator, monkeypatch):
    """x @ w.t() with 17-64 16-bit rows on sm_90: not swapped (hgemm.SWAP_SM90_MAX_ROWS), the Hopper kernel
    reads x, w.t() (a K-major B) and out as they lie (split K at 1024-4096 columns, not at K = 96 or 512);
    with a bias repeated over the rows (read through a column stride of 0), with a full c, with out = c,
    and with a NaN c not read."""
    from cute_kernels.ops.gemm import op as op_module
    from cute_kernels.runtime import plans

    plans.clear_all()  # a structure planned before would not be prepared (and seen) again
    swapped = []
    prepare = op_module._prepare_swapped
    monkeypatch.setattr(op_module, "_prepare_swapped", lambda *args: swapped.append(args) or prepare(*args))
    x = _operand(m, k, False, None, generator, dtype)
    w = _operand(n, k, False, None, generator, dtype)
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    assert ck.hgemm(x, w.t(), bias, alpha=1.5, beta=1.0, out=out) is out
    _assert_gemm(out, x, w.t(), bias, alpha=1.5, beta=1.0)
    assert swapped == []
    c = torch.randn(m, n, generator=generator, device="cuda").to(dtype)
    _assert_gemm(ck.hgemm(x, w.t(), c, alpha=0.5, beta=0.5), x, w.t(), c, alpha=0.5, beta=0.5)
    in_place = c.clone()
    assert ck.hgemm(x, w.t(), in_place, beta=1.0, out=in_place) is in_place
    _assert_gemm(in_place, x, w.t(), c, beta=1.0)
    nan_c = _poisoned((m, n), dtype)
    _assert_gemm(ck.hgemm(x, w.t(), nan_c, alpha=1.0, beta=0.0), x, w.t())


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("config", [None, GemvConfig(True, 4, 1), GemvConfig(True, 16, 8), GemvConfig(True, 4, 2, 2),
                                    GemvConfig(False, 8, 4), GemvConfig(False, 4, 2, 4), GemvConfig(False, 8, 4, 2)],
                         ids=["default", "mma-w4u1", "mma-w16u8", "mma-w4u2c2", "simt-w8u4", "simt-w4u2c4",
                              "simt-w8u4c2"])
@pytest.mark.parametrize("m, n, k, aligned", [(1, 4096, 4096, True), (8, 1000, 520, True), (3, 77, 1000, True),
                                              (6, 200, 4104, True), (5, 300, 97, False), (2, 33, 1, False),
                                              (7, 130, 4104, False), (16, 300, 520, True), (11, 77, 97, False),
                                              (12, 1000, 4104, True), (9, 33, 72, True)])
def test_gemv_rows_times_a_transposed_weight(op, dtype, config, m, n, k, aligned, generator):
    """The GEMV variant (pinned by its config, or chosen by the op for M <= 8, 16 for 16-bit 16-byte rows): x @ w.t() with a bias, and
    with a NaN c and beta = 0 (not read); aligned rows (16-byte chunks, the unrolled rounds and the tail)
    and misaligned ones (views one element in: the scalar path); 2 or 4 columns per warp on N that is no
    multiple of the CTA's columns (the last warp's rows past N re-read, not stored)."""
    shift = 0 if aligned else 1
    x = _operand(m, k + shift, False, None, generator, dtype)[:, shift:]
    w = _operand(n, k + shift, False, None, generator, dtype)[:, shift:]
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    assert op(x, w.t(), bias, alpha=1.5, beta=1.0, out=out, config=config) is out
    _assert_gemm(out, x, w.t(), bias, alpha=1.5, beta=1.0)
    nan_c = _poisoned((m, n), dtype)
    result = op(x, w.t(), nan_c, alpha=0.5, beta=0.0, config=config)
    _assert_gemm(result, x, w.t(), alpha=0.5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("config", [GemvConfig(True, 8, 2, 2, k_ctas=2), GemvConfig(True, 16, 1, 1, k_ctas=4),
                                    GemvConfig(True, 4, 1, 2, k_ctas=8)], ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (9, 1000, 4104), (3, 77, 1000), (16, 40, 72), (1, 33, 8)])
def test_gemv_k_split_across_ctas(dtype, config, m, n, k, generator):
    """The tensor-core GEMV with K split across CTAs (their partial tiles summed by the last to arrive):
    with a bias and beta, N no multiple of the CTA's columns, K shorter than one k-block per CTA (CTAs that
    walk nothing still arrive); a second call gives the same bits (the sum's order is fixed, the counters
    are left at zero), and a call with beta = 0 does not read its NaN c."""
    _check_repeatable_gemv(_operand(m, k, False, None, generator, dtype), _operand(n, k, False, None, generator, dtype),
                           config, generator)


def _check_repeatable_gemv(x, w, config, generator):
    """``x @ w.t()`` on ``config`` with a bias and beta (the oracle), a repeat into a fresh output that gives
    the same bits, and beta = 0 with a NaN c (not read)."""
    (m, _), n, dtype = x.shape, w.shape[0], x.dtype
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    assert ck.hgemm(x, w.t(), bias, alpha=1.5, beta=1.0, out=out, config=config) is out
    _assert_gemm(out, x, w.t(), bias, alpha=1.5, beta=1.0)
    again = _poisoned((m, n), dtype)
    ck.hgemm(x, w.t(), bias, alpha=1.5, beta=1.0, out=again, config=config)
    assert torch.equal(out, again)
    result = ck.hgemm(x, w.t(), _poisoned((m, n), dtype), alpha=0.5, beta=0.0, config=config)
    _assert_gemm(result, x, w.t(), alpha=0.5)


@_SM90_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("config", [GemvConfig(True, tma_stages=4), GemvConfig(True, tma_stages=11),
                                    GemvConfig(True, tma_stages=8, k_ctas=2), GemvConfig(True, tma_stages=6, k_ctas=4),
                                    GemvConfig(True, tma_stages=4, k_ctas=8)],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k, padded", [(16, 4096, 4096, False), (9, 1000, 4104, True), (3, 77, 1000, False),
                                             (16, 40, 72, True), (1, 33, 8, False), (12, 300, 520, True)])
def test_gemv_tma_kernel(dtype, config, m, n, k, padded, generator):
    """The sm_90 GEMV that streams the weight through a TMA ring onto wgmma: N no multiple of its 128 rows
    (and below them), K no multiple of its 64-wide stages (and below one), rows of x past M zero-filled,
    row strides wider than K (``padded``); with a bias and beta, a repeat that gives the same bits (the split's
    sum has a fixed order, its counters are left at zero), new tensors of the same structure (the plan's maps
    pointed at them), a c of wider rows, and beta = 0 not reading a NaN c."""
    pad = 8 if padded else 0
    x, x2 = (_operand(m, k + pad, False, None, generator, dtype)[:, :k] for _ in range(2))
    w, w2 = (_operand(n, k + pad, False, None, generator, dtype)[:, :k] for _ in range(2))
    _check_repeatable_gemv(x, w, config, generator)
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    ck.hgemm(x2, w2.t(), bias, alpha=1.5, beta=1.0, out=out, config=config)  # the first call's plan, new pointers
    _assert_gemm(out, x2, w2.t(), bias, alpha=1.5, beta=1.0)
    c = torch.randn(m, n + 8, generator=generator, device="cuda").to(dtype)[:, :n]
    ck.hgemm(x2, w2.t(), c, alpha=1.5, beta=-0.5, out=out, config=config)
    _assert_gemm(out, x2, w2.t(), c, alpha=1.5, beta=-0.5)


@pytest.mark.parametrize("config, dtype", [(GemvConfig(True, 8, 2, 2, k_ctas=2), torch.float16),
                                           pytest.param(GemvConfig(True, tma_stages=8, k_ctas=4), torch.bfloat16,
                                                        marks=_SM90_ONLY)],
                         ids=["mma-k2", "tma-k4"])
def test_gemv_k_split_across_ctas_under_graph_capture(config, dtype, generator):
    """The split GEMV (the register kernel's, and the TMA kernel's with its maps encoded before the capture)
    captured in a CUDA graph (its partial tiles and counters then come from the graph's pool, both alive
    until the launch is enqueued) and replayed: the oracle's result, twice."""
    m, n, k = 16, 4096, 4096
    x = _operand(m, k, False, None, generator, dtype)
    w = _operand(n, k, False, None, generator, dtype)
    out = _poisoned((m, n), dtype)
    ck.hgemm(x, w.t(), out=out, config=config)  # compiled and planned outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ck.hgemm(x, w.t(), out=out, config=config)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_gemm(out, x, w.t())


# The op's own choice (float32: gemv.ROW_MAJOR_TAKES_DTYPES), then configs pinned on every dtype.
_ROWS_CASES = ([(ck.sgemm, torch.float32, None)]
               + [(op, dtype, config) for op, dtype in OPS
                  for config in (GemvConfig(False, 8, 4, 1, 8, k_ctas=8), GemvConfig(False, 8, 1, 1, 1),
                                 GemvConfig(False, 16, 8, 1, 4, k_ctas=2), GemvConfig(False, 4, 2, 1, 2, k_ctas=4))])


@pytest.mark.parametrize("op, dtype, config", _ROWS_CASES,
                         ids=lambda v: v.short() if isinstance(v, GemvConfig) else getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("m, n, k, aligned", [(1, 4096, 4096, True), (8, 1000, 520, True), (3, 77, 1000, True),
                                              (6, 200, 4104, True), (5, 300, 97, False), (2, 33, 1, False),
                                              (7, 130, 4104, False), (1, 8, 3, True), (4, 520, 33, True)])
def test_gemv_rows_times_a_row_major_weight(op, dtype, config, m, n, k, aligned, generator):
    """A few rows times a row-major weight, x @ w (gemv_rows_kernel, pinned by its config or chosen by the
    op): with a bias and beta, and with a NaN c and beta = 0 (not read); aligned rows (16-byte chunks, the
    unrolled rounds and the tail) and misaligned ones (views one element in: scalar loads); N no multiple
    of the CTA's columns, K shorter than a CTA's share (CTAs that walk nothing still arrive). A repeat gives
    the same bits (the warps' and CTAs' sums in a fixed order). With no config, the op's route is asserted
    to be the GEMV's (the profiler names the kernel)."""
    shift = 0 if aligned else 1
    x = _operand(m, k + shift, False, None, generator, dtype)[:, shift:]
    w = _operand(k, n + shift, False, None, generator, dtype)[:, shift:]
    bias = torch.randn(n, generator=generator, device="cuda").to(dtype)
    out = _poisoned((m, n), dtype)
    assert op(x, w, bias, alpha=1.5, beta=1.0, out=out, config=config) is out
    _assert_gemm(out, x, w, bias, alpha=1.5, beta=1.0)
    again = _poisoned((m, n), dtype)
    op(x, w, bias, alpha=1.5, beta=1.0, out=again, config=config)
    assert torch.equal(out, again)
    result = op(x, w, _poisoned((m, n), dtype), alpha=0.5, beta=0.0, config=config)
    _assert_gemm(result, x, w, alpha=0.5)
    if config is None:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            op(x, w)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert any("gemv_rows_kernel" in name for name in names), names


@pytest.mark.parametrize("b_transposed", [False, True], ids=["b-row", "b-col"])
@pytest.mark.parametrize("m, n, k", [(4096, 8, 4096), (1000, 5, 520), (77, 8, 97), (300, 1, 64), (130, 3, 4104)])
def test_skinny_n_runs_as_the_transposed_gemv(m, n, k, b_transposed, generator):
    """sgemm with N <= 8 (gemv.TransposedLaunch: b^T the rows of x, a the weight, out^T written in place
    through its column stride): with a bias, with alpha, and with a NaN c and beta = 0 (not read); a
    row-major b (copied) and a column-major one (read as it lies); K odd (scalar loads)."""
    a = _operand(m, k, False, None, generator, torch.float32)
    b = _operand(k, n, b_transposed, None, generator, torch.float32)
    bias = torch.randn(n, generator=generator, device="cuda")
    out = _poisoned((m, n), torch.float32)
    assert ck.sgemm(a, b, bias, alpha=1.5, beta=1.0, out=out) is out
    _assert_gemm(out, a, b, bias, alpha=1.5, beta=1.0)
    result = ck.sgemm(a, b, _poisoned((m, n), torch.float32), alpha=0.5, beta=0.0)
    _assert_gemm(result, a, b, alpha=0.5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", [HgemmConfig(), HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2),
                                    HgemmConfig(tile_m=16, tile_n=128, tile_k=64, num_stages=4, warps_m=1, warps_n=4,
                                                split_k=2)],
                         ids=["128x256", "64x64", "16x128k2"])
@pytest.mark.parametrize("m, n, k, batch", [(130, 264, 200, None), (77, 45, 99, None), (40, 72, 136, 3)])
def test_sm80_kernel_takes_every_layout(dtype, layout, config, m, n, k, batch, generator):
    """The sm80-style variant itself (its config pins it) on each majorness of A and B: its stages keep the
    global majorness and ldmatrix transposes where the MMA needs it; ragged and misaligned shapes (narrow
    copies along the contiguous mode), batches (no split-K)."""
    if batch is not None and config.split_k > 1:
        config = HgemmConfig(tile_m=16, tile_n=128, tile_k=64, num_stages=4, warps_m=1, warps_n=4)
    _check_hgemm_layout(dtype, layout, config, m, n, k, batch, generator)


SGEMM_CONFIGS = {
    "128x128": GemmConfig(),
    "32x32": GemmConfig(tile_m=32, tile_n=32, tile_k=8, threads_m=8, threads_n=8),
    "64x64-ak": GemmConfig(tile_m=64, tile_n=64, tile_k=16, threads_m=8, threads_n=8, a_smem_major="k", num_stages=4),
    "64x64k2": GemmConfig(tile_m=64, tile_n=64, tile_k=32, threads_m=8, threads_n=8, split_k=2),
}
# An M-major a needs a_smem_major='m' (sgemm.why_unsupported): those pairs are not a call anyone can make.
SGEMM_LAYOUT_CONFIGS = [(layout, name) for layout in LAYOUTS for name, config in SGEMM_CONFIGS.items()
                        if not (layout[0] == "T" and config.a_smem_major == "k")]


@pytest.mark.parametrize("layout, config_name", SGEMM_LAYOUT_CONFIGS)
@pytest.mark.parametrize("m, n, k, batch", [(130, 264, 200, None), (77, 45, 99, None), (40, 72, 136, 3)])
def test_sgemm_kernel_takes_every_layout(layout, config_name, m, n, k, batch, generator):
    """The SGEMM on each majorness of A and B: an M-major A copied along M into its M-major stage, a K-major B
    transposed into its N-major stage; ragged and misaligned shapes, batches (no split-K)."""
    config = SGEMM_CONFIGS[config_name]
    if batch is not None and config.split_k > 1:
        config = GemmConfig(tile_m=64, tile_n=64, tile_k=32, threads_m=8, threads_n=8)
    a = _operand(m, k, layout[0] == "T", batch, generator, torch.float32)
    b = _operand(k, n, layout[1] == "T", batch, generator, torch.float32)
    c = _operand(m, n, False, batch, generator, torch.float32)
    shape = (m, n) if batch is None else (batch, m, n)
    out = _poisoned(shape, torch.float32)
    ck.sgemm(a, b, c, alpha=0.75, beta=-0.5, out=out, config=config)
    _assert_gemm(out, a, b, c, alpha=0.75, beta=-0.5)


# ---------------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("single", ["none", "a", "b"])  # which operand is one matrix for the whole batch
@pytest.mark.parametrize("m, n, k", [(65, 40, 33), (128, 64, 96), (256, 256, 256)])
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_batches(op, dtype, batch, single, m, n, k, layout, generator):
    a = _operand(m, k, layout[0] == "T", None if single == "a" else batch, generator, dtype)
    b = _operand(k, n, layout[1] == "T", None if single == "b" else batch, generator, dtype)
    out = _poisoned((batch, m, n), dtype)
    op(a, b, out=out)
    _assert_gemm(out, a, b)
    fresh = op(a, b)
    assert fresh.shape == (batch, m, n) and torch.equal(fresh, out)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("c_shape", [(40,), (65, 1), (3, 1, 40), (65, 40), (3, 65, 40), (1, 65, 40), ()])
def test_batched_c_broadcasts_as_baddbmm(op, dtype, c_shape, generator):
    a = _operand(65, 33, False, 3, generator, dtype)
    b = _operand(33, 40, False, 3, generator, dtype)
    c = torch.randn(c_shape, generator=generator, device="cuda").to(dtype)
    out = op(a, b, c, alpha=1.25, beta=0.5)
    _assert_gemm(out, a, b, c, alpha=1.25, beta=0.5)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("m, n, k, transposed_b, batch", [(300, 200, 64, False, None), (1024, 1024, 1024, False, None),
                                                         (4, 4096, 512, True, None), (12, 4096, 512, True, None),
                                                         (5, 1, 64, True, 4)])
def test_a_row_of_out_as_c(op, dtype, m, n, k, transposed_b, batch, generator):
    """c one row of out itself (``out[:1]``; a batch's ``out[:1, :1]``) with beta != 0: every result row reads
    that row while the kernel writes it, so the op copies it first; each kernel family (the tile kernels, the
    Hopper HGEMM, the GEMV on FMA, warp-MMA and TMA, a folded batch of one-row products)."""
    a = _operand(m, k, False, batch, generator, dtype)
    if batch is not None:
        a = a[:, :1]
    b = _operand(k, n, transposed_b, None, generator, dtype)
    out = _operand(m if batch is None else 1, n, False, batch, generator, dtype)
    row = out[:1] if batch is None else out[:1, :1]
    before = row.clone()
    assert op(a, b, row, alpha=1.25, beta=0.5, out=out) is out
    _assert_gemm(out, a, b, before, alpha=1.25, beta=0.5)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
def test_batched_in_place_and_nan_c_with_beta_zero(op, dtype, generator):
    a = _operand(64, 48, False, 4, generator, dtype)
    b = _operand(48, 40, True, 4, generator, dtype)
    c = torch.randn(4, 64, 40, generator=generator, device="cuda").to(dtype)
    expect_c = c.clone()
    assert op(a, b, c, beta=1.0, out=c) is c
    _assert_gemm(c, a, b, expect_c, beta=1.0)
    nan_c = _poisoned((4, 64, 40), dtype)
    out = op(a, b, nan_c, beta=0.0)
    _assert_gemm(out, a, b)


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
def test_strided_batches_without_copies(op, dtype, generator):
    """Batches that are slices of bigger tensors (batch strides other than M*K) and a result written into
    a wider buffer."""
    big_a = _operand(80, 64, False, 6, generator, dtype)
    big_b = _operand(64, 48, False, 6, generator, dtype)
    a, b = big_a[::2, :70, :40], big_b[1::2, :40, :32]
    buffer = _poisoned((3, 72, 40), dtype)
    out = buffer[:, :70, :32]
    op(a, b, out=out)
    _assert_gemm(out, a, b)
    assert torch.isnan(buffer[:, 70:]).all() and torch.isnan(buffer[:, :, 32:]).all()


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("layout", ["NN", "TN"])
@pytest.mark.parametrize("batch, m, k, n", [(3, 70, 40, 32), (32, 256, 256, 256)])  # the second: Hopper kernels (TMA)
def test_out_interleaved_row_by_row(op, dtype, layout, batch, m, k, n, generator):
    """out a (M, B, N) buffer seen as (B, M, N) (torch's layout of a sequence-first result): the matrices'
    rows interleave, none overlaps; a c of that layout too."""
    a = _operand(m, k, layout[0] == "T", batch, generator, dtype)
    b = _operand(k, n, layout[1] == "T", batch, generator, dtype)
    buffer = _poisoned((m, batch, n + 8), dtype)
    out = buffer[:, :, :n].transpose(0, 1)
    assert op(a, b, out=out) is out
    _assert_gemm(out, a, b)
    assert torch.isnan(buffer[:, :, n:]).all()
    c = _operand(m, batch * n, False, None, generator, dtype).view(m, batch, n).transpose(0, 1)
    _assert_gemm(op(a, b, c, beta=0.5, out=out), a, b, c, beta=0.5)


def test_batches_that_do_not_broadcast_write_nothing():
    a = torch.randn(2, 8, 4, device="cuda")
    b = torch.randn(3, 4, 5, device="cuda")
    out = _poisoned((2, 8, 5), torch.float32)
    with pytest.raises(ValueError, match="b: a batch of 3 does not broadcast"):
        ck.sgemm(a, b, out=out)
    assert torch.isnan(out).all()


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
def test_a_batch_past_the_grid_runs_folded(op, dtype, generator):
    """A batch past the kernels' grid (65535) of a times one b runs as one GEMM of B * M rows: as it lies,
    from a row-major copy of a column-major a, with a bias c; into an out, and from a c, whose matrices are
    apart (row-major copies, the result copied into out)."""
    batch = 70000
    b = _operand(24, 16, False, None, generator, dtype)
    a = _operand(3, 24, False, batch, generator, dtype)
    _assert_gemm(op(a, b), a, b)
    a_t = _operand(3, 24, True, batch, generator, dtype)
    _assert_gemm(op(a_t, b), a_t, b)
    bias = _operand(1, 16, False, None, generator, dtype)[0]
    _assert_gemm(op(a, b, bias, beta=1.0), a, b, bias, beta=1.0)
    buffer = _poisoned((batch, 4, 16), dtype)
    assert op(a, b, out=buffer[:, :3]) is not None
    _assert_gemm(buffer[:, :3], a, b)
    assert torch.isnan(buffer[:, 3]).all()
    c = _operand(4, 16, False, batch, generator, dtype)[:, :3]
    _assert_gemm(op(a, b, c, beta=0.5), a, b, c, beta=0.5)


# ---------------------------------------------------------------------------------------------- gradients
def _grads_oracle(ours, a, b, c, grad, alpha, beta):
    """Each gradient is a GEMM (or a sum): judged as one against float64."""
    da, db, dc = ours
    batch_a = a.dim() == 3 and a.shape[0] > 1
    batch_b = b.dim() == 3 and b.shape[0] > 1
    if da is not None:
        if grad.dim() == 3 and not batch_a:
            g = grad.transpose(0, 1).reshape(grad.shape[1], -1)
            bt = _batch(b, grad.shape[0]).transpose(1, 2).reshape(-1, b.shape[-2])
            _assert_gemm(da.reshape(a.shape[-2:]), g, bt, alpha=alpha)
        else:
            _assert_gemm(da, grad, b.transpose(-1, -2), alpha=alpha)
    if db is not None:
        if grad.dim() == 3 and not batch_b:
            at = _batch(a, grad.shape[0]).reshape(-1, a.shape[-1]).t()
            _assert_gemm(db.reshape(b.shape[-2:]), at, grad.reshape(-1, grad.shape[-1]), alpha=alpha)
        else:
            _assert_gemm(db, a.transpose(-1, -2), grad, alpha=alpha)
    if dc is not None:
        expect = (grad.double() * beta).sum_to_size(c.shape)
        assert torch.allclose(dc.double(), expect, rtol=1e-2, atol=1e-2 * float(expect.abs().max()) + 1e-6)


def _batch(t, batch):
    return t.expand(batch, *t.shape[-2:]) if (t.dim() == 2 or t.shape[0] == 1) else t


@pytest.mark.parametrize("op, dtype", OPS, ids=OP_IDS)
@pytest.mark.parametrize("case", ["linear", "bmm", "x_at_w", "w_at_x", "transposed"])
def test_gradients(op, dtype, case, generator):
    shapes = {  # a, b, c (with the layout of a and b)
        "linear": ((37, 48), (40, 48), (40,)),  # F.linear: x @ w.t() + bias
        "bmm": ((3, 33, 40), (3, 40, 24), (3, 33, 24)),
        "x_at_w": ((4, 33, 40), (40, 24), (24,)),
        "w_at_x": ((33, 40), (4, 40, 24), (33, 1)),
        "transposed": ((40, 33), (24, 40), ()),  # a.t() @ b.t()
    }[case]
    a_shape, b_shape, c_shape = shapes
    leaf = [torch.randn(s, generator=generator, device="cuda").to(dtype).requires_grad_() for s in shapes]
    a, b, c = leaf
    a_in = a.t() if case == "transposed" else a
    b_in = b.t() if case in ("linear", "transposed") else b
    out = op(a_in, b_in, c, alpha=1.5, beta=0.5)
    assert out.requires_grad and out.grad_fn is not None
    grad = torch.randn(out.shape, generator=generator, device="cuda").to(dtype)
    _poison_allocator()  # the gradients come from memory reading NaN: an element left unwritten shows
    out.backward(grad)
    da = a.grad.t() if case == "transposed" else a.grad
    db = b.grad.t() if case in ("linear", "transposed") else b.grad
    _grads_oracle((da, db, c.grad), a_in.detach(), b_in.detach(), c.detach(), grad, 1.5, 0.5)


def test_gradcheck_through_the_float32_path(generator):
    a = torch.randn(3, 7, 5, generator=generator, device="cuda").requires_grad_()
    b = torch.randn(5, 6, generator=generator, device="cuda").requires_grad_()
    c = torch.randn(6, generator=generator, device="cuda").requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: ck.sgemm(a, b.t().contiguous().t(), c, alpha=1.5, beta=0.5),
                                    (a, b, c), eps=1e-2, atol=2e-2, rtol=1e-2)


def test_gradient_of_a_sum_and_out_refused(generator):
    """``out.sum()``'s gradient is an expanded scalar (no unit stride): the backward takes it; ``out=`` with
    an input requiring grad is refused, as torch refuses it, writing nothing."""
    a = torch.randn(16, 8, device="cuda", requires_grad=True)
    b = torch.randn(8, 12, device="cuda", requires_grad=True)
    ck.sgemm(a, b).sum().backward()
    assert torch.allclose(a.grad, torch.ones(16, 12, device="cuda") @ b.detach().t(), rtol=1e-5, atol=1e-5)
    out = _poisoned((16, 12), torch.float32)
    with pytest.raises(ValueError, match="out: ck.sgemm with out= does not support automatic differentiation"):
        ck.sgemm(a, b, out=out)
    assert torch.isnan(out).all()


def test_linear_layer_trains_under_torch_compile(generator):
    x = torch.randn(64, 128, generator=generator, device="cuda").to(torch.bfloat16)
    w = torch.randn(96, 128, generator=generator, device="cuda").to(torch.bfloat16).requires_grad_()
    bias = torch.randn(96, generator=generator, device="cuda").to(torch.bfloat16).requires_grad_()

    def step(x, w, bias):
        return ck.hgemm(x, w.t(), bias, beta=1.0).float().square().mean()

    eager = step(x, w, bias)
    eager.backward()
    expect = (w.grad.clone(), bias.grad.clone())
    w.grad = bias.grad = None
    compiled = torch.compile(step, fullgraph=True)(x, w, bias)
    compiled.backward()
    # The compiled graph's own ops (the loss, its gradient) may round differently: close, not equal.
    assert torch.allclose(compiled.detach(), eager.detach(), rtol=1e-3)
    for ours, theirs in zip((w.grad, bias.grad), expect):
        assert torch.allclose(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2 * float(theirs.float().abs().max()))


@_SM90_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_short_k_batches_run_two_ctas_per_sm_by_default(dtype, generator):
    """Batches of a short K over many tiles take the two-CTAs-per-SM Hopper config by default
    (``hgemm_sm90._two_ctas_pay``): right with beta 0 and with a batched C read, outputs poisoned."""
    from cute_kernels.ops.gemm import hgemm_sm90
    from cute_kernels.ops.gemm.problem import GemmProblem

    batch, m, n, k = 16, 2048, 2048, 128
    problem = GemmProblem(m=m, n=n, k=k, dtype=str(dtype).split(".")[1], a_align=8, b_align=8, c_align=8, batch=batch)
    assert hgemm_sm90.default_config(problem).ctas_per_sm == 2
    a = _operand(m, k, False, batch, generator, dtype)
    b = _operand(k, n, False, batch, generator, dtype)
    out = _poisoned((batch, m, n), dtype)
    ck.hgemm(a, b, out=out)
    _assert_gemm(out, a, b)
    c = _operand(m, n, False, batch, generator, dtype)
    out = _poisoned((batch, m, n), dtype)
    ck.hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out)
    _assert_gemm(out, a, b, c, 1.5, -0.5)
