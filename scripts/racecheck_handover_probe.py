"""Does compute-sanitizer's racecheck understand the scan's named-barrier hand-over? (docs/perf-notes.md,
session 4: it reports a hazard in scan_kernel_lookback_warp that the SASS shows ordered by barrier 2.)

One small kernel, four ways of handing a value from a producer warp to the consumer warps, in the scan's
pattern: the consumer warps write their sums and arrive on barrier 1 (without waiting), the producer warp syncs
on barrier 1, reads the sums, writes a total to shared memory and hands it over on barrier 2 by
  0  bar.arrive and exit (the scan's schedule before session 4),
  1  bar.sync and exit,
  2  __syncthreads() on both sides instead of barrier 2,
  3  nothing: the consumers read without waiting, a real race (the control racecheck must report),
  4  __syncthreads() for both hand-overs, no named barrier at all (the control racecheck must pass),
  5  named barriers 1 and 2 with bar.sync on both sides (no arrive anywhere),
  6  the consumers bar.sync on barrier 1, the producer bar.arrive on barrier 2 and exits (mode 0 with the
     consumers' arrive made a sync: the change that would make the scan's schedule racecheck-clean).
Every mode but 3 must give the right totals. On the H200 (2026-12-01) racecheck reported modes 0-3 and
passed modes 4, 5 and 6: what it does not follow is the consumers' arrive-only barrier 1 before the
hand-over, not the hand-over itself (mode 6 keeps the producer's arrive on barrier 2 and is clean), so the
scan's data warps now sync on barrier 1. Those runs used the .aligned bar.sync / bar.arrive, which synccheck
then showed to be wrong here (see scan.cu); the probe now uses barrier.sync / barrier.arrive as the scan does.
Run it under racecheck (and synccheck) and read which kernels it names:

    compute-sanitizer --tool racecheck --print-limit 20 python3 scripts/racecheck_handover_probe.py
    compute-sanitizer --tool synccheck --print-limit 20 python3 scripts/racecheck_handover_probe.py
    python3 scripts/racecheck_handover_probe.py sm_90a    # compile only (no GPU)
"""

from __future__ import annotations

import ctypes
import sys

import torch

from legacy_cuda import nvrtc

SOURCE = r"""
// The non-.aligned forms, as scan.cu uses them: the producer and the consumers reach a barrier at different
// instructions, which bar.sync / bar.arrive (barrier.*.aligned) do not allow.
__device__ __forceinline__ void bar_sync(unsigned id, unsigned n) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned n) { asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

template <int kMode>
__global__ void handover(const float* x, float* out) {
  constexpr int kConsumerWarps = 4;
  constexpr unsigned kAll = (kConsumerWarps + 1) * 32;
  __shared__ float s_sum[kConsumerWarps];
  __shared__ float s_total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == kConsumerWarps) {  // the producer
    if (kMode == 4) __syncthreads(); else bar_sync(1, kAll);
    float total = lane < kConsumerWarps ? s_sum[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) s_total = total + blockIdx.x;
    if (kMode == 0 || kMode == 6) bar_arrive(2, kAll);
    if (kMode == 1 || kMode == 5) bar_sync(2, kAll);
    if (kMode == 2 || kMode == 4) __syncthreads();
    return;
  }
  float v = x[blockIdx.x * kConsumerWarps * 32 + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) s_sum[warp] = v;
  if (kMode == 4) __syncthreads(); else if (kMode == 5 || kMode == 6) bar_sync(1, kAll); else bar_arrive(1, kAll);
  if (kMode == 0 || kMode == 1 || kMode == 5 || kMode == 6) bar_sync(2, kAll);
  if (kMode == 2 || kMode == 4) __syncthreads();
  out[blockIdx.x * kConsumerWarps * 32 + threadIdx.x] = s_total;
}
"""
MODES = {0: "bar.arrive + exit", 1: "bar.sync + exit", 2: "__syncthreads", 3: "no barrier (control: a race)",
         4: "__syncthreads only (control: no race)", 5: "bar.sync on both named barriers",
         6: "consumers sync on barrier 1, producer arrives on barrier 2"}
THREADS = 5 * 32
BLOCKS = 264


def build(arch: str) -> nvrtc.Cubin:
    return nvrtc.compile_text("racecheck_handover.cu", SOURCE, [f"handover<{m}>" for m in MODES], arch)


def main() -> int:
    if len(sys.argv) > 1:
        cubin = build(sys.argv[1])
        print(f"compiled {len(cubin.symbols)} kernels for {sys.argv[1]}")
        return 0
    cubin = build(nvrtc.device_arch(0))
    x = torch.randint(-4, 5, (BLOCKS, 128), device="cuda").float()
    expected = (x.sum(1, keepdim=True) + torch.arange(BLOCKS, device="cuda")[:, None]).expand(BLOCKS, 128)
    stream = torch.cuda.current_stream().cuda_stream
    status = 0
    for mode, what in MODES.items():
        out = torch.full_like(x, float("nan"))
        kernel = nvrtc.get_kernel(cubin, f"handover<{mode}>", 0)
        nvrtc.launch(kernel, (BLOCKS, 1, 1), (THREADS, 1, 1), (x.data_ptr(), out.data_ptr()),
                     (ctypes.c_void_p, ctypes.c_void_p), stream_handle=stream)
        torch.cuda.synchronize()
        right = torch.equal(out, expected)
        print(f"handover<{mode}> ({what}): totals {'right' if right else 'WRONG'}", flush=True)
        status |= mode != 3 and not right
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
