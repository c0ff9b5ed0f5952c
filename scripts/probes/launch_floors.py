"""The floors under an eager call: what each piece a launch cannot avoid costs the host, beside torch's own
eager ops, in one process.

For tiny problems (64^3 GEMMs, 1024 scan elements), best of five runs of ``--calls`` back-to-back calls:

- torch's eager ``a @ b`` and ``torch.cumsum`` (the figures to meet);
- our public ops, eager;
- the compiled CuTe GEMM called directly (the TVM-FFI function: argument conversion, its signature checks,
  the launch on torch's current stream), with a preallocated output;
- an NVRTC launch through ``cuda.bindings`` with the arguments as a (values, ctypes types) tuple, and with
  them packed once into a ``void*[]`` whose address is passed (``kernelParams`` as an int);
- the pieces around a launch: ``torch.empty`` of the result, the current device and stream queries.

    PYTHONPATH=. python3 scripts/probes/launch_floors.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def best_us(fn, calls: int, tries: int = 5) -> float:
    """Microseconds per call of ``fn``: best of ``tries`` runs of ``calls`` calls, synchronised at the end."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    from cuda.bindings import driver

    import cute_kernels as ck
    from cute_kernels.ops.gemm import hgemm_sm80, sgemm as sgemm_mod
    from cute_kernels.ops.gemm.problem import make_problem
    from cute_kernels.ops.scan import lookback
    from cute_kernels.ops.scan.problem import ScanProblem
    from cute_kernels.runtime import nvrtc
    from cute_kernels.runtime.device import current_stream_handle, shared_memory_limit

    n = args.calls
    rows = []

    def row(what, fn):
        rows.append((what, best_us(fn, n)))
        print(f"| {what} | {rows[-1][1]:.2f} |", flush=True)

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| what | us per call (best of 5) |\n| --- | --- |")
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    h1, h2 = a.half(), b.half()
    x = torch.randn(1024, device="cuda")
    row("torch a @ b, fp32 64^3", lambda: a @ b)
    row("torch h1 @ h2, fp16 64^3", lambda: h1 @ h2)
    row("torch.cumsum 1024", lambda: torch.cumsum(x, -1))
    row("ck.sgemm 64^3", lambda: ck.sgemm(a, b))
    row("ck.hgemm 64^3", lambda: ck.hgemm(h1, h2))
    row("ck.scan 1024", lambda: ck.scan(x))

    for label, module, lhs, rhs in (("sgemm", sgemm_mod, a, b), ("hgemm sm80", hgemm_sm80, h1, h2)):
        problem = make_problem(lhs, rhs)
        compiled = module.compile(module.SPEC.choose_config(problem, 0), problem)
        out = torch.empty(64, 64, device="cuda", dtype=lhs.dtype)
        row(f"{label}: compiled TVM-FFI call, output given", lambda: compiled(lhs, rhs, out, out, 1.0, 0.0))

    problem = ScanProblem(1, 1024, torch.float32, False, 4, shared_memory_limit(0))
    out = torch.empty_like(x)
    # The op's own prepared launch (the one its plans keep), driven here on a workspace of the probe's own
    # (zeroed, epochs counting up from 1, as scan.cu expects).
    scan_launch = lookback.prepare(lookback.SPEC.choose_config(problem, 0), problem, {"x": x}, out)
    packed = scan_launch.packed
    ws = torch.zeros(1 << 13, dtype=torch.int64, device="cuda")
    slots = scan_launch.slots
    for slot, value in zip(slots, (x.data_ptr(), out.data_ptr(), None, None, ws.data_ptr(),
                                   ws.data_ptr() + lookback.WORKSPACE_HEADER_BYTES, 1 << 10)):
        if value is not None:
            slot.value = value
    stream = current_stream_handle(0)
    epoch = [0]

    def tuple_launch():
        epoch[0] += 1
        slots[7].value = epoch[0]
        nvrtc.launch(packed.loaded, packed.grid, packed.block, tuple(s.value for s in slots), lookback.KERNEL_SIGNATURE,
                     shared_mem=packed.shared_mem, stream_handle=stream)

    row("NVRTC scan launch, (values, types) tuple", tuple_launch)

    def packed_launch():
        epoch[0] += 1
        with packed.lock:
            slots[7].value = epoch[0]
            slots[0].value, slots[1].value = x.data_ptr(), out.data_ptr()
            packed.launch(stream)

    row("NVRTC scan launch, packed void*[] address (nvrtc.PackedLaunch)", packed_launch)
    row("driver.CUstream(handle)", lambda: driver.CUstream(stream))
    device = a.device
    row("torch.empty((64, 64), dtype, device=torch.device)", lambda: torch.empty((64, 64), dtype=torch.float32, device=device))
    row("torch.empty((64, 64), dtype, device=0)", lambda: torch.empty((64, 64), dtype=torch.float32, device=0))
    row("torch.empty(64, 64, dtype, device=torch.device)", lambda: torch.empty(64, 64, dtype=torch.float32, device=device))
    row("a.new_empty((64, 64))", lambda: a.new_empty((64, 64)))
    row("torch.empty_like(x)", lambda: torch.empty_like(x))
    row("torch.cuda.current_device()", torch.cuda.current_device)
    row("torch._C._cuda_getDevice()", torch._C._cuda_getDevice)
    row("current_stream_handle(0)", lambda: current_stream_handle(0))
    row("torch.is_grad_enabled()", torch.is_grad_enabled)
    row("b.t()", b.t)
    row("4-tensor metadata key", lambda: tuple((t.dtype, t.device, t.shape, t.stride(), t.data_ptr() % 16,
                                                t.requires_grad) for t in (a, b, out, x)))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
