"""CPU tier for the 3xTF32 SGEMM (``sgemm/tf32x3_mma``): its configs, validity predicate and routing, the
bank-conflict freedom of its fragment reads under each stage swizzle, and sm_90a compiles of every ladder
config over alignments, layouts, beta, batches and split-K (fake tensors, no GPU)."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported anywhere

import dataclasses

import pytest

from cute_kernels.ops.gemm import GemmConfig, HgemmConfig, Tf32x3GemmConfig
from cute_kernels.ops.gemm import sgemm as S
from cute_kernels.ops.gemm import sgemm_tf32x3 as T
from cute_kernels.ops.gemm.hgemm_sm80_kernel import operand_swizzle
from cute_kernels.ops.gemm.problem import GemmProblem

ARCH = "sm_90a"
LADDER = [config for config, _, _ in T._LADDER]


def _problem(**kw):
    fields = dict(m=1000, n=1003, k=333, dtype="float32", beta_zero=False, a_align=4, b_align=4, c_align=4)
    return GemmProblem(**{**fields, **kw})


def test_config_checks():
    with pytest.raises(ValueError, match="tile_k"):
        Tf32x3GemmConfig(tile_k=64)
    with pytest.raises(ValueError, match="registers"):
        Tf32x3GemmConfig(tile_m=128, tile_n=128, warps_m=2, warps_n=2)  # 64x64 warp tiles: two accumulator sets
    # Its own class, apart from the HGEMM's with which it shares a base: a config picks its entry by class.
    assert not isinstance(Tf32x3GemmConfig(), HgemmConfig) and not isinstance(HgemmConfig(), Tf32x3GemmConfig)
    for config in T.candidates():
        assert config.fragment_registers() <= config.FRAGMENT_REGISTER_BUDGET


def test_why_unsupported():
    config = Tf32x3GemmConfig()
    assert T.why_unsupported(config, _problem()) is None
    assert "float32" in T.why_unsupported(config, _problem(dtype="float16"))
    assert "sm_80" in T.why_unsupported(config, _problem(sm=75))
    assert "Tf32x3GemmConfig" in T.why_unsupported(GemmConfig(), _problem())
    assert "split-K" in T.why_unsupported(dataclasses.replace(config, split_k=2), _problem(batch=3))


def test_shared_memory_is_judged_for_the_problems_chip():
    """The largest rung (128 KB) fits sm_90's 227 KB and sm_80's 163 KB but not sm_86/89's 99 KB, where the
    default takes a smaller one."""
    big = T._LADDER[0][0]
    assert T.why_unsupported(big, _problem(sm=90)) is None and T.why_unsupported(big, _problem(sm=80)) is None
    assert "shared memory" in T.why_unsupported(big, _problem(sm=86))
    config = T.default_config(_problem(m=4096, n=4096, k=4096, sm=89))
    assert config.smem_bytes() <= 99 * 1024 and T.why_unsupported(config, _problem(sm=89)) is None


def test_rows_not_16_byte_aligned_take_the_tile_that_does_not_spill():
    for kw in (dict(a_align=1), dict(b_align=2), dict(c_align=1)):
        config = T.default_config(_problem(m=4096, n=4096, k=4096, **kw))
        assert (config.tile_m, config.tile_n) == (64, 64), kw


def test_routing():
    """M and N above 32 on sm_80+ run here; skinny and pre-Ampere shapes on the SIMT kernel; the GEMV's
    rows on the GEMV."""
    assert S._variant_order(_problem())[0] is T.SPEC
    assert S._variant_order(_problem(m=32))[0] is S.SPEC
    assert S._variant_order(_problem(n=16))[0] is S.SPEC
    assert S._variant_order(_problem(sm=75))[0] is S.SPEC
    decode = _problem(m=4, n=4096, k=4096, b_major="k", beta_zero=True)
    assert S._variant_order(decode)[0] is S.GEMV_SPEC
    # A K-major b is read as it lies here (no row-major copy, unlike the SIMT kernel's).
    assert S._copies(_problem(m=4096, n=4096, k=4096, b_major="k")) == (False, False)
    assert S._copies(_problem(m=4096, n=16, k=4096, b_major="k")) == (False, True)


@pytest.mark.parametrize("shape, tile", [((4096, 4096, 4096), (128, 128)), ((1536, 1536, 1536), (64, 64)),
                                         ((777, 3001, 2000), (64, 64)), ((2047, 2049, 1023), (128, 64)),
                                         ((128, 4096, 4096), (64, 64))])
def test_default_tiles_follow_the_probe(shape, tile):
    m, n, k = shape
    config = T.default_config(_problem(m=m, n=n, k=k))
    assert (config.tile_m, config.tile_n) == tile


def _swizzled(offset: int, swizzle) -> int:
    bits, base, shift = swizzle
    mask = ((1 << bits) - 1) << (base + shift)
    return offset ^ ((offset & mask) >> shift)


@pytest.mark.parametrize("tile_k", [16, 32])
def test_k_contiguous_fragment_reads_hit_every_bank(tile_k):
    """Lane (g, t) of a TF32 fragment reads row g, column t (then t + 4) of a K-contiguous stage."""
    (width, _), swizzle = operand_swizzle(tile_k, 32)
    for column in (0, 4):
        banks = {_swizzled(g * width + t + column, swizzle) % 32 for g in range(8) for t in range(4)}
        assert len(banks) == 32


@pytest.mark.parametrize("tile_mn", [64, 128])
def test_mn_contiguous_fragment_reads_hit_every_bank(tile_mn):
    """Lane (g, t) reads column g (+ 8 per atom) of k-row t (then t + 4) of an M/N-contiguous stage."""
    from cute_kernels.ops.gemm.sgemm_tf32x3_kernel import mn_swizzle

    (width, _), swizzle = mn_swizzle(tile_mn)
    for atom in range(width // 8):
        for row in (0, 4):
            banks = {_swizzled((t + row) * width + atom * 8 + g, swizzle) % 32 for g in range(8) for t in range(4)}
            assert len(banks) == 32


@pytest.mark.parametrize("config", LADDER + [dataclasses.replace(LADDER[0], tile_k=16)], ids=lambda c: c.short())
def test_ladder_compiles_for_sm90a(config):
    assert T.compile(config, _problem(m=8192, n=8192, k=8192), ARCH) is not None


@pytest.mark.parametrize("kw", [dict(a_align=1, b_align=1, c_align=1), dict(a_align=2, b_align=4, c_align=1),
                                dict(a_major="m", b_major="k", beta_zero=True),
                                dict(a_major="m", b_align=1), dict(batch=4), dict(a_major="k", b_major="k")],
                         ids=["align1", "align2-4-1", "TT", "TN-unaligned", "batched", "NT"])
def test_problem_traits_compile(kw):
    config = LADDER[-1]
    assert T.compile(config, _problem(**kw), ARCH) is not None


def test_split_k_compiles():
    assert T.compile(dataclasses.replace(LADDER[-1], split_k=4), _problem(m=64, n=64, k=8192), ARCH) is not None
