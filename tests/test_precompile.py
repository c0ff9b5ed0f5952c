"""ck.precompile: the op's validation runs, nothing is launched, and afterwards the real call compiles nothing."""

import pytest
from scan_stub import route_scan_to_stub
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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_a_precompiled_attention_backward_compiles_nothing(dtype, tmp_path, monkeypatch):
    """``precompile``'s attention backward (the forward with lse and the backward, run under the dry-run
    switch) compiles kernels on a cold cache, and a real backward of the same problem through autograd then
    compiles nothing (on sm_90, 16-bit: the wgmma kernels; elsewhere and in float32 the others)."""
    from cute_kernels.ops.attention import backward
    from cute_kernels.ops.attention.problem import AttentionProblem

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))  # a cold NVRTC disk cache
    nvrtc.clear_memory_cache()  # and nothing an earlier test loaded
    problem = AttentionProblem(1, 4, 300, 300, 64, dtype, True, kv_heads=2, vector=8 if dtype != torch.float32 else 4)
    compiled_before = nvrtc.stats["compiled"]
    backward.precompile_backward(problem, torch.cuda.current_device())
    assert nvrtc.stats["compiled"] > compiled_before
    compiled_before = nvrtc.stats["compiled"]
    q = torch.randn(1, 4, 300, 64, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    out = ck.attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    torch.cuda.synchronize()
    assert nvrtc.stats["compiled"] == compiled_before
    assert all(torch.isfinite(g).all() for g in grads)


def test_precompile_leaves_out_untouched_where_a_copy_follows_the_kernel(monkeypatch):
    """A call whose result the op copies from the kernel's (a narrowing dtype=, a moved dim) would copy
    uninitialised memory into ``out`` when the launch is skipped: precompile writes nothing there. CPU
    tensors, the kernel emulated (skipped as PackedLaunch skips it under the switch)."""
    from cute_kernels.ops.scan import op as scan_op

    def launch_for(variant, problem):
        def launch(x, y, *rest):
            if not dry_run.is_dry_run():
                y.copy_(torch.cumsum(x.to(torch.int64), -1))
        return launch

    route_scan_to_stub(monkeypatch, launch_for)
    x = torch.arange(1000, dtype=torch.int32)
    out = torch.full((1000,), 7, dtype=torch.int32)
    ck.precompile(scan_op.scan, x, dtype=torch.int32, out=out)  # an int32 sum: the kernel writes int64
    assert (out == 7).all()
    assert torch.equal(scan_op.scan(x, dtype=torch.int32, out=out), torch.cumsum(x, 0, dtype=torch.int32))
