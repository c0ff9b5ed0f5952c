"""GEMMs whose operands or result hold more than 2^31 elements: every element offset past int32 must be
computed in 64 bits. Checks rows on both sides of the 2^31 boundary against float64 with the shared oracle
(full references would take tens of GB). Each case allocates 4-9 GB."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.gemm import hgemm as H
from cute_kernels.ops.gemm import reference
from cute_kernels.ops.gemm.hgemm_sm80_config import HgemmConfig
from cute_kernels.ops.gemm.hgemm_sm90_config import HgemmSm90Config
from cute_kernels.runtime import oracle

pytestmark = [pytest.mark.gpu, pytest.mark.memory_heavy, pytest.mark.usefixtures("exact_fp32_torch")]

BIG = (1 << 31) + (1 << 15)  # elements: just past what an int32 offset can address


def _randn(*shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _check_rows(out, a, b, rows, dtype):
    a_rows, got = a[rows], out[rows]
    ref = a_rows.double() @ b.double()
    theirs = torch.mm(a_rows, b)
    if dtype == torch.float32:
        verdict = oracle.compare(got, ref, theirs, scale=reference.gemm_scale(a_rows, b))
    else:
        verdict = reference.gemm_verdict(got, a_rows, b, baseline=theirs)
    assert verdict, verdict.detail


def _run(dtype, variant, a, b):
    if dtype == torch.float32:
        return ck.sgemm(a, b)
    config = {"sm80": HgemmConfig(), "sm90": HgemmSm90Config(cluster_m=2)}[variant]
    return H.hgemm(a, b, config=config)


CASES = [(torch.float32, None), (torch.float16, "sm80"), (torch.float16, "sm90")]


@pytest.mark.parametrize("dtype, variant", CASES, ids=["sgemm", "hgemm-sm80", "hgemm-sm90"])
def test_a_past_int32(dtype, variant):
    k = 1 << 15
    m = BIG // k + 1  # A: (m, k) with m * k > 2^31
    a, b = _randn(m, k, dtype=dtype), _randn(k, 72, dtype=dtype)
    out = _run(dtype, variant, a, b)
    _check_rows(out, a, b, torch.tensor([0, 1, m // 2, m - 2, m - 1], device="cuda"), dtype)


@pytest.mark.parametrize("dtype, variant", CASES, ids=["sgemm", "hgemm-sm80", "hgemm-sm90"])
def test_result_past_int32(dtype, variant):
    n = 1 << 15
    m = BIG // n + 1  # D: (m, n) with m * n > 2^31
    a, b = _randn(m, 64, dtype=dtype), _randn(64, n, dtype=dtype)
    out = _run(dtype, variant, a, b)
    _check_rows(out, a, b, torch.tensor([0, m // 2, m - 1], device="cuda"), dtype)
