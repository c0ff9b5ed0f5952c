// A few rows times a transposed weight: out = alpha * x @ w^T + beta * c, for x (M, K) with M small (a
// decode step's F.linear) and w (N, K), both row-major, and c / out (M, N) at any row and column strides
// (a skinny-N GEMM a @ b runs as its transpose, x = b^T and w = a, writing out^T where out lies). The GEMM
// kernels' tiles cannot fill the GPU on such a call without splitting K (and then they still compute 16-64
// rows for M of 1); here the whole cost is streaming w once, so the kernel is shaped around that stream.
//
// kSlices warps per group of kCols output columns n0 .. n0 + kCols - 1 (kCols rows of w), each warp
// streaming a contiguous share of K: its 32 lanes walk those rows in 16-byte chunks (lane l takes chunks
// l, l + 32, ...; every load instruction of the warp covers 512 contiguous bytes of one row), kUnroll
// chunks of each row in flight per lane. Each chunk of x (every one of the kRows rows, read through the
// read-only path: x is M * K elements that every warp re-reads, so it stays in L1/L2) is loaded once per
// kCols chunks of w: with 8 rows of x and one column per warp the x reloads, not the weight, set the pace
// (eight 16-byte L1 reads per 16 bytes streamed). More columns per warp mean fewer warps and more
// registers, so fewer loads in flight; the slices give them back. FP32 products summed per (row, column),
// the warp's kRows * kCols sums reduced across lanes by halving exchanges (31 shuffles for 32 sums,
// reduce_across_lanes), the slices' sums added in shared memory in slice order (the one barrier, after
// the stream), and one lane per sum applies alpha / beta and stores it. w is read with an L1 no-allocate
// hint: it is touched once and must not evict x.
//
// kRows: M rounded up to 1, 2, 4, 8 or 16 (rows past M are neither read nor stored). kCols: 1, 2 or 4
// (columns past N re-read the last row of w and are not stored). kSlices: 1, 2, 4 or 8, dividing kWarps.
// kVec: elements per chunk, 16 bytes' worth (x and w rows 16-byte aligned, K a multiple of it) or 1 (any
// layout: scalar loads). Accumulation is FP32 for every T (float, __half, __nv_bfloat16); the result is
// rounded once.
//
// gemv_mma_kernel (16-bit, 16-byte rows): the same stream on tensor cores, for 2 to 16 rows of x, where
// gemv_kernel's per-element conversions and x reloads cost more than the stream (below).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "common.cuh"
#include "mma16.cuh"
#include "sm90.cuh"

namespace gemv {

struct Params {
  const void* x;
  const void* w;
  const void* c;  // read only when beta != 0
  void* out;
  long long x_ld, w_ld, c_ld, out_ld;  // row strides in elements
  long long c_cs, out_cs;  // column strides in elements (1, or the row count of a transposed result)
  int m, n, k;
  float alpha, beta;
  // gemv_mma_kernel with K split across CTAs (gridDim.y > 1) only: each CTA's FP32 partial result, plane
  // blockIdx.y of (gridDim.y, gridDim.x, kCols * kRows), and one arrival counter per column group, zero
  // before and after every launch.
  float* partials;
  unsigned* arrivals;
};
static_assert(sizeof(Params) == 120, "gemv.py's Params mirrors this layout");

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// 16 bytes of w: read once, so they bypass L1 (ld.global.nc.L1::no_allocate) and leave it to x.
__device__ __forceinline__ uint4 load_weight16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// A chunk of kVec elements: one 16-byte (or element-sized) access, of w (kWeight: load_weight16) or of x
// (the read-only path, kept in L1: every warp re-reads it).
template <typename T, int kVec>
using Chunk = ck::Array<T, kVec>;

template <bool kWeight, typename T, int kVec>
__device__ __forceinline__ Chunk<T, kVec> load_chunk(const Chunk<T, kVec>* p) {
  Chunk<T, kVec> c;
  if constexpr (sizeof(c) == 16) {
    const uint4 v = kWeight ? load_weight16(p) : __ldg(reinterpret_cast<const uint4*>(p));
    c = *reinterpret_cast<const Chunk<T, kVec>*>(&v);
  } else {
    c.v[0] = __ldg(reinterpret_cast<const T*>(p));
  }
  return c;
}

// out[row][col] = alpha * sum + beta * c[row][col], rounded once (c read only when beta != 0).
template <typename T>
__device__ __forceinline__ void store_result(const Params& p, int row, int col, float sum) {
  float y = p.alpha * sum;
  if (p.beta != 0.f) y = fmaf(p.beta, to_float(static_cast<const T*>(p.c)[row * p.c_ld + col * p.c_cs]), y);
  static_cast<T*>(p.out)[row * p.out_ld + col * p.out_cs] = from_float<T>(y);
}

// K split across CTAs (gridDim.y > 1): CTA y of column group x writes its FP32 tile of kTile values to
// own(), plane y of p.partials ([gridDim.y][gridDim.x][kTile]); then every CTA counts its arrival on the
// group's counter (threadFenceReduction: the writes, a fence, a barrier, one atomic), and the one that
// arrives last resets the counter for the next launch and reads sum(e), the planes added in plane order (the
// same bits whichever CTA is last). `sync` is the barrier over the threads that wrote the tile, thread 0
// among them (the whole CTA, or a consumer warpgroup).
template <int kTile>
struct SplitK {
  float* plane0;
  long long plane_stride;

  __device__ __forceinline__ explicit SplitK(const Params& p)
      : plane0(p.partials + static_cast<long long>(blockIdx.x) * kTile),
        plane_stride(static_cast<long long>(gridDim.x) * kTile) {}

  __device__ __forceinline__ float* own() const { return plane0 + blockIdx.y * plane_stride; }

  template <typename Sync>
  __device__ __forceinline__ bool last_to_arrive(const Params& p, Sync sync) const {
    __threadfence();
    sync();
    __shared__ bool s_last;
    if (threadIdx.x == 0) {
      const unsigned before = atomicAdd(p.arrivals + blockIdx.x, 1u);
      s_last = before == gridDim.y - 1;
      if (s_last) p.arrivals[blockIdx.x] = 0;  // ready for the next launch; nobody else touches it in this one
    }
    sync();
    if (!s_last) return false;
    __threadfence();
    return true;
  }

  __device__ __forceinline__ float sum(int e) const {
    float total = 0.f;
    for (unsigned y = 0; y < gridDim.y; ++y) total += __ldcg(plane0 + y * plane_stride + e);
    return total;
  }
};

// One halving exchange of reduce_across_lanes: the first kLive values of each lane are partial sums; after
// it, the first kLive / 2 are, each summed with the lane kOffset apart (the lane with that bit set keeps the
// upper half and sends the lower). A template per step so that every register index is a constant.
template <int kLive, int kOffset, int kValues>
__device__ __forceinline__ void exchange_halves(float (&v)[kValues], int lane) {
  if constexpr (kLive > 1 && kOffset > 0) {
    const bool upper = lane & kOffset;
#pragma unroll
    for (int i = 0; i < kLive / 2; ++i) {
      const float send = upper ? v[i] : v[i + kLive / 2];
      const float keep = upper ? v[i + kLive / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(ck::kFullMask, send, kOffset);
    }
    exchange_halves<kLive / 2, kOffset / 2>(v, lane);
  }
}

// Values of reduce_across_lanes each lane ends with, and lanes that end with the same one.
template <int kValues> constexpr int kHeldSums = kValues >= 32 ? kValues / 32 : 1;
template <int kValues> constexpr int kLanesPerSum = kValues >= 32 ? 1 : 32 / kValues;

// The warp-wide sums of kValues per-lane values (a power of two, at most 64), in place: lane l ends with
// the sums of values (l / kLanesPerSum) * kHeldSums + i in v[i], i < kHeldSums. The halving exchanges cost
// kValues - 1 shuffles up to 32 values, then a plain butterfly runs over the lanes that hold the same sum.
// The order of the adds is fixed: the result is repeatable.
template <int kValues>
__device__ __forceinline__ void reduce_across_lanes(float (&v)[kValues], int lane) {
  static_assert(kValues >= 1 && kValues <= 64 && (kValues & (kValues - 1)) == 0, "a power of two up to 64");
  exchange_halves<kValues, 16>(v, lane);
#pragma unroll
  for (int offset = kLanesPerSum<kValues> / 2; offset > 0; offset /= 2)
    v[0] += __shfl_xor_sync(ck::kFullMask, v[0], offset);
}

template <typename T, int kRows, int kCols, int kSlices, int kWarps, int kVec, int kUnroll>
__global__ void __launch_bounds__(32 * kWarps) gemv_kernel(const Params p) {
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8 || kRows == 16, "rows: 1, 2, 4, 8 or 16");
  static_assert(kCols == 1 || kCols == 2 || kCols == 4, "columns per warp: 1, 2 or 4");
  static_assert(kWarps % kSlices == 0, "whole column groups per CTA");
  static_assert(kVec * sizeof(T) == 16 || kVec == 1, "a chunk is 16 bytes or one element");
  using C = Chunk<T, kVec>;
  constexpr int kValues = kRows * kCols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slice = warp % kSlices;  // this warp's share of K
  const int col0 = (blockIdx.x * (kWarps / kSlices) + warp / kSlices) * kCols;  // its group's first column
  const bool live = col0 < p.n;  // whole warps; a dead one still meets the slices' barrier

  const T* x = static_cast<const T*>(p.x);
  const C* w_rows[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    w_rows[c] = reinterpret_cast<const C*>(static_cast<const T*>(p.w) + min(col0 + c, p.n - 1) * p.w_ld);
  const int chunks = p.k / kVec;  // kVec > 1: K is a multiple of kVec (the host checks)
  // Slice s walks chunks [begin, end): contiguous runs of whole 32-chunk warp loads, so each warp streams.
  const int per_slice = (chunks + 32 * kSlices - 1) / (32 * kSlices) * 32;
  const int begin = min(chunks, slice * per_slice), end = live ? min(chunks, begin + per_slice) : begin;

  float acc[kValues];  // acc[r * kCols + c]: row r of x, column col0 + c
#pragma unroll
  for (int i = 0; i < kValues; ++i) acc[i] = 0.f;

  auto multiply = [&](const C (&wc)[kCols], int chunk) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (kRows == 1 || r < p.m) {  // uniform across the warp
        const C xc = load_chunk<false, T, kVec>(reinterpret_cast<const C*>(x + r * p.x_ld) + chunk);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            acc[r * kCols + c] = fmaf(to_float(xc.v[e]), to_float(wc[c].v[e]), acc[r * kCols + c]);
      }
    }
  };

  // Full rounds: every lane has kUnroll chunks of each row; their loads are all issued before the first product.
  constexpr int kRound = 32 * kUnroll;
  int base = begin;
  for (; base + kRound <= end; base += kRound) {
    C wc[kUnroll][kCols];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int c = 0; c < kCols; ++c) wc[u][c] = load_chunk<true, T, kVec>(w_rows[c] + base + u * 32 + lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) multiply(wc[u], base + u * 32 + lane);
  }
  // The rest: fewer than kRound chunks, one per lane and row at a time.
  for (int chunk = base + lane; chunk < end; chunk += 32) {
    C wc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) wc[c] = load_chunk<true, T, kVec>(w_rows[c] + chunk);
    multiply(wc, chunk);
  }

  // Each group of kLanesPerSum lanes ends with kHeldSums sums of its slice. One slice: its first lane
  // stores them. More: the slices' sums meet in shared memory and slice 0 adds them in slice order.
  reduce_across_lanes<kValues>(acc, lane);
  const bool leader = lane % kLanesPerSum<kValues> == 0;
  if constexpr (kSlices > 1) {
    __shared__ float sums[kWarps][kValues];
    if (leader) {
#pragma unroll
      for (int i = 0; i < kHeldSums<kValues>; ++i)
        sums[warp][lane / kLanesPerSum<kValues> * kHeldSums<kValues> + i] = acc[i];
    }
    __syncthreads();
    if (slice != 0) return;
    if (leader) {
#pragma unroll
      for (int i = 0; i < kHeldSums<kValues>; ++i) {
        const int sum = lane / kLanesPerSum<kValues> * kHeldSums<kValues> + i;
        acc[i] = sums[warp][sum];
#pragma unroll
        for (int s = 1; s < kSlices; ++s) acc[i] += sums[warp + s][sum];
      }
    }
  }
  if (live && leader) {
#pragma unroll
    for (int i = 0; i < kHeldSums<kValues>; ++i) {
      const int sum = lane / kLanesPerSum<kValues> * kHeldSums<kValues> + i;
      const int row = sum / kCols, col = col0 + sum % kCols;
      if (row < p.m && col < p.n) store_result<T>(p, row, col, acc[i]);
    }
  }
}

// ---- gemv_rows_kernel -----------------------------------------------------------------------------------
// A few rows times a row-major weight: out = alpha * x @ b + beta * c for x (M, K) row-major with M small and
// b (K, N) row-major (a weight kept as (in, out), or any GEMM's own B). b's rows run along N here, so a lane
// owns one chunk of kVec adjacent output columns for all kRows rows of x and walks down K: a warp covers a
// strip of 32 * kVec columns, and each of its load instructions reads 512 contiguous bytes of one row of b
// (kVec 1, unaligned: 128). The CTA's kWarps warps form kWarps / kKWarps strips side by side, kKWarps
// warps per strip splitting the CTA's rows of K (warp v of a strip takes rows v, v + kKWarps, ...: the
// strip's warps read neighbouring rows, kUnroll rows of b in flight per lane before their products), and
// with kSplitK the CTAs of gridDim.y split K into contiguous shares (SplitK's planes and last arriver).
// Each row k of b meets x[r][k] for every row r of x: a scalar that all lanes read at once (one broadcast
// load through the read-only path; x stays in L1, b's 16-byte chunks bypass it, its scalars do not).
//
// The sums: a strip's warps write their partials to shared memory one row of x at a time and the CTA adds
// them in warp order; with kSplitK that sum goes to the CTA's plane and the last CTA to arrive adds the
// planes in plane order. Every order is fixed, so the result is repeatable. Rows of x past M are neither
// read nor stored; columns past N (N is a multiple of kVec where kVec > 1: the host checks) are not read.
template <typename T, int kRows, int kWarps, int kKWarps, int kVec, int kUnroll, bool kSplitK>
__global__ void __launch_bounds__(32 * kWarps, 1) gemv_rows_kernel(const Params p) {
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "rows: 1, 2, 4 or 8");
  static_assert(kWarps % kKWarps == 0, "whole strips per CTA");
  static_assert(kVec * sizeof(T) == 16 || kVec == 1, "a chunk is 16 bytes or one element");
  using C = Chunk<T, kVec>;
  constexpr int kStripCols = 32 * kVec;
  constexpr int kCtaCols = kWarps / kKWarps * kStripCols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int strip = warp / kKWarps, slice = warp % kKWarps;
  const int col = blockIdx.x * kCtaCols + strip * kStripCols + lane * kVec;  // this lane's first column
  const bool live = col < p.n;
  // This CTA's contiguous share of K, then this warp's rows of it: k_begin + slice, + kKWarps, ...
  const int per_cta = (p.k + gridDim.y - 1) / gridDim.y;
  const int k_begin = min(p.k, static_cast<int>(blockIdx.y) * per_cta), k_end = min(p.k, k_begin + per_cta);

  const T* x = static_cast<const T*>(p.x);
  const T* b = static_cast<const T*>(p.w) + col;
  float acc[kRows][kVec];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[r][e] = 0.f;

  auto multiply = [&](const C& bc, int k) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (kRows == 1 || r < p.m) {  // uniform across the CTA
        const float xv = to_float(__ldg(x + r * p.x_ld + k));
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[r][e] = fmaf(xv, to_float(bc.v[e]), acc[r][e]);
      }
    }
  };

  int k = k_begin + slice;
  if (live) {
    // Full rounds: kUnroll rows of b per lane, every load issued before the first product.
    for (; k + (kUnroll - 1) * kKWarps < k_end; k += kUnroll * kKWarps) {
      C bc[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        bc[u] = load_chunk<true, T, kVec>(reinterpret_cast<const C*>(b + static_cast<long long>(k + u * kKWarps) * p.w_ld));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) multiply(bc[u], k + u * kKWarps);
    }
    for (; k < k_end; k += kKWarps)
      multiply(load_chunk<true, T, kVec>(reinterpret_cast<const C*>(b + static_cast<long long>(k) * p.w_ld)), k);
  }

  // One row of x at a time: the warps' partials meet in shared memory, a strip's added in warp order.
  __shared__ float partial[kWarps][kStripCols];
  SplitK<kRows * kCtaCols> split(p);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (kRows > 1 && r >= p.m) continue;  // uniform; unrolled, so acc stays in registers
#pragma unroll
    for (int e = 0; e < kVec; ++e) partial[warp][lane * kVec + e] = acc[r][e];
    __syncthreads();
    for (int e = threadIdx.x; e < kCtaCols; e += 32 * kWarps) {
      const int s = e / kStripCols, within = e % kStripCols;
      float total = partial[s * kKWarps][within];
#pragma unroll
      for (int v = 1; v < kKWarps; ++v) total += partial[s * kKWarps + v][within];
      const int out_col = blockIdx.x * kCtaCols + e;
      if constexpr (kSplitK) {
        split.own()[r * kCtaCols + e] = total;
      } else if (out_col < p.n) {
        store_result<T>(p, r, out_col, total);
      }
    }
    __syncthreads();
  }
  if constexpr (kSplitK) {
    if (!split.last_to_arrive(p, [] { __syncthreads(); })) return;
    for (int i = threadIdx.x; i < kRows * kCtaCols; i += 32 * kWarps) {
      const int r = i / kCtaCols, out_col = blockIdx.x * kCtaCols + i % kCtaCols;
      if (r < p.m && out_col < p.n) store_result<T>(p, r, out_col, split.sum(i));
    }
  }
}

// ---- gemv_mma_kernel ------------------------------------------------------------------------------------
// A CTA computes 16 * kColGroups output columns n0 .. (16 rows of w per group) for all M <= 8 * kRowGroups
// rows of x as kColGroups x kRowGroups m16n8k16 products per 16 k: A = 16 rows of w (row-major, K
// contiguous), B = 8 rows of x transposed (column-major: x's rows are its columns), D (16 x 8 per pair,
// FP32) = w x^T. The kWarps warps split K: warp v takes the 32-wide k-blocks v, v + kWarps, ..., so the
// warps of a CTA read neighbouring 64-byte pieces of the same rows of w.
//
// No shared memory on the way in: the fragments come straight from global memory in 16-byte loads. A
// dot product does not care in which order its k terms are summed, so a k-block's 32 columns are handed to
// the two MMAs in a permuted order that makes every thread's share one contiguous 8-element chunk: thread
// (g = lane / 4, t4 = lane % 4) loads k0 + 8 t4 .. k0 + 8 t4 + 7 of w's rows g and g + 8 of each column
// group and of x's rows g (+ 8 for the second row group), and uses elements 0-3 as the first MMA's columns
// {2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9} and elements 4-7 as the second's. A and B use the same permutation
// (fragment column j of A and row j of B are the same thread's same elements), so the product is w x^T
// exactly. Per warp load instruction that is 8 rows x 64 contiguous bytes of w, whole 32-byte sectors.
// Every chunk of x serves kColGroups chunks of w and every chunk of w kRowGroups of x: x is re-read from
// L1/L2 by every CTA, so with 16 rows a second column group halves those reads per byte of w streamed.
// Rows of x past M load zeros (their columns of D are never stored), rows of w past N too; the last k-block
// of a K that is not a multiple of 32 zero-fills whole chunks (K is a multiple of 8 here). kUnroll k-blocks'
// loads are issued before their MMAs.
//
// The warps' partial D tiles are summed in shared memory in warp order (fixed: the result is repeatable),
// and the CTA's threads apply alpha / beta and store one element each, 16 * kColGroups * M in all.
//
// K split across CTAs (kSplitK, gridDim.y > 1): CTA y of a column group walks only the k-blocks of its contiguous
// share of K, so each CTA reads 1 / gridDim.y of x (every CTA re-reads its share of x from L2: with 16 rows
// and 16 columns per CTA that is as many bytes as it streams of w) and the grid keeps its CTA count with
// twice the columns per CTA. The CTAs' summed tiles meet in the stream's partials (SplitK): the last CTA
// to arrive adds them in plane order before alpha / beta and the store.
template <typename T, int kWarps, int kUnroll, int kRowGroups, int kColGroups, bool kSplitK>
__global__ void __launch_bounds__(32 * kWarps) gemv_mma_kernel(const Params p) {
  static_assert(sizeof(T) == 2, "16-bit inputs");
  static_assert(kRowGroups == 1 || kRowGroups == 2, "8 or 16 rows of x");
  static_assert(kColGroups == 1 || kColGroups == 2, "16 or 32 columns of the result");
  constexpr int kRows = 8 * kRowGroups, kCols = 16 * kColGroups;
  __shared__ float partial[kWarps][kCols][kRows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t4 = lane % 4;
  const int n0 = blockIdx.x * kCols;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  // This thread's rows: w's n0 + 16 c + g (+ 8) (clamped to a valid row; zeroed below), x's g + 8 j.
  bool w_ok[kColGroups][2];
  const T* w_row[kColGroups][2];
#pragma unroll
  for (int c = 0; c < kColGroups; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = n0 + 16 * c + 8 * h + g;
      w_ok[c][h] = row < p.n;
      w_row[c][h] = w + static_cast<long long>(w_ok[c][h] ? row : 0) * p.w_ld;
    }
  bool x_ok[kRowGroups];
  const T* x_row[kRowGroups];
#pragma unroll
  for (int j = 0; j < kRowGroups; ++j) {
    x_ok[j] = g + 8 * j < p.m;
    x_row[j] = x + static_cast<long long>(x_ok[j] ? g + 8 * j : 0) * p.x_ld;
  }

  float d[kColGroups][kRowGroups][4] = {};
  auto mma_block = [&](const uint4 (&wv)[kColGroups][2], const uint4 (&xv)[kRowGroups]) {
#pragma unroll
    for (int c = 0; c < kColGroups; ++c) {
      const uint4 &lo = wv[c][0], &hi = wv[c][1];
      const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
      for (int j = 0; j < kRowGroups; ++j) {
        ck::Mma<T>::mma(d[c][j], a0, xv[j].x, xv[j].y);
        ck::Mma<T>::mma(d[c][j], a1, xv[j].z, xv[j].w);
      }
    }
  };
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto load_w = [&](uint4 (&wv)[kColGroups][2], int k) {  // k: this thread's chunk start in the rows
#pragma unroll
    for (int c = 0; c < kColGroups; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) wv[c][h] = w_ok[c][h] && k < p.k ? load_weight16(w_row[c][h] + k) : zero;
  };
  auto load_x = [&](uint4 (&xv)[kRowGroups], int k) {
#pragma unroll
    for (int j = 0; j < kRowGroups; ++j)
      xv[j] = x_ok[j] && k < p.k ? __ldg(reinterpret_cast<const uint4*>(x_row[j] + k)) : zero;
  };

  // This CTA walks k-blocks [first_block, blocks): all of them, or its share where K is split. The split is
  // an instantiation of its own: its index arithmetic and epilogue in every kernel took the unsplit one
  // from 64 to 74 registers (8 warps, 2 in flight, 16 rows, 32 columns), three CTAs an SM instead of four.
  int first_block = 0, blocks = (p.k + 31) / 32;
  if constexpr (kSplitK) {
    const int per_cta = (blocks + gridDim.y - 1) / gridDim.y;
    first_block = min(blocks, static_cast<int>(blockIdx.y) * per_cta);
    blocks = min(blocks, first_block + per_cta);
  }
  constexpr int kStep = kWarps * kUnroll;
  int b = first_block + warp;
  for (; b + (kUnroll - 1) * kWarps < blocks; b += kStep) {  // rounds where all kUnroll blocks exist
    uint4 wv[kUnroll][kColGroups][2], xv[kUnroll][kRowGroups];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (b + u * kWarps) * 32 + 8 * t4;
      load_w(wv[u], k);
      load_x(xv[u], k);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mma_block(wv[u], xv[u]);
  }
  for (; b < blocks; b += kWarps) {
    const int k = b * 32 + 8 * t4;
    uint4 wv[kColGroups][2], xv[kRowGroups];
    load_w(wv, k);
    load_x(xv, k);
    mma_block(wv, xv);
  }

  // D of (c, j): this thread holds (column 16 c + g, rows 8 j + 2 t4, + 1) and (16 c + g + 8, same rows).
#pragma unroll
  for (int c = 0; c < kColGroups; ++c)
#pragma unroll
    for (int j = 0; j < kRowGroups; ++j) {
      float* lo = partial[warp][16 * c + g];
      float* hi = partial[warp][16 * c + g + 8];
      lo[8 * j + 2 * t4] = d[c][j][0], lo[8 * j + 2 * t4 + 1] = d[c][j][1];
      hi[8 * j + 2 * t4] = d[c][j][2], hi[8 * j + 2 * t4 + 1] = d[c][j][3];
    }
  __syncthreads();
  // Output element t: column n0 + t % kCols, row t / kCols; its sum over the warps, in warp order.
  auto cta_sum = [&](int t) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][t % kCols][t / kCols];
    return sum;
  };
  auto store = [&](int t, float sum) {
    if (n0 + t % kCols < p.n) store_result<T>(p, t / kCols, n0 + t % kCols, sum);
  };
  constexpr int kThreads = 32 * kWarps;
  const int elements = kCols * p.m;
  if constexpr (!kSplitK) {
    if constexpr (kThreads >= kCols * kRows) {  // one element per thread at most
      if (threadIdx.x < elements) store(threadIdx.x, cta_sum(threadIdx.x));
    } else {
      for (int t = threadIdx.x; t < elements; t += kThreads) store(t, cta_sum(t));
    }
    return;
  }
  const SplitK<kCols * kRows> split(p);
  for (int t = threadIdx.x; t < elements; t += kThreads) __stcg(split.own() + t, cta_sum(t));
  if (!split.last_to_arrive(p, [] { __syncthreads(); })) return;
  for (int t = threadIdx.x; t < elements; t += kThreads) store(t, split.sum(t));
}

// ---- gemv_tma_kernel (sm_90a) ---------------------------------------------------------------------------
// The weight streamed the way Hopper's own GEMV kernels stream it: through TMA into a ring of shared-memory
// stages, so the bytes in flight per SM are set by the ring's depth, not by registers and occupancy (the
// kernels above hold every load in a register until its MMA; ncu on the H200 had them at 0.81-0.90x
// cuBLAS's TMA kernel at 9-16 rows, docs/notes/gemm.md). A CTA owns kTmaRows = 128 rows of w (output
// columns n0 .. n0 + 127) and all M <= 16 rows of x, for its share of K.
//
// Shapes (per stage s, 64 k): sW (128 rows of w, 64 k each: 128 bytes a row, TMA's 128-byte swizzle, 16
// swizzle atoms of 8 rows), sX (16 rows of x, 64 k: 2 atoms; rows past M arrive as zeros). The product is
// D^T (128 x 16) = w (128 x 64) * x^T (64 x 16): two wgmma m64n16k16 (rows 0-63 and 64-127) per k16, A = sW
// and B = sX, both K-major in shared memory. tDrD[h][v] (warp w, lane l of the consumer warpgroup): w row
// 64 h + 16 w + l / 4 + 8 ((v >> 1) & 1), x row 8 (v >> 2) + 2 (l % 4) + (v & 1).
//
// Warps 0-3 are the consumer warpgroup (wgmma needs a whole, aligned warpgroup), warp 4 the producer, whose
// lane 0 issues every TMA. Pipeline: full[s] completes when the producer has armed it with the stage's bytes
// and both boxes have landed; the consumers wait on it before their wgmmas read the stage. empty[s] takes
// one arrival per consumer warp, made once that warp's wgmmas of the stage have retired (wait_group 1 after
// the next stage's batch is issued, so one batch is always queued behind the tensor cores); the producer
// waits on it before refilling the stage. A stage is freed one batch after its own, so in the steady state
// about kStages - 1 stages (18 KB each) of weight are in flight on the SM.
//
// K split across CTAs (kSplitK, gridDim.y > 1): CTA y takes a contiguous share of the 64-wide k-tiles; the
// tiles ([16][128], x row major) meet as gemv_mma_kernel's do (SplitK, over the consumer warpgroup).
constexpr int kTmaRows = 128;
constexpr int kTmaK = 64;
constexpr int kTmaXRows = 16;
constexpr int kTmaWBytes = kTmaRows * kTmaK * 2;
constexpr int kTmaXBytes = kTmaXRows * kTmaK * 2;
constexpr int kTmaStageBytes = kTmaWBytes + kTmaXBytes;  // 18432: every stage starts 1024-byte aligned
constexpr int kTmaThreads = 160;

// The dynamic shared memory of a kStages ring (gemv.py's tma_shared_bytes: 1024 bytes of alignment slack,
// the stages, then the full and empty barriers).
template <int kStages>
constexpr int kTmaSharedBytes = 1024 + kStages * kTmaStageBytes + 2 * kStages * 8;

struct TmaParams {
  sm90::TmaMap w_map;  // 4-D (K, N, 1, 1) of w, box (64, 128, 1, 1), 128-byte swizzle
  sm90::TmaMap x_map;  // 4-D (K, M, 1, 1) of x, box (64, 16, 1, 1), 128-byte swizzle
  Params p;
};
static_assert(sizeof(TmaParams) == 384, "gemv.py's TmaParams mirrors this layout");

template <typename T, int kStages, bool kSplitK>
__global__ void __launch_bounds__(kTmaThreads, 1) gemv_tma_kernel(const __grid_constant__ TmaParams tp) {
#if CK_SM90A
  static_assert(sizeof(T) == 2, "16-bit inputs");
  static_assert(kStages >= 2 && kTmaSharedBytes<kStages> <= 227 * 1024, "a ring that fits shared memory");
  const Params& p = tp.p;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (sm90::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + kStages * kTmaStageBytes);
  unsigned long long* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    if (ck::dynamic_smem_bytes() < kTmaSharedBytes<kStages>) __trap();  // the host's size disagrees
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      sm90::barrier_init(&full[s], 1);
      sm90::barrier_init(&empty[s], 4);
    }
    sm90::barrier_init_fence();
  }
  __syncthreads();

  const int n0 = blockIdx.x * kTmaRows;
  int first = 0, tiles = (p.k + kTmaK - 1) / kTmaK;
  if constexpr (kSplitK) {
    const int per_cta = (tiles + gridDim.y - 1) / gridDim.y;
    first = min(tiles, static_cast<int>(blockIdx.y) * per_cta);
    tiles = min(tiles, first + per_cta) - first;
  }

  if (warp == 4) {  // the producer
    if (lane == 0) {
      sm90::prefetch_map(&tp.w_map);
      sm90::prefetch_map(&tp.x_map);
      for (int i = 0; i < tiles; ++i) {
        const int s = i % kStages;
        sm90::barrier_wait(&empty[s], ((i / kStages) & 1) ^ 1);
        sm90::barrier_arrive_expect(&full[s], kTmaStageBytes);
        const int k = (first + i) * kTmaK;
        unsigned char* stage = smem + s * kTmaStageBytes;
        sm90::tma_load_4d(stage, &tp.w_map, &full[s], k, n0, 0, 0);
        sm90::tma_load_4d(stage + kTmaWBytes, &tp.x_map, &full[s], k, 0, 0, 0);
      }
    }
    return;  // the consumers synchronise among themselves from here on (named barrier 1)
  }

  float tDrD[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int v = 0; v < 8; ++v) tDrD[h][v] = 0.f;
  for (int i = 0; i < tiles; ++i) {
    const int s = i % kStages;
    sm90::barrier_wait(&full[s], (i / kStages) & 1);
    const unsigned sW = sm90::smem_addr(smem + s * kTmaStageBytes), sX = sW + kTmaWBytes;
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTmaK / 16; ++kk) {
      const unsigned long long b = sm90::descriptor(sX + 32 * kk, 16, 1024);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sm90::Wgmma<T, 16>::ss(tDrD[h], sm90::descriptor(sW + h * (kTmaWBytes / 2) + 32 * kk, 16, 1024), b, 1);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // the previous stage's batch has retired: its stage may be refilled
    if (i > 0 && lane == 0) sm90::barrier_arrive(&empty[(i - 1) % kStages]);
  }
  sm90::wgmma_wait<0>();
  sm90::fence_operand(tDrD[0]);
  sm90::fence_operand(tDrD[1]);

  // This thread's values: (x row m, w row n) with the index e = m * 128 + n - n0 of the CTA's tile.
  auto element = [&](int h, int v) { return (8 * (v >> 2) + 2 * (lane % 4) + (v & 1)) * kTmaRows
                                            + 64 * h + 16 * warp + lane / 4 + 8 * ((v >> 1) & 1); };
  if constexpr (!kSplitK) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const int e = element(h, v), m = e / kTmaRows, n = n0 + e % kTmaRows;
        if (m < p.m && n < p.n) store_result<T>(p, m, n, tDrD[h][v]);
      }
  } else {
    const SplitK<kTmaRows * kTmaXRows> split(p);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int v = 0; v < 8; ++v) __stcg(split.own() + element(h, v), tDrD[h][v]);
    if (!split.last_to_arrive(p, [] { sm90::named_barrier_sync(1, 128); })) return;
    for (int e = threadIdx.x; e < p.m * kTmaRows; e += 128) {
      const int n = n0 + e % kTmaRows;
      if (n < p.n) store_result<T>(p, e / kTmaRows, n, split.sum(e));
    }
  }
#endif
}

}  // namespace gemv
