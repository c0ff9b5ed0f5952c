"""CPU tier for HGEMM: config validation, the swizzles' bank-conflict claims (modelled in Python), the
validity predicate and default heuristic, compiles for sm_90a from fake tensors (fp16 and bf16, aligned and
not), the compile cache, runtime-tensor marshalling, the oracle, and argument validation."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported anywhere

import dataclasses
import importlib

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.gemm import reference
from cute_kernels.ops.gemm.hgemm import hgemm
from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig
from cute_kernels.ops.gemm.split_k import MIN_K_TILES_PER_SLICE
from cute_kernels.ops.gemm.problem import GemmProblem
from cute_kernels.runtime.device import SM90_SHARED_OPTIN_BYTES as SMEM_BYTES_SM90
from cute_kernels.runtime import oracle

H = importlib.import_module("cute_kernels.ops.gemm.hgemm_sm80")  # the sm80_mma variant
ARCH = "sm_90a"
BIG = GemmProblem(m=8192, n=8192, k=8192, dtype="float16", a_align=8, b_align=8, c_align=8)


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("tile_m", 48, "tile_m"),
        ("split_k", 3, "split_k"),
        ("tile_n", 96, "tile_n"),
        ("tile_k", 16, "tile_k"),
        ("num_stages", 1, "num_stages"),
        ("num_stages", 9, "num_stages"),
        ("warps_m", 3, "warps_m"),
        ("n_atoms", 1, "n_atoms"),
        ("raster", 0, "raster"),
        ("tile_k", 32.0, "tile_k"),
        ("warps_n", True, "warps_n"),
    ],
)
def test_config_rejects_bad_field(field, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        dataclasses.replace(HgemmConfig(), **{field: value})


def test_config_rejects_warp_counts_other_than_4_or_8():
    with pytest.raises(ValueError, match="must be 4 or 8"):
        HgemmConfig(tile_m=128, tile_n=128, warps_m=1, warps_n=2)
    with pytest.raises(ValueError, match="must be 4 or 8"):
        HgemmConfig(tile_m=256, tile_n=256, warps_m=4, warps_n=4)


def test_config_rejects_tiles_the_warps_do_not_cover():
    with pytest.raises(ValueError, match="tile_m must be a multiple of 16 \\* warps_m = 128"):
        HgemmConfig(tile_m=64, tile_n=128, warps_m=8, warps_n=1)
    with pytest.raises(ValueError, match="tile_n must be a multiple of 8 \\* n_atoms \\* warps_n = 128"):
        HgemmConfig(tile_m=128, tile_n=64, warps_m=2, warps_n=4, n_atoms=4)


def test_config_rejects_warp_tiles_past_the_register_file():
    # 4 warps on 128x256: a 64x128 warp tile is 256 FP32 accumulators per thread.
    with pytest.raises(ValueError, match="registers"):
        HgemmConfig(tile_m=128, tile_n=256, warps_m=2, warps_n=2)
    assert HgemmConfig().fragment_registers() == 128 + 2 * (16 + 16)  # 64x64 warp tile


def test_smem_is_the_larger_of_pipeline_and_epilogue():
    cfg = HgemmConfig()  # 128x256x32, 4 stages
    assert cfg.pipeline_bytes() == 2 * 4 * 32 * (128 + 256)
    assert cfg.epilogue_bytes() == 4 * 128 * 256
    assert cfg.smem_bytes() == max(cfg.pipeline_bytes(), cfg.epilogue_bytes()) == 4 * 128 * 256
    deep = dataclasses.replace(cfg, tile_k=64, num_stages=4)
    assert deep.smem_bytes() == deep.pipeline_bytes() == 2 * 4 * 64 * 384


def test_short_name():
    assert HgemmConfig().short() == "128x256x32_s4_w2x4_n2_r8"


# ---------------------------------------------------------------------------------------------- swizzles
def _swizzle(offset: int, bits: int, base: int, shift: int) -> int:
    """CuTe's Swizzle<B, M, S> on an element offset: XOR bits [M+S, M+S+B) down into [M, M+B)."""
    mask = ((1 << bits) - 1) << (base + shift)
    return offset ^ ((offset & mask) >> shift)


def _operand_offset(contiguous: int, other: int, c: int, o: int) -> int:
    """Unswizzled element offset of (contiguous index c, other index o) in one stage built like
    HgemmKernel._operand_smem_layout: 8-row atoms of min(contiguous, 64) elements, contiguous-mode first."""
    from cute_kernels.ops.gemm.hgemm_sm80_kernel import operand_swizzle

    (atom_c, atom_rows), _ = operand_swizzle(contiguous)
    atom = atom_c * atom_rows
    atoms_c = contiguous // atom_c
    return ((o // atom_rows) * atoms_c + c // atom_c) * atom + (o % atom_rows) * atom_c + c % atom_c


def _bank_group(elem_offset: int) -> int:
    """The 16-byte bank group (4 banks) of a 16-bit element offset."""
    return (2 * elem_offset // 16) % 8


@pytest.mark.parametrize("contiguous, other", [(32, 128), (64, 128), (64, 32), (128, 32), (256, 64)])
def test_operand_swizzle_is_conflict_free_for_ldmatrix_and_cp_async(contiguous, other):
    """Every 8-lane phase of ldmatrix (8 rows, one 16-byte chunk column; rows in 8-aligned groups, as the
    MMA fragments take them) and every 8 consecutive 16-byte cp.async writes hit 8 distinct bank groups;
    the swizzle is a bijection that keeps each 16-byte chunk whole."""
    from cute_kernels.ops.gemm.hgemm_sm80_kernel import operand_swizzle

    _, sw = operand_swizzle(contiguous)

    def phys(c, o):
        return _swizzle(_operand_offset(contiguous, other, c, o), *sw)

    offsets = {phys(c, o) for c in range(contiguous) for o in range(other)}
    assert offsets == set(range(contiguous * other))
    for o in range(other):
        for chunk in range(contiguous // 8):
            first = phys(8 * chunk, o)
            assert first % 8 == 0 and all(phys(8 * chunk + i, o) == first + i for i in range(8))
    for o0 in range(0, other, 8):
        for chunk in range(contiguous // 8):
            groups = {_bank_group(phys(8 * chunk, o0 + i)) for i in range(8)}
            assert len(groups) == 8, (o0, chunk, groups)
    # cp.async: threads run along the contiguous mode first (HgemmKernel._g2s_tiled_copy, 8-element vectors).
    chunks = [(8 * j, o) for o in range(other) for j in range(contiguous // 8)]
    for start in range(0, len(chunks), 8):
        groups = {_bank_group(phys(c, o)) for c, o in chunks[start : start + 8]}
        assert len(groups) == 8


@pytest.mark.parametrize("tile_n", [64, 128, 256])
def test_epilogue_swizzle_spreads_accumulator_stores(tile_n):
    """Half a warp's 64-bit accumulator stores (rows r..r+3, one 8-column MMA atom, two floats per lane)
    touch 32 distinct banks; 4-float runs stay contiguous for the 128-bit read-back."""
    from cute_kernels.ops.gemm.hgemm_sm80_kernel import epilogue_swizzle

    sw = epilogue_swizzle(tile_n)
    for row0 in range(0, 16, 4):
        for atom in range(tile_n // 8):
            banks = set()
            for lane in range(16):
                row, col = row0 + lane // 4, 8 * atom + 2 * (lane % 4)
                for j in range(2):
                    banks.add(_swizzle(row * tile_n + col + j, *sw) % 32)
            assert len(banks) == 32
    for row in range(8):
        for c0 in range(0, tile_n, 4):
            first = _swizzle(row * tile_n + c0, *sw)
            assert all(_swizzle(row * tile_n + c0 + i, *sw) == first + i for i in range(4))


# ---------------------------------------------------------------------------------------------- space
def test_candidates_are_valid_and_span_the_space():
    cands = H.candidates()
    assert len(set(cands)) == len(cands)
    assert {c.tile_k for c in cands} == {32, 64}
    assert {c.num_stages for c in cands} == {2, 3, 4, 5}
    assert {c.num_warps for c in cands} == {4, 8}
    assert {(c.tile_m, c.tile_n) for c in cands} == {(128, 256), (256, 128), (128, 128), (128, 64), (64, 128), (64, 64),
                                                     (16, 128), (32, 128)}
    assert {c.split_k for c in cands} == {1, 2, 4, 8, 16}
    assert {c.n_atoms for c in cands} == {2, 4} and {c.raster for c in cands} == {1, 8}
    supported = registry.configs("hgemm", None, BIG)
    assert 0 < len(supported) < len(cands)  # the deepest 128x256x64 / 256x128x64 exceed 227 KB


def test_why_unsupported():
    deep = HgemmConfig(tile_k=64, num_stages=5)
    assert deep.smem_bytes() > SMEM_BYTES_SM90
    assert "shared memory" in H.why_unsupported(deep, BIG)
    assert "float16/bfloat16 only" in H.why_unsupported(HgemmConfig(), dataclasses.replace(BIG, dtype="float32", a_align=4, b_align=4, c_align=4))
    assert "HgemmConfig" in H.why_unsupported(object(), BIG)
    for align in (1, 2, 4):  # narrower copies fit every candidate's thread layout
        problem = dataclasses.replace(BIG, a_align=align, b_align=align, c_align=align)
        assert all(H.why_unsupported(c, problem) is None for c in H.candidates() if c.smem_bytes() <= SMEM_BYTES_SM90)


def test_problem_alignment_limits_per_dtype():
    with pytest.raises(ValueError, match="a_align"):
        GemmProblem(m=1, n=1, k=1, dtype="float32", a_align=8)
    with pytest.raises(ValueError, match="dtype"):
        GemmProblem(m=1, n=1, k=1, dtype="float64")
    assert GemmProblem(m=1, n=1, k=1, dtype="bfloat16", a_align=8, b_align=8, c_align=8).a_align == 8


@pytest.mark.parametrize(
    "size, align, expected",
    [
        (8192, 8, "128x256x32_s4_w2x4"),  # whole waves of the biggest tile
        (4096, 8, "128x256x32_s4_w2x4"),
        (8192, 2, "128x128x32_s4_w2x4"),  # 128x256 and 4-warp 128x128 spill with narrow copies
        (3000, 8, "128x128x32_s4_w2x2"),  # 276 tiles of 128x256 would be 2.1 waves
        (512, 8, "64x64x32_s3_w2x2"),  # 8 tiles of 128x128 would idle most of the 132 SMs
    ],
)
def test_default_config_ladder(size, align, expected):
    problem = GemmProblem(m=size, n=size, k=1024, dtype="float16", a_align=align, b_align=align, c_align=align)
    config = H.default_config(problem)
    assert config.short().startswith(expected)
    assert H.why_unsupported(config, problem) is None


@pytest.mark.parametrize(
    "m, n, k, expected",
    [
        (1, 4096, 4096, "16x128x64_s4_w1x4_n2_r8_k4"),  # 32 tiles: split in 4 -> 128 CTAs
        (16, 11008, 4096, "16x128x64_s4_w1x4_n2_r8_k2"),  # 86 tiles: in 2 -> 172
        (1, 14336, 4096, "16x128x64_s4_w1x4_n2_r8"),  # 112 tiles already run 0.85 CTAs per SM
        (32, 4096, 4096, "32x128x64_s4_w1x4_n2_r8_k4"),
        (4096, 16, 4096, "128x64x32_s4_w2x2_n2_r8_k4"),  # skinny N
        (1, 4096, 256, "16x128x64_s4_w1x4_n2_r8"),  # 4 k-tiles: too short to share
        (1, 4096, 1024, "16x128x64_s4_w1x4_n2_r8_k2"),  # 16 k-tiles: two slices of 8
    ],
)
def test_default_config_splits_k_where_tiles_leave_sms_idle(m, n, k, expected):
    problem = GemmProblem(m=m, n=n, k=k, dtype="float16", a_align=8, b_align=8, c_align=8)
    config = H.default_config(problem)
    assert config.short() == expected
    assert H.why_unsupported(config, problem) is None


@pytest.mark.parametrize("align", [1, 8])
def test_split_k_keeps_slices_long_and_ctas_bounded(align):
    for m, n, k in [(1, 64, 1 << 20), (1, 4096, 4096), (16, 1000, 333), (4096, 8, 100000), (7, 7, 7), (12, 1000, 999)]:
        for base in (H._DECODE_ROWS, H._SKINNY_N):
            problem = GemmProblem(m=m, n=n, k=k, dtype="bfloat16", a_align=align, b_align=align, c_align=align)
            split = H.split_k_for(base, problem)
            tiles = -(-m // base.tile_m) * -(-n // base.tile_n)
            # Decode rows with a misaligned A may take shorter slices (measured paying), no shorter than that.
            shortest = (H._MISALIGNED_DECODE_MIN_K_TILES if base.tile_m <= 32 and align < 8
                        else MIN_K_TILES_PER_SLICE)
            assert split in (1, 2, 4, 8, 16)
            assert split == 1 or (tiles * split <= H._SPLIT_TARGET_CTAS and -(-k // base.tile_k) >= shortest * split)


def test_misaligned_decode_rows_split_short_k_further():
    """12 x 1000 x 999 (A's rows 1998 bytes): 16 k-tiles in 8 slices of 2, where aligned rows keep slices
    of 8 (the H200 probe: 11.2 us against 15.8 split in 2)."""
    misaligned = GemmProblem(m=12, n=1000, k=999, dtype="float16", a_align=1, b_align=8, c_align=8)
    aligned = GemmProblem(m=12, n=1000, k=1000, dtype="float16", a_align=8, b_align=8, c_align=8)
    assert H.default_config(misaligned).short() == "16x128x64_s4_w1x4_n2_r8_k8"
    assert H.default_config(aligned).short() == "16x64x64_s4_w1x4_n2_r8_k2"  # N <= 1024, aligned: 64 columns


def test_decode_rows_against_a_narrow_weight_take_64_column_tiles():
    """Up to N = 1024 (16-byte rows of A) the decode tile is 64 columns wide, at the split the 128-column one
    had: 16x1024x4096 ran 0.96x cuBLAS so against 0.92x (H100)."""
    def short(m, n, k):
        return H.default_config(GemmProblem(m=m, n=n, k=k, dtype="float16", a_align=8, b_align=8, c_align=8)).short()

    assert short(16, 1024, 4096) == "16x64x64_s4_w1x4_n2_r8_k8"
    assert short(32, 1024, 4096) == "32x64x64_s4_w1x4_n2_r8_k8"
    assert short(16, 1025, 4096).startswith("16x128x64")
    assert short(16, 4096, 4096) == "16x128x64_s4_w1x4_n2_r8_k4"


def test_split_config_fields():
    config = HgemmConfig(tile_m=16, tile_n=128, tile_k=64, warps_m=1, warps_n=4, split_k=8)
    assert config.short() == "16x128x64_s4_w1x4_n2_r8_k8"
    assert config.smem_bytes() == config.pipeline_bytes() + 16  # the finishing flag
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="split_k"):
            HgemmConfig(split_k=bad)
    with pytest.raises(ValueError, match="tile_m"):
        HgemmConfig(tile_m=48)


def test_registry_entry():
    spec = registry.get("hgemm")
    assert spec.variant == "sm80_mma" and spec.bound == "fp16" and spec.error_scale is not None
    assert set(spec.dtypes) == {torch.float16, torch.bfloat16}
    assert {p.dtype for p in spec.standard_problems()} == {"float16", "bfloat16"}


# ---------------------------------------------------------------------------------------------- compile
def _p(dtype="float16", beta_zero=True, align=(8, 8, 8), m=1000, n=1000, k=1000):
    return GemmProblem(m=m, n=n, k=k, dtype=dtype, beta_zero=beta_zero, a_align=align[0], b_align=align[1],
                       c_align=align[2])


@pytest.mark.parametrize(
    "problem",
    [
        _p("float16", True),
        _p("bfloat16", False),
        _p("float16", False, (1, 1, 1), 1001, 999, 17),
        _p("bfloat16", True, (2, 4, 2), 1002, 1004, 1002),
        _p("float16", False, (4, 8, 1), 1004, 1000, 1004),
        _p("float16", True, (8, 8, 8), 1, 4096, 4096),  # decode rows, split-K
        _p("bfloat16", False, (1, 1, 1), 17, 1001, 3001),  # split-K with narrow copies, C read
        _p("float16", False, (8, 8, 8), 4096, 16, 4096),  # skinny N, split-K
    ],
    ids=lambda p: f"{p.dtype}_bz{int(p.beta_zero)}_al{p.a_align}{p.b_align}{p.c_align}",
)
def test_compile_default(problem):
    assert H.compile(H.default_config(problem), problem, ARCH) is not None


def _sample(configs, count):
    step = max(1, len(configs) // count)
    return configs[::step][:count]


@pytest.mark.parametrize("config", _sample(registry.configs("hgemm", None, BIG), 8), ids=lambda c: c.short())
def test_compile_candidate_sample(config):
    assert H.compile(config, BIG, ARCH) is not None


@pytest.mark.parametrize(
    "config",
    [HgemmConfig(n_atoms=4), HgemmConfig(tile_m=256, tile_n=128, warps_m=2, warps_n=4), HgemmConfig(num_stages=2)],
    ids=lambda c: c.short(),
)
def test_compile_big_tile_variants_bf16(config):
    assert H.compile(config, dataclasses.replace(BIG, dtype="bfloat16", beta_zero=False), ARCH) is not None


def test_compile_cache_key_distinguishes_compile_time_traits():
    cfg = HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2, num_stages=3)
    first = H.compile(cfg, BIG, ARCH)
    assert H.compile(cfg, dataclasses.replace(BIG, m=17, n=3000, k=77), ARCH) is first  # sizes are dynamic
    key = H.compile_key(cfg, BIG, ARCH)
    for change in ({"dtype": "bfloat16"}, {"beta_zero": False}, {"a_align": 4}, {"b_align": 2}, {"c_align": 1}):
        assert H.compile_key(cfg, dataclasses.replace(BIG, **change), ARCH) != key, change
    assert H.compile_key(cfg, BIG, "sm_80") != key


def test_compile_refuses_unsupported_config():
    with pytest.raises(ValueError, match="shared memory"):
        H.compile(HgemmConfig(tile_k=64, num_stages=5), BIG, ARCH)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_function_takes_torch_tensors_and_checks_them(dtype):
    """The TVM-FFI function takes torch tensors and Python floats (no CuTe tensors, no stream argument) and
    checks them against its signature: here it refuses CPU tensors, naming the argument."""
    problem = dataclasses.replace(BIG, dtype=str(dtype).split(".")[1])
    compiled = H.compile(HgemmConfig(tile_m=64, tile_n=64, warps_m=2, warps_n=2, num_stages=3), problem, ARCH)
    a, b = torch.randn(72, 40).to(dtype), torch.randn(40, 48).to(dtype)
    c, d = torch.randn(72, 48).to(dtype), torch.empty(72, 48, dtype=dtype)
    with pytest.raises(ValueError, match=r"argument #0 .*mA: Tensor\(\[n0, n1\].*expected device_type=cuda"):
        compiled(a, b, c, d, 1.5, 0.5)


def test_alignment_measurement_16_bit():
    from cute_kernels.ops.gemm.problem import operand_alignment

    def alignment_elems(t, widest):
        return operand_alignment(t, "row", widest)

    base = torch.zeros(64, 72, dtype=torch.float16)
    assert alignment_elems(base, 8) == 8
    assert alignment_elems(base[:, :68], 8) == 4  # 68 columns
    assert alignment_elems(base[:, 2:66], 8) == 2  # base pointer 4 bytes off
    assert alignment_elems(base[:, 1:65], 8) == 1
    from cute_kernels.ops.gemm.problem import make_problem

    problem = make_problem(base[:, :64], torch.zeros(64, 32, dtype=torch.bfloat16), out=torch.zeros(64, 32, dtype=torch.bfloat16))
    assert (problem.dtype, problem.a_align, problem.b_align, problem.c_align) == ("float16", 8, 8, 8)


# ---------------------------------------------------------------------------------------------- oracle
def test_oracle_accepts_one_rounding_and_rejects_bugs():
    """reference.gemm_verdict: the FP32-accumulated product rounded once to fp16 passes against torch's own
    fp16 product; a dropped K term, a wrong element and a NaN fail it."""
    gen = torch.Generator().manual_seed(7)
    m, n, k = 48, 64, 2048
    a = torch.randn(m, k, generator=gen).half()
    b = torch.randn(k, n, generator=gen).half()
    c = torch.randn(m, n, generator=gen).half()
    exact = 1.5 * (a.float() @ b.float()) - 0.75 * c.float()
    ours = exact.half()
    theirs = torch.addmm(c.float(), a.float(), b.float(), alpha=1.5, beta=-0.75).half()
    verdict = reference.gemm_verdict(ours, a, b, c, alpha=1.5, beta=-0.75, baseline=theirs)
    assert verdict, verdict.detail
    dropped = (exact - 1.5 * a[:, 100:101].float() * b[100:101, :].float()).half()
    assert not reference.gemm_verdict(dropped, a, b, c, alpha=1.5, beta=-0.75, baseline=theirs)
    wrong = ours.clone()
    wrong[5, 7] = ours[5, 8]
    assert not reference.gemm_verdict(wrong, a, b, c, alpha=1.5, beta=-0.75, baseline=theirs)
    poisoned = ours.clone()
    poisoned[0, 0] = float("nan")
    assert not reference.gemm_verdict(poisoned, a, b, c, alpha=1.5, beta=-0.75, baseline=theirs)


def test_registry_oracle_matches_gemm_verdict():
    spec = registry.get("hgemm")
    problem = GemmProblem(m=20, n=24, k=40, dtype="bfloat16", beta_zero=False, a_align=8, b_align=8, c_align=8)
    inputs = spec.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    assert inputs["a"].dtype == torch.bfloat16
    exact = (inputs["alpha"] * (inputs["a"].float() @ inputs["b"].float()) + inputs["beta"] * inputs["c"].float())
    out = exact.to(torch.bfloat16)
    assert spec.verify(problem, inputs, out, out)
    assert not spec.verify(problem, inputs, oracle.poisoned_like(out), out)


# ---------------------------------------------------------------------------------------------- arguments
def _mats(m=8, n=6, k=5, dtype=torch.float16):
    return torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)


def test_rejects_wrong_dtype():
    a, b = _mats(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"a: expected dtype in \(torch.float16, torch.bfloat16\), got torch.float32"):
        hgemm(a, b)


def test_rejects_mixed_dtypes():
    a, _ = _mats()
    _, b = _mats(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"b: expected dtype in \(torch.float16\), got torch.bfloat16"):
        hgemm(a, b)
    a, b = _mats()
    with pytest.raises(TypeError, match=r"c: expected dtype in \(torch.float16\), got torch.float32"):
        hgemm(a, b, torch.randn(8, 6), beta=1.0)
    with pytest.raises(TypeError, match=r"out: expected dtype in \(torch.float16\), got torch.bfloat16"):
        hgemm(a, b, out=torch.empty(8, 6, dtype=torch.bfloat16))


def test_rejects_bad_shapes_and_layouts():
    a, b = _mats()
    with pytest.raises(ValueError, match="b: expected 5 rows"):
        hgemm(a, torch.randn(4, 6).half())
    with pytest.raises(ValueError, match="a: expected row-major matrices .* or column-major"):
        hgemm(torch.randn(16, 10).half()[::2, ::2], b)
    with pytest.raises(ValueError, match=r"out: expected shape \(8, 6\)"):
        hgemm(a, b, out=torch.empty(6, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="c: required when beta != 0"):
        hgemm(a, b, beta=0.5)


@pytest.mark.parametrize("shape", [(6,), (1, 6), (8, 1), (1, 1), (), (8, 6)])
def test_c_may_broadcast_as_torch_addmm_input(shape):
    """A bias row, a column or a scalar passes every structural check (the CPU tensors then fail the
    device check, the last one); any other shape is refused naming c."""
    a, b = _mats()
    c = torch.randn(shape).half()
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):
        hgemm(a, b, c, beta=1.0)


def test_c_expanded_to_m_n_is_a_broadcast_and_a_non_tensor_c_is_refused_by_type():
    a, b = _mats()
    bias = torch.randn(6).half()
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):  # structure accepted
        hgemm(a, b, bias.expand(8, 6), beta=1.0)
    with pytest.raises(TypeError, match="^c: expected a torch.Tensor"):
        hgemm(a, b, 1.0, beta=1.0)


@pytest.mark.parametrize("shape", [(5,), (8,), (2, 6), (8, 2), (1, 8, 6), (6, 8)])
def test_c_that_does_not_broadcast_is_refused(shape):
    a, b = _mats()
    with pytest.raises(ValueError, match=r"^c: expected shape \(8, 6\) or one that broadcasts"):
        hgemm(a, b, torch.randn(shape).half(), beta=1.0)


def test_rejects_bad_scalars_and_config():
    a, b = _mats()
    with pytest.raises(TypeError, match="alpha: expected a real number"):
        hgemm(a, b, alpha="2")
    with pytest.raises(TypeError, match="config: expected a HgemmSm90Config or HgemmConfig or GemvConfig or None, got GemmProblem"):
        hgemm(a, b, config=dataclasses.replace(BIG))


def test_rejects_cpu_tensors_without_writing():
    a, b = _mats()
    out = torch.full((8, 6), 7.0, dtype=torch.float16)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor, got .* on cpu"):
        hgemm(a, b, out=out)
    assert torch.all(out == 7.0)


def test_public_through_the_package():
    """Public since its GPU tests passed on the H200: ck.hgemm is the compile-aware wrapper of this op."""
    import cute_kernels as ck

    assert ck.hgemm.__wrapped__ is hgemm
    assert registry.get("hgemm").launch is not None


def test_unswizzled_reference_layout():
    """HgemmConfig.swizzle=False: the conflicted layout the swizzle is measured against -- validated, named,
    never among the candidates, and it compiles for sm_90a (A and B stages in plain row-major atoms)."""
    config = HgemmConfig(swizzle=False)
    assert config.short().endswith("_unswizzled") and not HgemmConfig().short().endswith("_unswizzled")
    with pytest.raises(ValueError, match="HgemmConfig.swizzle"):
        HgemmConfig(swizzle="no")
    assert all(c.swizzle for c in H.candidates())
    assert H.compile(config, BIG, ARCH) is not None
    assert H.compile(dataclasses.replace(config, tile_k=64, num_stages=3), BIG, ARCH) is not None
