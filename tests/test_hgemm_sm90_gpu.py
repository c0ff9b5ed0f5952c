"""GPU tier for the Hopper HGEMM (hgemm/sm90_wgmma), run against that variant explicitly: the numerics suite of
the sm80-style HGEMM (shapes that break every tile in M, N and K, alpha/beta, in place, NaN in C with beta == 0,
integer exactness, fp16 and bf16), every sweep candidate (clusters with multicast, persistent CTAs walking
several tiles, cluster tiles overhanging the matrix), and the public op's choice: sm90_wgmma where TMA can
describe the operands, the sm80-style kernel (automatically) where it cannot.

TMA needs rows of A, B, C and out that are multiples of 8 elements with 16-byte aligned bases, so here N and
K are multiples of 8 (M is free); the unaligned shapes are the fallback's tests. The oracle is
``reference.gemm_verdict``, as for the sm80-style kernel."""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing as mp
import os

import pytest
import torch

from cute_kernels.ops.gemm.hgemm import hgemm
from cute_kernels.ops.gemm.op import choose_variant
from cute_kernels.ops.gemm.problem import make_problem, operand_alignment, unit_strides
from cute_kernels.runtime import oracle
from test_hgemm_gpu import _assert_oracle, _rand

H = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm80")  # the sm80_mma variant
S = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm90")
H_OP = importlib.import_module("cute_kernels.ops.gemm.hgemm")  # the public op's module (its variant order)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
                       reason="the wgmma/TMA variant needs an sm_90 GPU"),
]

DTYPES = [torch.float16, torch.bfloat16]


def _problem(a, b, c, beta, out):
    return make_problem(unit_strides(a), unit_strides(b), None if (c is None or beta == 0.0) else unit_strides(c),
                        beta=beta, out=None if out is None else unit_strides(out))


def sm90_hgemm(a, b, c=None, *, alpha=1.0, beta=0.0, out=None, config=None):
    """The public op pinned to the Hopper variant: its default config for the call unless one is given. A
    Hopper config makes ``hgemm`` run sm90_wgmma or raise ValueError, never fall back silently."""
    if config is None:
        config = S.default_config(_problem(a, b, c, beta, out))
    return hgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)


# ---------------------------------------------------------------------------------------------- small exact
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (32, 16, 16), (32, 16, 32), (1, 8, 8), (3, 24, 8)])
def test_alpha_beta_half_exact(m, n, k, dtype):
    """Small integers: every product, sum and 0.5 * x is exact in FP32, so the result must equal the float64
    reference rounded once to the dtype."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randint(-3, 4, (m, k), generator=gen, device="cuda").to(dtype)
    b = torch.randint(-3, 4, (k, n), generator=gen, device="cuda").to(dtype)
    c = torch.randint(-8, 9, (m, n), generator=gen, device="cuda").to(dtype)
    expected = (0.5 * (a.double() @ b.double()) + 0.5 * c.double()).to(dtype)
    sm90_hgemm(a, b, c, alpha=0.5, beta=0.5, out=c)
    assert torch.equal(c, expected)


def test_integer_inputs_are_exact():
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randint(-3, 4, (333, 176), generator=gen, device="cuda").half()
    b = torch.randint(-3, 4, (176, 264), generator=gen, device="cuda").half()
    assert torch.equal(sm90_hgemm(a, b), (a.double() @ b.double()).half())


# ---------------------------------------------------------------------------------------------- shapes
SIZES_M = (1, 7, 17, 64, 127, 128, 129, 1000, 4096)
SIZES_NK = (8, 16, 56, 64, 120, 128, 136, 1000, 4096)  # TMA: multiples of 8
SHAPES = sorted(
    {(m, SIZES_NK[(i + 3) % len(SIZES_NK)], SIZES_NK[(i + 7) % len(SIZES_NK)]) for i, m in enumerate(SIZES_M)}
    | {(SIZES_M[(i + 5) % len(SIZES_M)], n, SIZES_NK[(i + 2) % len(SIZES_NK)]) for i, n in enumerate(SIZES_NK)}
    | {(SIZES_M[(i + 1) % len(SIZES_M)], SIZES_NK[(i + 4) % len(SIZES_NK)], k) for i, k in enumerate(SIZES_NK)}
    | {(128, 128, 8192), (64, 1000, 8192), (129, 24, 8192), (4096, 4096, 64), (1000, 1000, 1000)}
)
ALPHA_BETA = [(1.0, 0.0), (1.5, 0.5), (-0.75, 2.0), (0.5, 0.5)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_random_shapes(m, n, k, dtype):
    alpha, beta = ALPHA_BETA[(m + 3 * n + 7 * k) % len(ALPHA_BETA)]
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n * 31 + k)
    a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
    out = oracle.poisoned_like(c)
    res = sm90_hgemm(a, b, c, alpha=alpha, beta=beta, out=out)
    assert res is out
    _assert_oracle(out, a, b, c, alpha, beta)


_SPLIT_CONFIGS = [
    S.HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=2),
    S.HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=4),
    S.HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=8),
    S.HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=16),
    S.HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=12, split_k=4),  # the ladder's split
    S.HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=12, split_k=16),  # and its deepest
]


def _check_alpha_beta(m, n, k, b_transposed, config):
    """One call of ``config`` per dtype on randn operands (b row-major or a ``w.t()`` view), alpha 1.5 and
    beta -0.5, into a poisoned output, against the oracle."""
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k + config.num_stages + config.split_k)
    for dtype in DTYPES:
        a, c = _rand(m, k, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
        b = _rand(n, k, gen=gen, dtype=dtype).t() if b_transposed else _rand(k, n, gen=gen, dtype=dtype)
        out = oracle.poisoned_like(c)
        sm90_hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
        _assert_oracle(out, a, b, c, 1.5, -0.5)


@pytest.mark.parametrize("config", _SPLIT_CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k", [(64, 4096, 4096), (17, 264, 3000), (300, 72, 4104), (1, 8, 8), (130, 136, 3 * 512 + 8),
                                     (1000, 1000, 1000)])
def test_split_k_shapes(m, n, k, config):
    """Split-K in the persistent walk on shapes that break every tile: slices K cannot fill (fewer k-tiles
    than slices, uneven slices, K below one tile), tiles over the matrix edge, several (tile, slice) units
    per CTA; alpha/beta on, output poisoned."""
    _check_alpha_beta(m, n, k, False, config)


@pytest.mark.parametrize("config", S.NARROW_CANDIDATES, ids=lambda c: c.short())
@pytest.mark.parametrize("b_transposed", [False, True], ids=["b-row", "b-col"])
@pytest.mark.parametrize("m, n, k", [(4096, 16, 4096), (300, 24, 4104), (1000, 40, 1000), (130, 8, 72)])
def test_32_column_tiles_on_skinny_n(m, n, k, b_transposed, config):
    """The 32-column tiles (a 64-byte swizzled B where B is row-major): N below, at and past one tile,
    ragged M and K, K below one k-tile; split or not; alpha/beta on, output poisoned."""
    _check_alpha_beta(m, n, k, b_transposed, config)


@pytest.mark.parametrize("config", [dataclasses.replace(c, transposed=True) for c in S.NARROW_CANDIDATES],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("b_transposed", [False, True], ids=["b-row", "b-col"])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (8, 1000, 4104), (24, 1000, 72), (40, 520, 1000)])
def test_32_column_tiles_on_decode_rows_transposed(m, n, k, b_transposed, config):
    """The transposed 32-column tiles: a few rows of ``a`` as the 32-column operand, the weight (row-major
    or ``w.t()``) as the 64-row one, ``out^T`` written where ``out`` lies; rows below, at and past one tile,
    ragged K; split or not; alpha/beta on, output poisoned."""
    _check_alpha_beta(m, n, k, b_transposed, config)


def test_split_k_is_deterministic_and_leaves_the_counters_ready():
    """The planes are summed in slice order whichever slice arrives last, so every call gives the same
    bits; each launch leaves its tiles' counters at zero for the next (20 calls, alternating shapes that
    share the stream's counters)."""
    from cute_kernels.runtime.device import current_stream_handle
    from cute_kernels.runtime.workspace import stream_buffer

    gen = torch.Generator(device="cuda").manual_seed(12)
    config = _SPLIT_CONFIGS[1]
    a, b = _rand(200, 8192, gen=gen, dtype=torch.float16), _rand(8192, 520, gen=gen, dtype=torch.float16)
    small_a, small_b = _rand(70, 1024, gen=gen, dtype=torch.float16), _rand(1024, 64, gen=gen, dtype=torch.float16)
    first = sm90_hgemm(a, b, out=oracle.poisoned_like(torch.empty(200, 520, dtype=torch.float16, device="cuda")),
                       config=config)
    _assert_oracle(first, a, b)
    small = sm90_hgemm(small_a, small_b, config=config)
    _assert_oracle(small, small_a, small_b)
    for _ in range(20):  # each into a poisoned output: a tile whose epilogue did not run shows
        assert torch.equal(sm90_hgemm(a, b, out=oracle.poisoned_like(first), config=config), first)
        assert torch.equal(sm90_hgemm(small_a, small_b, out=oracle.poisoned_like(small), config=config), small)
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    tiles = -(-200 // config.tile_m) * -(-520 // config.tile_n)
    counters = stream_buffer("arrivals", device, current_stream_handle(device), tiles)[:tiles]
    assert not counters.any(), "an arrival counter was left non-zero"


@pytest.mark.parametrize("config", [S.HgemmSm90Config(cluster_m=2, num_stages=3, epi_n=64, epi_stages=4),
                                    S.HgemmSm90Config(tile_m=256, tile_n=128, epi_n=64),
                                    S.HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6,
                                                      epi_n=32, epi_stages=4),
                                    S.HgemmSm90Config(cluster_m=2, num_stages=3, epi_n=32, epi_stages=8)],
                         ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k", [(4104, 4104, 264), (1000, 1000, 1000), (17, 72, 8)])
def test_wide_and_deep_epilogues(m, n, k, config):
    """Epilogues of 64 columns (128-byte swizzled rows) and of 4 and 8 buffers, over tiles that walk many units and
    overhang the matrix; C read (beta != 0) through the same sub-tiles; output poisoned."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k + config.epi_n)
    for dtype in DTYPES:
        a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
        out = oracle.poisoned_like(c)
        sm90_hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
        _assert_oracle(out, a, b, c, 1.5, -0.5)


@pytest.mark.parametrize("config", [S.HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3,
                                                       ctas_per_sm=2),
                                    S.HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=4,
                                                      ctas_per_sm=2)], ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k", [(4104, 4104, 136), (1000, 1000, 1000), (17, 72, 8)])
def test_two_ctas_per_sm(m, n, k, config):
    """Two CTAs on each SM, a persistent grid of twice the SMs: short K (three k-tiles per tile, the
    epilogue most of the time) over many tiles that overhang the matrix, a long K, a single partial tile;
    C read (beta != 0); output poisoned."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    for dtype in DTYPES:
        a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
        out = oracle.poisoned_like(c)
        sm90_hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
        _assert_oracle(out, a, b, c, 1.5, -0.5)


@pytest.mark.parametrize("config", [
    S.HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1),
    S.HgemmSm90Config(),  # two consumer warpgroups: 128-row sub-tiles, two 64-row TMA boxes each
    S.HgemmSm90Config(cluster_m=2), S.HgemmSm90Config(cluster_n=2),
    S.HgemmSm90Config(cluster_m=2, num_stages=3, epi_n=64, epi_stages=4),
    S.HgemmSm90Config(tile_m=256, tile_n=128, epi_n=32, epi_stages=4, num_stages=4),
    S.HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3, ctas_per_sm=2),
    S.HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=2),
    S.HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=4),
], ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k", [(4096, 24, 4096), (1000, 72, 520), (264, 328, 192), (24, 8, 8), (17, 8, 8)])
def test_a_column_major_result(m, n, k, config):
    """d_major "m": D (and C) column-major with a leading dimension past M, as the op's in-place decode swap
    writes out^T: stmatrix .trans, the column-major TMA store clipped at M and N, C read through its
    column-major view; beta 0 with a NaN C (not read) and beta != 0; fp16 and bf16; the padding past M
    stays poisoned. Through the variant's own prepare (the op reaches it only through the swap). The
    problem's C/D alignment is measured on the column-major tensors, whose contiguous extent is M: an M
    that is not a whole number of 16-byte lines is refused (the TMA store wrote such an M's last line whole,
    rows 17-23 at M = 17, when a problem said otherwise)."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    ld = -(-m // 8) * 8 + 8  # TMA: column strides of whole 16-byte lines, padded past M
    for dtype in DTYPES:
        for beta in (0.0, -0.5):
            a, b = _rand(m, k, gen=gen, dtype=dtype), _rand(n, k, gen=gen, dtype=dtype).t()
            c_rows = _rand(n, ld + 8, gen=gen, dtype=dtype)
            c = c_rows[:, :m].t() if beta else torch.full_like(c_rows, float("nan"))[:, :m].t()
            out_rows = torch.full((n, ld), float("nan"), device="cuda", dtype=dtype)
            out = out_rows[:, :m].t()
            c_align = min(operand_alignment(t, "col", 8) for t in ((out, c) if beta else (out,)))
            problem = dataclasses.replace(make_problem(a, b), beta_zero=beta == 0.0, d_major="m", c_align=c_align)
            if m % 8:
                assert S.why_unsupported(config, problem) is not None
                continue
            assert S.why_unsupported(config, problem) is None
            S.prepare(config, problem, {}, out)(a, b, None if beta == 0.0 else c, out, 1.5, beta)
            _assert_oracle(out, a, b, c if beta else None, 1.5, beta)
            assert torch.isnan(out_rows[:, m:]).all(), "a store past M"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_persistent_ctas_walk_many_tiles(dtype):
    """4104 x 4104 in 128 x 256 tiles is 33 x 17 = 561 tiles for 132 CTAs: each walks four or five, the
    pipeline running across tile boundaries, and the last row and column of tiles hang over the matrix."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    a, b, c = _rand(4104, 264, gen=gen, dtype=dtype), _rand(264, 4104, gen=gen, dtype=dtype), _rand(4104, 4104, gen=gen, dtype=dtype)
    out = oracle.poisoned_like(c)
    sm90_hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=S.HgemmSm90Config())
    _assert_oracle(out, a, b, c, 1.5, -0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(17, 32, 8), (512, 384, 200), (1000, 1000, 1000)])
def test_out_is_c_in_place(m, n, k, dtype):
    gen = torch.Generator(device="cuda").manual_seed(5)
    a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
    c_before = c.clone()
    res = sm90_hgemm(a, b, c, alpha=0.5, beta=2.0, out=c)
    assert res is c
    _assert_oracle(c, a, b, c_before, 0.5, 2.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_nan_in_c_does_not_leak_when_beta_is_zero(dtype):
    gen = torch.Generator(device="cuda").manual_seed(9)
    a, b = _rand(200, 104, gen=gen, dtype=dtype), _rand(104, 152, gen=gen, dtype=dtype)
    c = torch.full((200, 152), float("nan"), device="cuda", dtype=dtype)
    res = sm90_hgemm(a, b, c, alpha=2.0, beta=0.0)
    _assert_oracle(res, a, b, alpha=2.0)
    sm90_hgemm(a, b, c, beta=0.0, out=c)
    _assert_oracle(c, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_aligned_views_with_padded_rows(dtype):
    """Sliced views TMA can still describe: leading dimensions larger than the rows (multiples of 8), bases
    16 bytes in; the padding of out stays untouched."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    m, n, k, off, pad = 129, 72, 48, 8, 16
    a = _rand(m, k + off + pad, gen=gen, dtype=dtype)[:, off : off + k]
    b = _rand(k, n + off + pad, gen=gen, dtype=dtype)[:, off : off + n]
    c = _rand(m, n + off + pad, gen=gen, dtype=dtype)[:, off : off + n]
    out_base = torch.full((m, n + off + pad), float("nan"), device="cuda", dtype=dtype)
    out = out_base[:, off : off + n]
    sm90_hgemm(a, b, c, alpha=1.25, beta=0.5, out=out)
    _assert_oracle(out, a, b, c, 1.25, 0.5)
    assert torch.isnan(out_base[:, :off]).all() and torch.isnan(out_base[:, off + n :]).all()


# ---------------------------------------------------------------------------------------------- the op's choice
def test_public_op_uses_sm90_where_tma_can_and_is_right():
    gen = torch.Generator(device="cuda").manual_seed(2)
    a, b = _rand(4096, 4096, gen=gen, dtype=torch.float16), _rand(4096, 4096, gen=gen, dtype=torch.float16)
    out = torch.full((4096, 4096), float("nan"), device="cuda", dtype=torch.float16)
    spec, _ = choose_variant((S.SPEC, H.SPEC), _problem(a, b, None, 0.0, out), None, 0)
    assert spec is S.SPEC
    hgemm(a, b, out=out)
    _assert_oracle(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k, beta, chosen", [
    (24, 5120, 5120, 0.0, "DECODE_ROWS"), (17, 1000, 4104, 0.5, "DECODE_ROWS"), (32, 4096, 4096, -1.0, "DECODE_ROWS"),
    (8192, 16, 4096, 0.0, "NARROW_COLUMNS"), (2056, 24, 4096, 0.5, "NARROW_COLUMNS"),
    (64, 1024, 4096, 0.0, "ONE_TILE_ROW"), (40, 2000, 4104, -1.0, "ONE_TILE_ROW")])
def test_the_op_runs_decode_rows_and_skinny_n_on_the_32_column_tiles(m, n, k, beta, chosen, dtype):
    """Through the public op with no config: decode rows on the transposed 32-column tiles, skinny N and one
    row of tiles against a narrow output on the plain ones, ``c`` read where beta != 0, and right."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, b = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype)
    c = _rand(m, n, gen=gen, dtype=dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    problem = _problem(a, b, c if beta else None, beta, out)
    spec, config = choose_variant(H_OP._variant_order(problem), problem, None, 0)
    expected = getattr(S, chosen)
    assert spec is S.SPEC and dataclasses.replace(config, split_k=1, num_stages=expected.num_stages) == expected, config
    hgemm(a, b, c, beta=beta, out=out)
    _assert_oracle(out, a, b, c=c, beta=beta)


@pytest.mark.parametrize("m, n, k, split", [(120, 64, 18000, 8), (64, 72, 40000, 16)])
def test_one_or_two_tiles_over_a_long_k_split_deep_through_the_op(m, n, k, split):
    """The ladder's deepest splits as the op chooses them (slices of 32 k-tiles or more, up to 16), on
    K that no slice count divides, and right."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, b = _rand(m, k, gen=gen, dtype=torch.float16), _rand(k, n, gen=gen, dtype=torch.float16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    problem = _problem(a, b, None, 0.0, out)
    spec, config = choose_variant(H_OP._variant_order(problem), problem, None, 0)
    assert spec is S.SPEC and config.split_k == split, config
    hgemm(a, b, out=out)
    _assert_oracle(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("offset, ld_pad, n, k", [(1, 0, 72, 48), (2, 2, 72, 48), (0, 1, 72, 48), (0, 0, 71, 48),
                                                  (0, 0, 72, 45), (4, 4, 72, 48)])
def test_unaligned_operands_fall_back_to_sm80(offset, ld_pad, n, k, dtype):
    """What TMA cannot describe (bases off 16 bytes, rows not multiples of 8) goes to the sm80-style
    kernel automatically and is right; a Hopper config asked for explicitly is refused, nothing written."""
    gen = torch.Generator(device="cuda").manual_seed(offset * 10 + ld_pad + n + k)
    m = 129
    a = _rand(m, k + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + k]
    b = _rand(k, n + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + n]
    c = _rand(m, n + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + n]
    out = oracle.poisoned_like(c)
    spec, _ = choose_variant((S.SPEC, H.SPEC), _problem(a, b, c, 0.5, out), None, 0)
    assert spec is H.SPEC
    hgemm(a, b, c, alpha=1.25, beta=0.5, out=out)
    _assert_oracle(out, a, b, c, 1.25, 0.5)
    untouched = oracle.poisoned_like(c)
    with pytest.raises(ValueError, match="TMA needs 16-byte aligned"):
        hgemm(a, b, c, alpha=1.25, beta=0.5, out=untouched, config=S.HgemmSm90Config())
    assert torch.isnan(untouched).all()


def test_runs_on_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(11)
    a, b = _rand(512, 512, gen=gen, dtype=torch.float16), _rand(512, 512, gen=gen, dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = torch.full((512, 512), float("nan"), device="cuda", dtype=torch.float16)
        sm90_hgemm(a, b, out=out)
    stream.synchronize()
    _assert_oracle(out, a, b)


# ---------------------------------------------------------------------------------------------- configs
# Ragged in M, N and K for every tile (K = 5.1 k-tiles of 64), odd tile counts so 2-CTA clusters overhang the
# matrix; and a shape with more tiles than SMs for every tile size, so persistent CTAs walk several.
CANDIDATE_SHAPES = ((1100, 1288, 328), (2056, 4104, 136))


def check_candidates(configs_kwargs: list, dtype_name: str) -> list:
    """Worker (a separate process: compiles there run in parallel): each config on the candidate shapes,
    alpha/beta on, outputs poisoned; returns (config name, ok, detail)."""
    import torch

    from cute_kernels.ops.gemm import reference
    from cute_kernels.ops.gemm.hgemm import hgemm
    from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config
    from cute_kernels.runtime import oracle

    dtype = getattr(torch, dtype_name)
    rows = []
    for kwargs in configs_kwargs:
        config = HgemmSm90Config(**kwargs)
        try:
            for m, n, k in CANDIDATE_SHAPES:
                gen = torch.Generator(device="cuda").manual_seed(m + n + k)
                a = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
                b = torch.randn(k, n, generator=gen, device="cuda").to(dtype)
                c = torch.randn(m, n, generator=gen, device="cuda").to(dtype)
                baseline = torch.addmm(c, a, b, alpha=1.5, beta=-0.5)
                out = oracle.poisoned_like(c)
                hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
                verdict = reference.gemm_verdict(out, a, b, c, alpha=1.5, beta=-0.5, baseline=baseline)
                if not verdict:
                    break
            rows.append((config.short(), bool(verdict), f"{m}x{n}x{k}: {verdict.detail}"))
        except Exception as exc:  # reported per config
            rows.append((config.short(), False, f"{type(exc).__name__}: {exc}"))
    return rows


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_every_candidate(dtype_name):
    m, n, k = CANDIDATE_SHAPES[0]
    problem = dataclasses.replace(S.SPEC.standard_problems()[0], m=m, n=n, k=k, dtype=dtype_name, beta_zero=False)
    configs = [dataclasses.asdict(c) for c in S.candidates() if S.why_unsupported(c, problem) is None]
    jobs = max(1, min(8, (os.cpu_count() or 2) // 2))
    chunks = [configs[i::jobs] for i in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        rows = [row for part in pool.starmap(check_candidates, [(chunk, dtype_name) for chunk in chunks]) for row in part]
    assert len(rows) == len(configs)
    failures = [r for r in rows if not r[1]]
    assert not failures, failures


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_registry_entry_round_trip(dtype_name):
    from cute_kernels import registry

    spec = registry.get("hgemm", "sm90_wgmma")
    problem = dataclasses.replace(spec.standard_problems()[0], m=300, n=200, k=104, dtype=dtype_name, beta_zero=False)
    inputs = spec.make_inputs(problem, "cuda", torch.Generator(device="cuda").manual_seed(0))
    out = oracle.poisoned_like(inputs["c"])
    spec.launch(spec.default_config(problem), problem, inputs, out)
    torch.cuda.synchronize()
    verdict = spec.verify(problem, inputs, out, spec.baseline(problem, inputs))
    assert verdict, verdict.detail


@pytest.mark.quick
def test_the_zoo_times_a_staged_call_as_the_op_runs_it():
    """bench --zoo's row for a misaligned zoo shape is the public op (padded copies and the Hopper kernel),
    verified against the oracle and timed, under the Hopper entry."""
    from cute_kernels import registry
    from cute_kernels.ops.gemm import hgemm as hgemm_module
    from cute_kernels.tools import bench

    spec, problem = next((s, p) for s, p in registry.zoo("hgemm") if hgemm_module._stage_unaligned(p))
    call, entry, ran = registry.zoo_call("hgemm", problem)
    row = bench.measure(spec, problem, reps=3, op_call=call, runs_on=(entry, ran))
    assert row.verified, row.error
    assert row.variant == "sm90_wgmma (op)" and row.ours_us > 0 and row.wall_us > 0
