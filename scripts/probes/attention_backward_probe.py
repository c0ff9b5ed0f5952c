"""GPU probe for the attention backward against issue 23's targets: ``tools.attention_backward.measure`` (the
report's "Attention backward" section: ours against torch's backward in the same dtype, float32 with TF32
off and 16-bit on SDPA's FLASH_ATTENTION backend, SDPA's cuDNN backward beside it, each problem's gradients
checked against float64 first), plus on sm_90 our mma.sync kernels forced in place of the wgmma ones, and for
float32 each of its paths forced: the FFMA kernels, the 3xTF32 mma.sync ones and (sm_90) the wgmma kernels on
bf16 planes, in the same loop. A Markdown table goes to
stdout and to ``$OUT/attention_backward_probe.md`` when ``$OUT`` is set.

    python scripts/probes/attention_backward_probe.py [--reps 10] [--dtypes float32,float16,bfloat16]
        [--deterministic] [--kernels]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cute_kernels.ops.attention.backward import runs_on_bf16_planes  # noqa: E402
from cute_kernels.tools import attention_backward, bench  # noqa: E402


def _mma_sync_backward(out, inputs, grad):
    """The backward with our mma.sync kernels in place of the wgmma ones (which then decline every call)."""
    from cute_kernels.ops.attention import backward
    chosen = backward.sm90_backward_why_not
    backward.sm90_backward_why_not = lambda *args: "forced onto the mma.sync kernels"
    try:
        return torch.autograd.grad(out, inputs, grad, retain_graph=True)
    finally:
        backward.sm90_backward_why_not = chosen


def _float32_backward(planes: bool, tensor_cores: bool):
    """float32: the backward with the wgmma kernels' bf16 planes (sm_90, d up to 64; ``SM90_FP32_PLANES``) and
    the 3xTF32 mma.sync kernels (``FP32_TENSOR_CORES``) switched as given; what neither takes runs on FFMA."""
    def run(out, inputs, grad):
        from cute_kernels.ops.attention import backward
        previous = backward.SM90_FP32_PLANES, backward.FP32_TENSOR_CORES
        backward.SM90_FP32_PLANES, backward.FP32_TENSOR_CORES = planes, tensor_cores
        try:
            return torch.autograd.grad(out, inputs, grad, retain_graph=True)
        finally:
            backward.SM90_FP32_PLANES, backward.FP32_TENSOR_CORES = previous
    return run


def kernel_times(backward, calls: int = 3) -> str:
    """Each CUDA kernel's GPU time per call of ``backward`` (torch.profiler over ``calls`` calls), longest
    first: where a backward's time goes between the dK/dV, dQ and D kernels (and torch's fills)."""
    from torch.profiler import ProfilerActivity, profile

    backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            backward()
        torch.cuda.synchronize()
    totals = {row.key: row.self_device_time_total / calls for row in prof.key_averages()
              if row.self_device_time_total > 0}
    return "\n".join(f"    {us:9.1f} us  {name[:110]}" for name, us in sorted(totals.items(), key=lambda kv: -kv[1]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms(True, warn_only=True): float32 without atomics")
    parser.add_argument("--kernels", action="store_true",
                        help="also our kernels' GPU time per backward (torch.profiler, 3 backwards), per problem")
    args = parser.parse_args()
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    others = {"ck mma.sync": _mma_sync_backward} if hopper else {}
    fp32_others = {"ck FFMA": _float32_backward(False, False), "ck 3xTF32 mma.sync": _float32_backward(False, True),
                   **({"ck bf16 planes": _float32_backward(True, True)} if hopper else {})}

    def show(row):
        print(attention_backward.markdown([row]).splitlines()[-1], flush=True)

    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    rows = []
    for dtype in dtypes:
        # The forced paths: 16-bit on the mma.sync kernels, float32 on each of its own.
        rows += attention_backward.measure((dtype,), reps=args.reps, on_row=show,
                                           others=others if dtype != torch.float32 else fp32_others,
                                           planes=runs_on_bf16_planes)
    if args.kernels:
        import cute_kernels as ck
        for dtype in dtypes:
            for batch, heads, kv_heads, seq, d, causal in attention_backward.PROBLEMS[dtype]:
                q, k, v = (torch.randn(batch, h, seq, d, device="cuda").to(dtype).requires_grad_()
                           for h in (heads, kv_heads, kv_heads))
                grad = torch.randn(batch, heads, seq, d, device="cuda").to(dtype)
                out = ck.attention(q, k, v, causal=causal)
                print(f"{str(dtype)[6:]} {batch} {heads} {kv_heads} {seq} {d} {int(causal)}:", flush=True)
                print(kernel_times(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)), flush=True)
    bench.report(attention_backward.markdown(rows), "attention_backward_probe.md")


if __name__ == "__main__":
    main()
