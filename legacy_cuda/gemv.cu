// A few rows times a transposed weight: out = alpha * x @ w^T + beta * c, for x (M, K) with M small (a
// decode step's F.linear), w (N, K) and c / out (M, N), all row-major. The GEMM kernels' tiles cannot fill
// the GPU on such a call without splitting K (and then they still compute 16-64 rows for M of 1); here the
// whole cost is streaming w once, so the kernel is shaped around that stream.
//
// One warp per output column n (one row of w): its 32 lanes walk w's row in 16-byte chunks (lane l takes
// chunks l, l + 32, ...; every load instruction of the warp covers 512 contiguous bytes), kUnroll chunks in
// flight per lane, each multiplied by the same chunk of every one of the kRows rows of x (read through the
// read-only path: x is M * K elements that every warp re-reads, so it stays in L1/L2), FP32 products
// summed per row. A warp reduction of each row's sum, then lanes 0 .. kRows - 1 apply alpha / beta and
// store one element each. w is read with an L1 no-allocate hint: it is touched once and must not evict x.
//
// kRows: M rounded up to 1, 2, 4 or 8 (rows past M are neither read nor stored). kVec: elements per chunk,
// 16 bytes' worth (x and w rows 16-byte aligned, K a multiple of it) or 1 (any layout: scalar loads).
// Accumulation is FP32 for every T (float, __half, __nv_bfloat16); the result is rounded once.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "common.cuh"

namespace gemv {

struct Params {
  const void* x;
  const void* w;
  const void* c;  // read only when beta != 0
  void* out;
  long long x_ld, w_ld, c_ld, out_ld;  // row strides in elements
  int m, n, k;
  float alpha, beta;
};
static_assert(sizeof(Params) == 88, "gemv.py's Params mirrors this layout");

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// A chunk of kVec elements: one 16-byte (or element-sized) access.
template <typename T, int kVec>
using Chunk = ck::Array<T, kVec>;

// w's chunks: read once, so they bypass L1 (ld.global.nc.L1::no_allocate) and leave it to x.
template <typename T, int kVec>
__device__ __forceinline__ Chunk<T, kVec> load_weight(const Chunk<T, kVec>* p) {
  if constexpr (sizeof(Chunk<T, kVec>) == 16) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return *reinterpret_cast<const Chunk<T, kVec>*>(&v);
  } else {
    Chunk<T, kVec> c;
    c.v[0] = __ldg(reinterpret_cast<const T*>(p));
    return c;
  }
}

template <typename T, int kVec>
__device__ __forceinline__ Chunk<T, kVec> load_x(const Chunk<T, kVec>* p) {
  if constexpr (sizeof(Chunk<T, kVec>) == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<const Chunk<T, kVec>*>(&v);
  } else {
    Chunk<T, kVec> c;
    c.v[0] = __ldg(reinterpret_cast<const T*>(p));
    return c;
  }
}

template <typename T, int kRows, int kWarps, int kVec, int kUnroll>
__global__ void __launch_bounds__(32 * kWarps) gemv_kernel(const Params p) {
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "rows: 1, 2, 4 or 8");
  static_assert(kVec * sizeof(T) == 16 || kVec == 1, "a chunk is 16 bytes or one element");
  using C = Chunk<T, kVec>;
  const int lane = threadIdx.x % 32;
  const int col = blockIdx.x * kWarps + threadIdx.x / 32;  // the output column (row of w) of this warp
  if (col >= p.n) return;  // whole warps: no barrier follows

  const T* x = static_cast<const T*>(p.x);
  const C* w_row = reinterpret_cast<const C*>(static_cast<const T*>(p.w) + col * p.w_ld);
  const int chunks = p.k / kVec;  // kVec > 1: K is a multiple of kVec (the host checks)

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.f;

  auto multiply = [&](const C& wc, int chunk) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (kRows == 1 || r < p.m) {  // uniform across the warp
        const C xc = load_x<T, kVec>(reinterpret_cast<const C*>(x + r * p.x_ld) + chunk);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[r] = fmaf(to_float(xc.v[e]), to_float(wc.v[e]), acc[r]);
      }
    }
  };

  // Full rounds: every lane has kUnroll chunks; their loads are all issued before the first product.
  constexpr int kRound = 32 * kUnroll;
  int base = 0;
  for (; base + kRound <= chunks; base += kRound) {
    C wc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wc[u] = load_weight<T, kVec>(w_row + base + u * 32 + lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) multiply(wc[u], base + u * 32 + lane);
  }
  // The rest: fewer than kRound chunks, one per lane at a time.
  for (int chunk = base + lane; chunk < chunks; chunk += 32) multiply(load_weight<T, kVec>(w_row + chunk), chunk);

#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[r] += __shfl_xor_sync(ck::kFullMask, acc[r], offset);

  // Lane r stores row r (every lane holds every row's sum after the butterfly).
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (lane == r && r < p.m) {
      float y = p.alpha * acc[r];
      if (p.beta != 0.f) y = fmaf(p.beta, to_float(static_cast<const T*>(p.c)[r * p.c_ld + col]), y);
      static_cast<T*>(p.out)[r * p.out_ld + col] = from_float<T>(y);
    }
  }
}

}  // namespace gemv
