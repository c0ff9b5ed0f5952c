"""ck.precompile: the op's validation runs, nothing is launched, and afterwards the real call compiles nothing."""

import pytest
import torch

import cute_kernels as ck
from cute_kernels.ops.gemm import sgemm as sgemm_module
from cute_kernels.runtime import dry_run
from cute_kernels.runtime import nvrtc


def test_validation_still_runs_and_the_switch_is_reset():
    with pytest.raises(ValueError, match="^a:"):
        ck.precompile(ck.sgemm, torch.ones(4, 4), torch.ones(4, 4))  # CPU tensors
    assert dry_run.is_dry_run() is False


@pytest.mark.gpu
def test_precompiled_calls_launch_nothing_then_compile_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))  # a cold NVRTC disk cache
    x = torch.randn(3, 70_001, device="cuda", dtype=torch.float64)
    vol, ker = torch.randn(2, 11, 12, 13, device="cuda"), torch.randn(2, 3, 4, device="cuda")
    out_scan = torch.full((3, 70_001), float("nan"), device="cuda", dtype=torch.float64)
    out_conv = torch.full((2, 10, 10, 10), float("nan"), device="cuda")
    a, b = torch.randn(96, 40, device="cuda"), torch.randn(40, 72, device="cuda")
    out_mm = torch.full((96, 72), float("nan"), device="cuda")
    report = ck.precompile_all([(ck.scan, (x,), {"out": out_scan, "exclusive": True}),
                                (ck.conv3d, (vol, ker), {"out": out_conv}),
                                (ck.sgemm, (a, b), {"out": out_mm, "alpha": 2.0})])
    assert [name for name, _ in report] == ["scan", "conv3d", "sgemm"] and all(s >= 0 for _, s in report)
    torch.cuda.synchronize()
    assert torch.isnan(out_scan).all() and torch.isnan(out_conv).all() and torch.isnan(out_mm).all()

    compiled_before = nvrtc.stats["compiled"]
    cute_before = len(sgemm_module._CACHE._compiled)
    ck.scan(x, out=out_scan, exclusive=True)
    ck.conv3d(vol, ker, out=out_conv)
    ck.sgemm(a, b, out=out_mm, alpha=2.0)
    torch.cuda.synchronize()
    assert nvrtc.stats["compiled"] == compiled_before and len(sgemm_module._CACHE._compiled) == cute_before
    assert torch.isfinite(out_scan).all() and torch.isfinite(out_conv).all()
    torch.testing.assert_close(out_mm, 2.0 * (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-4)
