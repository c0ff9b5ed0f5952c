"""GPU probe for issue 23's forward targets beyond plain attention: a sliding window of 1024 at S 8192
against the same call without the window (target: 3x faster), and the training forward (``return_lse``,
what a forward with ``requires_grad`` inputs runs) against the plain forward and SDPA's flash forward on
inputs that require grad (which saves its log-sum-exp too). Every column of a row is timed in one loop with
``tools.bench.interleaved_times`` (events, medians, interleaved rep by rep). A Markdown table goes to stdout
and to ``$OUT/attention_window_probe.md`` when ``$OUT`` is set. Numerics: tests/test_attention_gpu.py.

    python scripts/probes/attention_window_probe.py [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import cute_kernels as ck  # noqa: E402
from cute_kernels.tools import bench  # noqa: E402

# (batch, heads, seq, d, dtype, causal, window)
WINDOWS = [(1, 8, 8192, 128, torch.float16, True, (1024, 0)), (1, 32, 8192, 128, torch.bfloat16, True, (1024, 0)),
           (1, 8, 8192, 128, torch.float16, False, (1024, 1024)), (1, 16, 8192, 64, torch.float16, True, (1024, 0)),
           (1, 8, 8192, 128, torch.float16, True, (256, 0))]
# (batch, heads, seq, d, dtype, causal)
TRAINING = [(4, 16, 4096, 128, torch.float16, True), (4, 16, 4096, 128, torch.float16, False),
            (4, 16, 4096, 64, torch.float16, True), (4, 16, 4096, 128, torch.bfloat16, True)]


def _sdpa_flash(q, k, v, causal):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _qkv(batch, heads, seq, d, dtype, gen):
    return tuple(torch.randn(batch, heads, seq, d, generator=gen, device="cuda").to(dtype) for _ in range(3))


def _median_us(fns, reps):
    return {name: statistics.median(times) for name, times in bench.interleaved_times(fns, reps=reps).items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = ["## Sliding windows", "",
            "| dtype B H S d causal window | ck, window (us) | ck, no window (us) | no window / window | "
            "SDPA flash, no window (us) |", "|---|---|---|---|---|"]
    for batch, heads, seq, d, dtype, causal, window in WINDOWS:
        q, k, v = _qkv(batch, heads, seq, d, dtype, gen)
        t = _median_us({"window": lambda _r: ck.attention(q, k, v, causal=causal, window=window),
                        "plain": lambda _r: ck.attention(q, k, v, causal=causal),
                        "sdpa": lambda _r: _sdpa_flash(q, k, v, causal)}, args.reps)
        rows.append(f"| {str(dtype)[6:]} {batch} {heads} {seq} {d} {int(causal)} {window} | {t['window']:.1f} | "
                    f"{t['plain']:.1f} | {t['plain'] / t['window']:.2f}x | {t['sdpa']:.1f} |")
        print(rows[-1], flush=True)
    rows += ["", "## Training forward (return_lse)", "",
             "| dtype B H S d causal | ck with lse (us) | ck plain (us) | SDPA flash, inputs requiring grad (us) | "
             "SDPA / ck with lse |", "|---|---|---|---|---|"]
    for batch, heads, seq, d, dtype, causal in TRAINING:
        q, k, v = _qkv(batch, heads, seq, d, dtype, gen)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        t = _median_us({"lse": lambda _r: ck.attention(q, k, v, causal=causal, return_lse=True),
                        "plain": lambda _r: ck.attention(q, k, v, causal=causal),
                        "sdpa": lambda _r: _sdpa_flash(qg, kg, vg, causal)}, args.reps)
        rows.append(f"| {str(dtype)[6:]} {batch} {heads} {seq} {d} {int(causal)} | {t['lse']:.1f} | {t['plain']:.1f} | "
                    f"{t['sdpa']:.1f} | {t['sdpa'] / t['lse']:.2f}x |")
        print(rows[-1], flush=True)
    bench.report("\n".join(rows), "attention_window_probe.md")


if __name__ == "__main__":
    main()
