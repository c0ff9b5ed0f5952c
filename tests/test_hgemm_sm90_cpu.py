"""CPU tier for the Hopper HGEMM (hgemm/sm90_wgmma): config validation, the validity predicate (TMA
alignment, sm_90 only) and the variant choice that sends everything else to the sm80-style kernel, the
default heuristic, the epilogue's accumulator order (checked on CuTe's own layouts), compiles for sm_90a from
fake tensors (fp16 and bf16, default and sample candidates, clusters), and the PTX: wgmma, TMA loads and
stores, setmaxnreg, multicast, and no spills where ptxas is at hand."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported anywhere

import dataclasses
import glob
import importlib.util
import re
import subprocess

import pytest

from cute_kernels import registry
from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig
from cute_kernels.ops.gemm.hgemm_sm90_config import EPI_TILE_N, HgemmSm90Config
from cute_kernels.ops.gemm.op import choose_variant
from cute_kernels.ops.gemm.problem import GemmProblem
from cute_kernels.runtime.device import SM90_SHARED_OPTIN_BYTES as SMEM_BYTES_SM90

H = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm80")  # the sm80_mma variant
S = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm90")
ARCH = "sm_90a"
BIG = GemmProblem(m=8192, n=8192, k=8192, dtype="float16", a_align=8, b_align=8, c_align=8)
PREFERENCE = (S.SPEC, H.SPEC)  # what hgemm() passes to run_gemm


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field, value",
    [
        ("tile_m", 32),
        ("tile_n", 96),
        ("tile_k", 32),
        ("num_stages", 1),
        ("num_stages", 17),
        ("consumer_warpgroups", 3),
        ("cluster_m", 4),
        ("raster", 0),
        ("tile_k", 64.0),
        ("cluster_n", True),
    ],
)
def test_config_rejects_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(HgemmSm90Config(), **{field: value})


def test_config_rejects_what_the_warpgroups_cannot_hold():
    with pytest.raises(ValueError, match="tile_m must be a multiple of 64 \\* consumer_warpgroups = 128"):
        HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=2)
    with pytest.raises(ValueError, match="256 FP32 accumulators per thread"):
        HgemmSm90Config(tile_m=128, tile_n=256, consumer_warpgroups=1)
    with pytest.raises(ValueError, match="clusters of at most 2 CTAs"):
        HgemmSm90Config(cluster_m=2, cluster_n=2)
    assert HgemmSm90Config().accumulators_per_thread() == 128


def test_config_rejects_an_epilogue_the_tile_cannot_hold():
    with pytest.raises(ValueError, match="epi_n must divide tile_n .a 32-column tile in 64-column"):
        HgemmSm90Config(tile_m=64, tile_n=32, consumer_warpgroups=1, epi_n=64)
    with pytest.raises(ValueError, match="1 epilogue sub-tiles of 32 columns, not a whole multiple of the 2 "
                                         "epilogue buffers .a tile of one sub-tile takes epi_stages=1"):
        HgemmSm90Config(tile_m=128, tile_n=32)
    assert HgemmSm90Config(tile_m=128, tile_n=32, epi_stages=1).epi_subtiles == 1


def test_two_ctas_per_sm_field():
    cfg = HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3, ctas_per_sm=2)
    assert cfg.short() == "128x128x64_s3_wg1_c1x1_r8_o2"
    assert cfg.consumer_registers() == 216 and HgemmSm90Config().consumer_registers() == 232
    # Each CTA's registers are half the file: the producer's 40 and the consumer's 216 a thread.
    assert 128 * 40 + 128 * cfg.consumer_registers() == 65536 // 2
    with pytest.raises(ValueError, match="run one consumer warpgroup each"):
        HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=2, ctas_per_sm=2)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        dataclasses.replace(cfg, ctas_per_sm=3)
    # Two CTAs share an SM's 228 KB less 1 KB each: 113 KB a CTA.
    assert S.why_unsupported(cfg, BIG) is None
    assert cfg.smem_bytes() <= 115712 < dataclasses.replace(cfg, num_stages=4).smem_bytes()
    assert "115712" in S.why_unsupported(dataclasses.replace(cfg, num_stages=4), BIG)
    assert S.why_unsupported(dataclasses.replace(cfg, num_stages=4, ctas_per_sm=1), BIG) is None
    assert any(c.ctas_per_sm == 2 for c in registry.configs("hgemm", "sm90_wgmma", BIG))
    with pytest.raises(ValueError, match="more than 128 columns"):
        HgemmSm90Config(tile_m=64, tile_n=256, consumer_warpgroups=1, ctas_per_sm=2)


def test_the_persistent_grid_holds_as_many_ctas_as_the_sms(monkeypatch):
    import torch

    monkeypatch.setattr(S._device, "sm_count", lambda index: 132)
    device = torch.device("cuda", 0)
    assert S.max_clusters(HgemmSm90Config(), device) == 132
    assert S.max_clusters(HgemmSm90Config(cluster_m=2), device) == 66
    two = HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3, ctas_per_sm=2)
    assert S.max_clusters(two, device) == 264
    assert S.max_clusters(dataclasses.replace(two, cluster_n=2), device) == 132


def test_split_k_field():
    cfg = HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4)
    assert cfg.short() == "64x64x64_s6_wg1_c1x1_r8_k4"
    assert cfg.smem_bytes() == dataclasses.replace(cfg, split_k=1).smem_bytes() + 16  # the arrival flag
    with pytest.raises(ValueError, match="split_k"):
        dataclasses.replace(cfg, split_k=3)
    with pytest.raises(ValueError, match="split-K runs 1x1 clusters only"):
        dataclasses.replace(cfg, cluster_m=2)
    with pytest.raises(ValueError, match="split-K runs one consumer warpgroup only"):
        HgemmSm90Config(tile_m=128, tile_n=128, split_k=2)
    with pytest.raises(ValueError, match="at most 64 accumulators per thread"):
        HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=4, split_k=2)
    assert HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, split_k=2).split_k == 2
    # The persistent walk counts tiles x slices in 32 bits.
    huge = dataclasses.replace(BIG, m=1 << 24, n=1 << 16, k=1 << 12)
    assert S.why_unsupported(dataclasses.replace(cfg, split_k=1), huge) is None
    assert "split-K slices" in S.why_unsupported(dataclasses.replace(cfg, split_k=16), huge)
    assert "unbatched" in S.why_unsupported(cfg, dataclasses.replace(BIG, batch=4))
    assert S.why_unsupported(cfg, BIG) is None


def test_epilogue_fields():
    cfg = HgemmSm90Config(epi_n=64, epi_stages=4, num_stages=3)
    assert cfg.short() == "128x256x64_s3_wg2_c1x1_r8_e64x4" and cfg.epi_subtiles == 4
    assert cfg.epilogue_bytes() == 2 * 4 * 128 * 64
    assert S.why_unsupported(cfg, BIG) is None
    assert "shared memory" in S.why_unsupported(dataclasses.replace(cfg, num_stages=4), BIG)
    for field, value in (("epi_n", 16), ("epi_n", 128), ("epi_stages", 3)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(cfg, **{field: value})
    with pytest.raises(ValueError, match="epilogue buffers"):  # 64 columns: a single sub-tile
        HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, epi_n=64, epi_stages=4)
    # Eight buffers: a whole 128x256 tile of 32-column sub-tiles (64 KB), three stages beside it.
    whole = HgemmSm90Config(num_stages=3, epi_n=32, epi_stages=8)
    assert whole.epi_subtiles == 8 and whole.epilogue_bytes() == 64 * 1024 and S.why_unsupported(whole, BIG) is None
    assert "shared memory" in S.why_unsupported(dataclasses.replace(whole, num_stages=4), BIG)
    with pytest.raises(ValueError, match="epilogue buffers"):  # 64-column sub-tiles: four of them
        HgemmSm90Config(num_stages=3, epi_n=64, epi_stages=8)


def test_split_slices_leave_none_empty():
    from cute_kernels.ops.gemm.kernel_common import split_slices

    assert split_slices(64, 4) == (16, 4)
    assert split_slices(10, 4) == (3, 4)  # slices of 3, 3, 3 and 1 k-tiles
    assert split_slices(9, 8) == (2, 5)  # 8 slices of 9 k-tiles would leave some empty
    assert split_slices(3, 8) == (1, 3)
    assert split_slices(1, 16) == (1, 1)
    for k_tiles in range(1, 70):
        for split in (2, 4, 8, 16):
            per_slice, slices = split_slices(k_tiles, split)
            assert slices <= split and (slices - 1) * per_slice < k_tiles <= slices * per_slice


def test_sizes_and_short_name():
    cfg = HgemmSm90Config()
    assert cfg.num_threads == 384 and cfg.epi_tile_m == 128 and cfg.epi_subtiles == 256 // EPI_TILE_N
    assert cfg.stage_bytes() == 2 * 64 * (128 + 256)
    assert cfg.smem_bytes() == 4 * 49152 + 2 * 2 * 128 * 32 + 3 * 1024 <= SMEM_BYTES_SM90
    assert dataclasses.replace(cfg, num_stages=5).smem_bytes() > SMEM_BYTES_SM90
    assert cfg.short() == "128x256x64_s4_wg2_c1x1_r8"


# ---------------------------------------------------------------------------------------------- space
def test_candidates_are_valid_and_span_the_space():
    cands = S.candidates()
    assert len(set(cands)) == len(cands)
    assert {(c.cluster_m, c.cluster_n) for c in cands} == {(1, 1), (2, 1), (1, 2)}
    assert {c.consumer_warpgroups for c in cands} == {1, 2} and {c.tile_k for c in cands} == {64, 128}
    supported = registry.configs("hgemm", "sm90_wgmma", BIG)
    assert HgemmSm90Config() in supported
    assert 0 < len(supported) < len(cands)  # the deepest rings exceed 227 KB
    assert all(c.smem_bytes() <= SMEM_BYTES_SM90 for c in supported)


def test_why_unsupported():
    cfg = HgemmSm90Config()
    assert S.why_unsupported(cfg, BIG) is None
    assert "shared memory" in S.why_unsupported(dataclasses.replace(cfg, num_stages=5), BIG)
    for field in ("a_align", "b_align", "c_align"):
        why = S.why_unsupported(cfg, dataclasses.replace(BIG, **{field: 4}))
        assert why is not None and "TMA needs 16-byte aligned" in why
    for sm in (80, 86, 100, 120):
        assert "needs an sm_90 GPU" in S.why_unsupported(cfg, dataclasses.replace(BIG, sm=sm))
    assert "float16/bfloat16 only" in S.why_unsupported(cfg, dataclasses.replace(BIG, dtype="float32", a_align=4,
                                                                                   b_align=4, c_align=4))
    assert "HgemmSm90Config" in S.why_unsupported(HgemmConfig(), BIG)


def test_default_config_ladder():
    # The measured rungs (see hgemm_sm90._LADDER): 128x256x64, 4 stages, 2x1 clusters at 2048^3, 4096^3 and
    # 8192^3, where it fills the SMs in whole waves; 128x192 at 3072^3 (384 tiles: 2.9 waves where 128x256
    # makes 2.2); 64x128 with one consumer warpgroup at 768^3-1024^3 and 64x64 at 512^3 and for 64-128
    # rows against 4096 x 4096, where bigger tiles leave most SMs idle.
    def tile(m, n, k):
        c = S.default_config(dataclasses.replace(BIG, m=m, n=n, k=k))
        assert S.why_unsupported(c, dataclasses.replace(BIG, m=m, n=n, k=k)) is None
        return (c.tile_m, c.tile_n, c.consumer_warpgroups, c.num_stages, c.cluster_m)

    for side in (2048, 4096, 8192):
        assert S.default_config(dataclasses.replace(BIG, m=side, n=side)) == HgemmSm90Config(cluster_m=2), side
    assert tile(3072, 3072, 3072) == (128, 192, 2, 4, 2)
    for side in (768, 1024):
        assert tile(side, side, side) == (64, 128, 1, 7, 1), side
    # Rows that are not whole 128-byte lines (1000 fp16 elements) pair the tile rows in 2x1 clusters.
    assert tile(1000, 1000, 1000) == (64, 128, 1, 7, 2)
    for m, n, k in ((512, 512, 512), (128, 4096, 4096), (4096, 128, 4096)):
        assert tile(m, n, k) == (64, 64, 1, 12, 1), (m, n, k)
    # K splits only where the tiles fill at most an eighth of the SMs, into slices of 32 k-tiles or more while
    # the CTAs fill at most half of them, in at most 16 slices, on the rung's ring.
    def split(m, n, k):
        return S.default_config(dataclasses.replace(BIG, m=m, n=n, k=k)).split_k

    assert tile(64, 4096, 4096) == (64, 64, 1, 12, 1)
    for m, n, k in ((64, 4096, 4096), (4096, 64, 4096), (48, 4096, 4096), (64, 2048, 4096), (128, 1024, 4096)):
        assert split(m, n, k) == 1, (m, n, k)  # 32 or 64 tiles: the unsplit deep ring
    assert split(1024, 64, 4096) == 2  # 16 tiles over 64 k-tiles: two slices of 32
    assert split(1024, 64, 8192) == 4  # 16 tiles over 128 k-tiles: four slices of 32
    assert split(1024, 64, 2048) == 1  # slices would be shorter than 32 k-tiles
    # One to four tiles over a long K: more slices, none shorter than 32 k-tiles.
    assert split(64, 64, 1 << 15) == 16 and split(128, 64, 1 << 14) == 8 and split(64, 256, 8192) == 4
    # A row-major B narrower than the tile splits while the CTAs fit one wave; a column-major one does not.
    assert split(4096, 48, 4096) == 2
    assert S.default_config(dataclasses.replace(BIG, m=4096, n=48, k=4096, b_major="k")).split_k == 1
    assert tile(1024, 64, 8192) == (64, 64, 1, 12, 1)
    # Batches of short K (two k-tiles) from four waves of 128x128 tiles on the two-CTA grid: two CTAs per SM.
    for batch, side in ((8, 4096), (16, 2048), (4, 4096)):
        problem = dataclasses.replace(BIG, m=side, n=side, k=128, batch=batch)
        config = S.default_config(problem)
        assert (config.tile_m, config.tile_n, config.consumer_warpgroups, config.num_stages, config.ctas_per_sm,
                config.cluster_m) == (128, 128, 1, 3, 2, 1), (batch, side)
        assert S.why_unsupported(config, problem) is None
    for batch, m, n, k in ((32, 256, 256, 256), (8, 1024, 1024, 64), (1, 8192, 8192, 128), (8, 4096, 4096, 192)):
        assert S.default_config(dataclasses.replace(BIG, m=m, n=n, k=k, batch=batch)).ctas_per_sm == 1, (batch, m, k)
    # A problem the variant cannot run still gets a config (so the op can ask supports() and move on).
    unaligned = dataclasses.replace(BIG, b_align=2)
    assert S.why_unsupported(S.default_config(unaligned), unaligned) is not None


def test_ragged_rows_pair_only_on_the_64x128_rung_with_two_tile_rows():
    rung = HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=7)
    ragged = dataclasses.replace(BIG, m=1000, n=1000, k=1000)
    assert S._pairs_ragged_rows(rung, ragged)
    # Either operand's rows: A's K (k-major), B's N (n-major); a transposed operand's rows are the other extent.
    assert S._pairs_ragged_rows(rung, dataclasses.replace(ragged, n=1024))
    assert S._pairs_ragged_rows(rung, dataclasses.replace(ragged, k=1024))
    assert not S._pairs_ragged_rows(rung, dataclasses.replace(ragged, n=1024, k=1024))
    assert S._pairs_ragged_rows(rung, dataclasses.replace(ragged, n=1024, k=1024, a_major="m"))
    assert not S._pairs_ragged_rows(rung, dataclasses.replace(ragged, m=64))  # one tile row: nothing to pair
    for other in (dataclasses.replace(rung, tile_n=64), dataclasses.replace(rung, cluster_n=2),
                  dataclasses.replace(rung, split_k=2), dataclasses.replace(rung, ctas_per_sm=2, num_stages=3)):
        assert not S._pairs_ragged_rows(other, ragged), other.short()


# ---------------------------------------------------------------------------------------------- variant choice
def test_variant_choice_prefers_hopper_and_falls_back():
    assert choose_variant(PREFERENCE, BIG, None, 0)[0] is S.SPEC
    for problem in (dataclasses.replace(BIG, sm=80), dataclasses.replace(BIG, a_align=1),
                    dataclasses.replace(BIG, n=1001, b_align=1, c_align=1), dataclasses.replace(BIG, c_align=4)):
        spec, config = choose_variant(PREFERENCE, problem, None, 0)
        assert spec is H.SPEC and isinstance(config, HgemmConfig) and H.why_unsupported(config, problem) is None
    # A given config picks its variant by type, and a Hopper config on an unaligned problem is an error.
    assert choose_variant(PREFERENCE, BIG, HgemmConfig(), 0) == (H.SPEC, HgemmConfig())
    with pytest.raises(ValueError, match="TMA needs 16-byte aligned"):
        choose_variant(PREFERENCE, dataclasses.replace(BIG, a_align=4), HgemmSm90Config(), 0)


def test_problem_records_the_device_capability():
    import torch

    from cute_kernels.ops.gemm.problem import make_problem

    a, b = torch.zeros(16, 8, dtype=torch.float16), torch.zeros(8, 24, dtype=torch.float16)
    assert make_problem(a, b).sm == 90  # no device: the H200 the project tunes on
    with pytest.raises(ValueError, match="GemmProblem.sm"):
        dataclasses.replace(BIG, sm=0)


# ---------------------------------------------------------------------------------------------- epilogue order
@pytest.mark.parametrize(
    "config",
    [HgemmSm90Config(), HgemmSm90Config(tile_m=256, tile_n=128),
     HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1),
     HgemmSm90Config(epi_n=64, epi_stages=4, num_stages=3), HgemmSm90Config(tile_m=256, tile_n=128, epi_n=64),
     HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, epi_n=64)],
    ids=lambda c: c.short(),
)
@pytest.mark.parametrize("m_major", [False, True], ids=["row-major-D", "column-major-D"])
def test_accumulator_slices_are_the_epilogue_subtiles(config, m_major):
    """The epilogue takes sub-tile e (row-major over the (tile_m / EM) x (tile_n / epi_n) sub-tiles) as the
    values [e*V, (e+1)*V) of the stmatrix-retiled accumulators, in the order the stmatrix copy reads its
    source (stmatrix or stmatrix .trans, for a column-major D). Check that on CuTe's layouts for sample
    threads of every warp position: the coordinates of those accumulators are the sub-tile's, value by
    value."""
    import cutlass
    import cutlass.cute as cute

    from cute_kernels.ops.gemm.hgemm_sm90_kernel import make_r2s_tiled_copy, make_tiled_mma

    threads = [0, 5, 37, 70, 127, 128, 161, 255][: config.consumer_warpgroups * 4]
    em, en = config.epi_tile_m, config.epi_n
    mismatches = []

    @cute.jit
    def probe():
        tiled_mma = make_tiled_mma(config, cutlass.Float16)
        r2s = make_r2s_tiled_copy(tiled_mma, cutlass.Float16, m_major)
        for i in cutlass.range_constexpr(len(threads)):
            t = threads[i]
            tile_coords = cute.make_identity_tensor((config.tile_m, config.tile_n))
            acc_coords = r2s.retile(tiled_mma.get_slice(t).partition_C(tile_coords))
            sub_coords = r2s.get_slice(t).partition_S(cute.make_identity_tensor((em, en)))
            values = cute.size(sub_coords)
            if cutlass.const_expr(cute.size(acc_coords) != values * config.epi_subtiles):
                mismatches.append((t, "size"))
            for sub_m in cutlass.range_constexpr(config.tile_m // em):
                for sub_n in cutlass.range_constexpr(config.tile_n // en):
                    e = sub_m * (config.tile_n // en) + sub_n
                    for v in cutlass.range_constexpr(values):
                        r, c = sub_coords[v]
                        if cutlass.const_expr(acc_coords[e * values + v] != (sub_m * em + r, sub_n * en + c)):
                            mismatches.append((t, sub_m, sub_n, v))

    cute.compile(probe)
    assert not mismatches, mismatches[:8]


# ---------------------------------------------------------------------------------------------- compile
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compile_default(dtype):
    problem = dataclasses.replace(BIG, dtype=dtype)
    assert S.compile(S.default_config(problem), problem, ARCH) is not None


@pytest.mark.parametrize(
    "config, dtype, beta_zero",
    [
        (HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=6), "bfloat16", False),
        (HgemmSm90Config(tile_m=256, tile_n=128, cluster_m=2), "float16", False),
        (HgemmSm90Config(cluster_n=2, num_stages=3), "bfloat16", True),
        (HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=7), "float16", True),
        (HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=7, cluster_m=2), "bfloat16", True),
        (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=12), "float16", False),
        (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4), "float16", True),
        (HgemmSm90Config(cluster_m=2, num_stages=3, epi_n=64, epi_stages=4), "float16", False),
        (HgemmSm90Config(tile_m=256, tile_n=128, num_stages=4, epi_n=32, epi_stages=4), "bfloat16", True),
        (HgemmSm90Config(cluster_m=2, num_stages=3, epi_n=32, epi_stages=8), "float16", False),
        (HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=8), "bfloat16", False),
    ],
    ids=lambda v: v.short() if isinstance(v, HgemmSm90Config) else str(v),
)
def test_compile_sample_candidates(config, dtype, beta_zero):
    assert config in S.candidates()
    problem = dataclasses.replace(BIG, dtype=dtype, beta_zero=beta_zero)
    assert S.compile(config, problem, ARCH) is not None


def test_compile_cache_key():
    cfg = HgemmSm90Config()
    first = S.compile(cfg, BIG, ARCH)
    assert S.compile(cfg, dataclasses.replace(BIG, m=17, n=3000, k=72), ARCH) is first  # sizes are dynamic
    key = S.compile_key(cfg, BIG, ARCH)
    for change in ({"dtype": "bfloat16"}, {"beta_zero": False}):
        assert S.compile_key(cfg, dataclasses.replace(BIG, **change), ARCH) != key, change
    assert S.compile_key(dataclasses.replace(cfg, cluster_m=2), BIG, ARCH) != key
    assert S.compile_key(cfg, BIG, "sm_90") != key
    assert key != H.compile_key(HgemmConfig(), BIG, ARCH)
    with pytest.raises(ValueError, match="TMA needs"):
        S.compile(cfg, dataclasses.replace(BIG, a_align=2), ARCH)


def _kept_code(config: HgemmSm90Config, problem: GemmProblem, tmp_path) -> tuple[str, str]:
    """Compile outside the cache, keeping the PTX in ``tmp_path``; returns the PTX file's path and its text."""
    S._build(config, problem, ARCH, extra_options=f"--keep-ptx --dump-dir {tmp_path}")
    (path,) = glob.glob(os.path.join(tmp_path, "*.ptx"))
    with open(path) as f:
        return path, f.read()


def _ptxas() -> "str | None":
    """The ptxas of the nvidia-cuda-nvcc wheel (the dev extra): a CUDA 13.0 toolkit's refuses the DSL's PTX."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "cu13", "bin", "ptxas")
        if os.path.exists(path):
            return path
    return None


def _ptxas_report_without_spills(ptx_path, tmp_path) -> str:
    """ptxas's -v report of the kept PTX for sm_90a, asserted free of spills. Skipped only where the dev
    extra's nvidia-cuda-nvcc is not installed (the GPU machines' bundle); CI and the README's tier have it."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("the dev extra's nvidia-cuda-nvcc (ptxas for the DSL's PTX) is not installed")
    run = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", os.path.join(tmp_path, "k.cubin")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in run.stderr, run.stderr
    return run.stderr


@pytest.mark.parametrize("beta_zero", [True, False], ids=["beta0", "beta"])
def test_ptx_is_tma_and_wgmma_without_spills(beta_zero, tmp_path):
    ptx_path, ptx = _kept_code(HgemmSm90Config(), dataclasses.replace(BIG, beta_zero=beta_zero), tmp_path)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx  # the TMA store of D
    assert "setmaxnreg.dec.sync.aligned.u32 \t40" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t232" in ptx
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert (".global.u16" in ptx or "ld.global" in ptx) != beta_zero  # C is loaded only when beta != 0
    report = _ptxas_report_without_spills(ptx_path, tmp_path)
    assert re.search(r"Used 168 registers", report), report  # 65536 / 384 threads: setmaxnreg moves the rest


@pytest.mark.parametrize("b_major", ["n", "k"])
@pytest.mark.parametrize("config", [S.NARROW_CANDIDATES[-1], S.NARROW_CANDIDATES[0]], ids=lambda c: c.short())
def test_a_32_column_tile_is_an_n32_wgmma_without_spills(config, b_major, tmp_path):
    """The skinny-N tiles (``NARROW_CANDIDATES``): 32 columns of B, 64-byte swizzled where B is N-major, one
    m64n32k16 wgmma per k-step, one epilogue buffer; split or not, nothing spills."""
    assert config.tile_n == 32 and config in S.candidates()
    problem = dataclasses.replace(BIG, n=16, b_major=b_major, beta_zero=config.split_k == 1)
    assert S.why_unsupported(config, problem) is None
    ptx_path, ptx = _kept_code(config, problem, tmp_path)
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16" not in ptx
    _ptxas_report_without_spills(ptx_path, tmp_path)


@pytest.mark.parametrize("config", [dataclasses.replace(c, transposed=True) for c in S.NARROW_CANDIDATES[2:]],
                         ids=lambda c: c.short())
def test_a_transposed_32_column_tile_takes_decode_rows_as_its_32_columns(config, tmp_path):
    """16 rows times a row-major weight on a transposed 32-column tile: the kernel runs out^T = w^T x^T, the
    weight an M-major A, the rows a K-major B of one m64n32k16 wgmma per k-step, out^T stored by stmatrix
    .trans; split or not, nothing spills."""
    call = dataclasses.replace(BIG, m=16, n=4096, k=4096, beta_zero=False)
    assert S.why_unsupported(config, call) is None
    kernel_problem = S._kernel_problem(config, call)
    assert (kernel_problem.m, kernel_problem.n, kernel_problem.a_major, kernel_problem.b_major,
            kernel_problem.d_major) == (4096, 16, "m", "k", "m")
    ptx_path, ptx = _kept_code(config, call, tmp_path)
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in ptx
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    _ptxas_report_without_spills(ptx_path, tmp_path)


# x (M, K) @ w.t() for M of 17-64 rows, run as out^T = w @ x^T: the weight row-major (A K-major), x as a
# K-major B, out^T a column-major D (d_major "m").
SWAPPED = GemmProblem(m=4096, n=64, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k",
                      d_major="m")


@pytest.mark.parametrize("config, beta_zero", [
    (HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1), True),
    (HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1), False),
    (HgemmSm90Config(), False),  # two consumer warpgroups: 128-row sub-tiles, two 64-row TMA boxes each
    (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4), True),
], ids=lambda v: v.short() if isinstance(v, HgemmSm90Config) else ("beta0" if v else "beta"))
def test_a_column_major_result_is_stored_transposed_by_stmatrix_and_tma(config, beta_zero, tmp_path):
    """A column-major D: the accumulators go to shared memory by stmatrix .trans (M-contiguous sub-tiles)
    and out by the same TMA store; nothing spills."""
    problem = dataclasses.replace(SWAPPED, beta_zero=beta_zero)
    assert S.why_unsupported(config, problem) is None
    ptx_path, ptx = _kept_code(config, problem, tmp_path)
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" not in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    _ptxas_report_without_spills(ptx_path, tmp_path)


def test_a_column_major_result_has_its_own_compile_key():
    config = HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1)
    row_major = dataclasses.replace(SWAPPED, d_major="n")
    assert S.compile_key(config, SWAPPED, ARCH) != S.compile_key(config, row_major, ARCH)
    assert "C:M-major" in S.compile_key(config, SWAPPED, ARCH)


@pytest.mark.parametrize("config, beta_zero", [
    (HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1), False),
    (HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4), True),
], ids=lambda v: v.short() if isinstance(v, HgemmSm90Config) else ("beta0" if v else "beta"))
def test_a_transposed_config_is_the_swapped_kernel_entered_with_the_calls_tensors(config, beta_zero, tmp_path):
    """A transposed config on the decode call x (64, 4096) @ w.t() compiles to the very kernel the config
    runs on the swapped problem (w @ x^T into a column-major result): the device code is identical, line
    for line; only the host entry's views differ (``kernel_common.kernel_views``). It has its own compile key."""
    decode = GemmProblem(m=64, n=4096, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k",
                         beta_zero=beta_zero)
    swapped = dataclasses.replace(SWAPPED, beta_zero=beta_zero)
    assert decode.transposed() == swapped and swapped.transposed() == decode
    twin = dataclasses.replace(config, transposed=True)
    assert S.why_unsupported(twin, decode) is None and twin.short() == config.short() + "_T"
    assert S.compile_key(twin, decode, ARCH) != S.compile_key(config, decode, ARCH)

    def device_code(config, problem, folder):
        os.makedirs(folder)
        return [line for line in _kept_code(config, problem, folder)[1].splitlines() if not line.startswith("//")]

    assert device_code(twin, decode, tmp_path / "twin") == device_code(config, swapped, tmp_path / "swapped")


def test_a_transposed_config_runs_one_product_its_transpose_supports():
    twin = HgemmSm90Config(tile_m=128, tile_n=64, consumer_warpgroups=1, transposed=True)
    decode = GemmProblem(m=64, n=4096, k=4096, dtype="float16", a_align=8, b_align=8, c_align=8, b_major="k")
    assert "one product" in S.why_unsupported(twin, dataclasses.replace(decode, batch=2, b_major="n"))
    # The transpose's A is w's rows: TMA needs them 16-byte aligned, as the untransposed kernel needs x's.
    assert "TMA" in S.why_unsupported(twin, dataclasses.replace(decode, b_align=4))
    assert S.why_unsupported(twin, dataclasses.replace(decode, a_major="m", b_major="n")) is None
    # Split-K's workspace rows are the call's M (N of the product run): whole C/D vectors.
    split = HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4, transposed=True)
    assert "workspace" in S.why_unsupported(split, dataclasses.replace(decode, m=12))
    assert S.why_unsupported(split, dataclasses.replace(decode, m=24)) is None
    assert "workspace" in S.why_unsupported(dataclasses.replace(split, transposed=False),
                                            dataclasses.replace(decode, m=12).transposed())
    with pytest.raises(ValueError, match="no transposed problem"):
        dataclasses.replace(decode, batch=2, b_major="n").transposed()
    tt = dataclasses.replace(decode, a_major="m", b_major="n", a_align=4).transposed()
    assert (tt.m, tt.n, tt.a_major, tt.b_major, tt.d_major, tt.a_align, tt.b_align) == (4096, 64, "m", "n", "m", 8, 4)


@pytest.mark.parametrize("beta_zero", [True, False], ids=["beta0", "beta"])
def test_split_k_ptx_counts_arrivals_without_spills(beta_zero, tmp_path):
    """The split-K build: the acq_rel arrival atomic and FP32 plane stores beside the unchanged TMA + wgmma
    main loop and TMA-store epilogue, and no spills."""
    cfg = HgemmSm90Config(tile_m=64, tile_n=128, consumer_warpgroups=1, num_stages=6, split_k=4)
    ptx_path, ptx = _kept_code(cfg, dataclasses.replace(BIG, beta_zero=beta_zero), tmp_path)
    assert re.search(r"atom\.global\.acq_rel(\.gpu)?\.add\.[su]32", ptx), "no acq_rel arrival atomic"
    assert "fence.acq_rel.gpu" in ptx  # the last slice's threads, before they read the other planes
    assert re.search(r"st\.global(\.v2)?\.[bf]32", ptx), "no FP32 plane store"
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in ptx
    _ptxas_report_without_spills(ptx_path, tmp_path)


def test_the_last_slice_loads_its_planes_in_groups(tmp_path):
    """64x64 split 4: 32 accumulators a thread, so the last slice issues two planes' loads before it adds
    either (``kernel_common.plane_group_depth``): the sum's loop over the slices steps by 2. (One plane at a
    time, each slice cost an L2 round trip after the last.)"""
    from cute_kernels.ops.gemm.kernel_common import plane_group_depth

    assert [plane_group_depth(v) for v in (16, 32, 64, 128)] == [4, 2, 1, 1]
    cfg = HgemmSm90Config(tile_m=64, tile_n=64, consumer_warpgroups=1, num_stages=6, split_k=4)
    _, ptx = _kept_code(cfg, BIG, tmp_path)
    after_arrival = ptx[ptx.index("fence.acq_rel.gpu"):]
    assert re.search(r"add\.s32\s+(%r\d+), \1, 2;\s*\n\s*setp\.\w+\.[us]32\s+%p\d+, \1,", after_arrival)


@pytest.mark.parametrize("beta_zero", [True, False], ids=["beta0", "beta"])
def test_two_ctas_per_sm_ptx_fits_half_the_register_file(beta_zero, tmp_path):
    """Two CTAs per SM: the kernel asks for two resident CTAs, launches at 128 registers a thread (65536 /
    512), moves the producer's surplus to the consumer (setmaxnreg 40 / 216) and does not spill its 128
    accumulators a thread."""
    cfg = HgemmSm90Config(tile_m=128, tile_n=128, consumer_warpgroups=1, num_stages=3, ctas_per_sm=2)
    ptx_path, ptx = _kept_code(cfg, dataclasses.replace(BIG, beta_zero=beta_zero), tmp_path)
    assert re.search(r"\.minnctapersm\s+2", ptx), "no minimum of 2 CTAs per SM"
    assert "setmaxnreg.dec.sync.aligned.u32 \t40" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t216" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx
    report = _ptxas_report_without_spills(ptx_path, tmp_path)
    assert re.search(r"Used 128 registers", report), report


def test_ptx_multicasts_with_a_cluster(tmp_path):
    _, ptx = _kept_code(HgemmSm90Config(tile_m=256, tile_n=128, cluster_m=2), BIG, tmp_path)
    assert "multicast::cluster" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx


def test_the_public_op_tries_hopper_first_only_where_it_was_measured_fast():
    order = importlib.import_module("cute_kernels.ops.gemm.hgemm")._variant_order
    for m, n, k in ((4096, 4096, 4096), (1024, 1024, 1024), (512, 512, 512), (1000, 1000, 1000), (64, 4096, 4096)):
        assert order(dataclasses.replace(BIG, m=m, n=n, k=k))[0] is S.SPEC, (m, n, k)
    # Tiles for at most half the SMs over a long K from 512^3 and more than 32 rows: the Hopper kernel, its
    # K split where the tiles are fewer still.
    for m, n, k, split in ((4096, 32, 4096, 1), (64, 64, 1 << 15, 16), (128, 64, 1 << 14, 8), (64, 512, 4096, 2),
                           (48, 4096, 4096, 1), (64, 2048, 4096, 1)):
        problem = dataclasses.replace(BIG, m=m, n=n, k=k)
        assert order(problem)[0] is S.SPEC and S.leaves_sms_idle(problem), (m, n, k)
        assert S.default_config(problem).split_k == split, (m, n, k)
    # 128^3 to 512^3 with 64 rows and columns or more, tiles for more than half the SMs: the Hopper kernel's
    # 64x64 tiles.
    for m, n, k in ((256, 512, 512), (256, 256, 256), (128, 128, 128), (512, 256, 512), (200, 300, 100)):
        problem = dataclasses.replace(BIG, m=m, n=n, k=k)
        assert order(problem)[0] is S.SPEC and S.default_config(problem).split_k == 1, (m, n, k)
    # Under 128^3, few tiles over a long K under 512^3, 16 rows or fewer, or 17 to 32 rows past one wave of
    # the Hopper kernel's transposed 32-column tiles: the sm80-style kernel (its split-K).
    for m, n, k in ((64, 64, 64), (64, 256, 4096), (16, 4096, 4096), (16, 64, 1 << 15), (32, 14336, 4096),
                    (24, 8512, 4096), (16, 6144, 4096), (8, 1024, 4096), (512, 16, 4096)):
        small = dataclasses.replace(BIG, m=m, n=n, k=k)
        assert order(small)[0] is H.SPEC and S.SPEC in order(small), (m, n, k)  # a Hopper config still finds it
    # Rows 17 to 32 whose transposed 32-column tiles (one per 64 columns) fit one wave: those, unsplit.
    for m, n, k in ((32, 6144, 4096), (24, 5120, 5120), (32, 8192, 4096), (17, 6144, 4096), (32, 4096, 4096),
                    (32, 1024, 4096), (20, 8448, 4096)):
        problem = dataclasses.replace(BIG, m=m, n=n, k=k)
        assert order(problem)[0] is S.SPEC and S.default_config(problem) == S.DECODE_ROWS, (m, n, k)
    # 32 or fewer columns of a row-major B against more rows from 512^3 of work: the 32-column tiles, split
    # in two where N < 32 and the tiles fill a quarter to half of the SMs, else by the general rule; the
    # splits of N < 32 on 16 stages.
    for m, n, k, split in ((8192, 16, 4096, 1), (4096, 16, 4096, 2), (4096, 24, 4096, 2), (2048, 16, 4096, 1),
                           (8192, 32, 8192, 1), (1024, 32, 4096, 2), (1024, 16, 8192, 4)):
        problem = dataclasses.replace(BIG, m=m, n=n, k=k)
        config = S.default_config(problem)
        assert order(problem)[0] is S.SPEC and config.split_k == split, (m, n, k)
        assert dataclasses.replace(config, split_k=1, num_stages=12) == S.NARROW_COLUMNS, (m, n, k)
        assert config.num_stages == (16 if n < 32 and split > 1 else 12), (m, n, k)  # N < 32 splits on 16
    # One row of tiles (33-64 rows) against up to 2048 columns: 32-column tiles on 16 stages; wider keeps 64x64.
    for m, n, k, split in ((64, 1024, 4096, 1), (64, 2048, 4096, 1), (48, 1024, 4096, 1), (64, 512, 4096, 2)):
        problem = dataclasses.replace(BIG, m=m, n=n, k=k)
        config = S.default_config(problem)
        assert order(problem)[0] is S.SPEC and dataclasses.replace(config, split_k=1) == S.ONE_TILE_ROW, (m, n, k)
        assert config.split_k == split, (m, n, k)
    assert S.default_config(dataclasses.replace(BIG, m=64, n=4096, k=4096)).tile_n == 64
    assert S.default_config(BIG).cluster_m == 2
