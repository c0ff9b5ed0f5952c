"""GPU tier for HGEMM: LeetGPU's examples, random shapes that break every tile (M, N, K from 1 to 4096, K up
to 8192), alpha/beta, in place, NaN in C with beta == 0, unaligned leading dimensions and base pointers,
every sweep candidate on one ragged shape, poisoned outputs, errors that need a device.

The oracle is ``reference.gemm_verdict``: against a float64 reference, per element in units of the result's
magnitude, at most twice torch's own fp16/bf16 error plus 2 eps of the dtype."""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing as mp
import os

import pytest
import torch

from cute_kernels.ops.gemm import reference
from cute_kernels.ops.gemm.hgemm import hgemm
from cute_kernels.ops.gemm.problem import make_problem
from cute_kernels.runtime import oracle

H = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm80")  # the sm80_mma variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = [torch.float16, torch.bfloat16]


def _rand(*shape, gen, dtype):
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def _baseline(a, b, c, alpha, beta):
    """torch's product in the same dtype, rounded once (addmm), the error the oracle scales."""
    if beta != 0.0:
        return torch.addmm(c, a, b, alpha=alpha, beta=beta)
    return torch.addmm(torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device), a, b, alpha=alpha, beta=0.0)


def _assert_oracle(out, a, b, c=None, alpha=1.0, beta=0.0):
    verdict = reference.gemm_verdict(out, a, b, c, alpha=alpha, beta=beta, baseline=_baseline(a, b, c, alpha, beta))
    assert verdict, verdict.detail


# ---------------------------------------------------------------------------------------------- LeetGPU
@pytest.mark.parametrize("dtype", DTYPES)
def test_leetgpu_example_2x3_by_3x2(dtype):
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device="cuda", dtype=dtype)
    b = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device="cuda", dtype=dtype)
    c = torch.full((2, 2), float("nan"), device="cuda", dtype=dtype)  # beta == 0: never read
    res = hgemm(a, b, c, alpha=1.0, beta=0.0, out=c)
    assert res is c
    assert torch.equal(c, torch.tensor([[22.0, 28.0], [49.0, 64.0]], device="cuda", dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (32, 16, 16), (32, 16, 32)])
def test_leetgpu_alpha_beta_half_exact(m, n, k, dtype):
    """Small integers: every product, sum and 0.5 * x is exact in FP32, so the result must equal the float64
    reference rounded once to the dtype."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randint(-3, 4, (m, k), generator=gen, device="cuda").to(dtype)
    b = torch.randint(-3, 4, (k, n), generator=gen, device="cuda").to(dtype)
    c = torch.randint(-8, 9, (m, n), generator=gen, device="cuda").to(dtype)
    expected = (0.5 * (a.double() @ b.double()) + 0.5 * c.double()).to(dtype)
    hgemm(a, b, c, alpha=0.5, beta=0.5, out=c)
    assert torch.equal(c, expected)


# ---------------------------------------------------------------------------------------------- shapes
SIZES = (1, 7, 8, 17, 64, 127, 128, 129, 1000, 4096)
# Every size in every position, paired so each test stays small; K up to 8192 on thin outputs.
SHAPES = sorted(
    {(s, SIZES[(i + 3) % len(SIZES)], SIZES[(i + 7) % len(SIZES)]) for i, s in enumerate(SIZES)}
    | {(SIZES[(i + 5) % len(SIZES)], s, SIZES[(i + 2) % len(SIZES)]) for i, s in enumerate(SIZES)}
    | {(SIZES[(i + 1) % len(SIZES)], SIZES[(i + 4) % len(SIZES)], s) for i, s in enumerate(SIZES)}
    | {(128, 128, 8192), (64, 1000, 8192), (129, 17, 8192), (4096, 4096, 64), (1000, 1000, 1000)}
)
ALPHA_BETA = [(1.0, 0.0), (1.5, 0.5), (-0.75, 2.0), (0.5, 0.5)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_random_shapes(m, n, k, dtype):
    alpha, beta = ALPHA_BETA[(m + 3 * n + 7 * k) % len(ALPHA_BETA)]
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n * 31 + k)
    a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
    out = oracle.poisoned_like(c)
    res = hgemm(a, b, c, alpha=alpha, beta=beta, out=out)
    assert res is out
    _assert_oracle(out, a, b, c, alpha, beta)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(17, 33, 9), (512, 384, 200), (1000, 1000, 1000)])
def test_out_is_c_in_place(m, n, k, dtype):
    gen = torch.Generator(device="cuda").manual_seed(5)
    a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
    c_before = c.clone()
    res = hgemm(a, b, c, alpha=0.5, beta=2.0, out=c)
    assert res is c
    _assert_oracle(c, a, b, c_before, 0.5, 2.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_nan_in_c_does_not_leak_when_beta_is_zero(dtype):
    gen = torch.Generator(device="cuda").manual_seed(9)
    a, b = _rand(200, 104, gen=gen, dtype=dtype), _rand(104, 152, gen=gen, dtype=dtype)
    c = torch.full((200, 152), float("nan"), device="cuda", dtype=dtype)
    res = hgemm(a, b, c, alpha=2.0, beta=0.0)
    _assert_oracle(res, a, b, alpha=2.0)
    hgemm(a, b, c, beta=0.0, out=c)
    _assert_oracle(c, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("offset, ld_pad", [(1, 0), (2, 2), (4, 4), (0, 1), (3, 5), (0, 8)])
def test_unaligned_views(offset, ld_pad, dtype):
    """Sliced views: base pointers off 16 bytes and leading dims not multiples of 8 (narrower copies)."""
    gen = torch.Generator(device="cuda").manual_seed(offset * 10 + ld_pad)
    m, n, k = 129, 72, 48
    a = _rand(m, k + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + k]
    b = _rand(k, n + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + n]
    c = _rand(m, n + offset + ld_pad, gen=gen, dtype=dtype)[:, offset : offset + n]
    out_base = torch.full((m, n + offset + ld_pad), float("nan"), device="cuda", dtype=dtype)
    out = out_base[:, offset : offset + n]
    hgemm(a, b, c, alpha=1.25, beta=0.5, out=out)
    _assert_oracle(out, a, b, c, 1.25, 0.5)
    # Padding columns of out stay untouched.
    assert torch.isnan(out_base[:, :offset]).all() and torch.isnan(out_base[:, offset + n :]).all()


def test_integer_inputs_are_exact():
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randint(-3, 4, (333, 177), generator=gen, device="cuda").half()
    b = torch.randint(-3, 4, (177, 259), generator=gen, device="cuda").half()
    assert torch.equal(hgemm(a, b), (a.double() @ b.double()).half())


# ---------------------------------------------------------------------------------------------- configs
RAGGED = (1000, 1000, 328)  # no multiple of any tile in M, N or K, but 16-byte rows: the fast copies


def check_candidates(configs_kwargs: list, dtype_name: str) -> list:
    """Worker (a separate process: compiles there run in parallel): each config on the ragged shape,
    alpha/beta on, outputs poisoned; returns (config name, ok, detail)."""
    import torch

    from cute_kernels.ops.gemm import HgemmConfig, reference
    from cute_kernels.ops.gemm.hgemm import hgemm
    from cute_kernels.runtime import oracle

    dtype = getattr(torch, dtype_name)
    m, n, k = RAGGED
    gen = torch.Generator(device="cuda").manual_seed(42)
    a = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    b = torch.randn(k, n, generator=gen, device="cuda").to(dtype)
    c = torch.randn(m, n, generator=gen, device="cuda").to(dtype)
    baseline = torch.addmm(c, a, b, alpha=1.5, beta=-0.5)
    rows = []
    for kwargs in configs_kwargs:
        config = HgemmConfig(**kwargs)
        try:
            out = oracle.poisoned_like(c)
            hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
            verdict = reference.gemm_verdict(out, a, b, c, alpha=1.5, beta=-0.5, baseline=baseline)
            rows.append((config.short(), bool(verdict), verdict.detail))
        except Exception as exc:  # reported per config
            rows.append((config.short(), False, f"{type(exc).__name__}: {exc}"))
    return rows


@pytest.mark.memory_heavy
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_every_candidate_on_a_ragged_shape(dtype_name):
    problem = make_problem(
        torch.empty(RAGGED[0], RAGGED[2], dtype=torch.float16), torch.empty(RAGGED[2], RAGGED[1], dtype=torch.float16)
    )
    configs = [dataclasses.asdict(c) for c in H.candidates() if H.why_unsupported(c, problem) is None]
    jobs = max(1, min(8, (os.cpu_count() or 2) // 2))
    chunks = [configs[i::jobs] for i in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        rows = [row for part in pool.starmap(check_candidates, [(chunk, dtype_name) for chunk in chunks]) for row in part]
    assert len(rows) == len(configs)
    failures = [r for r in rows if not r[1]]
    assert not failures, failures


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("tile_k", [32, 64])
def test_unswizzled_reference_layout_is_correct(tile_k, dtype):
    """The bank-conflicted layout the swizzle is measured against (HgemmConfig.swizzle=False) computes the
    same GEMM, on a shape that breaks every tile, misaligned views included."""
    from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig

    config = HgemmConfig(tile_k=tile_k, num_stages=3, swizzle=False)
    gen = torch.Generator(device="cuda").manual_seed(tile_k)
    for m, n, k in [(1000, 1000, 328), (129, 72, 48)]:
        a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
        out = oracle.poisoned_like(c)
        hgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
        _assert_oracle(out, a, b, c, 1.5, -0.5)


# ---------------------------------------------------------------------------------------------- plumbing
def test_empty_and_k_zero():
    a = torch.randn(0, 5, device="cuda").half()
    assert hgemm(a, torch.randn(5, 7, device="cuda").half()).shape == (0, 7)
    c = torch.randn(4, 6, device="cuda").half()
    res = hgemm(torch.randn(4, 0, device="cuda").half(), torch.randn(0, 6, device="cuda").half(), c, beta=0.5)
    assert torch.equal(res, c * 0.5)
    nan_c = torch.full((4, 6), float("nan"), device="cuda").half()
    res = hgemm(torch.randn(4, 0, device="cuda").half(), torch.randn(0, 6, device="cuda").half(), nan_c, beta=0.0)
    assert torch.equal(res, torch.zeros(4, 6, device="cuda").half())


def test_out_overlapping_input_is_rejected_without_writing():
    a = torch.randn(64, 64, device="cuda").half()
    b = torch.randn(64, 64, device="cuda").half()
    a_before = a.clone()
    with pytest.raises(ValueError, match="out: must not overlap input a"):
        hgemm(a, b, out=a)
    assert torch.equal(a, a_before)


def test_runs_on_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(11)
    a, b = _rand(512, 512, gen=gen, dtype=torch.float16), _rand(512, 512, gen=gen, dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = torch.full((512, 512), float("nan"), device="cuda", dtype=torch.float16)
        hgemm(a, b, out=out)
    stream.synchronize()
    _assert_oracle(out, a, b)


def test_rejects_tensors_on_different_devices():
    a = torch.randn(8, 8, device="cuda").half()
    with pytest.raises(ValueError, match="b: expected a CUDA tensor"):
        hgemm(a, torch.randn(8, 8).half())


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_registry_entry_round_trip(dtype_name):
    from cute_kernels import registry

    spec = registry.get("hgemm")
    problem = dataclasses.replace(spec.standard_problems()[0], m=300, n=200, k=104, dtype=dtype_name, beta_zero=False)
    inputs = spec.make_inputs(problem, "cuda", torch.Generator(device="cuda").manual_seed(0))
    out = oracle.poisoned_like(inputs["c"])
    spec.launch(spec.default_config(problem), problem, inputs, out)
    torch.cuda.synchronize()
    verdict = spec.verify(problem, inputs, out, spec.baseline(problem, inputs))
    assert verdict, verdict.detail


# ---------------------------------------------------------------------------------------------- split-K
def _split(tile_m=16, split_k=4, **kwargs):
    from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig

    base = dict(tile_m=tile_m, tile_n=128, tile_k=64, warps_m=1, warps_n=4) if tile_m <= 32 else \
        dict(tile_m=tile_m, tile_n=64, tile_k=32, warps_m=2, warps_n=2)
    return HgemmConfig(**{**base, "split_k": split_k, **kwargs})


# (m, n, k): decode rows, a slice count that K cannot fill (K shorter than split_k k-tiles), uneven slices,
# K below one tile, ragged everything, skinny N.
SPLIT_SHAPES = [(1, 4096, 4096), (3, 1000, 777), (17, 257, 3001), (16, 130, 64 * 4 * 3 + 5), (1, 1, 9),
                (32, 333, 65), (300, 16, 4097)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("split_k", [2, 4, 16])
@pytest.mark.parametrize("m, n, k", SPLIT_SHAPES)
def test_split_k_shapes(m, n, k, split_k, dtype):
    config = _split(tile_m=16 if m <= 16 else (32 if m <= 32 else 128), split_k=split_k)
    alpha, beta = ALPHA_BETA[(m + n + k) % len(ALPHA_BETA)]
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k + split_k)
    a, b, c = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype), _rand(m, n, gen=gen, dtype=dtype)
    out = oracle.poisoned_like(c)
    hgemm(a, b, c, alpha=alpha, beta=beta, out=out, config=config)
    _assert_oracle(out, a, b, c, alpha, beta)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_split_k_unaligned_views_and_nan_in_c(dtype):
    """Narrow copies under split-K (every operand one element off), and beta == 0 never reading C."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    m, n, k = 13, 515, 2049
    a = _rand(m, k + 1, gen=gen, dtype=dtype)[:, 1:]
    b = _rand(k, n + 1, gen=gen, dtype=dtype)[:, 1:]
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    out = oracle.poisoned_like(c)
    hgemm(a, b, c, alpha=0.75, beta=0.0, out=out, config=_split(split_k=8))
    _assert_oracle(out, a, b, None, 0.75, 0.0)


def test_split_k_is_deterministic_and_leaves_its_counters_at_zero():
    """The last slice sums the planes in slice order: the same bits on every call, whichever slice finished
    last. Many calls back to back on one stream reuse the counters, which each launch leaves at zero (a
    counter left non-zero would make a later launch's tile finish early with a partial sum)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    a, b = _rand(5, 8192, gen=gen, dtype=torch.float16), _rand(8192, 2048, gen=gen, dtype=torch.float16)
    config = _split(split_k=16)
    first = hgemm(a, b, config=config)
    _assert_oracle(first, a, b)
    for _ in range(20):
        assert torch.equal(hgemm(a, b, config=config), first)


def test_split_k_on_side_streams_and_in_a_cuda_graph():
    """Each stream has its own workspace (two streams at once do not mix partials); a captured launch
    replays correctly with a workspace of the graph's own."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    a, b = _rand(16, 4096, gen=gen, dtype=torch.bfloat16), _rand(4096, 1024, gen=gen, dtype=torch.bfloat16)
    a2 = _rand(16, 4096, gen=gen, dtype=torch.bfloat16)
    config = _split(split_k=8)
    expect, expect2 = hgemm(a, b, config=config), hgemm(a2, b, config=config)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [torch.empty_like(expect), torch.empty_like(expect)]
    torch.cuda.synchronize()
    for _ in range(10):
        for s, x, out in zip(streams, (a, a2), outs):
            with torch.cuda.stream(s):
                hgemm(x, b, out=out, config=config)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], expect) and torch.equal(outs[1], expect2)

    graph_out = torch.empty_like(expect)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        hgemm(a, b, out=graph_out, config=config)  # warm-up: compiled and planned outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hgemm(a, b, out=graph_out, config=config)
    graph_out.zero_()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, expect)


def test_decode_shapes_take_split_k_by_default():
    """The op's own choice for a decode row against an LLM projection is a split-K config, and it is right."""
    gen = torch.Generator(device="cuda").manual_seed(13)
    a, b = _rand(1, 4096, gen=gen, dtype=torch.float16), _rand(4096, 4096, gen=gen, dtype=torch.float16)
    problem = make_problem(a, b)
    assert H.default_config(problem).split_k > 1
    _assert_oracle(hgemm(a, b), a, b)


# ---------------------------------------------------------------------------------------------- staging
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k, offset, beta", [(2047, 2049, 1023, 0, 0.0), (2048, 2048, 2047, 0, 0.5),
                                                     (1031, 1024, 1024, 1, -1.0), (1024, 1030, 1100, 3, 0.0)])
def test_large_misaligned_problems_run_on_aligned_copies(m, n, k, offset, beta, dtype):
    """On sm_90 a misaligned call of 1024^3 or more runs the Hopper kernel on zero-padded aligned copies
    (op.StagedLaunch); the result lands in the caller's (misaligned) tensor, C read only with beta != 0."""
    from cute_kernels.ops.gemm.hgemm import _PLANS
    from cute_kernels.ops.gemm.op import StagedLaunch

    gen = torch.Generator(device="cuda").manual_seed(m + n + k)

    def view(rows, cols):
        return _rand(rows, cols + offset, gen=gen, dtype=dtype)[:, offset:]

    a, b, c = view(m, k), view(k, n), view(m, n)
    out = oracle.poisoned_like(view(m, n))
    hgemm(a, b, c, alpha=1.25, beta=beta, out=out)
    _assert_oracle(out, a, b, c, 1.25, beta)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert any(isinstance(p.launch, StagedLaunch) for p in _PLANS._plans.values())
    before = c.clone()
    hgemm(a, b, c, alpha=1.25, beta=beta, out=c)  # in place, C both read and written through the copies
    _assert_oracle(c, a, b, before, 1.25, beta)


# ---------------------------------------------------------------------------------------------- addmm's c
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(33, 70, 45), (1024, 1024, 1024), (1, 4096, 4096), (64, 4096, 4096)])
@pytest.mark.parametrize("c_shape", ["row", "row2d", "column", "scalar"])
def test_c_broadcasts_like_torch_addmm(m, n, k, c_shape, dtype):
    """A bias row, a column or a scalar-shaped c, on both variants (1024^3 runs the Hopper one) and on
    split-K (the decode row on the sm80-style kernel, 64 rows on the Hopper one): the result is alpha * a @ b
    + beta * c expanded, as torch.addmm gives it. A row reaches the kernels as its expansion (leading
    dimension 0), the others as row-major copies."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, b = _rand(m, k, gen=gen, dtype=dtype), _rand(k, n, gen=gen, dtype=dtype)
    shape = {"row": (n,), "row2d": (1, n), "column": (m, 1), "scalar": ()}[c_shape]
    c = _rand(*shape, gen=gen, dtype=dtype) if shape else _rand(1, gen=gen, dtype=dtype).reshape(())
    out = oracle.poisoned_like(torch.empty(m, n, device="cuda", dtype=dtype))
    hgemm(a, b, c, alpha=1.5, beta=0.5, out=out)
    full = c.expand(m, n)
    verdict = reference.gemm_verdict(out, a, b, full, alpha=1.5, beta=0.5,
                                     baseline=torch.addmm(c, a, b, alpha=1.5, beta=0.5))
    assert verdict, verdict.detail
    again = hgemm(a, b, c, alpha=1.5, beta=0.5)  # the plan's path
    assert torch.equal(again, out)
