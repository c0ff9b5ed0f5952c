"""How torch computes alpha * a @ b in one cuBLAS call: matmul then mul_ (two kernels) against addmm / baddbmm
with beta 0 on a broadcast zero (one, if torch skips the bias copy at beta 0), GPU time (interleaved medians)
and kernels launched (profiler), beside plain matmul.

    PYTHONPATH=. python scripts/probes/gemm_alpha_baseline.py
"""

import statistics

import torch

from cute_kernels.tools.bench import interleaved_times, wall_us_per_call

SHAPES = [(1, 4096, 4096, 4096), (1, 8192, 8192, 8192), (1, 256, 256, 256), (32, 256, 256, 256), (1, 16, 4096, 4096)]


def main():
    dev = "cuda"
    for batch, m, n, k in SHAPES:
        for dtype in (torch.float16, torch.float32):
            lead = (batch,) if batch > 1 else ()
            a = torch.randn(*lead, m, k, device=dev, dtype=dtype)
            b = torch.randn(*lead, k, n, device=dev, dtype=dtype)
            zero = torch.zeros((), device=dev, dtype=dtype)
            add = torch.baddbmm if batch > 1 else torch.addmm
            fns = {"matmul": lambda *_: torch.matmul(a, b), "matmul.mul_": lambda *_: torch.matmul(a, b).mul_(1.5),
                   "addmm beta0": lambda *_: add(zero, a, b, beta=0, alpha=1.5)}
            product = torch.matmul(a.double(), b.double())  # plain matmul computes it without alpha
            err = {name: (fn().double() - (product if name == "matmul" else 1.5 * product)).abs().max().item()
                   for name, fn in fns.items()}
            kernels = {}
            for name, fn in fns.items():
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                kernels[name] = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            times = interleaved_times(fns, reps=20, device=dev)
            walls = {name: wall_us_per_call(fn, calls=100) for name, fn in fns.items()}
            print(f"{batch}x{m}x{n}x{k} {str(dtype)[6:]}: " + "; ".join(
                f"{name} {statistics.median(times[name]):.1f} us GPU, {walls[name]:.1f} us wall, {kernels[name]} kernels, "
                f"err {err[name]:.2e}" for name in fns))


if __name__ == "__main__":
    main()
