"""The staged launch of misaligned GEMMs (``ops.gemm.op.StagedLaunch``): which operands get aligned copies,
and that the copies, the zero padding and the copy back give ``alpha * a @ b + beta * c`` in the caller's
tensors. Run on CPU tensors with a stand-in for the kernel that checks what a TMA kernel needs (16-byte
aligned rows and base addresses) and computes the product in float64."""

from __future__ import annotations

import pytest
import torch

from cute_kernels.ops.gemm.hgemm import _stage_unaligned
from cute_kernels.ops.gemm.op import StagedLaunch, staged_problem
from cute_kernels.ops.gemm.problem import GemmProblem


def _aligned(t) -> bool:
    return t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


class _Kernel:
    """Stands in for a compiled aligned-only kernel: refuses unaligned tensors, writes alpha*a@b + beta*c."""

    def __init__(self, beta_zero):
        self.beta_zero, self.calls = beta_zero, 0

    def __call__(self, a, b, c, out, alpha, beta):
        assert all(_aligned(t) for t in (a, b, out)) and a.shape[1] == b.shape[0]
        self.calls += 1
        acc = alpha * (a.double() @ b.double())
        if not self.beta_zero:
            assert _aligned(c) and c.shape == out.shape
            acc += beta * c.double()
        out.copy_(acc.to(out.dtype))


def _view(rows, cols, offset):
    """A (rows, cols) float16 view with its base ``offset`` elements into a wider buffer (misaligned rows
    and base when offset or cols are not multiples of 8)."""
    return torch.randn(rows, cols + offset, dtype=torch.float64).to(torch.float16)[:, offset:]


@pytest.mark.parametrize("m, n, k, offset, beta", [(33, 21, 13, 1, 0.0), (33, 24, 16, 1, 0.5), (7, 9, 24, 0, -1.0),
                                                     (16, 16, 15, 0, 0.0), (5, 3, 1, 3, 2.0)])
def test_staged_launch_pads_copies_and_writes_back(m, n, k, offset, beta):
    a, b, c = _view(m, k, offset), _view(k, n, offset), _view(m, n, offset)
    problem = GemmProblem(m=m, n=n, k=k, dtype="float16", beta_zero=beta == 0.0,
                          a_align=8 if _aligned(a) and k % 8 == 0 else 1,
                          b_align=8 if _aligned(b) and n % 8 == 0 else 1,
                          c_align=8 if _aligned(c) and n % 8 == 0 else 1)
    aligned, stages = staged_problem(problem, 8)
    assert aligned.k % 8 == 0 and aligned.n % 8 == 0 and (aligned.a_align, aligned.b_align, aligned.c_align) == (8, 8, 8)
    kernel = _Kernel(problem.beta_zero)
    out = torch.full((m, n + offset), float("nan"), dtype=torch.float16)[:, offset:]
    StagedLaunch(kernel, aligned.k, aligned.n, stages)(a, b, None if beta == 0.0 else c, out, 1.5, beta)
    expect = 1.5 * (a.double() @ b.double()) + (beta * c.double() if beta else 0.0)
    assert kernel.calls == 1
    torch.testing.assert_close(out.double(), expect.to(torch.float16).double(), rtol=0, atol=0)


def _staged_call(m, n, k, beta, seed):
    """One StagedLaunch call on fresh misaligned operands (offset 1); returns (kernel calls, error)."""
    torch.manual_seed(seed)
    a, b, c = _view(m, k, 1), _view(k, n, 1), _view(m, n, 1)
    problem = GemmProblem(m=m, n=n, k=k, dtype="float16", beta_zero=beta == 0.0, a_align=1, b_align=1, c_align=1)
    aligned, stages = staged_problem(problem, 8)
    kernel = _Kernel(problem.beta_zero)
    out = torch.full((m, n + 1), float("nan"), dtype=torch.float16)[:, 1:]
    StagedLaunch(kernel, aligned.k, aligned.n, stages)(a, b, None if beta == 0.0 else c, out, 1.5, beta)
    expect = 1.5 * (a.double() @ b.double()) + (beta * c.double() if beta else 0.0)
    return kernel.calls, (out.double() - expect.to(torch.float16).double()).abs().max().item()


def test_kept_buffers_keep_their_pads_zero_across_calls_and_shapes():
    """The kept staging buffers serve every later call of their shape, and a call whose data is narrower
    than an earlier one's in the same padded shape (K 13 after K 15, both padded to 16) gets its own buffer:
    the earlier data never lands in its pad."""
    from cute_kernels.runtime import workspace

    workspace.clear_staging()
    for seed, (m, n, k) in enumerate([(33, 21, 15), (33, 21, 15), (33, 21, 13), (33, 19, 15)]):
        assert _staged_call(m, n, k, 0.5, seed) == (1, 0.0)
    # a, b, c and the result of the first shape; the K-13 call adds a and b (c and the result are the same
    # regions); the N-19 one adds b, c and the result (a is the first call's).
    assert len(workspace._staging) == 4 + 2 + 3


def test_staging_buffers_are_per_thread_and_bounded(monkeypatch):
    import threading

    from cute_kernels.runtime import workspace

    workspace.clear_staging()
    device = torch.device("cpu")
    mine = workspace.staging_buffer("a", device, 0, torch.float16, (8, 16), (8, 15))
    assert workspace.staging_buffer("a", device, 0, torch.float16, (8, 16), (8, 15)) is mine
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(
        workspace.staging_buffer("a", device, 0, torch.float16, (8, 16), (8, 15))))
    worker.start()
    worker.join()
    assert theirs[0][0].data_ptr() != mine[0].data_ptr()
    assert mine[1].shape == (8, 15) and not mine[0].any()
    # A buffer over a sixteenth of the budget is not kept: the call copies into fresh memory.
    monkeypatch.setattr(workspace, "STAGING_BYTES", 16 * 8 * 16 * 2 - 1)
    assert workspace.staging_buffer("a", device, 0, torch.float16, (8, 16), (8, 14)) is None
    kept = len(workspace._staging)
    assert _staged_call(8, 9, 15, 0.0, 0) == (1, 0.0) and len(workspace._staging) == kept
    # Sixteen buffers of a sixteenth fill the budget; the next one empties the cache first.
    monkeypatch.setattr(workspace, "STAGING_BYTES", 16 * 8 * 16 * 2)
    workspace.clear_staging()
    for stream in range(16):
        assert workspace.staging_buffer("b", device, stream, torch.float16, (8, 16), (8, 13)) is not None
    assert len(workspace._staging) == 16
    fresh = workspace.staging_buffer("b", device, 16, torch.float16, (8, 16), (8, 13))
    assert [pair is fresh for pair in workspace._staging.values()] == [True]


def test_kept_buffers_serve_inference_mode_then_training_without_history():
    """A buffer made by a call under inference mode is a plain tensor, so a later ordinary call can copy into
    it; an operand that requires grad leaves no autograd history on the kept buffer."""
    from cute_kernels.runtime import workspace

    workspace.clear_staging()
    with torch.inference_mode():
        assert _staged_call(33, 21, 15, 0.0, 0) == (1, 0.0)
    assert _staged_call(33, 21, 15, 0.0, 1) == (1, 0.0)
    a = _view(33, 15, 1).float().requires_grad_()
    b = _view(15, 21, 1).float()
    problem = GemmProblem(m=33, n=21, k=15, dtype="float32", a_align=1, b_align=1, c_align=1)
    aligned, stages = staged_problem(problem, 4)
    StagedLaunch(_Kernel(True), aligned.k, aligned.n, stages)(a, b, None, torch.empty(33, 21), 1.0, 0.0)
    assert all(buf.grad_fn is None and not buf.requires_grad for buf, _ in workspace._staging.values())


def test_staged_problem_copies_only_what_is_misaligned():
    base = dict(m=64, n=64, k=64, dtype="float16", a_align=8, b_align=8, c_align=8)
    _, stages = staged_problem(GemmProblem(**{**base, "a_align": 1}), 8)
    assert stages == (True, False, False, False)
    _, stages = staged_problem(GemmProblem(**{**base, "k": 63, "a_align": 1}), 8)
    assert stages == (True, True, False, False)  # B needs zero rows past K
    _, stages = staged_problem(GemmProblem(**{**base, "n": 63, "b_align": 1, "c_align": 1, "beta_zero": False}), 8)
    assert stages == (False, True, True, True)
    _, stages = staged_problem(GemmProblem(**{**base, "n": 63, "b_align": 1, "c_align": 1}), 8)
    assert stages == (False, True, False, True)  # beta == 0: C is never read, so never copied


def test_hgemm_stages_only_large_misaligned_problems_on_sm90():
    big = dict(m=2048, n=2048, k=2047, dtype="float16", a_align=1, b_align=8, c_align=8)
    assert _stage_unaligned(GemmProblem(**big))
    assert not _stage_unaligned(GemmProblem(**{**big, "a_align": 8, "k": 2048}))  # aligned: runs in place
    assert not _stage_unaligned(GemmProblem(**{**big, "sm": 80}))  # no Hopper variant to stage for
    assert not _stage_unaligned(GemmProblem(**{**big, "m": 100, "n": 100, "k": 101}))  # too small to pay


def test_sgemm_stages_only_large_misaligned_problems_and_not_gemv_or_decode_calls():
    from cute_kernels.ops.gemm.sgemm import _stage_unaligned as sgemm_stages

    big = dict(m=2048, n=3001, k=2000, a_align=4, b_align=1, c_align=1)
    assert sgemm_stages(GemmProblem(**big))
    assert not sgemm_stages(GemmProblem(**{**big, "n": 3000, "b_align": 4, "c_align": 4}))  # aligned: in place
    assert not sgemm_stages(GemmProblem(**{**big, "m": 777}))  # too small to pay
    assert not sgemm_stages(GemmProblem(**{**big, "m": 32, "k": 999999}))  # decode-sized rows
    assert not sgemm_stages(GemmProblem(**{**big, "m": 8, "k": 999999, "a_align": 1, "b_major": "k"}))  # the GEMV's
    assert not sgemm_stages(GemmProblem(**{**big, "batch": 2}))
