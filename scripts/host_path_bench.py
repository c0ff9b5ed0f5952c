"""The Python part of each op's dispatch, measured on any machine: CPU tensors, the device checks and the
launch replaced by no-ops, the kernels compiled for real where the path needs them (CuTe GEMMs, for
sm_90a). What it prints is the host time a repeated call spends in our code before the driver (or TVM-FFI)
takes over; the lent GPU hosts' wall figures swing 2x between runs, these do not. Not a GPU figure.

    PYTHONPATH=. python scripts/host_path_bench.py [--profile]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch


def _mock_the_device() -> None:
    """Every op's device-only steps become no-ops, so the rest of the path runs on CPU tensors."""
    from cute_kernels import attention_fused, conv3d_direct
    from cute_kernels.gemm import hgemm, problem, sgemm
    from legacy_cuda import nvrtc

    def keep(name, t):
        return t

    for module in (attention_fused, conv3d_direct, problem):
        module._checks.cuda_tensor = keep
    problem._checks.same_device = lambda **tensors: None
    for module in (attention_fused, conv3d_direct):
        module.shared_memory_limit = lambda device: 227 * 1024
    for module in (sgemm, hgemm):
        module.device_arch = lambda device: "sm_90a"
    problem.launch_compiled = lambda *args, **kwargs: None
    nvrtc.kernel_for = lambda *args: "kernel"
    nvrtc.launch = lambda *args, **kwargs: None
    for module in (attention_fused, conv3d_direct):
        module.current_stream_handle = lambda device: 0
    torch.cuda.current_device = lambda: None


def _calls():
    import cute_kernels as ck

    a, b, out = torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)
    h1, h2, hout = a.half(), b.half(), out.half()
    q, k, v = (torch.randn(1, 1, 64, 64, dtype=torch.float16) for _ in range(3))
    aout = torch.empty_like(q)
    vol, ker, cout = torch.randn(16, 16, 16), torch.randn(3, 3, 3), torch.empty(14, 14, 14)
    return {
        "sgemm 64^3": lambda: ck.sgemm(a, b, out=out),
        "hgemm 64^3": lambda: ck.hgemm(h1, h2, out=hout),
        "attention 1x1x64x64": lambda: ck.attention(q, k, v, out=aout),
        "conv3d 16^3, 3^3": lambda: ck.conv3d(vol, ker, out=cout),
    }


def main() -> int:
    _mock_the_device()
    calls, reps = 5000, 5
    print("| call | Python host path per repeated call (us, best of 5 x 5000) |\n| --- | --- |")
    for name, fn in _calls().items():
        fn()  # the first call validates and compiles
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        print(f"| {name} | {best:.1f} |", flush=True)
        if "--profile" in sys.argv:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(calls):
                fn()
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
