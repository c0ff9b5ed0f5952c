"""CPU tier for ck.linear_scan: the predicate, the compile keys, every instantiation compiling, the
torch-ops reference against a plain loop, and the refusals that come before any device check."""

import dataclasses
import itertools
import math

import pytest
import torch

from covering import pairwise

import cute_kernels as ck
from cute_kernels.ops.scan import ScanConfig
from cute_kernels.ops.scan import linear
from cute_kernels.ops.scan.linear import LinearScanProblem, affine_scan, name_expression, why_unsupported
from cute_kernels.ops.scan import config as scan_config
from cute_kernels.ops.scan.problem import ScanProblem
from cute_kernels.runtime import nvrtc


def test_the_predicate_keeps_the_ordered_schedules():
    p = LinearScanProblem(4, 1000)
    assert why_unsupported(ScanConfig(256, 16, staged=False), p) is None
    assert why_unsupported(ScanConfig(256, 16, staged=True), p) is None
    assert "32768 bytes of shared memory, over 32767" in why_unsupported(
        ScanConfig(256, 16, staged=True), LinearScanProblem(4, 1000, shared_limit=32767))
    assert why_unsupported(ScanConfig(256, 16, staged=True), LinearScanProblem(4, 1000, scalar_a=True, shared_limit=16384)) is None
    assert "staged tile" in why_unsupported(ScanConfig(256, 16, staged=False, lookback="early"), p)
    assert why_unsupported(ScanConfig(256, 16, staged=True, lookback="early"), p) is None
    assert "out of order" in why_unsupported(ScanConfig(256, 16, staged=True, lookback="dedicated"), p)
    assert "not one of" in why_unsupported(ScanConfig(256, 16, staged=False), LinearScanProblem(4, 10, torch.float64))
    assert "vector width" in why_unsupported(ScanConfig(256, 4, staged=False), LinearScanProblem(4, 1000, torch.float16))
    assert all(why_unsupported(c, p) is None for c in linear.candidates() if c.lookback != "rows")


def test_the_rows_schedule_takes_rows_of_whole_register_tiles():
    rows = ScanConfig(256, 16, staged=False, lookback="rows")
    assert why_unsupported(rows, LinearScanProblem(64, 16384)) is None
    assert why_unsupported(rows, LinearScanProblem(2, 4096, torch.bfloat16, reverse=True, scalar_a=True, h0=True)) is None
    assert "single SM" in why_unsupported(rows, LinearScanProblem(1, 4096))
    assert "whole tiles" in why_unsupported(rows, LinearScanProblem(64, 16000))
    assert "registers" in why_unsupported(ScanConfig(256, 16, staged=True, lookback="rows"), LinearScanProblem(64, 16384))
    assert "256 threads" in why_unsupported(ScanConfig(512, 8, staged=False, lookback="rows"), LinearScanProblem(8, 4096))
    assert "8 vector loads" in why_unsupported(rows, LinearScanProblem(8, 4096, vector=1))
    assert "linear_scan's" in scan_config.why_unsupported(rows, ScanProblem(64, 16384))
    assert {c.lookback for c in linear.candidates()} == {"inline", "early", "rows"}
    assert all(why_unsupported(c, LinearScanProblem(8, 8192)) is None for c in linear.candidates() if c.lookback == "rows")


def test_a_reversed_problem_takes_a_vector_width_dividing_its_length():
    assert LinearScanProblem(1, 1002, reverse=True).vector_width == 2
    assert LinearScanProblem(1, 1002).vector_width == 4


def test_name_expression_holds_every_knob():
    p = LinearScanProblem(3, 100, torch.bfloat16, reverse=True, scalar_a=True, h0=True, vector=2)
    assert (name_expression(ScanConfig(128, 8, staged=False), p)
            == "scan::linear_scan_kernel<__nv_bfloat16, __nv_bfloat16, 128, 8, 2, true, false, true, true, true, false>")
    assert (name_expression(ScanConfig(128, 8, staged=True), p)
            == "scan::linear_scan_kernel<__nv_bfloat16, __nv_bfloat16, 128, 8, 2, true, true, true, true, true, false>")
    assert (name_expression(ScanConfig(128, 8, staged=True, lookback="early"), p)
            == "scan::linear_scan_kernel<__nv_bfloat16, __nv_bfloat16, 128, 8, 2, true, true, true, true, true, true>")
    assert (name_expression(ScanConfig(128, 8, staged=False, lookback="rows"), p)
            == "scan::linear_scan_rows_kernel<__nv_bfloat16, __nv_bfloat16, 128, 8, 2, true, true, true>")
    # One row with h0: the early schedule folds a_0 h0 into the first tile's aggregate only where it tracks
    # row starts (kSegmented), the inline one wherever h0 is given.
    one = LinearScanProblem(1, 1 << 16, torch.float32, h0=True)
    assert (name_expression(ScanConfig(256, 16, staged=True, lookback="early"), one)
            == "scan::linear_scan_kernel<float, float, 256, 16, 4, true, true, false, false, true, true>")
    assert (name_expression(ScanConfig(256, 16, staged=True), one)
            == "scan::linear_scan_kernel<float, float, 256, 16, 4, false, true, false, false, true, false>")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_kind_of_recurrence_compiles(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    names = []
    for dtype, rows, reverse, scalar_a, h0, wide, staged, early in pairwise(
            list(linear.DTYPES), (1, 4), (False, True), (False, True), (False, True), (False, True), (False, True),
            (False, True)):
        problem = LinearScanProblem(rows, 1024, dtype, reverse, scalar_a, h0, 16 // dtype.itemsize if wide else 1)
        config = dataclasses.replace(linear.default_config(problem), staged=staged or early,
                                     lookback="early" if early else "inline")
        if why_unsupported(config, problem) is not None:  # 2-byte vectors cannot be staged
            continue
        names.append(name_expression(config, problem))
    names = list(dict.fromkeys(names))
    cubin = nvrtc.compile_cubin(linear.SOURCE, names, arch)
    assert set(cubin.symbols) == set(names)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_kind_of_rows_recurrence_compiles_without_spills(arch, tmp_path, monkeypatch):
    """The rows schedule keeps two tiles of maps in registers: every candidate over every dtype, direction,
    decay, h0 and vector width (pairwise) compiles, and ptxas spills nothing (why_unsupported keeps the
    tiles that would)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    configs = [c for c in linear.candidates() if c.lookback == "rows"]
    names = []
    for config, dtype, reverse, scalar_a, h0, vector in pairwise(
            configs, list(linear.DTYPES), (False, True), (False, True), (False, True), (0, 1, 2)):
        problem = LinearScanProblem(4, 8192, dtype, reverse, scalar_a, h0, vector)
        if why_unsupported(config, problem) is None:
            names.append(name_expression(config, problem))
    names = list(dict.fromkeys(names))
    usage = nvrtc.resource_usage(linear.SOURCE, names, arch)
    assert set(usage) == set(names)
    spilling = {name: r for name, r in usage.items() if r.spill_stores or r.spill_loads or r.stack}
    assert not spilling, spilling


@pytest.mark.parametrize("length", [1, 63, 64, 77, 4103])  # one chunk, two levels, three (4103 = 64 * 64 + 7)
@pytest.mark.parametrize("reverse", [False, True])
def test_the_reference_and_the_cumprod_yardstick_are_the_recurrence(reverse, length):
    from cute_kernels.ops.scan.linear import affine_scan_by_cumprod

    gen = torch.Generator().manual_seed(0)
    a = 0.5 + 0.5 * torch.rand(3, length, dtype=torch.float64, generator=gen)
    x = torch.randn(3, length, dtype=torch.float64, generator=gen)
    h0 = torch.randn(3, dtype=torch.float64, generator=gen)
    h, expected = h0.clone(), torch.empty_like(x)
    for t in (reversed(range(length)) if reverse else range(length)):
        h = a[:, t] * h + x[:, t]
        expected[:, t] = h
    torch.testing.assert_close(affine_scan(a, x, h0, reverse), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(affine_scan_by_cumprod(a, x, h0, reverse), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(affine_scan(torch.ones_like(x), x), torch.cumsum(x, -1), rtol=1e-12, atol=1e-12)
    zeros = a.clone()
    zeros[:, ::5] = 0  # a decay of zero restarts the recurrence: the reference takes it, the yardstick cannot
    h, expected = torch.zeros(3, dtype=torch.float64), torch.empty_like(x)
    for t in range(length):
        h = zeros[:, t] * h + x[:, t]
        expected[:, t] = h
    torch.testing.assert_close(affine_scan(zeros, x), expected, rtol=1e-12, atol=1e-12)


def test_a_call_that_needs_a_gradient_is_recorded_by_autograd():
    """ck.linear_scan has a backward: an input that requires grad sends the call through its custom op (meta
    tensors: the fake implementation gives the shape on a CPU-only torch); without grad, the eager op runs and
    refuses a meta tensor for its device."""
    x = torch.randn(4, 5, device="meta", requires_grad=True)
    y = ck.linear_scan(0.9, x, dim=0)
    assert y.requires_grad and y.grad_fn is not None and y.shape == x.shape
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA"):
        ck.linear_scan(0.9, x)
    with pytest.raises(ValueError, match=r"^out: ck\.linear_scan with out= does not support automatic"):
        ck.linear_scan(0.9, x, out=torch.empty(4, 5, device="meta"))
    with pytest.raises(TypeError, match="config= is not supported with autograd"):
        ck.linear_scan(0.9, x, config=ScanConfig(256, 16, staged=False))


@pytest.mark.parametrize("a_shape, h0_shape, dim, reverse", [
    (None, None, -1, False), ((4, 8), (4,), 1, True), ((8,), (8,), 0, False), ((4, 1), None, 1, False),
    ((), (), 0, True)])
def test_torch_compile_traces_the_forward_and_backward(a_shape, h0_shape, dim, reverse):
    """torch.compile (aot_eager) traces the custom op and its backward (itself a linear_scan the other way) for
    a number, a full and a broadcast decay and a start value; every gradient has its input's shape."""
    x = torch.randn(4, 8, device="meta", requires_grad=True)
    a = 0.5 if a_shape is None else torch.rand(a_shape, device="meta", requires_grad=True)
    h0 = None if h0_shape is None else torch.randn(h0_shape, device="meta", requires_grad=True)
    compiled = torch.compile(lambda a, x, h0: ck.linear_scan(a, x, dim=dim, reverse=reverse, h0=h0).sum(),
                             fullgraph=True, backend="aot_eager")
    compiled(a, x, h0).backward()
    for t in (a, x, h0):
        if isinstance(t, torch.Tensor):
            assert t.grad is not None and t.grad.shape == t.shape


def test_torch_compile_traces_a_cpu_scalar_decay_in_one_graph():
    """A 0-d CPU tensor decay under torch.compile(fullgraph): its value is not known while tracing, so it
    crosses the custom op's schema as a tensor on x's device (the forward only: meta tensors cannot carry a
    gradient back to the CPU; tests/test_linear_scan_gpu.py checks that gradient)."""
    x = torch.randn(4, 8, device="meta")
    compiled = torch.compile(lambda a, x: ck.linear_scan(a, x), fullgraph=True, backend="aot_eager")
    for a in (torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64)):
        result = compiled(a, x)
        assert result.shape == x.shape and result.dtype == x.dtype


def test_a_decay_that_is_not_a_number_or_a_tensor_is_refused_on_the_autograd_path():
    """(The eager path's refusal is a GPU test: it checks x's device first.)"""
    with pytest.raises(TypeError, match=r"^a: expected a tensor or a Python number, got str"):
        ck.linear_scan("0.5", torch.randn(4, 5, device="meta", requires_grad=True))


def test_cpu_tensors_are_refused_naming_x():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ck.linear_scan(0.9, torch.randn(10))


def test_a_staged_tile_needs_vectors_cp_async_can_copy():
    """16-bit inputs with one-element vectors (a reversed odd length, a 2-byte aligned view): the staged
    tile's 2-byte copies do not exist, so the predicate refuses it and the default falls back to registers."""
    odd = LinearScanProblem(1, (1 << 22) + 1, torch.bfloat16, reverse=True)
    assert odd.vector_width == 1
    assert "4 bytes or more per cp.async" in why_unsupported(ScanConfig(384, 24, staged=True), odd)
    assert not linear.default_config(odd).staged and why_unsupported(linear.default_config(odd), odd) is None
    assert linear.default_config(LinearScanProblem(1, 1 << 22, torch.bfloat16)).staged


@pytest.mark.parametrize("rows, length, dtype, vector, expected", [
    (64, 16384, torch.float32, 0, ScanConfig(256, 16, False, "rows")),
    (4096, 4096, torch.float32, 0, ScanConfig(256, 16, False, "rows")),
    (32, 16384, torch.float32, 0, ScanConfig(256, 16, False, "rows")),
    (64, 6144, torch.float32, 0, ScanConfig(128, 16, False, "rows")),    # 2048-element tiles, 32-bit
    (256, 2048, torch.bfloat16, 0, ScanConfig(256, 8, False, "rows")),   # 2048-element tiles, 16-bit
    (1024, 1024, torch.float32, 0, ScanConfig(128, 8, False, "rows")),
    (4096, 512, torch.float32, 0, ScanConfig(128, 4, False, "rows")),
    (64, 16384, torch.float32, 1, ScanConfig(128, 8, False, "rows")),    # one-element vectors: 8 loads at most
    (4096, 512, torch.bfloat16, 0, ScanConfig(256, 16, False, "inline")),  # 4 items hold no vector of 8
    (32, 65536, torch.float32, 0, ScanConfig(256, 16, False, "inline")),   # 32 rows past the rule's 16384
    (16, 1 << 20, torch.float32, 0, ScanConfig(384, 24, True, "inline")),  # 16 CTAs: measured 2.4x slower
    (64, 1000, torch.float32, 0, ScanConfig(256, 16, False, "inline")),    # no rows tile divides the row
    (4096, 8192, torch.float32, 0, ScanConfig(384, 24, True, "inline")),   # past the largest batch measured
])
def test_the_default_takes_the_rows_schedule_for_batches_of_whole_tiles(rows, length, dtype, vector, expected):
    assert linear.default_config(LinearScanProblem(rows, length, dtype, vector=vector)) == expected


def test_every_default_is_a_config_the_problem_supports():
    """Over batches from 1 to 2^14 rows, lengths that are and are not multiples of the tiles, every dtype,
    direction, decay, h0 and vector width: the default never picks a config its own predicate refuses."""
    for rows, length, dtype, reverse, scalar_a, h0, vector in itertools.product(
            (1, 2, 31, 32, 64, 300, 1 << 14), (1, 512, 1000, 2048, 6144, 16384, 65536, 1 << 20),
            linear.DTYPES, (False, True), (False, True), (False, True), (0, 1, 2, 4)):
        problem = LinearScanProblem(rows, length, dtype, reverse, scalar_a, h0, vector)
        config = linear.default_config(problem)
        assert why_unsupported(config, problem) is None, (problem, config)


def test_the_backward_of_an_empty_recurrence_is_zeros():
    from cute_kernels.torch_ops import _linear_scan_backward

    ctx = type("Ctx", (), {})()
    a, h0 = torch.rand(3, 0), torch.zeros(3)
    ctx.saved_tensors, ctx.dim, ctx.reverse, ctx.a_number = (a, h0, torch.empty(3, 0)), 1, True, 0.0
    ctx.needs_input_grad = (True, True, False, False, True, False)
    da, dx, _, _, dh0, _ = _linear_scan_backward(ctx, torch.empty(3, 0))
    assert da.shape == (3, 0) and dx.shape == (3, 0) and torch.equal(dh0, torch.zeros(3))


@pytest.fixture
def emulated_recurrence(monkeypatch):
    """ck.linear_scan on CPU tensors: the op's host path with the kernel emulated (the float32 recurrence
    over the (rows, length) tensors it is handed, in the problem's dtype, as the kernel reads them)."""
    from cute_kernels.ops.scan import linear_op
    from cute_kernels.runtime import checks as runtime_checks
    from cute_kernels.runtime.plans import CallPlans

    def prepare(config, problem, inputs, out):
        # (rows, length, inner) as the kernel reads it: inner 1 for the lookback entry, the columns entry's
        # strided dim otherwise (x's own layout, no moved copy).
        shape = (problem.rows, problem.length, problem.inner)

        def launch(a, a_number, x, h0, y):
            assert x.dtype == y.dtype == problem.dtype and (a is None or a.dtype == problem.dtype)
            assert x.is_contiguous() and y.is_contiguous() and (a is None or a.is_contiguous())
            xs = x.reshape(shape).float()
            a_full = torch.full_like(xs, a_number) if a is None else a.reshape(shape).float()
            h = torch.zeros(problem.rows, problem.inner) if h0 is None else h0.reshape(problem.rows, problem.inner).float()
            result = torch.empty_like(xs)
            for t in (range(problem.length - 1, -1, -1) if problem.reverse else range(problem.length)):
                h = a_full[:, t] * h + xs[:, t]
                result[:, t] = h
            y.view(shape).copy_(result)
        return launch

    monkeypatch.setattr(runtime_checks, "cuda_tensor", lambda name, t: t)
    monkeypatch.setattr(linear_op, "prepare", prepare)
    monkeypatch.setattr(linear_op, "prepare_columns", prepare)
    monkeypatch.setattr(linear_op, "shared_memory_limit", lambda index: 227 * 1024)
    monkeypatch.setattr(linear_op, "on_device", lambda index, fn, *args: fn(*args))
    monkeypatch.setattr(linear_op, "_PLANS", CallPlans("linear_scan_emulated"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decay", ["tensor", "0-dim", "number"])
def test_a_float32_decay_keeps_its_precision_beside_a_16_bit_x(emulated_recurrence, dtype, decay):
    """0.999 is 1.0 in bfloat16 (and 0.9999 in float16): rounded to x's dtype, a decay tensor would turn a
    moving average into a running sum. A decay of another dtype runs the scan on float32 copies, as a
    number decay runs in float32."""
    value = 0.999 if dtype == torch.bfloat16 else 0.9999
    x = torch.ones(2, 3000, dtype=dtype)
    a = {"tensor": torch.full((2, 3000), value), "0-dim": torch.tensor(value), "number": value}[decay]
    exact = (1 - value ** 3000) / (1 - value)
    got = ck.linear_scan(a, x)
    assert got.dtype == dtype
    torch.testing.assert_close(got[:, -1].double(), torch.full((2,), exact, dtype=torch.float64), rtol=1e-2, atol=0)


def test_a_cpu_scalar_tensor_decay_is_a_number(emulated_recurrence):
    """A 0-d CPU tensor decays as the number it holds (torch's elementwise ops take one beside CUDA
    tensors); the eager op refuses one that requires grad where a gradient is recorded (its number would be
    detached; ck.linear_scan's custom-op path takes it on x's device instead), and a bool one as not real."""
    from cute_kernels.ops.scan.linear_op import linear_scan as eager

    x = torch.randn(3, 40)
    expected = ck.linear_scan(0.75, x)
    for a in (torch.tensor(0.75), torch.tensor(0.75, dtype=torch.float64), torch.tensor(0.75, dtype=torch.float16)):
        torch.testing.assert_close(ck.linear_scan(a, x), expected)
    needs_grad = torch.tensor(0.75, requires_grad=True)
    with pytest.raises(ValueError, match="^a: a CPU scalar tensor that requires grad"):
        eager(needs_grad, x)
    with torch.no_grad():
        torch.testing.assert_close(eager(needs_grad, x), expected)
    with pytest.raises(TypeError, match="^a: expected a real number"):
        ck.linear_scan(torch.tensor(True), x)
    for bad in (torch.tensor(float("nan")), torch.tensor(1e39, dtype=torch.float64)):
        with pytest.raises(ValueError, match="^a: "):
            ck.linear_scan(bad, x)


def test_a_repeat_of_an_empty_recurrence_still_checks_its_decay(emulated_recurrence):
    empty = torch.empty(0, 3)
    ck.linear_scan(0.5, empty)
    for bad in (float("nan"), 1e39):
        with pytest.raises(ValueError, match="^a: "):
            ck.linear_scan(bad, empty)


@pytest.mark.parametrize("dim", [0, 1])
def test_out_may_be_x_along_any_dim(emulated_recurrence, dim):
    """The first call's check and the plan agree: out may be x itself along any dim (a moved dim runs on a
    copy of x, read whole before the result is written)."""
    x = torch.randn(5, 7)
    expected = ck.linear_scan(0.5, x.clone(), dim=dim)
    for _ in range(2):  # the first call, then the plan's repeat
        inplace = x.clone()
        assert ck.linear_scan(0.5, inplace, dim=dim, out=inplace) is inplace
        torch.testing.assert_close(inplace, expected)


def test_a_float16_decay_beside_bfloat16_x_keeps_its_precision(emulated_recurrence):
    """float16 holds 0.999 (to 0.99902); bfloat16 rounds it to 1.0: a decay of the other 16-bit dtype runs
    on float32 copies too."""
    x = torch.ones(2, 3000, dtype=torch.bfloat16)
    a = torch.full((2, 3000), 0.999, dtype=torch.float16)
    value = a[0, 0].item()
    exact = (1 - value ** 3000) / (1 - value)
    torch.testing.assert_close(ck.linear_scan(a, x)[:, -1].double(), torch.full((2,), exact, dtype=torch.float64),
                               rtol=1e-2, atol=0)


def test_numpy_dims_and_decays_are_taken_as_torch_takes_them(emulated_recurrence):
    """torch.cumsum takes a NumPy integer dim, and a NumPy float64 is a float: both are taken (a bool is
    neither, and a NumPy float32 is no Python number)."""
    import numpy as np

    from cute_kernels.ops.scan.op import check_dim

    assert check_dim(np.int64(0), 2) == 0 and check_dim(np.int32(-1), 2) == 1
    with pytest.raises(TypeError, match="^dim: expected an int, got bool"):
        check_dim(True, 2)
    x = torch.randn(3, 5)
    torch.testing.assert_close(ck.linear_scan(np.float64(0.5), x, dim=np.int64(0)), ck.linear_scan(0.5, x, dim=0))
    with pytest.raises(TypeError, match="^a: expected a tensor or a Python number, got float32"):
        ck.linear_scan(np.float32(0.5), x)


def test_a_float64_decay_or_start_is_refused_not_rounded(emulated_recurrence):
    """The kernels compute in float32 at most: a float64 decay of 1 - 1e-9 would become 1.0 and the moving
    average a running sum, so a float64 a or h0 is refused, naming the cast that accepts the rounding."""
    x = torch.ones(2, 8)
    with pytest.raises(TypeError, match=r"^a: expected float32, float16 or bfloat16 .* got torch.float64; pass a.float\(\)"):
        ck.linear_scan(torch.full((2, 8), 1 - 1e-9, dtype=torch.float64), x)
    with pytest.raises(TypeError, match=r"^h0: expected float32, float16 or bfloat16"):
        ck.linear_scan(0.5, x, h0=torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_cumprod_yardstick_is_finite_and_near_the_reference_on_every_problem_kind(dtype):
    """The report times it beside the baseline on the registry's inputs: in 16-bit it runs in float32 (a
    float16 product of 32 decays in (0.5, 1) underflows to zero)."""
    from cute_kernels.ops.scan.linear import cumprod_baseline, make_inputs, reference

    gen = torch.Generator().manual_seed(3)
    for problem in (LinearScanProblem(3, 300, dtype, reverse=True, h0=True), LinearScanProblem(1, 1000, dtype, scalar_a=True),
                    LinearScanProblem(2, 77, dtype)):
        inputs = make_inputs(problem, "cpu", gen)
        got = cumprod_baseline(problem, inputs)
        assert got.dtype == dtype and bool(got.isfinite().all())
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(got.double(), reference(problem, inputs), rtol=tol, atol=tol)


def test_a_decay_that_broadcasts_is_expanded_for_the_chunks():
    from cute_kernels.ops.scan.linear import affine_scan_by_cumprod

    x = torch.randn(4, 300, dtype=torch.float64)
    a = torch.full((1, 300), 0.9, dtype=torch.float64)
    expected = affine_scan(a.expand_as(x).clone(), x)
    torch.testing.assert_close(affine_scan(a, x), expected)
    torch.testing.assert_close(affine_scan_by_cumprod(a, x, torch.tensor(0.0, dtype=torch.float64)), expected)


def test_broadcast_rule_matches_torch_without_importing_sympy():
    """The decay's broadcast check follows torch.broadcast_shapes on every pair of a set of shapes (zero
    sizes, ones, longer and shorter ranks), in plain Python: torch's function imports sympy on its first
    call, which cost a new process's first linear_scan 1.9 s (the first-call table at b447365)."""
    import itertools
    import subprocess
    import sys

    import torch

    from pathlib import Path

    code = ("import sys, torch\n"
            "from cute_kernels.ops.scan.linear_op import _broadcast_mismatch\n"
            "before = 'sympy' in sys.modules\n"
            "_broadcast_mismatch((2, 1), (2, 3))\n"
            "print(before, 'sympy' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    before, after = done.stdout.split()
    assert after == before  # the check imported nothing that was not there already
    from cute_kernels.ops.scan.linear_op import _broadcast_mismatch

    def torch_rule(shape, target):
        try:
            full = torch.broadcast_shapes(shape, target)
        except RuntimeError:
            return "does not broadcast to"
        return None if full == tuple(target) else "broadcasts past"

    shapes = [(), (1,), (3,), (0,), (1, 3), (2, 3), (2, 1), (3, 1), (1, 1, 3), (4, 2, 3), (2, 0), (0, 3), (1, 0)]
    for shape, target in itertools.product(shapes, shapes):
        assert _broadcast_mismatch(shape, target) == torch_rule(shape, target), (shape, target)


@pytest.mark.parametrize("shape, dim", [((5, 7), 0), ((3, 9, 4), 1), ((2, 6, 3, 5), 1), ((4, 6, 2), 0)])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_strided_dim_runs_on_the_columns_entry_in_place(emulated_recurrence, monkeypatch, shape, dim, reverse):
    """A strided dim goes to the columns entry with x, a and the result in x's own layout (no moved copies:
    the emulated kernel asserts contiguity and reads them as (rows, length, inner)); the last dim stays on the
    lookback entry. Against the float64 recurrence along the dim, with h0 of the other dims."""
    from cute_kernels.ops.scan import linear_op
    from cute_kernels.ops.scan.linear import affine_scan

    seen = []
    columns = linear_op.prepare_columns
    monkeypatch.setattr(linear_op, "prepare_columns", lambda c, p, i, o: seen.append(p) or columns(c, p, i, o))
    x = torch.randn(shape)
    a = 0.5 + 0.5 * torch.rand(shape)
    h0 = torch.randn(shape[:dim] + shape[dim + 1:])
    got = ck.linear_scan(a, x, dim=dim, reverse=reverse, h0=h0)
    expected = affine_scan(a.double().movedim(dim, -1), x.double().movedim(dim, -1), h0.double(), reverse).movedim(-1, dim)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert len(seen) == 1 and seen[0].inner == math.prod(shape[dim + 1:]) and seen[0].rows == math.prod(shape[:dim])
    seen.clear()
    ck.linear_scan(a, x, dim=-1, reverse=reverse)
    assert not seen  # the last dim: the lookback entry


def test_the_columns_entrys_default_fits_its_cta_to_a_narrow_inner_dim():
    """The recurrence's columns default (256 threads, 4 rows) narrows as the scan's does: 8 bf16 columns
    are one 16-byte vector, one lane, 32 threads of 8 rows; 1024 columns keep 256 threads of 4 rows."""
    from cute_kernels import registry
    from cute_kernels.ops.scan import linear_columns

    spec = registry.get("linear_scan", "columns")
    narrow = spec.default_config(LinearScanProblem(64, 4096, torch.bfloat16, inner=8))
    assert (narrow.threads, narrow.rows) == (32, 8)
    assert linear_columns.why_unsupported(narrow, LinearScanProblem(64, 4096, torch.bfloat16, inner=8)) is None
    assert (spec.default_config(LinearScanProblem(64, 4096, torch.float32, inner=8)).threads) == 64
    assert spec.default_config(LinearScanProblem(16, 2048, torch.float32, inner=1024)) == linear_columns.DEFAULT_CONFIG


def test_the_columns_entry_refuses_more_shared_memory_than_a_kernel_may_hold():
    """The row groups' maps (8 bytes a column per thread) stay within 48 KB of static shared memory: 1024
    threads of 8 bf16 columns (64 KB) are refused by name, 512 (32 KB) pass; every candidate the default
    sweep tries is checked the same way."""
    from cute_kernels.ops.scan import linear_columns
    from cute_kernels.ops.scan.config import ColumnScanConfig

    problem = LinearScanProblem(8, 4096, torch.bfloat16, h0=True, inner=512)
    assert "shared memory" in linear_columns.why_unsupported(ColumnScanConfig(threads=1024, rows=4), problem)
    assert linear_columns.why_unsupported(ColumnScanConfig(threads=512, rows=4), problem) is None
    assert linear_columns.why_unsupported(linear_columns.DEFAULT_CONFIG, problem) is None
