// float32 GEMM for Hopper (sm_90a) on warpgroup MMAs, as three TF32 products per product (3xTF32):
// D = alpha * A @ B + beta * C with A (M, K) row-major or column-major (kAMMajor: the transposed view of a
// row-major (K, M) matrix, x.t() @ y) and B (K, N) row-major or column-major (kBKMajor: the transposed view
// of a row-major (N, K) weight, x @ w.t()), or a batch of such products (blockIdx.y: the maps' third
// coordinate, the result's and C's batch strides), FP32-accurate (the split and the partial-sum fold
// of the sm80-style 3xTF32 kernel, cute_kernels/ops/gemm/sgemm_tf32x3_kernel.py, whose docstring says why
// each is needed). TF32 wgmma reads its shared-memory operand K-major only, and both B halves (big and small)
// have to be in shared memory: so the consumers split B's raw tile into two K-major tiles themselves,
// transposing it on the way when B is row-major (N-major); A is read into registers and split there (wgmma
// takes A from registers, K-major, the layout m16n8k8 uses per warp), gathered from an M-major tile alike.
//
// CTA tile kTile x kTile (128, or 64 for batches of small products), k-tiles of kBlockK = 32 floats (one
// 128-byte swizzle row); 128 + 128 kTile / 64 threads: warpgroup 0 produces (one thread issues the TMA loads;
// setmaxnreg gives its registers away), the kTile / 64 warpgroups after it consume, 64 rows each (FP32 running
// sums and this k-tile's partial sums, kTile / 2 + kTile / 2 registers a thread). The 64 tile runs two CTAs
// an SM.
//
// Shared memory (1024-byte aligned, 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8)),
// T = kTile:
//   sA[kStages]: [T rows m][32 floats k]              one TMA box (32, T) of the (K, M) map
//            or, kAMMajor: [T / 32 boxes][32 rows k][32 floats m]  TMA boxes (32, 32) of the (M, K) map
//   sB[kStages]: [T / 32 boxes][32 rows k][32 floats n]  TMA boxes (32, 32) of the (N, K) map
//            or, kBKMajor: [T rows n][32 floats k]      one TMA box (32, T) of the (K, N) map
//   sBt[2 buffers][big, small]: [T rows n][32 floats k]  K-major, written by the consumers
// 4 stages at T = 128: 128 KB of raw stages + 64 KB of split tiles (half of each at T = 64).
//
// The pipeline, and why it waits where it waits (one consumer warpgroup, k-tile j):
// - full[s] (the producer's arrival + the TMA bytes): wait before reading the raw stage, whose bytes are only
//   there once they have landed.
// - Split B: this warpgroup's 64 columns n of B's raw tile into sBt[j % 2] (big and small), each
//   16-byte chunk of a K-major raw tile to the same place, a row-major one's columns gathered; read
//   its A fragments of the tile's four k8 steps into registers.
// - empty[s] (one arrival per consumer warp): every read of the raw stage is done, so the producer may
//   refill it.
// - wgmma.wait_group 0, then fold: tile j-1's products are retired and its partial sums added into the
//   running sums (FP32 adds round to nearest; the tensor core truncates, which is why each k-tile starts a
//   fresh partial). The wait comes after B's split so that the split overlaps those products. (Before the
//   first tile nothing is pending and the partial is zero.)
// - Split A into a_big and a_small, which tile j-1's wgmmas read until the wait (the raw values are pinned
//   after the wait, so that the split cannot be scheduled above it).
// - Named barrier (every consumer warpgroup, after a proxy fence of each thread's shared-memory writes): the
//   wgmmas read all kTile columns of sBt[j % 2], half of which (kTile 128) the other warpgroup wrote, and
//   every warp's share of them (kTile 64: the warpgroup's own four warps). Passing it also means the other
//   warpgroup has retired tile j-1, the last reader of sBt[(j + 1) % 2], which it overwrites next.
// - Issue tile j's twelve wgmmas (four k8 steps: small x big, big x small, big x big, the first with
//   scale-d 0, which zeroes the partial), commit, and go on to split tile j + 1 while they run.
//
// Bounds: TMA zero-fills what lies outside A and B (the K tail, the M and N edges), and zero adds nothing to a
// product; the epilogue writes only rows below M and columns below N. B's 32-column boxes wholly past N (and
// an M-major A's 32-row boxes wholly past M) are not loaded (nor counted in the stage's bytes): the columns
// (rows) they would feed are never stored.
//
// Check the SASS for HGMMA.64x128x8.F32.TF32 (64x64x8 at kTile 64) and UTMALDG and no local memory:
//   tests/test_sgemm_sm90_cpu.py compiles it for sm_90a and asserts no spills.

#include <cuda_fp16.h>  // sm90.cuh's 16-bit Wgmma specialisations name __half and __nv_bfloat16
#include <cuda_bf16.h>

#include "sm90.cuh"

namespace sgemm_sm90 {

constexpr int kBlockK = 32;
constexpr int kBoxBytes = 32 * kBlockK * 4;  // one 32 x 32 TMA box: 4 KB
constexpr int kProducerRegisters = 40;

// A CTA tile of kTile x kTile: 128 (two consumer warpgroups of 64 rows, one CTA an SM) or 64 (one consumer
// warpgroup, two CTAs an SM: a batch of small products wastes no three quarters of each tile on padding).
template <int kTile> struct Tile {
  static_assert(kTile == 64 || kTile == 128, "64- or 128-square tiles");
  static constexpr int kConsumers = kTile / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kStageBytes = kTile * kBlockK * 4;  // one raw A or B stage, and one split tile
  static constexpr int kConsumerWarps = 4 * kConsumers;
  static constexpr int kCtasPerSm = kTile == 128 ? 1 : 2;
  // setmaxnreg: the producer's 40 and the consumers' share of the registers the launch gives the CTA
  // (65536 / kCtasPerSm): 128 x (40 + 2 x 232) = 64512; 128 x (40 + 216) = 32768.
  static constexpr int kConsumerRegisters = kTile == 128 ? 232 : 216;
  static constexpr int kAccumulators = kTile / 2;  // an m64 x kTile FP32 tile over a warpgroup's 128 threads
};
constexpr int kBarrierConsumers = 1;  // named barrier id (0 is __syncthreads)

struct Params {
  sm90::TmaMap a_map;  // A as (K, M, batch, 1), box (32, kTile, 1, 1); kAMMajor: as (M, K, batch, 1), box (32, 32, 1, 1)
  sm90::TmaMap b_map;  // B as (N, K, batch, 1), box (32, 32, 1, 1); kBKMajor: as (K, N, batch, 1), box (32, kTile, 1, 1)
  float* d;            // the result (M, N), row stride ldd, batch stride batch_d
  const float* c;      // read when beta != 0, row stride ldc, batch stride batch_c (0: one C for all; may be d)
  long long ldd, ldc, batch_d, batch_c;
  int m, n, k;
  int tiles_m, tiles_n;
  float alpha, beta;
  int a_batched, b_batched;  // 1: the map's third dim is the batch; 0: one matrix for every batch (dim of 1)
};

static_assert(sizeof(Params) == 384, "cute_kernels/ops/gemm/sgemm_sm90.py packs the same layout (PARAMS_BYTES)");

// Byte offset of element (row, col) in a 128-byte-swizzled tile of 32-float rows.
__device__ __forceinline__ unsigned swizzled(int row, int col) {
  return row * 128 + ((((col >> 2) ^ row) & 7) << 4) + ((col & 3) << 2);
}

// x = big + small: big is x rounded to TF32 (round to nearest, ties away: add half of the dropped 13 bits,
// clear them); small = x - big, exact in FP32, which the tensor core reads truncated. A NaN x leaves small
// NaN whatever big became; an infinity, or a magnitude from 0x7f7ff000 (which rounds to infinity), gives a
// non-finite small too, so the sums it enters are NaN (the sgemm docstring says so).
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  small = __float_as_uint(x - __uint_as_float(big));
}

template <int kTile> struct __align__(1024) Shared {
  float a[4][kTile * kBlockK];
  float b[4][kTile * kBlockK];
  float bt[2][2][kTile * kBlockK];  // [buffer][big, small]
  unsigned long long full[4];
  unsigned long long empty[4];
};

static_assert(sizeof(Shared<128>) == 12 * Tile<128>::kStageBytes + 1024 &&
                  sizeof(Shared<64>) == 12 * Tile<64>::kStageBytes + 1024,
              "sgemm_sm90.py's shared_bytes counts this, plus 1024 to align it");

// One consumer warpgroup's work on k-tile `tile`: split B's raw tile into sBt[tile % 2], retire and fold the
// previous tile's products, split A, issue this tile's (see the pipeline above).
template <int kStages, bool kBKMajor, bool kAMMajor, int kTile>
__device__ __forceinline__ void consume_tile(Shared<kTile>& sm, int tile, int wg, int t, unsigned (&a_big)[4][4],
                                             unsigned (&a_small)[4][4], float (&acc)[Tile<kTile>::kAccumulators],
                                             float (&part)[Tile<kTile>::kAccumulators]) {
  const int s = tile % kStages;
  sm90::barrier_wait(&sm.full[s], (tile / kStages) & 1);
  const char* raw_b = reinterpret_cast<const char*>(sm.b[s]);
  const char* raw_a = reinterpret_cast<const char*>(sm.a[s]);
  char* big = reinterpret_cast<char*>(sm.bt[tile & 1][0]);
  char* small = reinterpret_cast<char*>(sm.bt[tile & 1][1]);
  // B: this warpgroup's 64 columns; thread t takes column n and the 16-byte k-chunks t / 64 + 2 j. Row-major
  // reads of one k-row by 32 consecutive columns, and 16-byte reads and writes of 8 consecutive rows, are
  // bank-conflict free.
  const int n = 64 * wg + (t & 63);
  const int box = n >> 5, nn = n & 31;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int chunk = (t >> 6) + 2 * j;
    const unsigned at = n * 128 + (((chunk ^ n) & 7) << 4);
    float x[4];
    if constexpr (kBKMajor) {
      *reinterpret_cast<float4*>(x) = *reinterpret_cast<const float4*>(raw_b + at);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = *reinterpret_cast<const float*>(raw_b + box * 4096 + swizzled(4 * chunk + i, nn));
    }
    uint4 hi, lo;
    unsigned* h = reinterpret_cast<unsigned*>(&hi);
    unsigned* l = reinterpret_cast<unsigned*>(&lo);
#pragma unroll
    for (int i = 0; i < 4; ++i) split(x[i], h[i], l[i]);
    *reinterpret_cast<uint4*>(big + at) = hi;
    *reinterpret_cast<uint4*>(small + at) = lo;
  }
  // A: rows 16 w + g (+ 8) of this warpgroup's 64, columns t4 (+ 4) of each k8 step, read now and split once
  // the previous tile's wgmmas, which read a_big and a_small, have retired. From an M-major tile a warp's read
  // spans 8 rows m (two 16-byte chunks of a k-row) of 4 k-rows, two ways per bank.
  const int warp = t >> 5, lane = t & 31;
  const int row = 64 * wg + 16 * warp + (lane >> 2), col = lane & 3;
  float a[4][4];
#pragma unroll
  for (int step = 0; step < 4; ++step) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row + 8 * (i & 1), k = 8 * step + col + 4 * (i >> 1);
      a[step][i] = kAMMajor ? *reinterpret_cast<const float*>(raw_a + (r >> 5) * 4096 + swizzled(k, r & 31))
                            : *reinterpret_cast<const float*>(raw_a + swizzled(r, k));
    }
  }
  __syncwarp();
  if (lane == 0) sm90::barrier_arrive(&sm.empty[s]);
  sm90::fence_async_shared();
  sm90::wgmma_wait<0>();  // none pending before the first tile, whose partial (zeros) adds nothing
  sm90::fence_operand(part);
  // The split below writes a_big and a_small, which the retired wgmmas read: pinning its inputs here keeps
  // the compiler from computing it above the wait (register arithmetic may move across the asm otherwise).
#pragma unroll
  for (int step = 0; step < 4; ++step) sm90::fence_operand(a[step]);
#pragma unroll
  for (int i = 0; i < Tile<kTile>::kAccumulators; ++i) acc[i] += part[i];
#pragma unroll
  for (int step = 0; step < 4; ++step) {
#pragma unroll
    for (int i = 0; i < 4; ++i) split(a[step][i], a_big[step][i], a_small[step][i]);
  }
  sm90::named_barrier_sync(kBarrierConsumers, 128 * Tile<kTile>::kConsumers);
  sm90::wgmma_fence();
  const unsigned big_addr = sm90::smem_addr(big), small_addr = sm90::smem_addr(small);
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    const unsigned long long big_desc = sm90::descriptor(big_addr + 32 * step, 16, 1024);
    const unsigned long long small_desc = sm90::descriptor(small_addr + 32 * step, 16, 1024);
    sm90::WgmmaTf32<kTile>::rs(part, a_small[step], big_desc, step > 0);
    sm90::WgmmaTf32<kTile>::rs(part, a_big[step], small_desc, 1);
    sm90::WgmmaTf32<kTile>::rs(part, a_big[step], big_desc, 1);
  }
  sm90::wgmma_commit();
}

template <int kStages, bool kBKMajor, bool kAMMajor = false, int kTile = 128>
__global__ void __launch_bounds__(Tile<kTile>::kThreads, Tile<kTile>::kCtasPerSm)
    sgemm_tf32x3_kernel(const __grid_constant__ Params p) {
  static_assert(kStages >= 2 && kStages <= 4, "Shared holds four raw stages");
  using T = Tile<kTile>;
#if CK_SM90A
  // Aligned through the shared-window address, not the generic pointer: a pointer rounded as an integer is
  // no longer known to point into shared memory, and every access to it would go through generic loads.
  extern __shared__ unsigned char smem_raw[];
  Shared<kTile>& sm = *reinterpret_cast<Shared<kTile>*>(smem_raw + ((1024u - (sm90::smem_addr(smem_raw) & 1023u)) & 1023u));
  const int tid = threadIdx.x;
  // Tiles in bands of 8 tile rows, column by column inside a band, so that concurrent CTAs share A and B
  // tiles in L2.
  const int band = 8 * p.tiles_n, first_m = (blockIdx.x / band) * 8;
  const int band_rows = min(p.tiles_m - first_m, 8);
  const int tile_m = first_m + (blockIdx.x % band) % band_rows, tile_n = (blockIdx.x % band) / band_rows;
  const int m0 = tile_m * kTile, n0 = tile_n * kTile;
  const int batch = blockIdx.y, a_batch = batch * p.a_batched, b_batch = batch * p.b_batched;
  const int k_tiles = (p.k + kBlockK - 1) / kBlockK;
  // B's 32-column boxes that hold a column below N: a box wholly past N is not loaded (the columns it would
  // feed are never stored, so what its stage slot holds does not matter). A K-major B is one box. The same
  // for an M-major A's 32-row boxes and M.
  const int b_bytes = kBKMajor ? T::kStageBytes : min(kTile / 32, (p.n - n0 + 31) / 32) * kBoxBytes;
  const int a_bytes = kAMMajor ? min(kTile / 32, (p.m - m0 + 31) / 32) * kBoxBytes : T::kStageBytes;
  if (tid == 0) {
    sm90::prefetch_map(&p.a_map);
    sm90::prefetch_map(&p.b_map);
    for (int s = 0; s < kStages; ++s) {
      sm90::barrier_init(&sm.full[s], 1);
      sm90::barrier_init(&sm.empty[s], T::kConsumerWarps);
    }
    sm90::barrier_init_fence();
  }
  __syncthreads();
  const int wg = tid / 128 - 1;  // -1: the producer
  if (wg < 0) {
    sm90::registers_release<kProducerRegisters>();
    if (tid == 0) {
      for (int tile = 0; tile < k_tiles; ++tile) {
        const int s = tile % kStages;
        sm90::barrier_wait(&sm.empty[s], ((tile / kStages) & 1) ^ 1);
        sm90::barrier_arrive_expect(&sm.full[s], a_bytes + b_bytes);
        if constexpr (kAMMajor) {
          for (int box = 0; box < a_bytes / kBoxBytes; ++box) {
            sm90::tma_load_4d(sm.a[s] + box * 32 * kBlockK, &p.a_map, &sm.full[s], m0 + 32 * box, tile * kBlockK, a_batch, 0);
          }
        } else {
          sm90::tma_load_4d(sm.a[s], &p.a_map, &sm.full[s], tile * kBlockK, m0, a_batch, 0);
        }
        if constexpr (kBKMajor) {
          sm90::tma_load_4d(sm.b[s], &p.b_map, &sm.full[s], tile * kBlockK, n0, b_batch, 0);
        } else {
          for (int box = 0; box < b_bytes / kBoxBytes; ++box) {
            sm90::tma_load_4d(sm.b[s] + box * 32 * kBlockK, &p.b_map, &sm.full[s], n0 + 32 * box, tile * kBlockK, b_batch, 0);
          }
        }
      }
    }
    return;
  }
  sm90::registers_claim<T::kConsumerRegisters>();
  const int t = tid % 128;
  float acc[T::kAccumulators], part[T::kAccumulators];
#pragma unroll
  for (int i = 0; i < T::kAccumulators; ++i) acc[i] = 0.f, part[i] = 0.f;
  unsigned a_big[4][4], a_small[4][4];
  // A do-while (K > 0: the host launches no kernel otherwise): a loop that may run zero times joins a path
  // of zero partial sums to the final wait, which ptxas counts as a non-wgmma write of them and serialises
  // every wgmma for.
  int tile = 0;
  do {
    consume_tile<kStages, kBKMajor, kAMMajor, kTile>(sm, tile, wg, t, a_big, a_small, acc, part);
  } while (++tile < k_tiles);
  sm90::wgmma_wait<0>();
  sm90::fence_operand(part);
#pragma unroll
  for (int i = 0; i < T::kAccumulators; ++i) acc[i] += part[i];

  // Epilogue: value v of thread (warp, lane) is row 16 warp + lane / 4 + 8 ((v >> 1) & 1), column
  // 8 (v >> 2) + 2 (lane % 4) + (v & 1) of this warpgroup's 64 x kTile. Pairs of columns go as one 8-byte
  // store where the row allows it.
  const int warp = t >> 5, lane = t & 31;
  float* d = p.d + batch * p.batch_d;
  const float* c = p.c + batch * p.batch_c;
  const bool pairs = (p.ldd % 2 == 0) && (reinterpret_cast<size_t>(d) % 8 == 0);
#pragma unroll
  for (int v = 0; v < T::kAccumulators; v += 2) {
    const int row = m0 + 64 * wg + 16 * warp + (lane >> 2) + 8 * ((v >> 1) & 1);
    const int col = n0 + 8 * (v >> 2) + 2 * (lane & 3);
    if (row >= p.m) continue;
    float x0 = p.alpha * acc[v], x1 = p.alpha * acc[v + 1];
    if (p.beta != 0.f) {
      const float* c_row = c + row * p.ldc;
      if (col < p.n) x0 += p.beta * c_row[col];
      if (col + 1 < p.n) x1 += p.beta * c_row[col + 1];
    }
    float* d_row = d + row * p.ldd;
    if (pairs && col + 1 < p.n) {
      *reinterpret_cast<float2*>(d_row + col) = make_float2(x0, x1);
    } else {
      if (col < p.n) d_row[col] = x0;
      if (col + 1 < p.n) d_row[col + 1] = x1;
    }
  }
#endif
}

}  // namespace sgemm_sm90
