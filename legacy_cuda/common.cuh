// Shared device helpers for the CUDA C++ kernels of this package. Compiled by NVRTC (no host code, no
// system headers), so everything here is self-contained.
#pragma once

namespace ck {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// std::conditional without the standard library (NVRTC compiles with no system headers).
template <bool kCond, typename A, typename B> struct Conditional { using type = A; };
template <typename A, typename B> struct Conditional<false, A, B> { using type = B; };

// std::integral_constant<bool, B> without the standard library: lets a generic lambda take a compile-time
// flag as an argument (`[&](auto flag) { if constexpr (decltype(flag)::value) ... }`).
template <bool B> struct BoolConstant { static constexpr bool value = B; };

// exp2 as the one MUFU.EX2 instruction (ex2.approx, about 2 ulp: what exp2f uses too). Without fast math
// exp2f adds a fix-up for results below 2^-126 (a compare and two multiplies around the MUFU); in a softmax,
// next to a row's largest term exp2(0) = 1 such terms are invisible, so flushing them to zero (.ftz) changes
// no result. exp2(-inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp2 of x <= 0 (or NaN) on the FP32 pipe instead of the MUFU, for kernels whose exponentials keep the MUFU
// (16 results per clock per SM) busy while the FP32 pipe (128) has room. x = i + f, i = floor(x), f in
// [0, 1): 2^f by a degree-3 polynomial with p(0) = 1 (minimax relative error 8.6e-5, below a 16-bit value's
// rounding), then i added to its exponent field. Adding 1.5 * 2^23 rounding down leaves i in the sum's low
// mantissa bits; the two subtractions are exact. x is clamped at -127, so -inf gives +0 and anything below
// 2^-126 comes out below 2^-126 (where the MUFU's .ftz gives 0); a NaN x is passed through, as the MUFU
// does. About eleven instructions (the MUFU's one costs a single issue slot but eight of its pipe's clocks).
__device__ __forceinline__ float fma_exp2(float x) {
  const float clamped = fmaxf(x, -127.f);  // fmaxf drops a NaN: the select below brings it back
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23: sums with it in [2^23, 2^24) step by exactly 1
  const float shifted = __fadd_rd(clamped, kShift);  // kShift + i
  const float f = clamped - (shifted - kShift);
  const float p = fmaf(fmaf(fmaf(0.0770670399f, f, 0.227644995f), f, 0.695116758f), f, 1.f);
  // shifted's bits are kShift's (nine zero low bits) plus i, so shifted left by 23 they are i << 23 (unsigned:
  // the bits shifted out are dropped, where a signed shift past the sign bit is undefined in C++17).
  const float y = __uint_as_float(__float_as_uint(p) + (__float_as_uint(shifted) << 23));
  return x != x ? x : y;
}

// A fixed-size array aligned to its own size, so that loading or storing one becomes a single vector
// instruction (ld.global.v4.f32 and friends) when the pointer is aligned to sizeof(Array).
template <typename T, int N>
struct alignas(sizeof(T) * N) Array {
  static_assert((N & (N - 1)) == 0, "vector length must be a power of two (alignment must be one)");
  T v[N];
};

// Streaming accesses for data touched once: evict-first in the caches (ld/st .cs), so a pass over a large
// array does not push out what other work keeps in L2. 16-byte pieces go as one vector access each.
#ifndef CK_STREAMING_HINTS
#define CK_STREAMING_HINTS 1
#endif
template <typename T, int N>
__device__ __forceinline__ Array<T, N> load_stream(const Array<T, N>* p) {
  if constexpr (CK_STREAMING_HINTS && sizeof(Array<T, N>) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    Array<T, N> r;
    static_assert(sizeof(r) == sizeof(v), "16-byte pieces");
    *reinterpret_cast<uint4*>(&r) = v;
    return r;
  } else {
    return *p;
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_stream(Array<T, N>* p, const Array<T, N>& v) {
  if constexpr (CK_STREAMING_HINTS && sizeof(Array<T, N>) % 16 == 0) {
#pragma unroll
    for (int i = 0; i < int(sizeof(Array<T, N>) / 16); ++i)
      __stcs(reinterpret_cast<uint4*>(p) + i, reinterpret_cast<const uint4*>(&v)[i]);
  } else {
    *p = v;
  }
}

// cp.async of kBytes (4, 8 or 16) from global to shared memory; bytes past `src_bytes` are zero-filled
// (0 reads nothing). 16-byte copies bypass L1 (.cg); smaller ones must go through it (.ca).
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(void* smem, const void* gmem, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(gmem), "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Group bookkeeping for multi-stage pipelines: commit closes a group of the copies this thread issued since
// the last commit (an empty group is fine, so every thread can commit once per stage whatever it copied);
// wait_group<N> returns once at most N of this thread's groups are still in flight. Other threads' copies
// become visible only after a barrier that follows their own waits.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  static_assert(kPending >= 0, "a count of groups");
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Named barriers (ids 1-15; 0 is __syncthreads) in their non-.aligned PTX forms (sm_70+), for warps that
// reach one barrier at different instructions, as a producer warp and its consumers do: bar.sync and
// bar.arrive mean barrier.*.aligned, which promises that every thread executes the same instruction, and
// synccheck rejects that promise broken as "divergent threads in block". `threads` counts whole warps.
// A hand-over of shared-memory data wants a sync on both sides: racecheck does not follow a barrier some
// threads only arrive at before a later hand-over, and reports that hand-over as a hazard
// (docs/notes/scan.md#racecheck-and-arrive-only-barriers).
__device__ __forceinline__ void barrier_sync(unsigned id, unsigned threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void barrier_arrive(unsigned id, unsigned threads) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Bytes of dynamic shared memory the launch gave the CTA (a kernel whose host sizes it by hand traps when
// it is short of the layout's).
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
  unsigned bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

// Integer accumulation wraps modulo 2^64 like torch's int64 arithmetic; signed overflow is undefined in
// C++, so integers are added as unsigned.
template <typename T>
__device__ __forceinline__ T wrapping_add(T a, T b) {
  return a + b;
}
template <>
__device__ __forceinline__ long long wrapping_add<long long>(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
}

// ---- Inter-block communication through global memory --------------------------------------------------
// The PTX memory model's scoped operations: a release store orders every earlier write of this thread
// before it; an acquire load orders every later read after it; relaxed accesses are single-copy atomic and
// coherent at GPU scope (they go to L2, never a stale L1 line).

__device__ __forceinline__ void store_release_u32(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// CTA scope: a word one thread hands another of its own CTA, ordered by something else (an mbarrier's
// release and acquire); the SM's L1 may serve these.
__device__ __forceinline__ void store_relaxed_cta_i32(int* p, int v) {
  asm volatile("st.relaxed.cta.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int load_relaxed_cta_i32(const int* p) {
  int v;
  asm volatile("ld.relaxed.cta.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long load_relaxed_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// Two 8-byte words as one 16-byte access (p 16-byte aligned). Each word is single-copy atomic; the pair is
// not promised to be, so a reader must be able to tell a torn pair (scan.cu tags both words).
__device__ __forceinline__ void store_relaxed_u64x2(unsigned long long* p, unsigned long long lo, unsigned long long hi) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}
__device__ __forceinline__ void load_relaxed_u64x2(const unsigned long long* p, unsigned long long& lo, unsigned long long& hi) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
}

// Bit casts between 4-byte value types and the u32 halves of the u64 words the scoped accesses above move.
__device__ __forceinline__ unsigned to_bits32(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned to_bits32(int v) { return static_cast<unsigned>(v); }
template <typename T>
__device__ __forceinline__ T from_bits32(unsigned b);
template <>
__device__ __forceinline__ float from_bits32<float>(unsigned b) { return __uint_as_float(b); }
template <>
__device__ __forceinline__ int from_bits32<int>(unsigned b) { return static_cast<int>(b); }

// Bit casts between 8-byte value types and the u64 words the scoped accesses above move.
__device__ __forceinline__ unsigned long long to_bits64(double v) {
  return static_cast<unsigned long long>(__double_as_longlong(v));
}
__device__ __forceinline__ unsigned long long to_bits64(long long v) { return static_cast<unsigned long long>(v); }
template <typename T>
__device__ __forceinline__ T from_bits64(unsigned long long b);
template <>
__device__ __forceinline__ double from_bits64<double>(unsigned long long b) {
  return __longlong_as_double(static_cast<long long>(b));
}
template <>
__device__ __forceinline__ long long from_bits64<long long>(unsigned long long b) {
  return static_cast<long long>(b);
}

}  // namespace ck
