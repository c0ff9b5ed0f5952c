// Hopper (sm_90a) building blocks for raw CUDA kernels: shared-memory addresses, mbarriers, TMA tile loads,
// warpgroup MMA (wgmma) with its shared-memory descriptors, and register reallocation. Inline PTX only
// (NVRTC compiles with no system headers); every function is valid on sm_90a alone, so a kernel that uses
// them guards its body with CK_SM90A (below).
//
// Facts the helpers rely on (PTX ISA; CUTLASS's cute/arch and cute/atom/mma_traits_sm90_gmma.hpp):
// - A TMA tensor map (CUtensorMap, 128 bytes, 64-byte aligned) is read by the TMA unit from parameter,
//   constant or global memory: a kernel takes it inside a `const __grid_constant__` parameter and passes the
//   parameter's generic address, never a local copy.
// - An mbarrier's phase flips once its pending arrivals reach zero and its expected transaction bytes have
//   landed. Waiting with parity p returns once the phase with parity p has completed; on a fresh barrier the
//   phase before the first counts as complete, so a producer's first wait (parity 1) passes at once.
// - wgmma reads its shared-memory operands and its register A operand asynchronously: registers it reads or
//   writes must not be touched between the issue and the wait_group that retires it. `wgmma.fence` must
//   precede the first wgmma of a batch after those registers were touched, and `fence_operand` keeps the
//   compiler from moving reads of an accumulator above the wait.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CK_SM90A 1
#else
#define CK_SM90A 0
#endif

namespace sm90 {

// cuda.h's CUtensorMap, declared here because NVRTC has no cuda.h; the host encodes it (cuTensorMapEncodeTiled).
struct alignas(64) TmaMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarriers ----------------------------------------------------------------------------------------

__device__ __forceinline__ void barrier_init(unsigned long long* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the inits visible to the async proxy (TMA) and the other threads; a __syncthreads must follow.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also tells the barrier `bytes` more are coming through TMA.
__device__ __forceinline__ void barrier_arrive_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void barrier_wait(unsigned long long* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_map(const TmaMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// One box of a 4-D map (coordinates innermost first, in elements) into shared memory; completion is
// counted in bytes on `bar`. Parts of the box outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(void* smem, const TmaMap* map, unsigned long long* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
      ::"r"(smem_addr(smem)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
}

// One box of shared memory, laid out in the map's swizzle, into a 4-D map's tensor (coordinates innermost
// first, in elements); the parts of the box outside the tensor are not written. bulk_commit() closes a group
// of the stores issued since the last one; bulk_wait_read<N>() returns once at most N groups are still
// reading shared memory (the box may be overwritten then; the global writes land by the kernel's end).
__device__ __forceinline__ void tma_store_4d(const TmaMap* map, const void* smem, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
               ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_addr(smem)), "r"(c0), "r"(c1), "r"(c2),
               "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int kGroups> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kGroups) : "memory");
}

// Orders this thread's ordinary shared-memory writes before the async proxy's reads of them (TMA, wgmma);
// a barrier between the writers and the issuing thread must follow.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- register reallocation between warpgroups --------------------------------------------------------

template <int kRegisters> __device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters> __device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Named barrier over `threads` threads (a multiple of 32); ids 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ------------------------------------------------------------------------------------------------

// A shared-memory matrix descriptor in the 128-byte swizzle (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B). Address fields hold bits 4..17 of the byte value. `leading` and `stride` are
// the descriptor's LBO and SBO in bytes:
// - K-major operand (rows of 64 16-bit elements = 128 bytes, 8-row swizzle atoms of 1024 bytes): SBO = 1024
//   (atom to atom along M/N), LBO unused (16). A k16 step inside a 64-wide chunk adds 32 bytes to the start
//   (for TF32, rows of 32 floats: a k8 step, the same 32 bytes).
// - MN-major operand (rows along K, each 64 MN-contiguous elements): LBO = the stride between 64-wide MN
//   chunks, SBO = 1024 (8 K-rows to the next 8). A k16 step adds 16 rows = 2048 bytes.
// Every swizzle atom must start 1024-byte aligned (base offset 0).
__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned leading, unsigned stride) {
  auto field = [](unsigned bytes) { return static_cast<unsigned long long>((bytes & 0x3FFFF) >> 4); };
  return field(addr) | (field(leading) << 16) | (field(stride) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// ptxas hoists a wgmma.wait_group above arithmetic that does not depend on it: it moved every exp2 of a
// softmax below the wait that the softmax was meant to overlap with the tensor cores. (A predicated wait
// that reads the result makes ptxas serialise every wgmma instead.) A shared-memory store stays above the
// wait, so storing a value that depends on the arithmetic keeps the arithmetic above it too: call this
// just before the wait, from one thread, with a slot nothing reads.
__device__ __forceinline__ void keep_above_next_wait(float* slot, float value) {
  *reinterpret_cast<volatile float*>(slot) = value;
}

// Pins registers at this point of the program: reads of them cannot move above it, writes below it.
template <int N> __device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_operand(unsigned (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// m64nNk16 with FP32 accumulators, per 16-bit input type and N: each thread of the warpgroup holds N / 2
// accumulators, thread t (warp w = t / 32, lane l) value v at row 16 w + l / 4 + 8 ((v >> 1) & 1) and column
// 8 (v >> 2) + 2 (l % 4) + (v & 1). The register A operand of a 64x16 slice is that layout at N = 16,
// packed in pairs: a[k] = (value 2k, value 2k + 1).
template <typename T, int N> struct Wgmma;

// The wrappers' asm statements come from the macros below (this header's own, #undef'd at its end), so the
// operand numbering is written once. An m64nN FP32 accumulator is N / 2 registers a thread, d[0] ..
// d[N / 2 - 1], each named twice: as an asm operand "+f"(d[i]) and as "%i" in the instruction's register
// list; the operands after them (A, B, scale_d) are numbered from N / 2 on. The numbers are spelled out
// because the preprocessor cannot count and NVRTC refuses named operands (%[name]: "symbolic operand
// reference not supported"): CK_WGMMA_ACC_<N>(M, S) applies M to the accumulator numbers eight at a time,
// joining the groups with S() (function-like, so that it passes through the nested macros unexpanded), and
// CK_WGMMA_NEXT_<N> is the six numbers after them.
#define CK_WGMMA_OPERANDS(i0, i1, i2, i3, i4, i5, i6, i7)                                                         \
  "+f"(d[i0]), "+f"(d[i1]), "+f"(d[i2]), "+f"(d[i3]), "+f"(d[i4]), "+f"(d[i5]), "+f"(d[i6]), "+f"(d[i7])
#define CK_WGMMA_NAMES(i0, i1, i2, i3, i4, i5, i6, i7)                                                            \
  "%" #i0 ", %" #i1 ", %" #i2 ", %" #i3 ", %" #i4 ", %" #i5 ", %" #i6 ", %" #i7
#define CK_WGMMA_COMMA() ,
#define CK_WGMMA_TEXT_COMMA() ", "
#define CK_WGMMA_ACC_16(M, S) M(0, 1, 2, 3, 4, 5, 6, 7)
#define CK_WGMMA_ACC_32(M, S) CK_WGMMA_ACC_16(M, S) S() M(8, 9, 10, 11, 12, 13, 14, 15)
#define CK_WGMMA_ACC_48(M, S) CK_WGMMA_ACC_32(M, S) S() M(16, 17, 18, 19, 20, 21, 22, 23)
#define CK_WGMMA_ACC_64(M, S) CK_WGMMA_ACC_48(M, S) S() M(24, 25, 26, 27, 28, 29, 30, 31)
#define CK_WGMMA_ACC_80(M, S) CK_WGMMA_ACC_64(M, S) S() M(32, 33, 34, 35, 36, 37, 38, 39)
#define CK_WGMMA_ACC_96(M, S) CK_WGMMA_ACC_80(M, S) S() M(40, 41, 42, 43, 44, 45, 46, 47)
#define CK_WGMMA_ACC_112(M, S) CK_WGMMA_ACC_96(M, S) S() M(48, 49, 50, 51, 52, 53, 54, 55)
#define CK_WGMMA_ACC_128(M, S) CK_WGMMA_ACC_112(M, S) S() M(56, 57, 58, 59, 60, 61, 62, 63)
#define CK_WGMMA_ACC_144(M, S) CK_WGMMA_ACC_128(M, S) S() M(64, 65, 66, 67, 68, 69, 70, 71)
#define CK_WGMMA_ACC_160(M, S) CK_WGMMA_ACC_144(M, S) S() M(72, 73, 74, 75, 76, 77, 78, 79)
#define CK_WGMMA_ACC_176(M, S) CK_WGMMA_ACC_160(M, S) S() M(80, 81, 82, 83, 84, 85, 86, 87)
#define CK_WGMMA_ACC_192(M, S) CK_WGMMA_ACC_176(M, S) S() M(88, 89, 90, 91, 92, 93, 94, 95)
#define CK_WGMMA_ACC_208(M, S) CK_WGMMA_ACC_192(M, S) S() M(96, 97, 98, 99, 100, 101, 102, 103)
#define CK_WGMMA_ACC_224(M, S) CK_WGMMA_ACC_208(M, S) S() M(104, 105, 106, 107, 108, 109, 110, 111)
#define CK_WGMMA_ACC_240(M, S) CK_WGMMA_ACC_224(M, S) S() M(112, 113, 114, 115, 116, 117, 118, 119)
#define CK_WGMMA_ACC_256(M, S) CK_WGMMA_ACC_240(M, S) S() M(120, 121, 122, 123, 124, 125, 126, 127)
#define CK_WGMMA_NEXT_16 8, 9, 10, 11, 12, 13
#define CK_WGMMA_NEXT_32 16, 17, 18, 19, 20, 21
#define CK_WGMMA_NEXT_64 32, 33, 34, 35, 36, 37
#define CK_WGMMA_NEXT_80 40, 41, 42, 43, 44, 45
#define CK_WGMMA_NEXT_128 64, 65, 66, 67, 68, 69
#define CK_WGMMA_NEXT_176 88, 89, 90, 91, 92, 93
#define CK_WGMMA_NEXT_256 128, 129, 130, 131, 132, 133
// Calls M with __VA_ARGS__ expanded first, so that a CK_WGMMA_NEXT_<N> among them becomes six arguments.
#define CK_WGMMA_CALL(M, ...) M(__VA_ARGS__)

// One wgmma of an m64nN FP32 accumulator d: `instr` is the mnemonic with its shape and types, and scale_d
// becomes the predicate p. ss: A and B are shared-memory descriptors a and b, followed by the immediates
// scale-a 1, scale-b 1 (no negation), transpose-a 0 and transpose-b 0 (both K-major). rs: A is the four
// registers a[0 .. 3], B the descriptor b; `imm` is scale-a, scale-b and, for the 16-bit types, transpose-b
// (TF32 has no transpose).
#define CK_WGMMA_SS(instr, N) CK_WGMMA_CALL(CK_WGMMA_SS_, instr, N, CK_WGMMA_NEXT_##N)
#define CK_WGMMA_SS_(instr, N, x0, x1, x2, x3, x4, x5)                                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #x2 ", 0;\n" instr " {"                                       \
               CK_WGMMA_ACC_##N(CK_WGMMA_NAMES, CK_WGMMA_TEXT_COMMA) "}, %" #x0 ", %" #x1 ", p, 1, 1, 0, 0;\n}\n" \
               : CK_WGMMA_ACC_##N(CK_WGMMA_OPERANDS, CK_WGMMA_COMMA)                                              \
               : "l"(a), "l"(b), "r"(scale_d))
#define CK_WGMMA_RS(instr, imm, N) CK_WGMMA_CALL(CK_WGMMA_RS_, instr, imm, N, CK_WGMMA_NEXT_##N)
#define CK_WGMMA_RS_(instr, imm, N, x0, x1, x2, x3, x4, x5)                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #x5 ", 0;\n" instr " {"                                       \
               CK_WGMMA_ACC_##N(CK_WGMMA_NAMES, CK_WGMMA_TEXT_COMMA) "}, {%" #x0 ", %" #x1 ", %" #x2 ", %" #x3    \
               "}, %" #x4 ", p, " imm ";\n}\n"                                                                    \
               : CK_WGMMA_ACC_##N(CK_WGMMA_OPERANDS, CK_WGMMA_COMMA)                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d))

// Wgmma<T, N> for the 16-bit type T, whose PTX name is `type`:
//   ss: D(64xN) (+)= A(64x16, shared, K-major) * B(16xN, shared, K-major); scale_d 0 overwrites D.
//   rs: D(64xN) (+)= A(64x16, registers) * B(16xN, shared, MN-major); scale_d 0 overwrites D.
#define CK_WGMMA_16BIT(T, type, N)                                                                                \
  template <> struct Wgmma<T, N> {                                                                                \
    static __device__ __forceinline__ void ss(float (&d)[N / 2], unsigned long long a, unsigned long long b,      \
                                              int scale_d) {                                                      \
      CK_WGMMA_SS("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #type "." #type, N);                          \
    }                                                                                                             \
    static __device__ __forceinline__ void rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long b,    \
                                              int scale_d) {                                                      \
      CK_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #type "." #type, "1, 1, 1", N);               \
    }                                                                                                             \
  };

// Both 16-bit types at each N the kernels use.
#define CK_WGMMA_16BIT_TYPES(N) CK_WGMMA_16BIT(__half, f16, N) CK_WGMMA_16BIT(__nv_bfloat16, bf16, N)
CK_WGMMA_16BIT_TYPES(16)
CK_WGMMA_16BIT_TYPES(32)
CK_WGMMA_16BIT_TYPES(64)
CK_WGMMA_16BIT_TYPES(80)
CK_WGMMA_16BIT_TYPES(128)
CK_WGMMA_16BIT_TYPES(176)
CK_WGMMA_16BIT_TYPES(256)

// m64n64k8 and m64n128k8 TF32 with FP32 accumulators (the accumulator layout above, N / 2 a thread). The register A
// operand of a 64x8 slice (CUTLASS's ALayout_64x8 for 32-bit types): thread t (warp w, lane l) holds
// a[0] (row 16 w + l / 4, k l % 4), a[1] (row + 8, same k), a[2] (row, k + 4), a[3] (row + 8, k + 4), the
// mma.sync m16n8k8 TF32 layout per warp. B comes from shared memory K-major (TF32 wgmma has no transposed
// operand), in the 128-byte swizzle: 32 floats a row, so a k8 step adds 32 bytes to the start address. The
// tensor core reads the top 19 bits of each operand.
template <int N> struct WgmmaTf32;

template <> struct WgmmaTf32<64> {
  // D(64x64) (+)= A(64x8, registers) * B(8x64, shared, K-major); scale_d 0 overwrites D.
  static __device__ __forceinline__ void rs(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int scale_d) {
    CK_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", "1, 1", 64);
  }
};

template <> struct WgmmaTf32<128> {
  // D(64x128) (+)= A(64x8, registers) * B(8x128, shared, K-major); scale_d 0 overwrites D.
  static __device__ __forceinline__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int scale_d) {
    CK_WGMMA_RS("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "1, 1", 128);
  }
};

}  // namespace sm90

#undef CK_WGMMA_16BIT_TYPES
#undef CK_WGMMA_16BIT
#undef CK_WGMMA_RS_
#undef CK_WGMMA_RS
#undef CK_WGMMA_SS_
#undef CK_WGMMA_SS
#undef CK_WGMMA_CALL
#undef CK_WGMMA_NEXT_256
#undef CK_WGMMA_NEXT_176
#undef CK_WGMMA_NEXT_128
#undef CK_WGMMA_NEXT_80
#undef CK_WGMMA_NEXT_64
#undef CK_WGMMA_NEXT_32
#undef CK_WGMMA_NEXT_16
#undef CK_WGMMA_ACC_256
#undef CK_WGMMA_ACC_240
#undef CK_WGMMA_ACC_224
#undef CK_WGMMA_ACC_208
#undef CK_WGMMA_ACC_192
#undef CK_WGMMA_ACC_176
#undef CK_WGMMA_ACC_160
#undef CK_WGMMA_ACC_144
#undef CK_WGMMA_ACC_128
#undef CK_WGMMA_ACC_112
#undef CK_WGMMA_ACC_96
#undef CK_WGMMA_ACC_80
#undef CK_WGMMA_ACC_64
#undef CK_WGMMA_ACC_48
#undef CK_WGMMA_ACC_32
#undef CK_WGMMA_ACC_16
#undef CK_WGMMA_TEXT_COMMA
#undef CK_WGMMA_COMMA
#undef CK_WGMMA_NAMES
#undef CK_WGMMA_OPERANDS
