"""CPU tier for the SGEMM family: config validation, the validity predicate, compiles for sm_90a from fake
tensors (no GPU), the compile cache, runtime-tensor marshalling and argument validation."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported anywhere

import dataclasses
import importlib

import pytest
import torch

from cute_kernels import registry
from cute_kernels.ops.gemm.sgemm_config import GemmConfig
from cute_kernels.runtime.device import SM90_SHARED_OPTIN_BYTES as SMEM_BYTES_SM90

S = importlib.import_module("cute_kernels.ops.gemm.sgemm")
ARCH = "sm_90a"
BIG = S.GemmProblem(m=8192, n=8192, k=8192, beta_zero=False)


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("tile_m", 96, "tile_m"),
        ("tile_k", 4, "tile_k"),
        ("num_stages", 1, "num_stages"),
        ("threads_m", 3, "threads_m"),
        ("threads_n", 2, "threads_n"),
        ("a_smem_major", "x", "a_smem_major"),
        ("raster", 0, "raster"),
        ("min_ctas_per_sm", 5, "min_ctas_per_sm"),
        ("warp_rows", 3, "warp_rows"),
        ("tile_k", 8.0, "tile_k"),
    ],
)
def test_config_rejects_bad_field(field, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        dataclasses.replace(GemmConfig(), **{field: value})


def test_config_rejects_tile_not_covered_by_threads():
    with pytest.raises(ValueError, match="tile_m must be a multiple of 4 \\* threads_m"):
        GemmConfig(tile_m=32, tile_n=128, threads_m=16, threads_n=16)


def test_config_rejects_warp_that_does_not_tile_the_thread_grid():
    with pytest.raises(ValueError, match="a warp of 8 x 4 threads"):
        GemmConfig(tile_m=64, tile_n=64, threads_m=4, threads_n=16, warp_rows=8)


def test_warp_rows_plain_order_and_name():
    assert GemmConfig().lanes_m == 2 and GemmConfig(warp_rows=4).lanes_m == 4
    assert GemmConfig(tile_n=64, threads_n=8).lanes_m == 4
    assert GemmConfig(warp_rows=4).short().endswith("_w4") and "_w" not in GemmConfig().short()


def test_config_rejects_oversized_micro_tile():
    with pytest.raises(ValueError, match="registers"):
        GemmConfig(tile_m=128, tile_n=256, threads_m=8, threads_n=8)


def test_smem_bytes_counts_padding_and_stages():
    m_major = GemmConfig(tile_m=128, tile_n=128, tile_k=8, num_stages=3, a_smem_major="m")
    k_major = dataclasses.replace(m_major, a_smem_major="k")
    assert m_major.smem_bytes() == 4 * 3 * (8 * (128 + 4) + 8 * 128)
    assert k_major.smem_bytes() == 4 * 3 * (8 * 128 + 8 * 128)


def test_candidates_are_valid_and_span_the_space():
    cands = S.candidates()
    assert len(set(cands)) == len(cands)
    assert {c.num_stages for c in cands} == {2, 3, 4, 5}
    assert {c.tile_k for c in cands} == {8, 16, 32}
    assert {(c.tile_m, c.tile_n) for c in cands} == {
        (128, 128), (128, 64), (64, 128), (64, 64), (256, 128), (128, 256), (32, 32), (128, 32)
    }
    assert {c.a_smem_major for c in cands} == {"m", "k"}
    assert {c.warp_rows for c in cands} == {0, 4}
    supported = registry.configs("sgemm", None, BIG)
    assert 0 < len(supported) < len(cands)  # some deep/wide ones exceed the shared-memory budget


# ---------------------------------------------------------------------------------------------- predicate
def test_why_unsupported_smem_budget():
    cfg = GemmConfig(tile_k=32, num_stages=8)
    assert cfg.smem_bytes() > SMEM_BYTES_SM90
    assert "shared memory" in S.why_unsupported(cfg, BIG)


def test_why_unsupported_occupancy_hint_needs_room_for_two_ctas():
    cfg = GemmConfig(tile_k=32, num_stages=5, min_ctas_per_sm=2)
    assert cfg.smem_bytes() <= SMEM_BYTES_SM90
    assert "min_ctas_per_sm" in S.why_unsupported(cfg, BIG)
    assert S.why_unsupported(dataclasses.replace(cfg, min_ctas_per_sm=1), BIG) is None


def test_why_unsupported_alignment_dependent_copy_layout():
    # 64 threads cannot cover 128 columns of B one element at a time, but can with 16-byte copies.
    cfg = GemmConfig(tile_m=64, tile_n=128, threads_m=8, threads_n=8)
    assert S.why_unsupported(cfg, BIG) is None
    unaligned = dataclasses.replace(BIG, b_align=1)
    assert "B" in S.why_unsupported(cfg, unaligned)


def test_default_config_is_supported_everywhere():
    for problem in (BIG, S.GemmProblem(m=17, n=3, k=5, a_align=1, b_align=1, c_align=1)):
        assert S.why_unsupported(S.default_config(problem), problem) is None


@pytest.mark.parametrize(
    "m, n, a_align, expected",
    [
        (8192, 8192, 4, "128x128x32_s2_t16x16_ak"),  # best measured at 4096^3, 8192^3, 8192x6144
        (8192, 6144, 4, "128x128x32_s2_t16x16_ak"),  # per SM: 24 128x128 tiles against 47 of half the size
        (8192, 8192, 1, "128x128x8_s3_t16x16_am"),  # K-major A needs 16-byte rows of A
        (3000, 3000, 4, "128x64x8_s4_t16x8_ak"),  # per SM: 5 128x128 tiles (4.4 waves) against 9 of half the size
        (3000, 3000, 1, "128x64x8_s3_t16x8_am"),
        (512, 512, 4, "32x32x8"),  # 16 tiles of 128x128 would idle 116 of the 132 SMs
    ],
)
def test_default_config_ladder(m, n, a_align, expected):
    problem = S.GemmProblem(m=m, n=n, k=1024, a_align=a_align)
    assert S.default_config(problem).short().startswith(expected)


@pytest.mark.parametrize(
    "m, n, k, expected",
    [
        (16, 4096, 4096, "32x32x8_s3_t8x8_am_r8_k4"),  # decode rows: 128 tiles of 32x32, split in 4
        (4096, 16, 4096, "128x32x32_s3_t16x8_ak_r8_k4"),  # skinny N: a 128x32 tile streaming A, split in 4
        (8192, 32, 8192, "128x32x32_s3_t16x8_ak_r8_k2"),
        (128, 4096, 4096, "128x64x8_s4_t16x8_ak_r8_k2"),  # M and N fill the 128x64 tile: 64 of them, in 2
        (8192, 64, 4096, "128x64x8_s4_t16x8_ak_r8_k2"),
        (64, 2048, 2048, "64x64x32_s3_t16x16_ak_r8_k4"),  # 32 tiles: 256 threads each, split in 4
        (64, 512, 16384, "64x64x32_s3_t16x16_ak_r8_k4"),  # 8 tiles: still at most 4 slices
        (64, 4096, 4096, "64x64x32_s3_t16x16_ak_r8_k2"),  # 64 tiles: 256 threads each, split in 2
        (128, 8192, 4096, "128x64x8_s4_t16x8_ak_r8"),  # 128 tiles of 128x64 fill the SMs unsplit
        (1024, 1024, 1024, "64x64x8_s3_t8x8_am_r8"),  # 64 tiles of 128x128 would idle half the SMs
        (512, 512, 512, "32x32x8_s3_t8x8_am_r8_k2"),
        (256, 256, 256, "32x32x8_s3_t8x8_am_r8"),  # too short a launch to split
        (4096, 4096, 4096, "128x128x32_s2_t16x16_ak_r8"),  # big problems keep the ladder's choice
    ],
)
def test_default_config_for_shapes_that_leave_sms_idle(m, n, k, expected):
    problem = S.GemmProblem(m=m, n=n, k=k)
    config = S.default_config(problem)
    assert config.short() == expected
    assert S.why_unsupported(config, problem) is None


def test_split_configs_compile_with_narrow_copies_and_c_read():
    problem = S.GemmProblem(m=16, n=4095, k=4097, beta_zero=False, a_align=1, b_align=1, c_align=1)
    config = S.default_config(dataclasses.replace(problem, n=4096, k=4096, a_align=4, b_align=4, c_align=4))
    assert config.split_k == 4
    assert S.compile(config, problem, ARCH) is not None
    assert "_k4" in config.short()
    with pytest.raises(ValueError, match="split_k"):
        dataclasses.replace(config, split_k=5)


# ---------------------------------------------------------------------------------------------- compile
@pytest.mark.parametrize("beta_zero", [True, False])
def test_compile_default_big(beta_zero):
    problem = dataclasses.replace(BIG, beta_zero=beta_zero)
    assert S.compile(S.default_config(problem), problem, ARCH) is not None


@pytest.mark.parametrize("aligns", [(1, 1, 1), (2, 2, 2), (4, 1, 2), (1, 4, 4)])
def test_compile_unaligned(aligns):
    a, b, c = aligns
    problem = S.GemmProblem(m=1023, n=1021, k=1019, beta_zero=False, a_align=a, b_align=b, c_align=c)
    for a_major in ("m", "k"):
        cfg = dataclasses.replace(S.default_config(problem), a_smem_major=a_major)
        assert S.compile(cfg, problem, ARCH) is not None


def _sample(configs, count):
    step = max(1, len(configs) // count)
    return configs[::step][:count]


@pytest.mark.parametrize("config", _sample(registry.configs("sgemm", "simt_cpasync", BIG), 10), ids=lambda c: c.short())
def test_compile_candidate_sample(config):
    assert S.compile(config, BIG, ARCH) is not None


@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(warp_rows=4),
        GemmConfig(tile_m=256, tile_n=128, tile_k=16, warp_rows=4),
        GemmConfig(tile_m=32, tile_n=32, threads_m=8, threads_n=8),
    ],
    ids=lambda c: c.short(),
)
def test_compile_new_shapes(config):
    """4x8 warps, 16x8 micro-tiles, and a tile whose N mode has one 4-column run (flat in the epilogue)."""
    assert S.compile(config, BIG, ARCH) is not None


def test_every_stage_count_compiles():
    base = S.default_config(BIG)
    for stages in (2, 3, 4, 5):
        assert S.compile(dataclasses.replace(base, num_stages=stages), BIG, ARCH) is not None


def test_compile_cache_key_distinguishes_compile_time_traits():
    # The default config: the binary other tests compile too (the disk cache shares it between workers).
    default = S.default_config(BIG)
    first = S.compile(default, BIG, ARCH)
    # Sizes are dynamic (a problem of its own: test_a_problem_that_compiled_before_is_one_lookup counts the
    # checks of m=1000, n=3000, k=77 in the same process).
    assert S.compile(default, dataclasses.replace(BIG, m=999, n=2999, k=75), ARCH) is first
    cfg = dataclasses.replace(default, a_smem_major="m")
    # The compile cache is keyed by compile_key (test_a_problem_that_compiled_before_is_one_lookup): traits
    # that change the binary change the key, without compiling each binary here.
    key = S.compile_key(cfg, BIG, ARCH)
    assert S.compile_key(cfg, dataclasses.replace(BIG, beta_zero=True), ARCH) != key
    assert S.compile_key(cfg, dataclasses.replace(BIG, b_align=1), ARCH) != key
    # A transposed into an M-major tile is copied element-wise whatever its alignment: one binary.
    assert S.compile_key(cfg, BIG, ARCH) == S.compile_key(cfg, dataclasses.replace(BIG, a_align=1), ARCH)
    k_major = dataclasses.replace(cfg, a_smem_major="k")
    assert S.compile_key(k_major, BIG, ARCH) != S.compile_key(k_major, dataclasses.replace(BIG, a_align=1), ARCH)


def test_a_problem_that_compiled_before_is_one_lookup(monkeypatch):
    """The launch path's repeat (same config, problem and arch) skips the validity check and the compile
    key (CompileCache.by_problem); a new problem of the same binary is checked and gets that binary."""
    cfg = S.default_config(BIG)
    first = S.compile(cfg, BIG, ARCH)
    checks = []
    real = S.why_unsupported
    monkeypatch.setattr(S, "why_unsupported", lambda *a: checks.append(a) or real(*a))
    assert S.compile(cfg, BIG, ARCH) is first and checks == []
    other = dataclasses.replace(BIG, m=1000, n=3000, k=77)
    assert S.compile(cfg, other, ARCH) is first and len(checks) == 1
    assert S.compile(cfg, other, ARCH) is first and len(checks) == 1


def test_compile_refuses_unsupported_config():
    with pytest.raises(ValueError, match="shared memory"):
        S.compile(GemmConfig(tile_k=32, num_stages=8), BIG, ARCH)


def test_compiled_function_takes_torch_tensors_and_checks_them():
    """The TVM-FFI function takes torch tensors and Python floats (no CuTe tensors, no stream argument) and
    checks them against its signature: here it refuses CPU tensors, naming the argument."""
    compiled = S.compile(S.default_config(BIG), BIG, ARCH)
    a, b = torch.randn(70, 40), torch.randn(40, 36)
    c, d = torch.randn(70, 36), torch.empty(70, 36)
    with pytest.raises(ValueError, match=r"argument #0 .*mA: Tensor\(\[n0, n1\], float32\).*alpha: float32, beta: float32\)"):
        compiled(a, b, c, d, 1.5, 0.5)


def test_alignment_measurement():
    from cute_kernels.ops.gemm.problem import operand_alignment

    def alignment_elems(t):
        return operand_alignment(t, "row", 4)

    base = torch.zeros(64, 68)
    assert alignment_elems(base) == 4
    assert alignment_elems(base[:, :66]) == 2  # 66 columns: not a multiple of 4
    assert alignment_elems(base[:, 1:65]) == 1  # base pointer off by one element
    assert alignment_elems(torch.zeros(64, 66)[:, :64]) == 2  # leading dim 66


# ---------------------------------------------------------------------------------------------- arguments
def _mats(m=8, n=6, k=5, dtype=torch.float32):
    return torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)


def test_rejects_wrong_dtype():
    a, b = _mats(dtype=torch.float64)
    with pytest.raises(TypeError, match=r"a: expected dtype in \(torch.float32\), got torch.float64"):
        S.sgemm(a, b)


def test_rejects_non_tensor():
    with pytest.raises(TypeError, match="b: expected a torch.Tensor"):
        S.sgemm(torch.randn(3, 3), [[1.0]])


def test_rejects_mismatched_inner_dim():
    a, _ = _mats()
    with pytest.raises(ValueError, match="b: expected 5 rows"):
        S.sgemm(a, torch.randn(4, 6))


def test_takes_column_major_and_refuses_other_strides():
    """A transposed view passes every structural check (the CPU tensors then fail the device check, the
    last one); a matrix with no unit stride is refused naming the operand."""
    a, b = _mats()
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):
        S.sgemm(a.t().contiguous().t(), b)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):
        S.sgemm(a, b.t().contiguous().t())
    with pytest.raises(ValueError, match="a: expected row-major matrices .* or column-major"):
        S.sgemm(torch.randn(16, 10)[::2, ::2], b)


def test_rejects_4d_and_batches_that_do_not_broadcast():
    with pytest.raises(ValueError, match="a: expected a 2-D matrix or a 3-D batch of matrices, got 4-D"):
        S.sgemm(torch.randn(2, 2, 3, 4), torch.randn(4, 5))
    with pytest.raises(ValueError, match="b: a batch of 3 does not broadcast with a's batch of 2"):
        S.sgemm(torch.randn(2, 3, 4), torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 5\)"):
        S.sgemm(torch.randn(2, 3, 4), torch.randn(4, 5), out=torch.empty(3, 5))
    with pytest.raises(ValueError, match="out: its 2 matrices overlap"):
        S.sgemm(torch.randn(2, 3, 4), torch.randn(4, 5), out=torch.empty(3, 5).expand(2, 3, 5))
    with pytest.raises(ValueError, match="out: its 2 matrices overlap"):  # interleaved, rows too close
        S.sgemm(torch.randn(2, 3, 4), torch.randn(4, 5), out=torch.empty(3, 9).as_strided((2, 3, 5), (4, 9, 1)))
    with pytest.raises(ValueError, match="a: expected a CUDA tensor"):  # interleaved row by row: apart
        S.sgemm(torch.randn(2, 3, 4), torch.randn(4, 5), out=torch.empty(3, 2, 5).transpose(0, 1))


def test_rejects_bad_c_and_out_shapes():
    a, b = _mats()
    with pytest.raises(ValueError, match=r"c: expected shape \(8, 6\)"):
        S.sgemm(a, b, torch.randn(8, 7), beta=1.0)
    with pytest.raises(ValueError, match=r"out: expected shape \(8, 6\)"):
        S.sgemm(a, b, out=torch.empty(6, 8))


def test_rejects_missing_c_with_beta():
    a, b = _mats()
    with pytest.raises(ValueError, match="c: required when beta != 0"):
        S.sgemm(a, b, beta=0.5)


def test_rejects_bad_scalars_and_config():
    a, b = _mats()
    with pytest.raises(TypeError, match="alpha: expected a real number"):
        S.sgemm(a, b, alpha="2")
    with pytest.raises(TypeError, match="beta: expected a real number"):
        S.sgemm(a, b, beta=1j)
    with pytest.raises(TypeError, match="config: expected a GemmConfig"):
        S.sgemm(a, b, config={"tile_m": 128})


def test_rejects_cpu_tensors_without_writing():
    a, b = _mats()
    out = torch.full((8, 6), 7.0)
    with pytest.raises(ValueError, match="a: expected a CUDA tensor, got .* on cpu"):
        S.sgemm(a, b, out=out)
    assert torch.all(out == 7.0)


# ---------------------------------------------------------------------------------------------- oracle
def _sequential_fp32(a, b):
    """A K loop that rounds after every step, like one thread of the kernel (the worst ordering)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for k in range(a.shape[1]):
        acc += a[:, k : k + 1] * b[k : k + 1, :]
    return acc


def _tf32(x):
    """Round to TF32's 10 mantissa bits (what a tensor-core product would see)."""
    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("positive", [False, True], ids=["randn", "uniform01"])
def test_oracle_accepts_a_sequential_k_loop_and_rejects_bugs(positive):
    """The GPU tier's oracle (oracle.compare with reference.gemm_scale) on the thin shape where a max-abs
    oracle failed: a sequential FP32 sum passes against torch's blocked sum, for zero-mean and same-sign
    inputs alike; one dropped K term, a NaN, and (on zero-mean data) TF32 rounding fail it."""
    from cute_kernels.ops.gemm import reference
    from cute_kernels.runtime import oracle

    gen = torch.Generator().manual_seed(4)
    m, n, k = 64, 128, 4096
    make = torch.rand if positive else torch.randn
    a, b = make(m, k, generator=gen), make(k, n, generator=gen)
    ref = a.double() @ b.double()
    theirs = a @ b
    scale = reference.gemm_scale(a, b)
    ours = _sequential_fp32(a, b)
    verdict = oracle.compare(ours, ref, theirs, scale=scale)
    assert verdict, verdict.detail
    if not positive:
        # With same-sign terms a sequential FP32 sum is itself within a few times TF32's error (its
        # partial sums grow like i), so only zero-mean data can tell the two apart -- the GPU tier's randn.
        assert not oracle.compare(_tf32(a) @ _tf32(b), ref, theirs, scale=scale)
    dropped = ours.clone()
    dropped[5] -= a[5, 77] * b[77]
    assert not oracle.compare(dropped, ref, theirs, scale=scale)
    poisoned = ours.clone()
    poisoned[3, 4] = float("nan")
    assert not oracle.compare(poisoned, ref, theirs, scale=scale)


def test_registry_entry_has_the_gemm_error_scale():
    from cute_kernels.ops.gemm import reference
    from cute_kernels.runtime import oracle

    spec = registry.get("sgemm")
    problem = S.GemmProblem(m=20, n=30, k=40, beta_zero=False)
    inputs = spec.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = reference.gemm_scale(inputs["a"], inputs["b"], inputs["c"], alpha=inputs["alpha"], beta=inputs["beta"])
    assert torch.equal(spec.error_scale(problem, inputs), expected)
    # The spec's own oracle accepts the float32 product and refuses an unwritten element.
    out = spec.baseline(problem, inputs)
    assert spec.verify(problem, inputs, out, out)
    assert not spec.verify(problem, inputs, oracle.poisoned_like(out), out)


def test_rejects_overlapping_rows_and_extents_past_int32():
    a, b = _mats()
    rows_overlap = torch.empty(100).as_strided((8, 5), (2, 1))  # row stride 2 < 5 columns
    with pytest.raises(ValueError, match="a: expected row-major matrices .* each with a leading dimension that covers"):
        S.sgemm(rows_overlap, b)
    # More than 2^31 elements is fine (64-bit offsets; the GPU tier runs such GEMMs), an extent past int32 is not.
    tall = torch.empty(2**31, 1, device="meta")  # no memory behind it
    with pytest.raises(ValueError, match="a: shape .2147483648, 1. has an extent past 2147483647"):
        S.sgemm(tall, torch.empty(1, 3, device="meta"))


def test_repeat_calls_run_their_plan_and_check_only_the_values(monkeypatch):
    """A call with the structure of one planned before (runtime.plans: dtypes, devices, shapes, strides,
    pointer alignment, beta == 0, the config) runs that plan: no validation, no problem measurement, no
    compile lookup; its scalars and the overlap of ``out`` with the inputs are checked every time, and the
    launch gets this call's tensors. Runs on CPU tensors: the device checks and the launch are replaced."""
    from cute_kernels.ops.gemm import op as P
    from cute_kernels.runtime.plans import CallPlans

    monkeypatch.setattr(P._checks, "cuda_tensor", lambda name, t: None)
    monkeypatch.setattr(P._checks, "same_device", lambda **operands: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    plans = CallPlans("test")
    counts = {"validate": 0, "measure": 0}
    real_validate, real_measure = P.validate_gemm_args, P.make_problem

    def validate(*args, **kwargs):
        counts["validate"] += 1
        return real_validate(*args, **kwargs)

    def measure(*args, **kwargs):
        counts["measure"] += 1
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(P, "validate_gemm_args", validate)
    monkeypatch.setattr(P, "make_problem", measure)
    launched = []

    class Spec:
        config_cls = GemmConfig

        @staticmethod
        def why_unsupported(config, problem):
            return None

        @staticmethod
        def prepare(config, problem, inputs, out):
            return lambda a, b, c, out, alpha, beta: launched.append((problem, out.data_ptr()))

    storage = torch.empty(8000)
    a = storage[:2800].view(70, 40)
    b = torch.randn(40, 36)

    def call(out, alpha=1.0):
        return P.run_gemm(a, b, None, alpha=alpha, beta=0.0, out=out, config=GemmConfig(),
                          policy=P.GemmPolicy((torch.float32,), (Spec,)), plans=plans)

    apart = storage[4000:6520].view(70, 36)  # same storage as a, no overlap
    other = torch.empty(70, 36)  # the same structure (a fresh allocation is aligned), other memory
    call(apart)
    call(other)
    assert counts == {"validate": 1, "measure": 1} and len(launched) == 2 and len(plans) == 1
    assert launched[0][0] == launched[1][0] and [p for _, p in launched] == [apart.data_ptr(), other.data_ptr()]
    overlapping = storage[:2520].view(70, 36)  # the same structure as `apart`, but on top of a
    with pytest.raises(ValueError, match="out: must not overlap input a"):
        call(overlapping)
    with pytest.raises(ValueError, match="alpha: .* cannot be converted to float32 without overflow"):
        call(apart, alpha=1e39)  # a float, like the plan's: the plan checks it
    assert counts["validate"] == 1 and len(launched) == 2
    with pytest.raises(TypeError, match="alpha: expected a real number"):
        call(apart, alpha="1.5")  # another structure (a str): the full checks refuse it
    assert counts["validate"] == 2 and len(launched) == 2 and len(plans) == 1
    call(storage[4001:6521].view(70, 36))  # one element off: another alignment, so checked and measured again
    assert counts == {"validate": 3, "measure": 2} and launched[-1][0].c_align == 1 and len(plans) == 2


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("beta_zero", [True, False])
@pytest.mark.parametrize("majors", [("k", "n"), ("m", "k")])
def test_the_baseline_is_one_library_call_with_alpha(batch, beta_zero, majors):
    """torch's baseline computes alpha a b (+ beta c) in one addmm / baddbmm (cuBLAS's own alpha): one GEMM op
    and nothing else reaches aten, never a matmul and a separate scaling kernel timed as the vendor's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from cute_kernels.ops.gemm import spec as gemm_spec

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    problem = S.GemmProblem(m=6, n=10, k=12, beta_zero=beta_zero, batch=batch, a_major=majors[0], b_major=majors[1])
    inputs = gemm_spec.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    gemm_spec.torch_gemm(inputs)  # the zero scalar is made on the first call
    with Ops() as ops:
        out = gemm_spec.torch_gemm(inputs)
    gemms = [name for name in ops.seen if name in ("addmm", "baddbmm", "mm", "bmm", "matmul")]
    assert len(gemms) == 1 and not [name for name in ops.seen if name.startswith("mul")], ops.seen
    torch.testing.assert_close(out.double(), gemm_spec.reference(problem, inputs), rtol=1e-5, atol=1e-5)
