"""Peak throughput of the legacy tensor-core path (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) on this
GPU: a register-only loop, no memory traffic, kAcc independent accumulators per warp, at several warps per
SM. It bounds what an sm80-style (mma.sync) HGEMM can reach; cuBLAS on Hopper uses wgmma instead.

    python3 scripts/mma_sync_peak.py            # time on the GPU
    python3 scripts/mma_sync_peak.py sm_90a     # compile only (no GPU)
"""

from __future__ import annotations

import ctypes
import statistics
import sys

import torch

from legacy_cuda import nvrtc

SOURCE = r"""
template <int kAcc, bool kBf16>
__global__ void mma_loop(float* out, int iters) {
  // Operand registers hold small finite fp16/bf16 pairs; their values do not matter, only that the MMAs
  // cannot be folded away (asm volatile) and that the accumulators stay finite.
  unsigned a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = (threadIdx.x * (2 * i + 3)) & 0x3bff3bffu;
  for (int i = 0; i < 2; ++i) b[i] = (threadIdx.x * (2 * i + 11)) & 0x3bff3bffu;
  float acc[kAcc][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      if constexpr (kBf16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
ACCUMULATORS = (4, 8, 16)
DTYPES = ("fp16", "bf16")
FLOPS_PER_MMA = 2 * 16 * 8 * 16


def expression(acc: int, dtype: str) -> str:
    return f"mma_loop<{acc}, {'true' if dtype == 'bf16' else 'false'}>"


def build(arch: str) -> nvrtc.Cubin:
    return nvrtc.compile_text("mma_sync_peak.cu", SOURCE, [expression(a, d) for a in ACCUMULATORS for d in DTYPES], arch)


def main() -> int:
    if len(sys.argv) > 1:
        cubin = build(sys.argv[1])
        print(f"compiled {len(cubin.symbols)} kernels for {sys.argv[1]} ({len(cubin.data)} bytes)")
        return 0
    cubin = build(nvrtc.device_arch(0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 2 * 1024, device="cuda")
    iters = 4096
    stream = torch.cuda.current_stream().cuda_stream
    print(f"mma.sync m16n8k16 (fp32 accumulate) on {torch.cuda.get_device_name()} ({sms} SMs), {iters} iterations")
    for dtype in DTYPES:
        for acc in ACCUMULATORS:
            kernel = nvrtc.get_kernel(cubin, expression(acc, dtype), 0)
            for warps in (4, 8, 16, 32):
                for ctas_per_sm in (1, 2):
                    grid, block = sms * ctas_per_sm, 32 * warps

                    def go():
                        nvrtc.launch(kernel, (grid, 1, 1), (block, 1, 1), (out.data_ptr(), iters),
                                     (ctypes.c_void_p, ctypes.c_int), stream_handle=stream)
                    try:
                        go()
                    except nvrtc.KernelError as exc:  # too many registers for the block: not a point
                        print(f"{dtype} acc={acc:2d} warps/CTA={warps:2d}: not launchable ({exc})")
                        break
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(7):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        go()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end) * 1e-3)
                    flops = FLOPS_PER_MMA * acc * iters * grid * warps
                    print(f"{dtype} acc={acc:2d} warps/CTA={warps:2d} CTAs/SM={ctas_per_sm}: "
                          f"{flops / statistics.median(times) / 1e12:6.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
