"""Peak throughput of the legacy tensor-core path (mma.sync m16n8k16, fp16/bf16 in, fp32 accumulate) on this
GPU: a register-only loop, no memory traffic, ACC independent accumulators per warp, at several warps per
SM. It bounds what an sm80-style (mma.sync) HGEMM can reach; cuBLAS on Hopper uses wgmma instead.

    python3 scripts/mma_sync_peak.py            # time on the GPU
    python3 scripts/mma_sync_peak.py sm_90a     # compile only (no GPU)
"""
import ctypes
import statistics
import sys

import torch
from cuda.bindings import driver, nvrtc

SRC = r'''
extern "C" __global__ void mma_loop(float *out, int iters) {
  unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 ^ 5u, a3 = a0 + 7u, b0 = a0 * 11u, b1 = a0 ^ 13u;
  a0 &= 0x3bff3bffu; a1 &= 0x3bff3bffu; a2 &= 0x3bff3bffu; a3 &= 0x3bff3bffu; b0 &= 0x3bff3bffu; b1 &= 0x3bff3bffu;
  float acc[ACC][4];
  #pragma unroll
  for (int i = 0; i < ACC; ++i) { acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f; }
  for (int it = 0; it < iters; ++it) {
    #pragma unroll
    for (int i = 0; i < ACC; ++i) {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(acc[i][0]), "+f"(acc[i][1]), "+f"(acc[i][2]), "+f"(acc[i][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < ACC; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''

def check(r):
    err = r[0]
    if int(err) != 0:
        raise RuntimeError(str(r))
    return r[1:] if len(r) > 2 else (r[1] if len(r) == 2 else None)

def build(acc, ty, arch):
    src = SRC.replace("ACC", str(acc)).replace('" TY "', ty)
    prog = check(nvrtc.nvrtcCreateProgram(src.encode(), b"mma.cu", 0, [], []))
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    r = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(r[0]) != 0:
        n = check(nvrtc.nvrtcGetProgramLogSize(prog)); log = b" " * n; nvrtc.nvrtcGetProgramLog(prog, log); raise RuntimeError(log.decode())
    n = check(nvrtc.nvrtcGetCUBINSize(prog)); cubin = b" " * n; check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    return cubin

def main():
    arch = sys.argv[1] if len(sys.argv) > 1 else "run"
    if arch != "run":
        for acc in (4, 8, 16):
            for ty in ("f16", "bf16"):
                print(acc, ty, len(build(acc, ty, arch)), "bytes")
        return
    torch.cuda.init(); torch.zeros(1, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 32 * 1024, device="cuda")
    iters = 4096
    print(f"mma.sync m16n8k16 peak on {torch.cuda.get_device_name()} ({sms} SMs), iters={iters}")
    for ty in ("f16", "bf16"):
        for acc in (4, 8, 16):
            mod = check(driver.cuModuleLoadData(build(acc, ty, "sm_90a")))
            fn = check(driver.cuModuleGetFunction(mod, b"mma_loop"))
            for warps in (4, 8, 16, 32):
                for ctas_per_sm in (1, 2):
                    grid, block = sms * ctas_per_sm, 32 * warps
                    if block > 1024:
                        continue
                    args = ((out.data_ptr(), iters), (ctypes.c_void_p, ctypes.c_int))
                    stream = torch.cuda.current_stream().cuda_stream
                    def go():
                        check(driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, driver.CUstream(stream), args, 0))
                    try:
                        go()
                    except RuntimeError as exc:  # too many registers for the block: not a point
                        print(f"{ty} acc={acc:2d} warps/CTA={warps:2d}: not launchable ({exc})")
                        break
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(7):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record(); go(); e.record(); e.synchronize(); times.append(s.elapsed_time(e) * 1e-3)
                    t = statistics.median(times)
                    flops = 2 * 16 * 8 * 16 * acc * iters * (grid * warps)
                    print(f"{ty} acc={acc:2d} warps/CTA={warps:2d} CTAs/SM={ctas_per_sm}: {flops / t / 1e12:6.1f} TFLOP/s")

main()
