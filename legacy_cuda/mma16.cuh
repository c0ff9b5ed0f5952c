// The 16-bit tensor-core step the kernels share: mma.sync m16n8k16 with FP32 accumulators (A row-major,
// B column-major), and the conversions around it, for __half and __nv_bfloat16. Fragments (lane = 4 g + t4):
//   A: a0 (row g, cols 2 t4, 2 t4 + 1), a1 (row g + 8, same cols), a2 (row g, cols 2 t4 + 8, + 9), a3 (row
//      g + 8, those cols); B: b0 (rows 2 t4, 2 t4 + 1; col g), b1 (rows 2 t4 + 8, + 9; col g);
//   D: d0, d1 (row g, cols 2 t4, 2 t4 + 1), d2, d3 (row g + 8, those cols).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace ck {

template <typename T> struct Mma;  // pack (two floats into one 32-bit pair), from_float, mma
template <> struct Mma<__half> {
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

}  // namespace ck
