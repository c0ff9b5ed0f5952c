"""GPU tier for SGEMM: numerics against a float64 reference, shapes that break every tile, alpha/beta,
in-place updates, NaN in C with beta == 0, poisoned outputs, misaligned views, errors that need a device."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from cute_kernels.ops.gemm import reference
from cute_kernels.runtime import oracle

S = importlib.import_module("cute_kernels.ops.gemm.sgemm")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("exact_fp32_torch"),
]


def _rand(*shape, gen):
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32)


def _assert_close_to_reference(ours, a, b, c=None, alpha=1.0, beta=0.0):
    """The shared oracle (``oracle.compare``): our error against float64 is at most twice cuBLAS's (TF32
    off) plus a floor of 8 FP32 eps, both measured per element in units of ``reference.gemm_scale`` -- the
    error a length-K FP32 dot product may carry. A plain max-abs comparison is not fair to a sequential K
    loop: for thin shapes (64x128x4096) cuBLAS splits K and its error is far below any sequential sum's."""
    ref = alpha * (a.double() @ b.double())
    if beta != 0.0:
        ref = ref + beta * c.double()
        theirs = torch.addmm(c, a, b, alpha=alpha, beta=beta)
    else:
        theirs = torch.mm(a, b).mul_(alpha)
    scale = reference.gemm_scale(a, b, c, alpha=alpha, beta=beta)
    verdict = oracle.compare(ours, ref, theirs, scale=scale)
    assert verdict, verdict.detail


SHAPES = [
    (1, 1, 1),
    (3, 3, 3),
    (17, 17, 17),
    (113, 113, 113),
    (255, 255, 255),
    (1023, 1023, 1023),
    (128, 128, 5),  # K below one tile
    (130, 66, 7),  # K below one tile, M/N just past a tile
    (17, 300, 2),
    (301, 5, 129),  # N not a multiple of 4
    (64, 128, 4096),
    (256, 256, 256),
]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_shapes_beta_zero(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n * 31 + k)
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    out = torch.full((m, n), float("nan"), device="cuda")
    res = S.sgemm(a, b, out=out)
    assert res is out
    _assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (113, 255, 17), (1023, 1021, 1019), (256, 256, 256)])
def test_alpha_beta(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, b, c = _rand(m, k, gen=gen), _rand(k, n, gen=gen), _rand(m, n, gen=gen)
    res = S.sgemm(a, b, c, alpha=1.5, beta=-0.75)
    _assert_close_to_reference(res, a, b, c, 1.5, -0.75)


@pytest.mark.parametrize("m, n, k", [(17, 33, 9), (512, 384, 200)])
def test_out_is_c_in_place(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(5)
    a, b, c = _rand(m, k, gen=gen), _rand(k, n, gen=gen), _rand(m, n, gen=gen)
    c_before = c.clone()
    res = S.sgemm(a, b, c, alpha=0.5, beta=2.0, out=c)
    assert res is c
    _assert_close_to_reference(c, a, b, c_before, 0.5, 2.0)


def test_nan_in_c_does_not_leak_when_beta_is_zero():
    gen = torch.Generator(device="cuda").manual_seed(9)
    a, b = _rand(200, 100, gen=gen), _rand(100, 150, gen=gen)
    c = torch.full((200, 150), float("nan"), device="cuda")
    res = S.sgemm(a, b, c, alpha=2.0, beta=0.0)
    _assert_close_to_reference(res, a, b, alpha=2.0)
    res = S.sgemm(a, b, c, beta=0.0, out=c)
    _assert_close_to_reference(c, a, b)


def test_integer_inputs_are_exact():
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randint(-3, 4, (333, 177), generator=gen, device="cuda").float()
    b = torch.randint(-3, 4, (177, 259), generator=gen, device="cuda").float()
    res = S.sgemm(a, b)
    assert torch.equal(res, (a.double() @ b.double()).float())


@pytest.mark.parametrize("offset, ld_pad", [(1, 0), (2, 2), (0, 1), (3, 5)])
def test_misaligned_views(offset, ld_pad):
    """Sliced views: base pointers off 16 bytes and leading dims not multiples of 4 (narrower copies)."""
    gen = torch.Generator(device="cuda").manual_seed(offset * 10 + ld_pad)
    m, n, k = 129, 67, 45
    a = _rand(m, k + offset + ld_pad, gen=gen)[:, offset : offset + k]
    b = _rand(k, n + offset + ld_pad, gen=gen)[:, offset : offset + n]
    c = _rand(m, n + offset + ld_pad, gen=gen)[:, offset : offset + n]
    out_base = torch.full((m, n + offset + ld_pad), float("nan"), device="cuda")
    out = out_base[:, offset : offset + n]
    S.sgemm(a, b, c, alpha=1.25, beta=0.5, out=out)
    _assert_close_to_reference(out, a, b, c, 1.25, 0.5)
    # Padding columns of out stay untouched.
    assert torch.isnan(out_base[:, :offset]).all() and torch.isnan(out_base[:, offset + n :]).all()


@pytest.mark.parametrize("offset, beta", [(1, 0.5), (0, 0.0), (3, -1.0)])
@pytest.mark.parametrize("m, n, k", [(2048, 2048, 2047), (1900, 1901, 1799)])
def test_large_misaligned_problems_run_on_staged_copies(m, n, k, offset, beta):
    """Misaligned rows from ``STAGE_MIN_WORK`` run on aligned, zero-padded copies (op.StagedLaunch): the
    result lands in the caller's misaligned view (its neighbours untouched), C read only when beta != 0."""
    from cute_kernels.ops.gemm.op import StagedLaunch

    gen = torch.Generator(device="cuda").manual_seed(m + n + k + offset)
    a = _rand(m, k + offset, gen=gen)[:, offset:]
    b = _rand(k, n + offset, gen=gen)[:, offset:]
    c = _rand(m, n + offset, gen=gen)[:, offset:] if beta else torch.full((m, n), float("nan"), device="cuda")
    out_base = torch.full((m, n + offset + 1), float("nan"), device="cuda")
    out = out_base[:, offset : offset + n]
    S.sgemm(a, b, c, alpha=1.25, beta=beta, out=out)
    _assert_close_to_reference(out, a, b, c, 1.25, beta)
    assert torch.isnan(out_base[:, :offset]).all() and torch.isnan(out_base[:, offset + n :]).all()
    assert any(isinstance(p.launch, StagedLaunch) for p in S._PLANS._plans.values())


CONFIGS = [
    S.GemmConfig(),
    S.GemmConfig(num_stages=2),
    S.GemmConfig(num_stages=5, tile_k=16),
    S.GemmConfig(a_smem_major="k"),
    S.GemmConfig(a_smem_major="k", tile_k=32, num_stages=4),
    S.GemmConfig(tile_m=64, tile_n=128, threads_m=8, threads_n=16, raster=1),
    S.GemmConfig(tile_m=64, tile_n=64, threads_m=8, threads_n=8, min_ctas_per_sm=2),
    S.GemmConfig(warp_rows=4),
    S.GemmConfig(a_smem_major="k", warp_rows=4, num_stages=4),
    S.GemmConfig(tile_k=16, num_stages=5),  # more stages than k-tiles for K=100: the clamped re-reads
    S.GemmConfig(tile_m=256, tile_n=128, tile_k=16, warp_rows=4),
    S.GemmConfig(tile_m=128, tile_n=256, num_stages=4),
    S.GemmConfig(tile_m=32, tile_n=32, threads_m=8, threads_n=8),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.short())
@pytest.mark.parametrize("m, n, k, beta", [(257, 383, 100, 0.0), (1000, 1000, 333, 0.5), (128, 128, 128, 1.0)])
def test_configs(config, m, n, k, beta):
    gen = torch.Generator(device="cuda").manual_seed(m * n + k)
    a, b, c = _rand(m, k, gen=gen), _rand(k, n, gen=gen), _rand(m, n, gen=gen)
    out = torch.full((m, n), float("nan"), device="cuda")
    S.sgemm(a, b, c, alpha=1.0, beta=beta, out=out, config=config)
    _assert_close_to_reference(out, a, b, c, 1.0, beta)


def test_empty_and_k_zero():
    a = torch.randn(0, 5, device="cuda")
    assert S.sgemm(a, torch.randn(5, 7, device="cuda")).shape == (0, 7)
    c = torch.randn(4, 6, device="cuda")
    res = S.sgemm(torch.randn(4, 0, device="cuda"), torch.randn(0, 6, device="cuda"), c, beta=0.5)
    assert torch.equal(res, c * 0.5)
    nan_c = torch.full((4, 6), float("nan"), device="cuda")
    res = S.sgemm(torch.randn(4, 0, device="cuda"), torch.randn(0, 6, device="cuda"), nan_c, beta=0.0)
    assert torch.equal(res, torch.zeros(4, 6, device="cuda"))


def test_out_overlapping_input_is_rejected_without_writing():
    a = torch.randn(64, 64, device="cuda")
    b = torch.randn(64, 64, device="cuda")
    a_before = a.clone()
    with pytest.raises(ValueError, match="out: must not overlap input a"):
        S.sgemm(a, b, out=a)
    assert torch.equal(a, a_before)


def test_runs_on_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(11)
    a, b = _rand(512, 512, gen=gen), _rand(512, 512, gen=gen)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = torch.full((512, 512), float("nan"), device="cuda")
        S.sgemm(a, b, out=out)
    stream.synchronize()
    _assert_close_to_reference(out, a, b)


def test_rejects_tensors_on_different_devices():
    a = torch.randn(8, 8, device="cuda")
    with pytest.raises(ValueError, match="b: expected a CUDA tensor"):
        S.sgemm(a, torch.randn(8, 8))


@pytest.mark.parametrize("variant", ["simt_cpasync", "tf32x3_mma"])
def test_registry_entry_round_trip(variant):
    from cute_kernels import registry

    spec = registry.get("sgemm", variant)
    problem = dataclasses.replace(spec.standard_problems()[0], m=300, n=200, k=100)
    inputs = spec.make_inputs(problem, "cuda", torch.Generator(device="cuda").manual_seed(0))
    out = torch.full((problem.m, problem.n), float("nan"), device="cuda")
    spec.launch(spec.default_config(problem), problem, inputs, out)
    torch.cuda.synchronize()
    verdict = spec.verify(problem, inputs, out, spec.baseline(problem, inputs))
    assert verdict, verdict.detail


@pytest.mark.memory_heavy
@pytest.mark.parametrize("variant, at_least", [("simt_cpasync", 100), ("tf32x3_mma", 30)])
def test_every_candidate_on_a_ragged_shape(variant, at_least):
    """Every config of the sweep grid that supports it, on a shape that is a multiple of no tile in M, N or
    K (alpha 1.5, beta 0.5, poisoned output, the registry's oracle); compiled in parallel worker processes."""
    import os

    from cute_kernels import registry
    from cute_kernels.tools import sweep
    from cute_kernels.ops.gemm.problem import GemmProblem

    spec = registry.get("sgemm", variant)
    problem = GemmProblem(m=1000, n=1003, k=333, beta_zero=False, a_align=1, b_align=1, c_align=1)
    points = [sweep.Point(spec.op, spec.variant, problem, c) for c in spec.supported_candidates(problem)]
    assert len(points) >= at_least
    rows = sweep.verify_all(points, jobs=max(1, min(16, os.cpu_count() or 1)))
    failures = [(r["config"], r["verified"], r["detail"]) for r in rows if r["verified"] != "yes"]
    assert not failures, f"{len(failures)} of {len(rows)} configs failed: {failures[:5]}"


# ---------------------------------------------------------------------------------------------- split-K
_SPLIT_RUNGS = {32: dict(tile_m=32, tile_n=32, tile_k=8, num_stages=3, threads_m=8, threads_n=8),
                64: dict(tile_m=64, tile_n=64, tile_k=8, num_stages=3, threads_m=8, threads_n=8),
                # the few-tiles rung (sgemm._FEW_TILES_RUNG): 256 threads on a 64x64x16 tile
                "few": dict(tile_m=64, tile_n=64, tile_k=16, num_stages=3, threads_m=16, threads_n=16),
                "wide": dict(tile_m=128, tile_n=64, tile_k=8, num_stages=4, threads_m=16, threads_n=8,
                             a_smem_major="k"),
                "skinny": dict(tile_m=128, tile_n=32, tile_k=32, num_stages=3, threads_m=16, threads_n=8,
                               a_smem_major="k"),
                "few-k": dict(tile_m=64, tile_n=64, tile_k=32, num_stages=3, threads_m=16, threads_n=16,
                              a_smem_major="k")}


@pytest.mark.parametrize("rung", [32, 64, "few", "wide", "skinny", "few-k"])
@pytest.mark.parametrize("split_k", [2, 4, 16])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (3, 1000, 777), (17, 257, 3001), (300, 16, 4097), (1, 1, 9),
                                     (130, 70, 8 * 16 * 3 + 5)])
def test_split_k_shapes(m, n, k, split_k, rung):
    """Split-K on shapes that break every tile: slices K cannot fill, uneven slices, K below one tile;
    alpha/beta on, output poisoned."""
    from cute_kernels.ops.gemm import GemmConfig
    from cute_kernels.ops.gemm.sgemm import sgemm

    config = GemmConfig(**_SPLIT_RUNGS[rung], split_k=split_k)
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k + split_k)
    a, b, c = _rand(m, k, gen=gen), _rand(k, n, gen=gen), _rand(m, n, gen=gen)
    out = oracle.poisoned_like(c)
    sgemm(a, b, c, alpha=1.5, beta=-0.5, out=out, config=config)
    _assert_close_to_reference(out, a, b, c, 1.5, -0.5)


def test_split_k_unaligned_views_deterministic_and_nan_in_c():
    """Narrow copies under split-K, beta == 0 never reading C, and the same bits on every call (the planes
    are summed in slice order; the counters each launch leaves at zero serve the next)."""
    from cute_kernels.ops.gemm import GemmConfig
    from cute_kernels.ops.gemm.sgemm import sgemm

    gen = torch.Generator(device="cuda").manual_seed(9)
    m, n, k = 13, 515, 8193
    a = _rand(m, k + 1, gen=gen)[:, 1:]
    b = _rand(k, n + 1, gen=gen)[:, 1:]
    c = torch.full((m, n), float("nan"), device="cuda")
    config = GemmConfig(**_SPLIT_RUNGS[32], split_k=8)
    first = sgemm(a, b, c, alpha=0.75, beta=0.0, config=config)
    _assert_close_to_reference(first, a, b, None, 0.75, 0.0)
    for _ in range(20):
        assert torch.equal(sgemm(a, b, c, alpha=0.75, beta=0.0, config=config), first)


# (M, K, N, seed, what the default config must be): the heuristic's special shapes, each run once by default.
_DEFAULT_SHAPES = {
    "few-tiles": (64, 2048, 2048, 11, lambda c: (c.threads_m * c.threads_n, c.split_k) == (256, 4)),
    "128-rows": (128, 4096, 4096, 12, lambda c: (c.tile_m, c.tile_n, c.split_k) == (128, 64, 2)),
    "skinny-n": (4096, 4096, 16, 13, lambda c: (c.tile_m, c.tile_n, c.split_k) == (128, 32, 4)),
    "decode-rows": (16, 4096, 4096, 10, lambda c: c.split_k > 1),
}


@pytest.mark.parametrize("shape", sorted(_DEFAULT_SHAPES))
def test_shapes_that_leave_sms_idle_take_their_split_tiles_by_default(shape):
    """The SIMT entry's heuristic for the shapes that leave SMs idle: the few-tiles rung (256 threads,
    split in 4), 128 rows on the 128x64 tile split in 2, skinny N on the 128x32 tile split in 4, decode rows
    split; each is the SIMT default, run with that config and checked by the oracle. (The op itself runs
    the first two on the 3xTF32 entry: ``takes_tf32x3``.)"""
    from cute_kernels.ops.gemm.sgemm import sgemm
    from cute_kernels.ops.gemm.problem import make_problem

    m, k, n, seed, expected = _DEFAULT_SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b = _rand(m, k, gen=gen), _rand(k, n, gen=gen)
    config = S.default_config(make_problem(a, b))
    assert expected(config), config.short()
    _assert_close_to_reference(sgemm(a, b, config=config), a, b)


@pytest.mark.parametrize("c_shape", [(70,), (1, 70), (33, 1), ()])
def test_c_broadcasts_like_torch_addmm(c_shape):
    from cute_kernels.ops.gemm.sgemm import sgemm

    gen = torch.Generator(device="cuda").manual_seed(7)
    a, b = _rand(33, 45, gen=gen), _rand(45, 70, gen=gen)
    c = _rand(*c_shape, gen=gen) if c_shape else _rand(1, gen=gen).reshape(())
    out = oracle.poisoned_like(torch.empty(33, 70, device="cuda"))
    sgemm(a, b, c, alpha=2.0, beta=-0.5, out=out)
    _assert_close_to_reference(out, a, b, c.expand(33, 70), 2.0, -0.5)
