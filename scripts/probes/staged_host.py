"""Where a staged (misaligned, zero-padded) GEMM call spends its wall time, beside cuBLAS's: the op back to
back, its host path alone (``host_path.host_path_us``), what each fresh padded copy (the path under graph
capture and for large buffers) and the copy back cost alone, and a torch.profiler listing of five calls.

    PYTHONPATH=. python3 scripts/probes/staged_host.py > staged_host.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main() -> int:
    import cute_kernels as ck
    from cute_kernels.tools.bench import wall_us_per_call
    from host_path import host_path_us  # noqa: E402

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    torch.backends.cuda.matmul.allow_tf32 = False
    # The HGEMM stages from 1024^3 of work on sm_90, the SGEMM from 1800^3 (its rows pad to 4 floats).
    shapes = {torch.float16: ((2047, 2049, 1023), (2048, 2048, 2047), (4095, 4097, 4095)),
              torch.bfloat16: ((2047, 2049, 1023), (2048, 2048, 2047)),
              torch.float32: ((2047, 2049, 2047), (4095, 4097, 4095))}
    for dtype, problems in shapes.items():
        op, widest = (ck.sgemm, 4) if dtype == torch.float32 else (ck.hgemm, 8)
        for m, n, k in problems:
            a = torch.randn(m, k, device="cuda").to(dtype)
            b = torch.randn(k, n, device="cuda").to(dtype)
            out = torch.empty(m, n, device="cuda", dtype=dtype)
            ours = lambda: op(a, b, alpha=1.5, out=out)  # noqa: E731
            theirs = lambda: torch.matmul(a, b).mul_(1.5)  # noqa: E731
            kp, np_ = -(-k // widest) * widest, -(-n // widest) * widest
            res = torch.empty(m, np_, device="cuda", dtype=dtype)
            parts = {
                "pad a": lambda: F.pad(a, (0, kp - k)),
                "pad b": lambda: F.pad(b, (0, np_ - n, 0, kp - k)),
                "empty result": lambda: torch.empty(m, np_, dtype=dtype, device="cuda"),
                "copy out": lambda: out.copy_(res[:, :n]),
            }
            for _ in range(10):
                ours(), theirs()
            torch.cuda.synchronize()
            print(f"## {dtype} {m}x{n}x{k}")
            print("ours wall/call:", " / ".join(f"{wall_us_per_call(ours):.1f}" for _ in range(3)))
            print("torch wall/call:", " / ".join(f"{wall_us_per_call(theirs):.1f}" for _ in range(3)))
            print(f"ours host path alone: {host_path_us(ours, 500):.1f}")
            for name, fn in parts.items():
                print(f"{name} wall/call:", " / ".join(f"{wall_us_per_call(fn):.1f}" for _ in range(2)))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    ours()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
