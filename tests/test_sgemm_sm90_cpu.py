"""CPU tier for the Hopper 3xTF32 SGEMM (legacy_cuda/sgemm_sm90.cu, not yet a registry entry): it compiles
for sm_90a with no spills and wgmmas ptxas does not serialise, and for sm_80 (an empty body there); its
parameter block matches the kernel's; what its tensor maps cannot describe is refused before a launch."""

import ctypes

import pytest
import torch

from cute_kernels.ops.gemm import sgemm_sm90 as S
from cute_kernels.runtime import nvrtc


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_compiles_without_spills_or_serialised_wgmmas(arch):
    names = [S.name_expression(b_k_major) for b_k_major in (False, True)]
    for name, resources in nvrtc.resource_usage(S.SOURCE, names, arch).items():
        assert resources.spill_stores == 0 and resources.spill_loads == 0 and resources.stack == 0, name
        assert not resources.wgmma_serialized, name


def test_parameters_match_the_kernel():
    # sgemm_sm90.cu static_asserts sizeof(Params) == 320 and the shared-memory size SHARED_BYTES counts.
    assert ctypes.sizeof(S.Params) == S.PARAMS_BYTES == 320
    assert S.Params.d.offset == 256 and S.Params.beta.offset == 312
    assert S.SHARED_BYTES <= 227 * 1024


def test_what_the_maps_cannot_describe_is_refused():
    a, b = torch.randn(64, 40), torch.randn(40, 48)
    assert S.why_not(a, b, 90) is None
    assert "sm_90" in S.why_not(a, b, 80)
    assert "a row-major 2-D a" in S.why_not(a.t().contiguous().t(), b, 90)
    assert "a row-major 2-D a" in S.why_not(a, torch.randn(40, 96)[:, ::2], 90)  # b neither row- nor column-major
    assert S.why_not(a, torch.randn(48, 40).t(), 90) is None  # x @ w.t()
    assert S._maps(a, torch.randn(48, 40).t())[1] == ((40, 48, 1, 1), (160, 160 * 48, 160 * 48), (32, 128, 1, 1))
    assert "float32" in S.why_not(a.half(), b.half(), 90)
    assert "stride" in S.why_not(torch.randn(64, 41)[:, :40], b, 90)  # rows of 41 floats: not 16-byte multiples
    assert "K = 0" in S.why_not(torch.randn(64, 0), torch.randn(0, 48), 90)
    assert "M, N or K = 0" in S.why_not(torch.randn(0, 40), b, 90)
    assert "K differs" in S.why_not(a, torch.randn(44, 48), 90)
    assert "out:" in S.why_not(a, b, 90, out=torch.empty(64, 47))
    assert "c:" in S.why_not(a, b, 90, c=torch.empty(48, 64).t())
