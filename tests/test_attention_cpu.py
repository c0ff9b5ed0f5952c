"""CPU tier: attention's configs, supports() predicate, launch geometry, reference, argument checks and the
NVRTC compile (with ptxas's register/spill report) of every instantiation the registry names."""

import ctypes

import dataclasses

import threading

import pytest
import torch

import cute_kernels as ck


from cute_kernels.ops.attention import flash2_mma as flash
from cute_kernels.ops.attention import flash2_tf32x3 as tf32x3
from cute_kernels.ops.attention import fused_fp32 as fp32
from cute_kernels.ops.attention import op as aop
from cute_kernels.ops.attention import problem as prob
from cute_kernels.ops.attention import spec as aspec
from cute_kernels import registry, tuned
from cute_kernels.runtime import checks as runtime_checks
from cute_kernels.runtime import nvrtc

ARCHS = ("sm_80", "sm_90a")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    nvrtc.clear_memory_cache()
    yield
    nvrtc.clear_memory_cache()


def P(m=64, n=64, d=64, dtype=torch.float32, causal=False, batch=1, heads=1, vector=0, window=None, num_sinks=0,
      lse=False):
    return prob.AttentionProblem(batch, heads, m, n, d, dtype, causal, vector, window=window, num_sinks=num_sinks,
                                 lse=lse)


def test_fp32_config_validation():
    with pytest.raises(ValueError, match="Fp32Config.block_m"):
        fp32.Fp32Config(block_m=48)
    with pytest.raises(ValueError, match="Fp32Config.block_n"):
        fp32.Fp32Config(block_n=128)
    with pytest.raises(ValueError, match="Fp32Config.rows_per_thread"):
        fp32.Fp32Config(rows_per_thread=3)
    with pytest.raises(ValueError, match="512 threads"):
        fp32.Fp32Config(128, 64, 2)
    assert fp32.Fp32Config(128, 64, 4).threads == 256
    assert fp32.Fp32Config(32, 32, 2).threads == 128
    # sQ + sK at pitch 132, sV at 128, sP at 72 floats
    assert fp32.Fp32Config(128, 64, 4).shared_bytes(128) == 4 * (192 * 132 + 64 * 128 + 128 * 72)


def test_head_dim_padding_and_vector_width():
    assert [prob.padded_head_dim(d) for d in (1, 3, 32, 33, 64, 100, 128, 129, 256)] == [32, 32, 32, 64, 64, 128, 128, 256, 256]
    with pytest.raises(ValueError):
        prob.padded_head_dim(257)
    assert P(d=100).vector_width == 4 and P(d=3).vector_width == 1 and P(d=100, vector=1).vector_width == 1


def test_fp32_why_unsupported():
    ok = fp32.Fp32Config()
    assert fp32.fp32_why_unsupported(ok, P()) is None
    assert "not float32" in fp32.fp32_why_unsupported(ok, P(dtype=torch.float16))
    assert "outside" in fp32.fp32_why_unsupported(ok, P(d=300))
    assert "registers" in fp32.fp32_why_unsupported(fp32.Fp32Config(64, 32, 4), P(d=200))
    assert fp32.fp32_why_unsupported(fp32.Fp32Config(64, 32, 2), P(d=200)) is None
    assert fp32.fp32_why_unsupported(fp32.Fp32Config(64, 64, 2), P(d=256)) is None  # 217 KB of shared memory
    assert "d % 4" in fp32.fp32_why_unsupported(ok, P(d=6, vector=4))


@pytest.mark.parametrize("d", [1, 3, 16, 64, 100, 128, 129, 200, 256])
@pytest.mark.parametrize("mn", [(1, 1), (512, 256), (4096, 4096), (17, 4097)])
def test_fp32_default_config_is_supported(d, mn):
    for vector in (0, 1):
        problem = P(*mn, d=d, vector=vector)
        assert fp32.fp32_why_unsupported(fp32.fp32_default_config(problem), problem) is None


def test_fp32_default_configs_for_the_standard_problems():
    leetgpu, long_seq = P(512, 256, 128), P(4096, 4096, 128)
    assert fp32.fp32_default_config(leetgpu) == fp32.Fp32Config(32, 32, 2)
    assert fp32.fp32_default_config(long_seq) == fp32.Fp32Config(128, 64, 4)


def test_fp32_name_expression_holds_every_knob():
    assert (fp32.fp32_name_expression(fp32.Fp32Config(64, 32, 2), P(d=100))
            == "attention::fused_fp32_kernel<128, 64, 32, 2, 4>")
    assert (fp32.fp32_name_expression(fp32.Fp32Config(128, 64, 4), P(d=3))
            == "attention::fused_fp32_kernel<32, 128, 64, 4, 1>")


def test_choose_splits_fills_the_gpu_in_one_wave():
    # S=4096, 128-row tiles: 32 query CTAs, one CTA per SM -> 4 splits (128 CTAs; 5 would need a second wave)
    assert fp32.choose_splits(32, 64, 132, 1) == 4
    # LeetGPU's size with 32x32 tiles: 16 query CTAs, 8 key tiles -> every key tile its own split
    assert fp32.choose_splits(16, 8, 132, 4) == 8
    assert fp32.choose_splits(2048, 64, 132, 1) == 1
    assert fp32.choose_splits(1, 1, 132, 4) == 1
    assert fp32.choose_splits(1, 1000, 132, 4) == fp32.MAX_SPLITS


def test_causal_key_tiles_are_longest_first():
    # 128-row query tiles over 64-key tiles: tile i sees keys up to 128 (i + 1) - 1, capped at N
    assert fp32.causal_key_tiles(512, 512, 128, 64) == [8, 6, 4, 2]
    assert fp32.causal_key_tiles(300, 100, 128, 64) == [2, 2, 2]
    assert fp32.causal_key_tiles(1, 4096, 128, 64) == [1]


def test_causal_splits_follow_the_causal_work_not_the_key_count():
    """S=4096 causal with 128x64 tiles, one CTA per SM: the non-causal rule gives the longest tile 4 splits
    of 16 key tiles (the critical path of the full problem); the causal choice makes splits short enough
    that 1056 key tiles over 132 SMs finish in well under that."""
    tiles = fp32.causal_key_tiles(4096, 4096, 128, 64)
    assert sum(tiles) == 1056 and max(tiles) == 64
    tps = fp32.choose_causal_tiles_per_split(tiles, 1, 132, 1)
    splits = -(-64 // tps)
    assert 8 <= tps <= 12 and 2 <= splits <= fp32.MAX_SPLITS
    assert fp32.simulated_makespan(tiles, 1, tps, 132) < 0.75 * fp32.simulated_makespan(tiles, 1, 16, 132)
    # many heads: the query tiles alone fill the GPU in order longest first, no split
    assert fp32.choose_causal_tiles_per_split(fp32.causal_key_tiles(1024, 1024, 128, 64), 64, 132, 1) == 16
    # never more than MAX_SPLITS splits, never a split of zero tiles
    for m, n, bh in ((65536, 65536, 1), (17, 4097, 1), (4096, 4096, 4), (1, 1, 1)):
        tiles = fp32.causal_key_tiles(m, n, 128, 64)
        tps = fp32.choose_causal_tiles_per_split(tiles, bh, 132, 1)
        assert 1 <= tps <= max(tiles) and -(-max(tiles) // tps) <= fp32.MAX_SPLITS


def test_fp32_split_plan():
    config = fp32.Fp32Config(128, 64, 4)
    assert fp32.fp32_split_plan(config, P(4096, 4096, 128), 132, 1) == (4, 16)
    splits, tps = fp32.fp32_split_plan(config, P(4096, 4096, 128, causal=True), 132, 1)
    assert splits * tps >= 64 and (splits - 1) * tps < 64 and splits > 4
    assert fp32.fp32_split_plan(config, P(4096, 4096, 64, batch=4, heads=16), 132, 1) == (1, 64)


def test_params_layout_matches_the_kernel():
    assert ctypes.sizeof(prob.Params) == prob.PARAMS_BYTES
    assert prob.Params.num_sinks.offset == prob.PARAMS_BYTES - 4  # the last field


@pytest.mark.parametrize("m,n", [(5, 3), (3, 5), (4, 4), (1, 7), (7, 1)])
def test_unmasked_pairs(m, n):
    assert aspec.unmasked_pairs(m, n, True) == int(aspec.attention_mask(m, n, "cpu", causal=True).sum())
    assert aspec.unmasked_pairs(m, n, False) == m * n


def test_reference_matches_the_seed_example():
    q = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    k = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]])
    v = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    ref, scale = aspec.reference_and_scale(q, k, v)
    assert torch.equal(ref.round(decimals=2), torch.tensor([[4.29, 5.29, 6.29, 7.29], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64))
    assert (scale >= ref.abs()).all()


@pytest.mark.parametrize("m,n", [(5, 9), (9, 5), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_torch_sdpa_masking(m, n, causal):
    """The reference's causal mask is torch's is_causal (top-left aligned) also when M != N."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, r, 8, dtype=torch.float64, generator=g) for r in (m, n, n))
    ref, _ = aspec.reference_and_scale(q, k, v, 0.7, causal)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.7)
    assert torch.allclose(ref, expected, rtol=1e-12, atol=1e-12)


def test_flops_count_only_unmasked_pairs():
    assert aspec._flops(P(4, 4, 8)) == 4 * 16 * 8
    assert aspec._flops(P(4, 4, 8, causal=True)) == 4 * 10 * 8


def test_cpu_tensors_are_refused():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        aop.attention(x, x, x)


def test_non_tensor_is_refused():
    with pytest.raises(TypeError, match="q: expected a torch.Tensor, got list"):
        aop.attention([[1.0]], torch.zeros(1, 1), torch.zeros(1, 1))


def test_every_dtype_has_a_registered_variant():
    for dtype, variant in prob.DTYPE_VARIANTS.items():
        if variant in registry.variants("attention"):
            assert dtype in registry.get("attention", variant).dtypes


def _fp32_instantiations():
    """What the registry can name: every candidate at d=128 with float4 accesses, and each head dim's
    default configs with both access widths."""
    pairs = [(c, P(512, 256, 128)) for c in fp32.fp32_candidates()]
    for d in (3, 64, 100, 128, 200):
        for mn in ((512, 256), (4096, 4096)):
            for vector in (0, 1):
                problem = P(*mn, d=d, vector=vector)
                pairs.append((fp32.fp32_default_config(problem), problem))
    for spec_problem in fp32.FP32_SPEC.standard_problems():
        pairs.append((fp32.fp32_default_config(spec_problem), spec_problem))
    # The window and lse instantiations: every candidate with float4 accesses, the defaults with both widths.
    windowed = P(4096, 4096, 128, window=(256, 0))
    for window, lse in (((256, 0), False), (None, True), ((256, 0), True)):
        pairs += [(c, dataclasses.replace(windowed, window=window, lse=lse)) for c in fp32.fp32_candidates()]
        for vector in (0, 1):
            problem = dataclasses.replace(windowed, vector=vector, window=window, lse=lse)
            pairs.append((fp32.fp32_default_config(problem), problem))
    names = sorted({fp32.fp32_name_expression(c, p) for c, p in pairs if fp32.fp32_why_unsupported(c, p) is None})
    return names


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_instantiations_compile_without_spills(arch, cache_dir):
    """One NVRTC program for all of them; ptxas's own report (-v) must show no spill traffic."""
    names = _fp32_instantiations()
    usage = nvrtc.resource_usage(prob.SOURCE, names, arch)
    spilled = {n: r for n, r in usage.items() if r.spill_stores or r.spill_loads}
    assert not spilled, spilled
    assert all(r.registers <= 255 for r in usage.values())


# ---- flash2_tf32x3 -------------------------------------------------------------------------------------

def test_tf32x3_config_validation_and_name():
    with pytest.raises(ValueError, match="block_m"):
        tf32x3.Tf32x3Config(32, 64)
    with pytest.raises(ValueError, match="block_n"):
        tf32x3.Tf32x3Config(128, 128)
    assert tf32x3.Tf32x3Config(128, 64).threads == 256
    assert (tf32x3.tf32x3_name_expression(tf32x3.Tf32x3Config(128, 64), P(d=100))
            == "attention::flash2_mma_kernel<float, 128, 128, 64, 8, 4>")
    assert (tf32x3.tf32x3_name_expression(tf32x3.Tf32x3Config(64, 32), P(d=3, window=(4, 4), lse=True))
            == "attention::flash2_mma_kernel<float, 32, 64, 32, 4, 1, true, true>")


def test_tf32x3_refusals_name_their_reason():
    config = tf32x3.Tf32x3Config()
    assert "float32" in tf32x3.tf32x3_why_unsupported(config, P(dtype=torch.float16))
    assert "spill" in tf32x3.tf32x3_why_unsupported(config, P(d=200))
    assert "sm_80" in tf32x3.tf32x3_why_unsupported(config, dataclasses.replace(P(), sm=75))
    assert "shared memory" in tf32x3.tf32x3_why_unsupported(config, dataclasses.replace(P(d=128), shared_limit=99 * 1024))
    assert tf32x3.tf32x3_why_unsupported(config, P(d=128)) is None


def test_float32_default_entry_takes_tensor_cores_where_the_grid_fills_the_gpu():
    def variant(*shape, causal=False, d=64, **kw):
        batch, heads, m = shape
        return aop.default_entry(P(m, m, d, causal=causal, batch=batch, heads=heads, **kw)).variant

    assert variant(1, 16, 1024, d=128) == "flash2_tf32x3"  # 128 query tiles of 128 rows
    assert variant(2, 8, 700) == "flash2_tf32x3"  # 96
    assert variant(1, 1, 4096) == "fused_fp32"  # 32: fused_fp32 splits the keys
    assert variant(1, 4, 2500, causal=True, d=128) == "fused_fp32"  # 80, half of them short
    assert variant(1, 16, 1024, d=256) == "fused_fp32"  # the tensor-core kernel spills at d=256
    assert aop.default_entry(P(64, 64), tf32x3.Tf32x3Config()).variant == "flash2_tf32x3"  # a config picks
    assert aop.default_entry(P(4096, 4096, batch=8, heads=16), fp32.Fp32Config()).variant == "fused_fp32"


def _tf32x3_instantiations() -> list[str]:
    pairs = []
    for d in (3, 32, 64, 100, 128):
        for vector in (0, 1):
            for window, lse in ((None, False), ((256, 0), False), (None, True), ((256, 0), True)):
                problem = P(4096, 4096, d, vector=vector, window=window, lse=lse)
                pairs += [(c, problem) for c in tf32x3.tf32x3_candidates()]
    return sorted({tf32x3.tf32x3_name_expression(c, p) for c, p in pairs if tf32x3.tf32x3_why_unsupported(c, p) is None})


@pytest.mark.exhaustive
@pytest.mark.parametrize("arch", ARCHS)
def test_tf32x3_instantiations_compile_without_spills(arch, cache_dir):
    """Every candidate at every compiled head dim, both copy widths, windows and the log-sum-exp: ptxas -v
    must report no spills (what TF32X3_MAX_HEAD_DIM promises)."""
    names = _tf32x3_instantiations()
    assert len(names) == 4 * 3 * 2 * 4  # configs x head dims 32, 64, 128 x widths x (window, lse)
    usage = nvrtc.resource_usage(prob.SOURCE, names, arch)
    spilled = {n: r for n, r in usage.items() if r.spill_stores or r.spill_loads}
    assert not spilled, spilled


# ---- flash2_mma ----------------------------------------------------------------------------------------


def test_flash_config_validation():
    with pytest.raises(ValueError, match="FlashConfig.block_m"):
        flash.FlashConfig(block_m=96)
    with pytest.raises(ValueError, match="FlashConfig.block_n"):
        flash.FlashConfig(block_n=16)
    with pytest.raises(ValueError, match="FlashConfig.warps"):
        flash.FlashConfig(64, 32, 8)
    c = flash.FlashConfig(128, 32, 4)
    assert c.row_blocks == 2 and c.threads == 128
    assert c.shared_bytes(128) == 2 * (128 + 4 * 32) * 136
    assert c.accumulators(128) == 160


def test_flash_why_unsupported():
    ok = flash.FlashConfig()
    assert flash.flash_why_unsupported(ok, P(dtype=torch.float16)) is None
    assert flash.flash_why_unsupported(ok, P(d=3, dtype=torch.bfloat16)) is None  # slow path, scalar copies
    assert "not float16" in flash.flash_why_unsupported(ok, P())
    assert "spill" in flash.flash_why_unsupported(flash.FlashConfig(128, 128, 4), P(d=128, dtype=torch.float16))
    assert flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4), P(d=128, dtype=torch.float16)) is None
    assert "d % 8" in flash.flash_why_unsupported(ok, P(d=12, dtype=torch.float16, vector=8))
    assert "outside" in flash.flash_why_unsupported(ok, P(d=257, dtype=torch.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 3, 8, 64, 72, 100, 128, 136, 256])
def test_flash_default_config_is_supported(dtype, d):
    for vector in (0, 1):
        problem = P(4096, 4096, d, dtype, vector=vector)
        assert flash.flash_why_unsupported(flash.flash_default_config(problem), problem) is None


def test_flash_defaults_are_the_measured_lean_tiles():
    """128 query rows over 4 warps and 64 keys per tile with the lean key loop at d=64 and d=128 (the H200
    probe's winners); the classic loop elsewhere."""
    lean = flash.FlashConfig(128, 64, 4, "lean")
    for dtype in (torch.float16, torch.bfloat16):
        assert flash.flash_default_config(P(4096, 4096, 128, dtype)) == lean
        assert flash.flash_default_config(P(4096, 4096, 64, dtype)) == lean
        assert flash.flash_default_config(P(4096, 4096, 128, dtype, causal=True)) == lean
        assert flash.flash_default_config(P(4096, 4096, 3, dtype)).mainloop == "classic"
    assert flash.FlashConfig(128, 64, 4).accumulators(128) == flash.FlashConfig(128, 128, 4).accumulators(64) == 192


def test_flash_mainloop_field():
    """The key-loop knob: validated, in the sweep space once per tile, classic by default, and refused by
    supports() exactly on the tiles whose lean kernels ptxas spills (FLASH_LEAN_LIMITS)."""
    assert flash.FlashConfig().mainloop == "classic"  # the field's default; the op's default is in the test above
    with pytest.raises(ValueError, match="FlashConfig.mainloop"):
        flash.FlashConfig(mainloop="fast")
    candidates = flash.flash_candidates()
    tiles = {(c.block_m, c.block_n, c.warps) for c in candidates}
    for loop in flash.FLASH_MAINLOOPS:
        assert {(c.block_m, c.block_n, c.warps) for c in candidates if c.mainloop == loop} == tiles
    assert len(candidates) == len(tiles) * len(flash.FLASH_MAINLOOPS)
    d128, d64 = P(4096, 4096, 128, torch.float16), P(4096, 4096, 64, torch.bfloat16)
    assert flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4, "lean"), d128) is None
    assert "S accumulators" in flash.flash_why_unsupported(flash.FlashConfig(128, 128, 4, "lean"), d64)
    assert "full 192" in flash.flash_why_unsupported(flash.FlashConfig(128, 128, 4, "lean_eager"), d64)
    assert "full 192" in flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4, "lean_eager"), d128)
    assert flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4, "lean_eager"), d64) is None
    assert flash.flash_why_unsupported(flash.FlashConfig(128, 32, 4, "lean_eager"), d128) is None
    # over the budget anyway
    assert "spill" in flash.flash_why_unsupported(flash.FlashConfig(128, 128, 4, "lean"), d128)
    # A GPU with little shared memory: the fallback default is a classic config.
    small = P(4096, 4096, 128, torch.float16)
    small = dataclasses.replace(small, shared_limit=99 * 1024 - 1024)
    assert flash.flash_default_config(small).mainloop == "classic"


def test_flash_mainloop_round_trips_through_tuned_tables():
    from cute_kernels import tuned

    config = tuned.config_from_fields(flash.FlashConfig,
                                      {"block_m": 128, "block_n": 64, "warps": 4, "mainloop": "lean"})
    assert config == flash.FlashConfig(128, 64, 4, "lean")
    fields = {"block_m": 128, "block_n": 64, "warps": 4}
    assert tuned.config_from_fields(flash.FlashConfig, fields).mainloop == "classic"


def test_flash_name_expression_holds_every_knob():
    assert (flash.flash_name_expression(flash.FlashConfig(128, 32, 4), P(d=128, dtype=torch.float16))
            == "attention::flash2_mma_kernel<__half, 128, 128, 32, 4, 8>")
    assert (flash.flash_name_expression(flash.FlashConfig(64, 32, 4), P(d=100, dtype=torch.bfloat16))
            == "attention::flash2_mma_kernel<__nv_bfloat16, 128, 64, 32, 4, 1>")
    assert (flash.flash_name_expression(flash.FlashConfig(128, 64, 4, "lean"), P(d=128, dtype=torch.float16))
            == "attention::flash2_lean_kernel<__half, 128, 128, 64, 4, 8, true>")
    assert (flash.flash_name_expression(flash.FlashConfig(64, 32, 4, "lean_eager"), P(d=100, dtype=torch.bfloat16))
            == "attention::flash2_lean_kernel<__nv_bfloat16, 128, 64, 32, 4, 1, false>")


def _flash_instantiations(every_candidate: bool, mainloop: str | None = None):
    pairs = []
    if every_candidate:
        for d in (64, 128):
            problem = P(4096, 4096, d, torch.float16)
            pairs += [(c, problem) for c in flash.flash_candidates()]
    for dtype in (torch.float16, torch.bfloat16):
        for d in (3, 64, 100, 128, 256):
            for vector in (0, 1):
                problem = P(4096, 4096, d, dtype, vector=vector)
                default = flash.flash_default_config(problem)
                pairs += [(dataclasses.replace(default, mainloop=loop), problem) for loop in flash.FLASH_MAINLOOPS]
    for problem in flash.FLASH_SPEC.standard_problems():
        pairs.append((flash.flash_default_config(problem), problem))
    # Windows, lse: the defaults in both dtypes and access widths, and with every_candidate every candidate
    # in float16 with 16-byte accesses (bfloat16's register counts have matched float16's on every tile
    # measured; an unaligned call runs its default unless a config is forced, and a spill costs speed only).
    for dtype in (torch.float16, torch.bfloat16):
        for d in (3, 64, 100, 128, 256):
            for vector in (0, 1):
                for window, lse in (((100, None), False), (None, True), ((100, None), True)):
                    problem = P(4096, 4096, d, dtype, vector=vector, window=window, num_sinks=4, lse=lse)
                    pairs.append((flash.flash_default_config(problem), problem))
                    if every_candidate and dtype == torch.float16 and d in (64, 128, 256) and vector == 0:
                        pairs += [(c, problem) for c in flash.flash_candidates()]
    return sorted({flash.flash_name_expression(c, p) for c, p in pairs
                   if flash.flash_why_unsupported(c, p) is None and mainloop in (None, c.mainloop)})


# sm_90a compiles every candidate, one program per key loop (so that test workers share them out).
@pytest.mark.exhaustive
@pytest.mark.parametrize("arch,mainloop", [("sm_90a", loop) for loop in flash.FLASH_MAINLOOPS] + [("sm_80", None)])
def test_flash_instantiations_compile_without_spills(arch, mainloop, cache_dir):
    """Every supported candidate at the fast head dims (sm_90a) and every default (both archs): ptxas -v
    must report no spills, which is what flash_why_unsupported's accumulator budget promises."""
    names = _flash_instantiations(every_candidate=arch == "sm_90a", mainloop=mainloop)
    usage = nvrtc.resource_usage(prob.SOURCE, names, arch)
    spilled = {n: r for n, r in usage.items() if r.spill_stores or r.spill_loads}
    tolerated = {_lean_name(key, dtype): limit for key, limit in flash.FLASH_TOLERATED_SPILLS.items()
                 for dtype in (torch.float16, torch.bfloat16)}
    if mainloop in (None, "lean"):
        assert tolerated.keys() <= set(names)  # the tolerated tiles are the ones chosen
    for name, limit in tolerated.items():
        if name in spilled and (spilled[name].spill_stores, spilled[name].spill_loads) <= limit:
            del spilled[name]
    assert not spilled, spilled


def _lean_name(key, dtype) -> str:
    mainloop, block_m, block_n, warps, head_dim, vector, windowed, lse = key
    problem = P(4096, 4096, head_dim, dtype, vector=0 if vector == 8 else 1, window=(100, None) if windowed else None,
                lse=lse)
    return flash.flash_name_expression(flash.FlashConfig(block_m, block_n, warps, mainloop), problem)


@pytest.mark.parametrize("limit", [163 * 1024 - 1024, 99 * 1024 - 1024])
def test_defaults_fit_smaller_shared_memory(limit):
    """An A100 (163 KB) or a consumer GPU (99 KB) must get a default that runs, not a launch failure."""
    import dataclasses

    for variant in ("fused_fp32", "flash2_mma"):
        spec = registry.get("attention", variant)
        for problem in spec.standard_problems():
            small = dataclasses.replace(problem, shared_limit=limit)
            config = spec.default_config(small)
            assert spec.why_unsupported(config, small) is None, (variant, small, config)
    # The op's own choice, on every entry's standard problems: flash2_tf32x3 fits no tile at d=128 in 99 KB,
    # and then the call goes to fused_fp32.
    for variant in registry.variants("attention"):
        for problem in registry.get("attention", variant).standard_problems():
            small = dataclasses.replace(problem, shared_limit=limit, sm=80)
            entry = aop.default_entry(small)
            config = entry.default_config(small)
            assert entry.why_unsupported(config, small) is None, (entry.variant, small, config)


def test_repeat_calls_run_their_plan_and_check_only_the_values(monkeypatch):
    """A call with the structure of one planned before (runtime.plans) runs that plan: no argument checks,
    no problem build, no kernel lookup, the launch packed once; the scale and which memory ``out`` overlaps
    are still checked, and each launch gets this call's pointers and scale. Runs on CPU tensors: the
    device checks and the driver launch are replaced."""
    from cute_kernels.runtime.plans import CallPlans

    monkeypatch.setattr(runtime_checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(aop, "shared_memory_limit", lambda device: 227 * 1024)
    monkeypatch.setattr(aop, "_PLANS", CallPlans("attention"))
    monkeypatch.setattr(flash, "_flash_plans", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    # The config choice asks for the device's arch: the CPU tensors have none (on a GPU machine too).
    monkeypatch.setattr(tuned, "table_arch", lambda device_index: "none")
    monkeypatch.setattr(prob, "current_stream_handle", lambda device: 0)
    monkeypatch.setattr(nvrtc, "kernel_for", lambda *args: "kernel")
    launched, packed = [], []

    class Packed:  # nvrtc.PackedLaunch without the driver: records the parameters each launch sends
        def __init__(self, kernel, grid, block, args, shared_mem=0, lock=None):
            self.args, self.lock = args, threading.Lock()
            packed.append(self)

        def launch(self, stream):
            launched.append(prob.Params.from_buffer_copy(self.args[0]))

    monkeypatch.setattr(nvrtc, "PackedLaunch", Packed)
    checks = []
    real_checks = aop.check_attention_args
    monkeypatch.setattr(aop, "check_attention_args", lambda *a: checks.append(1) or real_checks(*a))

    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.float16) for _ in range(3))
    outs = [torch.empty_like(q) for _ in range(3)]
    for out, scale in zip(outs, (0.25, 0.5, 0.25)):
        aop.attention(q, k, v, out=out, scale=scale, variant="flash2_mma")
    assert len(checks) == 1 and len(launched) == 3 and len(packed) == 1
    assert [p.o for p in launched] == [o.data_ptr() for o in outs]
    assert launched[-1].q == q.data_ptr() and launched[-1].scale_log2 == pytest.approx(0.25 * prob.LOG2E)
    assert launched[1].scale_log2 == pytest.approx(0.5 * prob.LOG2E)
    with pytest.raises(ValueError, match="out: overlaps the memory of k"):
        aop.attention(q, k, v, out=k, scale=0.25, variant="flash2_mma")
    with pytest.raises(ValueError, match="scale"):
        aop.attention(q, k, v, out=outs[0], scale=float("nan"), variant="flash2_mma")
    assert len(launched) == 3
    aop.attention(q[:, :, :20], k, v, scale=0.25, variant="flash2_mma")  # a new structure: checked again
    assert len(checks) == 2 and len(launched) == 4


def _params_field_by_field(problem, inputs, out, scale):
    """Every field of attention::Params written one by one, in the order the struct declares them: the
    oracle for make_params."""
    p = prob.Params()
    for name, t in (("q", inputs["q"]), ("k", inputs["k"]), ("v", inputs["v"]), ("o", out)):
        setattr(p, name, t.data_ptr())
        strides = (0, 0, t.stride(0)) if t.dim() == 2 else (0, *t.stride()[:2]) if t.dim() == 3 else t.stride()[:3]
        for suffix, stride in zip(("batch", "head", "row"), strides):
            setattr(p, f"{name}_{suffix}_stride", stride)
    p.heads, p.m, p.n, p.d = problem.heads, problem.m, problem.n, problem.d
    p.splits, p.tiles_per_split = 1, 0
    p.scale_log2 = scale * prob.LOG2E
    p.causal = int(problem.causal)
    p.kv_group = problem.kv_group
    left, right = problem.window or (None, None)  # clamped to M and N: the kernel's 32-bit row bounds
    p.window_left = problem.m if left is None else min(left, problem.m)
    p.window_right = problem.n if right is None else min(right, problem.n)
    p.num_sinks = min(problem.num_sinks, problem.n)
    return p


def test_launch_parameters_are_the_fields_written_one_by_one():
    """The bytes the kernel receives from make_params equal a field-by-field build, for every layout and
    for repeated builds with new tensors."""
    base = torch.randn(2, 3, 50, 64)
    layouts = [
        (torch.randn(2, 3, 40, 64), base[:, :, :30], base[:, :, 20:], False, 0.125),
        (torch.randn(2, 3, 40, 64).transpose(1, 2).contiguous().transpose(1, 2), base, base, True, 0.3),
        (torch.randn(40, 64), torch.randn(70, 64), torch.randn(70, 64), False, 1 / 8),
        (torch.randn(2, 6, 40, 64), base[:, :, :30], base[:, :, 20:], True, 0.5),  # grouped-query: 6 over 3
        (torch.randn(6, 40, 64), base[0, :, :30], base[1, :, 20:], False, 0.25),  # 3-D, grouped
    ]
    for q, k, v, causal, scale in layouts:
        batch, heads = prob.batch_heads_of(q)
        kv_heads = prob.batch_heads_of(k)[1]
        problem = prob.AttentionProblem(batch, heads, q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, causal,
                                        kv_heads=kv_heads)
        for _ in range(2):  # a repeat with new tensors builds its own
            inputs = {"q": q.clone(), "k": k, "v": v}
            out = torch.empty(q.shape)
            got = prob.make_params(problem, inputs, out, scale)
            assert bytes(got) == bytes(_params_field_by_field(problem, inputs, out, scale))


# ---- windows and sinks ------------------------------------------------------------------------------------


def _full_tile(problem, m0, n0, block_m, block_n):
    """attention.cu's window_tile_is_full, emulated."""
    first, last, last_key = m0, min(m0 + block_m, problem.m) - 1, n0 + block_n - 1
    left, right = problem.window
    left = problem.m if left is None else min(left, problem.m)
    right = problem.n if right is None else min(right, problem.n)
    if last_key >= problem.n:
        return False
    sink_end = min(problem.num_sinks, first + 1) if problem.causal else problem.num_sinks
    if last_key < sink_end:
        return True
    if problem.causal and last_key > first:
        return False
    return n0 >= last - left and last_key <= first + right


@pytest.mark.parametrize("m, n, causal, window, sinks", [
    (300, 300, False, (0, 0), 0), (300, 300, True, (128, 0), 0), (200, 500, False, (16, 16), 3),
    (500, 200, True, (40, None), 70), (500, 200, False, (None, 3), 0), (257, 129, True, (0, 200), 129),
    (700, 100, False, (10, 10), 0), (130, 1000, True, (1000, 1000), 5)])
@pytest.mark.parametrize("block_m, block_n", [(128, 64), (64, 32), (32, 32), (128, 128)])
def test_window_tiles_cover_every_seen_key_and_full_tiles_are_full(m, n, causal, window, sinks, block_m, block_n):
    """The kernels' tile walk (window_key_tiles: sink tiles, then the window's) reaches every key a real
    row sees, each tile once and in order; a tile the kernel runs unmasked is seen whole by every real row
    (RowKeys against the reference's mask)."""
    problem = P(m, n, 64, window=window, num_sinks=sinks, causal=causal)
    mask = aspec.attention_mask(m, n, "cpu", causal, problem.window, problem.num_sinks)
    counts = prob.window_key_tiles(problem, block_m, block_n)
    for index, m0 in enumerate(range(0, m, block_m)):
        rows = mask[m0:m0 + block_m]
        for row in range(m0, min(m0 + block_m, m)):
            lo, hi, row_sinks = prob.row_keys(problem, row)
            j = torch.arange(n)
            assert torch.equal(((j >= lo) & (j <= hi)) | (j < row_sinks), mask[row])
        sink_end = prob.row_keys(problem, min(m0 + block_m, m) - 1)[2]
        sink_tiles = -(-sink_end // block_n)
        lo = prob.row_keys(problem, m0)[0]
        window_first = max(min(lo, n) // block_n, sink_tiles)
        tiles = [i if i < sink_tiles else window_first + i - sink_tiles for i in range(counts[index])]
        assert tiles == sorted(set(tiles)) and all(0 <= t < -(-n // block_n) for t in tiles)
        needed = {j // block_n for j in rows.any(0).nonzero().flatten().tolist()}
        assert needed <= set(tiles), (m0, needed - set(tiles))
        for t in tiles:
            if _full_tile(problem, m0, t * block_n, block_m, block_n):
                assert rows[:, t * block_n:(t + 1) * block_n].all()


def test_window_problems_normalise_and_validate():
    assert P(window=(None, None), num_sinks=4).window is None and P(window=(None, None), num_sinks=4).num_sinks == 0
    assert P(window=[3, None]).window == (3, None)
    for bad, error, match in (((1, 2, 3), TypeError, "pair"), ((-1, 0), ValueError, "left side must be >= 0"),
                              ((0, 1.5), TypeError, "right side"), ((True, 0), TypeError, "left side"), (5, TypeError, "pair")):
        with pytest.raises(error, match=match):
            P(window=bad)
    with pytest.raises(ValueError, match="num_sinks"):
        P(window=(4, 0), num_sinks=-1)
    with pytest.raises(TypeError, match="num_sinks"):
        P(window=(4, 0), num_sinks=2.0)


def test_window_configs_and_names():
    windowed = P(4096, 4096, 128, torch.float16, window=(1024, 0), causal=True)
    config = flash.flash_default_config(windowed)
    assert config == flash.FlashConfig(128, 64, 4, "lean") and flash.flash_why_unsupported(config, windowed) is None
    assert "spill" in flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4), windowed)
    assert flash.flash_name_expression(config, windowed) == "attention::flash2_lean_kernel<__half, 128, 128, 64, 4, 8, true, true>"
    both = dataclasses.replace(windowed, lse=True)  # the 4-warp lean tile spills with both: eight warps
    assert "log-sum-exp" in flash.flash_why_unsupported(flash.FlashConfig(128, 64, 4, "lean"), both)
    assert flash.flash_default_config(both) == flash.FlashConfig(128, 64, 8, "lean")
    assert fp32.fp32_name_expression(fp32.Fp32Config(), P(window=(3, 3))).endswith(", true>")
    assert not fp32.fp32_name_expression(fp32.Fp32Config(), P()).endswith(", true>")
    assert aspec.shape_bucket(windowed) != aspec.shape_bucket(dataclasses.replace(windowed, window=None))


def test_window_flops_count_seen_pairs():
    for m, n, causal, window, sinks in ((50, 70, True, (5, 0), 3), (70, 50, False, (0, 4), 10), (40, 40, False, (None, 0), 0)):
        problem = P(m, n, 64, causal=causal, window=window, num_sinks=sinks)
        assert aspec.window_pairs(problem) == int(aspec.attention_mask(m, n, "cpu", causal, window, sinks).sum())


def test_window_reference_is_a_masked_softmax_with_empty_rows_zero():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    ref, _ = aspec.reference_and_scale(q, k[:5], v[:5], causal=False, window=(2, 1), num_sinks=0)
    mask = aspec.attention_mask(12, 5, "cpu", False, (2, 1), 0)
    s = (q @ k[:5].T / 8 ** 0.5).masked_fill(~mask, float("-inf"))
    expected = torch.softmax(s, -1).nan_to_num(0.0) @ v[:5]
    torch.testing.assert_close(ref, expected)
    assert torch.equal(ref[7:], torch.zeros(5, 8, dtype=torch.float64))  # rows 7.. see no key (7 - 2 > 4)


def test_window_crosses_the_custom_op_schema():
    from cute_kernels import torch_ops

    assert torch_ops._window_arg((None, 4)) == [-1, 4] and torch_ops._window_of([-1, 4]) == (None, 4)
    assert torch_ops._window_arg((None, None)) is None and torch_ops._window_of(None) is None
    schema = str(torch.ops.cute_kernels.attention.default._schema)
    assert "[]? window=None" in schema and "num_sinks=0" in schema


def test_lse_kernels_are_their_own_instantiations():
    assert fp32.fp32_name_expression(fp32.Fp32Config(), P(lse=True)).endswith(", false, true>")
    assert fp32.fp32_name_expression(fp32.Fp32Config(), P(window=(1, 1), lse=True)).endswith(", true, true>")
    with_lse = P(4096, 4096, 64, torch.float16, lse=True)
    config = flash.flash_default_config(with_lse)
    assert config.mainloop == "lean" and flash.flash_name_expression(config, with_lse).endswith(", true, false, true>")
    assert flash.flash_name_expression(flash.FlashConfig(128, 64, 8), with_lse).endswith(", 8, false, true>")
    assert aspec.shape_bucket(with_lse) != aspec.shape_bucket(dataclasses.replace(with_lse, lse=False))


def test_an_lse_kernel_never_launches_without_its_tensor():
    launch = prob.AttentionLaunch(None, prob.Params(), 64, 0, writes_lse=True)
    with pytest.raises(ValueError, match="log-sum-exp"):
        launch(None, None, None, None, None)


def test_backward_params_pack_the_kernels_struct():
    """ops/attention/backward.py packs attention.cu's BwdParams (which static_asserts 280 bytes): nine
    pointers, 21 strides, four sizes, the scale and five ints, in that order."""
    from cute_kernels.ops.attention.backward import BwdParams

    assert ctypes.sizeof(BwdParams) == 280
    assert BwdParams.heads.offset == 9 * 8 + 21 * 8
    assert BwdParams.scale.offset == BwdParams.heads.offset + 16
    assert BwdParams.num_sinks.offset == 280 - 4


def test_delta_params_pack_the_kernels_struct():
    """ops/attention/backward.py packs attention.cu's DeltaParams (which static_asserts 128 bytes): six
    pointers, six strides, the row count and pitch and three ints, in that order (4 bytes of tail padding)."""
    from cute_kernels.ops.attention.backward import DeltaParams

    assert ctypes.sizeof(DeltaParams) == 128
    assert (DeltaParams.lse.offset, DeltaParams.stage_rows.offset) == (4 * 8, 5 * 8)
    assert DeltaParams.o_batch_stride.offset == 6 * 8
    assert DeltaParams.rows.offset == 6 * 8 + 6 * 8
    assert DeltaParams.rows_pitch.offset == DeltaParams.rows.offset + 8
    assert DeltaParams.d.offset == DeltaParams.rows_pitch.offset + 8 + 8


def test_the_delta_kernel_loads_16_byte_vectors_where_rows_and_strides_allow():
    """D's kernel shape for O and dO as they lie: 16-byte loads with a lane per vector of the row (a power of
    two, at most 32), element loads a warp a row wherever a base, a stride or the head dim is not whole
    vectors."""
    from cute_kernels.ops.attention.backward import delta_shape

    def shape(dtype, *dims, head_stride=None, offset=0):
        """O (heads, rows, d) of ``dims``, its heads ``head_stride`` apart, ``offset`` elements into its
        storage; dO contiguous."""
        heads, rows, d = dims[-3:]
        head_stride = rows * d if head_stride is None else head_stride
        storage = torch.zeros(offset + heads * head_stride * (dims[0] if len(dims) == 4 else 1), dtype=dtype)
        strides = (heads * head_stride, head_stride, d, 1)[-len(dims):]
        return delta_shape(torch.as_strided(storage, dims, strides, offset), torch.zeros(dims, dtype=dtype))

    assert shape(torch.float16, 4, 128, 64) == (8, 8)
    assert shape(torch.bfloat16, 2, 4, 128, 128) == (16, 8)
    assert shape(torch.float16, 4, 128, 256) == (32, 8)
    assert shape(torch.float16, 4, 128, 512) == (32, 8)  # two vectors a lane
    assert shape(torch.float32, 4, 128, 64) == (16, 4)
    assert shape(torch.float16, 4, 128, 72) == (16, 8)  # 9 vectors: 16 lanes, 7 idle
    assert shape(torch.float16, 4, 128, 16) == (2, 8)
    assert shape(torch.float16, 4, 128, 8) == (1, 8)
    assert shape(torch.float16, 4, 128, 100) == (32, 1)  # the head dim is not whole vectors
    assert shape(torch.float16, 4, 128, 64, offset=4) == (32, 1)  # the base is not 16-byte aligned
    assert shape(torch.float16, 4, 128, 64, head_stride=128 * 64 + 4) == (32, 1)  # nor a head's stride


def test_backward_shapes_fit_the_gpus_shared_memory():
    """The 16-bit backward's tile shapes: the H200's where they fit the block's shared memory, the narrow one
    on GPUs with 99 KB per block (sm_86/89/120: the dQ kernel at d = 128), and every shape within the limit."""
    from cute_kernels.ops.attention import backward

    h200, small = 227 * 1024 - 1024, 99 * 1024
    for d in backward.BWD_MMA_HEAD_DIMS:
        for windowed in (False, True):
            assert backward.bwd_mma_shapes(d, windowed, h200) == backward.bwd_mma_shapes(d, windowed)
            for shape in backward.bwd_mma_shapes(d, windowed, small):
                assert backward.bwd_mma_shared_bytes(d, shape) <= small
    assert backward.bwd_mma_shapes(128, False, small)[1] == backward.BWD_MMA_NARROW_SHAPE


def test_a_named_variant_that_cannot_run_here_is_refused_before_anything_runs(monkeypatch):
    """variant="flash3_wgmma" without a config on a GPU that is not sm_90 (here an sm_100 stands in): its
    default config is refused by its predicate with the reason, where it once compiled for the device's
    arch, whose build of the wgmma kernel is empty, and returned memory nothing wrote."""
    monkeypatch.setattr(runtime_checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(aop, "shared_memory_limit", lambda device: 227 * 1024)
    monkeypatch.setattr(aop, "device_sm", lambda t: 100)
    monkeypatch.setattr(tuned, "table_arch", lambda device: "none")
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match=r"^variant: 'flash3_wgmma' cannot run .* need sm_90"):
        aop.attention(q, k, v, variant="flash3_wgmma", out=out)
    assert torch.all(out == 7.0)


@pytest.mark.parametrize("argument", ["window", "num_sinks"])
def test_compiled_attention_takes_a_window_and_sinks_that_change_between_calls(argument):
    """Under torch.compile a window side or sink count that changes between calls becomes a symbolic int
    (automatic dynamic): the checks take it as they take an int, and the call traces."""
    torch._dynamo.reset()
    if argument == "window":
        compiled = torch.compile(lambda q, k, v, w: ck.attention(q, k, v, window=(w, 0)), backend="eager")
    else:
        compiled = torch.compile(lambda q, k, v, w: ck.attention(q, k, v, window=(8, 0), num_sinks=w),
                                 backend="eager")
    q = torch.empty(1, 2, 64, 64, device="meta", dtype=torch.float16)
    for value in (3, 5, 7):
        assert compiled(q, q, q, value).shape == q.shape


def test_window_sides_and_sinks_take_numpy_integers_as_ints():
    import numpy as np

    from cute_kernels.ops.attention.problem import check_num_sinks, check_window

    window = check_window((np.int64(3), None))
    assert window == (3, None) and type(window[0]) is int
    sinks = check_num_sinks(np.int32(2))
    assert sinks == 2 and type(sinks) is int
    for bad in ((True, 1), (1.0, 1), (np.float32(1), 1)):
        with pytest.raises(TypeError, match="window: the left side must be an int"):
            check_window(bad)
    with pytest.raises(TypeError, match="num_sinks: expected an int"):
        check_num_sinks(np.bool_(True))
    with pytest.raises(ValueError, match="num_sinks: expected an int >= 0"):
        check_num_sinks(np.int64(-1))
