"""The attention backward's benchmark (issue 23): ``torch.autograd.grad`` through ``ck.attention`` against the
same through ``torch.nn.functional.scaled_dot_product_attention``, the backward alone (each forward's graph
is built once and kept), timed with ``bench.interleaved_times`` (CUDA events, medians, interleaved rep by
rep). float32 runs against torch's own backend choice with TF32 off; float16/bfloat16 against SDPA's
FLASH_ATTENTION backend, with its cuDNN backward timed in the same loop where cuDNN takes the call.

Before it is timed, each problem's gradients are checked against float64 autograd on one group of heads
(batch 0, key/value head 0 and the query heads it serves: the whole of those heads' dq, dk and dv), with
torch's gradients in the same dtype as the oracle's baseline (``runtime.oracle``), as
tests/test_attention_backward_gpu.py checks every case. Used by ``python -m cute_kernels bench`` (the
report's "Attention backward" section) and ``scripts/probes/attention_backward_probe.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from typing import Callable

import torch

# (batch, heads, kv_heads, seq, d, causal) per dtype: issue 23's problems.
PROBLEMS = {
    torch.float32: [(2, 16, 16, 2048, 64, False), (2, 16, 16, 2048, 64, True), (2, 16, 16, 2048, 128, False),
                    (2, 16, 16, 2048, 128, True), (1, 32, 8, 2048, 128, True)],
    torch.float16: [(4, 16, 16, 4096, 64, False), (4, 16, 16, 4096, 64, True), (4, 16, 16, 4096, 128, False),
                    (4, 16, 16, 4096, 128, True), (1, 32, 8, 4096, 128, True)],
}
PROBLEMS[torch.bfloat16] = PROBLEMS[torch.float16]
# Hopper's dense peaks (TFLOP/s; the H100 SXM and the H200 share them): FP32 on the CUDA cores, FP16/BF16
# on the tensor cores.
HOPPER_PEAK_TFLOPS = {torch.float32: 67.0, torch.float16: 989.0, torch.bfloat16: 989.0}
# float32 as three bf16 planes (backward.SM90_FP32_PLANES) takes six bf16 products per product on the tensor
# cores: a sixth of their peak is its ceiling.
PLANES_PEAK_TFLOPS = HOPPER_PEAK_TFLOPS[torch.bfloat16] / 6


@dataclasses.dataclass
class Row:
    dtype: torch.dtype
    problem: tuple  # (batch, heads, kv_heads, seq, d, causal)
    ours_us: float
    torch_us: float
    cudnn_us: float | None  # None: not a 16-bit call, or cuDNN declined it
    others_us: dict  # further timed callables by name (the probe's)
    verified: bool
    detail: str  # why it is not verified, and what was not timed (cuDNN declining the call)
    on_planes: bool = False  # float32 that ran as bf16 planes on the tensor cores

    @property
    def peak_tflops(self) -> float:
        """Hopper's dense peak of the units the backward ran on (PLANES_PEAK_TFLOPS for the planes)."""
        return PLANES_PEAK_TFLOPS if self.on_planes else HOPPER_PEAK_TFLOPS[self.dtype]

    @property
    def speedup(self) -> float:
        return self.torch_us / self.ours_us

    @property
    def tflops(self) -> float:
        batch, heads, _, seq, d, causal = self.problem
        return backward_flops(batch, heads, seq, d, causal) / self.ours_us / 1e6


def backward_flops(batch, heads, seq, d, causal):
    """2.5x the forward's 4 * B * H * S^2 * d (five S x S x d products against the forward's two), halved
    when causal."""
    flops = 2.5 * 4 * batch * heads * seq * seq * d
    return flops / 2 if causal else flops


def _check_group(q, k, v, grad, ours, theirs, causal) -> tuple[bool, str]:
    """Our gradients of batch 0's first key/value head and its query heads against float64 autograd, torch's
    same-dtype gradients as the baseline."""
    from ..runtime import oracle

    group = q.shape[1] // k.shape[1]
    pick = (lambda t: t[:1, :group]), (lambda t: t[:1, :1]), (lambda t: t[:1, :1])
    leaves = [p(t).detach().double().requires_grad_() for p, t in zip(pick, (q, k, v))]
    qq, kk, vv = leaves
    kk, vv = kk.expand(-1, group, -1, -1), vv.expand(-1, group, -1, -1)
    s = (qq @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    out = torch.softmax(s, dim=-1) @ vv
    exact = torch.autograd.grad(out, leaves, grad[:1, :group].double())
    for name, p, mine, e, t in zip(("dq", "dk", "dv"), pick, ours, exact, theirs):
        verdict = oracle.compare(p(mine), e, p(t), scale=e.abs().amax().clamp_min(1e-30))
        if not verdict:
            return False, f"{name}: {verdict.detail}"
    return True, ""


def measure(dtypes=tuple(PROBLEMS), *, reps: int = 10, others: dict[str, Callable] | None = None,
            on_row: Callable[[Row], None] | None = None, planes: Callable | None = None,
            remember: Callable[[str, Callable[[], Row]], Row] | None = None) -> list[Row]:
    """One Row per problem of each dtype. ``others``: name -> fn(out, inputs, grad) giving gradients, checked
    like ours and timed in the same loop (the probe's forced kernels); ``on_row`` sees each row as it is
    measured; ``planes(q, k, v, grad)``: whether the op runs that float32 backward as bf16 planes (the
    caller's, from the op's routing: tools reach the ops only through their public calls); ``remember(key,
    measure)``: a row an earlier run measured, else ``measure()``'s (the report's checkpoint). A problem
    that raises becomes an unverified row saying why (NaN times), and the rest go on."""
    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    rows = []
    try:
        torch.set_float32_matmul_precision("highest")  # TF32 off, as the float32 baseline is defined
        torch.backends.cudnn.allow_tf32 = False
        gen = torch.Generator(device="cuda").manual_seed(0)
        for dtype in dtypes:
            for problem in PROBLEMS[dtype]:
                def one(dtype=dtype, problem=problem) -> Row:
                    try:
                        return _measure_one(dtype, problem, gen, reps, others or {}, planes)
                    except Exception as e:  # noqa: BLE001 - reported in the row, the report goes on
                        nan = float("nan")
                        return Row(dtype, problem, nan, nan, None, {}, False, f"{type(e).__name__}: {e}".splitlines()[0])

                row = one() if remember is None else remember(f"{dtype} {problem}", one)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]
    return rows


def _measure_one(dtype, problem, gen, reps: int, others: dict[str, Callable], planes: Callable | None) -> Row:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cute_kernels as ck

    from . import bench

    batch, heads, kv_heads, seq, d, causal = problem

    def rand(h):
        return torch.randn(batch, h, seq, d, generator=gen, device="cuda").to(dtype).requires_grad_()
    q, k, v = rand(heads), rand(kv_heads), rand(kv_heads)
    inputs = (q, k, v)
    grad = torch.randn(batch, heads, seq, d, generator=gen, device="cuda").to(dtype)
    gqa = kv_heads != heads
    ours = ck.attention(q, k, v, causal=causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if dtype != torch.float32 else contextlib.nullcontext():
        theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    fns = {"ours": lambda _r: torch.autograd.grad(ours, inputs, grad, retain_graph=True),
           "torch": lambda _r: torch.autograd.grad(theirs, inputs, grad, retain_graph=True)}
    torch_grads = fns["torch"](0)
    verified, detail = _check_group(q, k, v, grad, fns["ours"](0), torch_grads, causal)
    for name, fn in others.items():
        fns[name] = lambda _r, fn=fn: fn(ours, inputs, grad)
        ok, why = _check_group(q, k, v, grad, fns[name](0), torch_grads, causal)
        if not ok:
            verified, detail = False, f"{name} {why}"
    cudnn_declined = ""
    if dtype != torch.float32:
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            torch.autograd.grad(cudnn, inputs, grad, retain_graph=True)
            fns["cudnn"] = lambda _r: torch.autograd.grad(cudnn, inputs, grad, retain_graph=True)
        except Exception as e:  # noqa: BLE001 - cuDNN declines some calls (grouped-query heads on some versions)
            cudnn_declined = f"cuDNN declined: {str(e).splitlines()[0][:100]}" if str(e) else "cuDNN declined"
    times = {name: statistics.median(t) for name, t in bench.interleaved_times(fns, reps=reps, warmup=2).items()}
    if cudnn_declined:
        detail = f"{detail}; {cudnn_declined}" if detail else cudnn_declined
    on_planes = planes is not None and planes(q, k, v, grad)
    return Row(dtype, problem, times.pop("ours"), times.pop("torch"), times.pop("cudnn", None), times, verified,
               detail, on_planes)


def markdown(rows: list[Row]) -> str:
    """The rows as a Markdown table: times in us, TFLOP/s (backward_flops) and % of Hopper's dense peak on
    the units each ran on (``Row.peak_tflops``)."""
    others = sorted({name for row in rows for name in row.others_us})
    head = (["dtype", "B H H_kv S d causal", "ours (us)", "torch (us)", "speed-up", "TFLOP/s", "% of Hopper peak",
             "cuDNN (us)", "ours vs cuDNN"] + [f"{name} (us)" for name in others] + ["verified"])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for row in rows:
        batch, heads, kv_heads, seq, d, causal = row.problem
        cells = [str(row.dtype).removeprefix("torch."), f"{batch} {heads} {kv_heads} {seq} {d} {int(causal)}",
                 f"{row.ours_us:.0f}", f"{row.torch_us:.0f}", f"{row.speedup:.2f}x", f"{row.tflops:.1f}",
                 f"{100 * row.tflops / row.peak_tflops:.0f}%" + (" (planes)" if row.on_planes else ""),
                 "-" if row.cudnn_us is None else f"{row.cudnn_us:.0f}",
                 "-" if row.cudnn_us is None else f"{row.cudnn_us / row.ours_us:.2f}x"]
        cells += [f"{row.others_us[name]:.0f}" if name in row.others_us else "-" for name in others]
        cells.append(("yes" if row.verified else "NO") + (f" ({row.detail})" if row.detail else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
