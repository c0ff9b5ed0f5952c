"""GPU probe for the attention backward against issue 23's targets: ``torch.autograd.grad`` through
``ck.attention`` against the same through ``torch.nn.functional.scaled_dot_product_attention``, backward alone
(the forward's graph is built once and kept), both timed with ``tools.bench.interleaved_times`` (medians,
interleaved rep by rep). float32: torch's own backend choice, TF32 off (target: 1.5x); float16/bfloat16:
SDPA restricted to the FLASH_ATTENTION backend (target: 1.0x), and in the same loop SDPA's cuDNN backward
and, on sm_90, our mma.sync kernels forced in place of the wgmma ones. A Markdown table goes to stdout and
to ``$OUT/attention_backward_probe.md`` when ``$OUT`` is set.

    python scripts/probes/attention_backward_probe.py [--reps 10] [--dtypes float32,float16,bfloat16]
        [--deterministic] [--kernels]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

# (batch, heads, kv_heads, seq, d, causal) per dtype
PROBLEMS = {
    "float32": [(2, 16, 16, 2048, 64, False), (2, 16, 16, 2048, 64, True), (2, 16, 16, 2048, 128, False),
                (2, 16, 16, 2048, 128, True), (1, 32, 8, 2048, 128, True)],
    "16-bit": [(4, 16, 16, 4096, 64, False), (4, 16, 16, 4096, 64, True), (4, 16, 16, 4096, 128, False),
               (4, 16, 16, 4096, 128, True), (1, 32, 8, 4096, 128, True)],
}


def backward_flops(batch, heads, seq, d, causal):
    """2.5x the forward's 4 * B * H * S^2 * d (five S x S x d products against the forward's two), halved
    when causal."""
    flops = 2.5 * 4 * batch * heads * seq * seq * d
    return flops / 2 if causal else flops


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms(True, warn_only=True): float32 without atomics")
    parser.add_argument("--kernels", action="store_true",
                        help="also each of our kernels' GPU time per backward (torch.profiler, 3 backwards)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = ["| dtype B H H_kv S d causal | ck backward us | torch backward us | speedup | ck TFLOP/s "
            "| ck mma.sync us | cuDNN us | ck vs cuDNN |",
            "|---|---|---|---|---|---|---|---|"]
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        for batch, heads, kv_heads, seq, d, causal in PROBLEMS["float32" if dtype == torch.float32 else "16-bit"]:
            def rand(h):
                return torch.randn(batch, h, seq, d, generator=gen, device="cuda").to(dtype).requires_grad_()
            q, k, v = rand(heads), rand(kv_heads), rand(kv_heads)
            grad = torch.randn(batch, heads, seq, d, generator=gen, device="cuda").to(dtype)
            ours = ck.attention(q, k, v, causal=causal)
            backend = SDPBackend.FLASH_ATTENTION if dtype != torch.float32 else None
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != heads)
            fns = {
                "ck": lambda _r: torch.autograd.grad(ours, (q, k, v), grad, retain_graph=True),
                "torch": lambda _r: torch.autograd.grad(theirs, (q, k, v), grad, retain_graph=True),
            }
            if dtype != torch.float32:
                fns["mma"] = lambda _r: _mma_sync_backward(ours, (q, k, v), grad)
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != heads)
                    torch.autograd.grad(cudnn, (q, k, v), grad, retain_graph=True)
                    fns["cudnn"] = lambda _r: torch.autograd.grad(cudnn, (q, k, v), grad, retain_graph=True)
                except RuntimeError as e:  # cuDNN declines some shapes (grouped-query heads on some versions)
                    print(f"cuDNN: {str(e).splitlines()[0][:120]}", flush=True)
            times = bench.interleaved_times(fns, reps=args.reps, warmup=2)
            ck_us, torch_us = (statistics.median(times[name]) for name in ("ck", "torch"))
            mma_us, cudnn_us = (statistics.median(times[name]) if name in times else None for name in ("mma", "cudnn"))
            tflops = backward_flops(batch, heads, seq, d, causal) / ck_us / 1e6
            extra = (f"{mma_us:.0f}" if mma_us else "-", f"{cudnn_us:.0f}" if cudnn_us else "-",
                     f"{cudnn_us / ck_us:.2f}x" if cudnn_us else "-")
            rows.append(f"| {str(dtype)[6:]} {batch} {heads} {kv_heads} {seq} {d} {int(causal)} | {ck_us:.0f} | "
                        f"{torch_us:.0f} | {torch_us / ck_us:.2f}x | {tflops:.1f} | {' | '.join(extra)} |")
            print(rows[-1], flush=True)
            if args.kernels:
                print(kernel_times(lambda: torch.autograd.grad(ours, (q, k, v), grad, retain_graph=True)), flush=True)
    bench.report("\n".join(rows), "attention_backward_probe.md")


def _mma_sync_backward(out, inputs, grad):
    """The backward with our mma.sync kernels in place of the wgmma ones (which then decline every call)."""
    from cute_kernels.ops.attention import backward
    chosen = backward.sm90_backward_why_not
    backward.sm90_backward_why_not = lambda *args: "forced onto the mma.sync kernels"
    try:
        return torch.autograd.grad(out, inputs, grad, retain_graph=True)
    finally:
        backward.sm90_backward_why_not = chosen


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


if __name__ == "__main__":
    main()
