"""CPU tier for ck.linear_scan: the predicate, the compile keys, every instantiation compiling, the
torch-ops reference against a plain loop, and the refusals that come before any device check."""

import pytest
import torch

from covering import pairwise

import cute_kernels as ck
from cute_kernels.ops.scan import ScanConfig
from cute_kernels.ops.scan import linear
from cute_kernels.ops.scan.linear import LinearScanProblem, affine_scan, name_expression, why_unsupported
from cute_kernels.runtime import nvrtc


def test_the_predicate_keeps_the_ordered_register_schedule():
    p = LinearScanProblem(4, 1000)
    assert why_unsupported(ScanConfig(256, 16, staged=False), p) is None
    assert "registers" in why_unsupported(ScanConfig(256, 16, staged=True), p)
    assert "in order" in why_unsupported(ScanConfig(256, 16, staged=False, lookback="early"), p)
    assert "in order" in why_unsupported(ScanConfig(256, 16, staged=False, lookback="dedicated"), p)
    assert "not one of" in why_unsupported(ScanConfig(256, 16, staged=False), LinearScanProblem(4, 10, torch.float64))
    assert "vector width" in why_unsupported(ScanConfig(256, 4, staged=False), LinearScanProblem(4, 1000, torch.float16))
    assert all(why_unsupported(c, p) is None for c in linear.candidates())


def test_a_reversed_problem_takes_a_vector_width_dividing_its_length():
    assert LinearScanProblem(1, 1002, reverse=True).vector_width == 2
    assert LinearScanProblem(1, 1002).vector_width == 4


def test_name_expression_holds_every_knob():
    p = LinearScanProblem(3, 100, torch.bfloat16, reverse=True, scalar_a=True, h0=True, vector=2)
    assert (name_expression(ScanConfig(128, 8, staged=False), p)
            == "scan::linear_scan_kernel<__nv_bfloat16, __nv_bfloat16, 128, 8, 2, true, true, true, true>")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_kind_of_recurrence_compiles(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    names = []
    for dtype, rows, reverse, scalar_a, h0, wide in pairwise(list(linear.DTYPES), (1, 4), (False, True), (False, True),
                                                            (False, True), (False, True)):
        problem = LinearScanProblem(rows, 1024, dtype, reverse, scalar_a, h0, 16 // dtype.itemsize if wide else 1)
        names.append(name_expression(linear.default_config(problem), problem))
    names = list(dict.fromkeys(names))
    cubin = nvrtc.compile_cubin(linear.SOURCE, names, arch)
    assert set(cubin.symbols) == set(names)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_reference_is_the_recurrence(reverse):
    gen = torch.Generator().manual_seed(0)
    a, x = torch.rand(3, 77, dtype=torch.float64, generator=gen), torch.randn(3, 77, dtype=torch.float64, generator=gen)
    h0 = torch.randn(3, dtype=torch.float64, generator=gen)
    h, expected = h0.clone(), torch.empty_like(x)
    for t in (reversed(range(77)) if reverse else range(77)):
        h = a[:, t] * h + x[:, t]
        expected[:, t] = h
    torch.testing.assert_close(affine_scan(a, x, h0, reverse), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(affine_scan(torch.ones_like(x), x), torch.cumsum(x, -1), rtol=1e-12, atol=1e-12)


def test_a_call_that_needs_a_gradient_is_refused_first():
    with pytest.raises(ValueError, match=r"^x: requires grad, but ck\.linear_scan has no backward yet"):
        ck.linear_scan(0.9, torch.randn(10, requires_grad=True))


def test_cpu_tensors_are_refused_naming_x():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        ck.linear_scan(0.9, torch.randn(10))
