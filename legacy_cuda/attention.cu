// Attention, O = softmax(Q K^T * scale) V, fused: the scores never leave the chip.
//
// Both kernels walk the keys in tiles with the online softmax: per query row a running maximum m and a
// running sum l of exp(s - m); when a tile raises the maximum, what is already summed (l and the output
// accumulator) is multiplied by exp(m_old - m_new). Scores are kept in the log2 domain (scale * log2(e)
// is folded into the scale once), so every exponential is one exp2. Division by l waits for the end.
//
// - fused_fp32: FP32 everywhere (FFMA, no tensor cores, no TF32). One CTA per (query tile, key split,
//   batch*head). Q, the current K tile, V tile and the probabilities P sit in shared memory; both
//   products are register-tiled. When query tiles alone cannot fill the GPU, the keys are split and the
//   last CTA of a query tile to finish merges the splits' partial results (an in-kernel reduction).
// - flash2_mma (FP16/BF16): FlashAttention-2 on mma.sync m16n8k16 (see the second half of this file); its
//   float instantiation (the flash2_tf32x3 entry) runs each product as three m16n8k8 TF32 products.
//
// Masking follows torch's SDPA: causal is top-left aligned (query i sees keys 0..i, also when M != N).
// Without a window key 0 is never masked, so a row's maximum is finite once the first key tile is in; a key
// split that starts later may see a whole row masked, which the -inf guards below handle. Windows and sinks
// (the kWindow instantiations, below) may mask any key, and a row may see none: its output is 0.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "attention_windows.cuh"
#include "common.cuh"
#include "mma16.cuh"

namespace attention {

// Everything a launch passes, as one struct (the host packs the same layout with ctypes). Strides are in
// elements; the last dim of every tensor has stride 1.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long o_batch_stride, o_head_stride, o_row_stride;
  float* partial_o;     // fused_fp32 split-N workspace: [query tile][split][kBlockM][kHeadDim], normalised
  float* partial_lse;   // [query tile][split][kBlockM], log2 of each row's sum of exp2 (-inf: no keys)
  unsigned* arrivals;   // [query tile] splits finished so far; zero before and after every launch
  float* lse;           // kLse kernels: [batch * heads][m], each row's log-sum-exp of its scaled scores
                        // (natural log; -inf for a row that sees no key)
  int heads, m, n, d;
  int splits, tiles_per_split;  // key splits, and key tiles per split
  float scale_log2;             // scale * log2(e)
  int causal;
  int kv_group;                 // query heads per key/value head (grouped-query attention; 1: one each)
  int window_left, window_right;  // kWindow: row i sees keys i - left .. i + right (clamped to M and N)
  int num_sinks;                  // kWindow: keys 0 .. num_sinks - 1 are seen by every row (within causal)
};
static_assert(sizeof(Params) == 208, "cute_kernels/ops/attention/problem.py packs this layout (PARAMS_BYTES)");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Offsets of one (batch, head) slice of each tensor; blockIdx-derived indices, 64-bit from the start.
// Query head h reads key/value head h / kv_group (grouped-query attention), in place: K and V are never
// expanded.
struct Slice {
  long long q, k, v, o;
  __device__ Slice(const Params& p, int bh) {
    const long long b = bh / p.heads, h = bh % p.heads;
    // Unsigned 32-bit division: the signed or 64-bit one needs more registers than the tightest
    // instantiations (255 per thread) have to spare.
    const long long h_kv = static_cast<unsigned>(bh % p.heads) / static_cast<unsigned>(p.kv_group);
    q = b * p.q_batch_stride + h * p.q_head_stride;
    k = b * p.k_batch_stride + h_kv * p.k_head_stride;
    v = b * p.v_batch_stride + h_kv * p.v_head_stride;
    o = b * p.o_batch_stride + h * p.o_head_stride;
  }
};

// Copy rows [0, kRows) x columns [0, kCols) of a row-major global tile into shared memory (row pitch
// kPitch elements) with cp.async, kVec elements per copy. Rows >= valid_rows and columns >= d are
// zero-filled: zero keys and zero head-dim padding leave every dot product unchanged. kVec > 1 needs d a
// multiple of kVec and 16-byte-aligned rows (the host checks both).
template <typename T, int kRows, int kCols, int kPitch, int kVec, int kThreads>
__device__ __forceinline__ void copy_tile_async(T* smem, const T* gmem, long long row_stride, int valid_rows, int d,
                                                int tid) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async moves 4, 8 or 16 bytes");
  static_assert(kCols % kVec == 0 && kPitch % kVec == 0, "whole vectors per row");
  constexpr int kChunksPerRow = kCols / kVec;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = tid; i < (kChunks + kThreads - 1) / kThreads * kThreads; i += kThreads) {
    if (kChunks % kThreads != 0 && i >= kChunks) break;
    const int row = i / kChunksPerRow;
    const int col = (i % kChunksPerRow) * kVec;
    const bool valid = row < valid_rows && col < d;
    ck::cp_async_zfill<kBytes>(smem + row * kPitch + col, valid ? gmem + row * row_stride + col : gmem,
                               valid ? kBytes : 0);
  }
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Butterfly reductions over the lanes that share a row: kLanes consecutive lanes (a power of two).
template <int kLanes>
__device__ __forceinline__ float lanes_max(float x) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) x = fmaxf(x, __shfl_xor_sync(ck::kFullMask, x, o));
  return x;
}
template <int kLanes>
__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) x += __shfl_xor_sync(ck::kFullMask, x, o);
  return x;
}

using ck::fast_exp2;  // common.cuh

// Which (batch*head, query tile) a CTA works on, from its query-tile slot (0 .. batch_heads * query_tiles).
// Without a mask every tile costs the same and batch*head is the slow index. Causal: tile i costs about
// i + 1 key tiles, so the order is longest first over the whole grid (the tile is the slow index, counted
// from the last): the block scheduler hands out the big pieces first and the short tiles fill the gaps at
// the end, instead of every (batch, head) ending on a short tile while another's long tile still runs.
struct TileSlot {
  int bh, tile;
  __device__ TileSlot(long long slot, int query_tiles, long long batch_heads, bool causal) {
    if (causal) {
      bh = static_cast<int>(slot % batch_heads);
      tile = query_tiles - 1 - static_cast<int>(slot / batch_heads);
    } else {
      bh = static_cast<int>(slot / query_tiles);
      tile = static_cast<int>(slot % query_tiles);
    }
  }
};

// blockIdx.x read anew (volatile: the compiler may not reuse an earlier read), so that values derived from it
// can be recomputed where they are needed instead of held in registers across a long loop.
__device__ __forceinline__ unsigned fresh_block_index() {
  unsigned x;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  return x;
}

// The maximum to subtract: -inf (a row with no unmasked key so far) becomes 0 so that exp2(-inf - m) is 0,
// never exp2(-inf + inf) = NaN.
__device__ __forceinline__ float usable_max(float m) { return m == neg_inf() ? 0.f : m; }

// A row's log-sum-exp in natural units from the online softmax's state: m (log2 domain, the scores already
// scaled by scale * log2(e)) and the row's sum of exp2(s - m); -inf when it summed nothing. log2 as the one
// MUFU.LG2 instruction (lg2.approx, about 2^-22 relative error; the sum is at least 1 wherever it is finite).
__device__ __forceinline__ float row_lse(float m, float sum) {
  constexpr float kLn2 = 0.693147180559945309f;
  float lg;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(sum));
  return sum == 0.f ? neg_inf() : (m + lg) * kLn2;  // == 0, not > 0: a NaN sum stays NaN
}


// ---- Sliding windows and sinks (kWindow instantiations): attention_windows.cuh ---------------------------
using attention_windows::KeyTiles;
using attention_windows::RowKeys;
using attention_windows::window_key_tiles;
using attention_windows::window_tile_is_full;

// =========================================================================================================
// fused_fp32
// =========================================================================================================
//
// CTA: kBlockM query rows, one split of the keys, in tiles of kBlockN. Warp w owns kWarpRows = 4 *
// kRowsPerThread consecutive rows; a lane is (row group ty = lane / 8, column group tx = lane % 8) and
// holds rows w * kWarpRows + ty + 4 r (r < kRowsPerThread), of
//   S = Q K^T : keys tx + 8 c              (c < kBlockN / 8)
//   O += P V  : head dims 4 tx + 32 c + e  (c < kHeadDim / 32, e < 4)
// A row lives in the 8 lanes of one row group, so softmax reductions are three shuffles, and P only passes
// between lanes of one warp (its rows of sP): __syncwarp, not __syncthreads, separates writing and reading.
//
// Shared memory (floats): sQ [kBlockM][kHeadDim + 4], sK [kBlockN][kHeadDim + 4], sV [kBlockN][kHeadDim],
// sP [kBlockM][kBlockN + 8]. Bank conflicts: a float4 read of sQ by one warp touches 4 rows (ty) 4 banks
// apart; of sK 8 rows (tx) 4 banks apart; of sV 8 consecutive float4s of one row; writes of sP go to 4 rows
// 8 banks apart x 8 consecutive columns: every access is one wavefront. Reads of sQ and sP are broadcasts
// across tx, so per 4 k-steps a lane issues kRowsPerThread + kBlockN / 8 LDS.128 for 4 * that many x
// kRowsPerThread FFMAs.
//
// Pipeline: K and V have one buffer each and their loads overlap the other product. Commit groups, in
// order: {Q, K_0}, {V_0}, then per tile {K_t+1}, {V_t+1} (empty past the end, so the counts stay fixed).
//   wait_group 1 -> K_t (and Q) landed; barrier; S = Q K_t^T; barrier (sK free); copy K_t+1;
//   softmax -> sP; wait_group 1 -> V_t landed; barrier; O += P V_t; barrier (sV free); copy V_t+1.
// The barriers after each wait make every thread's copies visible to every thread.

template <int kHeadDim, int kBlockM, int kBlockN, int kRowsPerThread>
struct Fp32Tile {
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim: a multiple of 32 up to 256 (pad d to it)");
  static_assert(kBlockN % 32 == 0, "8 lanes x float4 reads of sP per row group");
  static_assert(kRowsPerThread == 2 || kRowsPerThread == 4, "a float4/float2 of sP per lane and key step");
  static constexpr int kWarpRows = 4 * kRowsPerThread;
  static_assert(kBlockM % kWarpRows == 0, "whole warps");
  static constexpr int kWarps = kBlockM / kWarpRows;
  static constexpr int kThreads = kWarps * ck::kWarpSize;
  static_assert(kThreads >= 64 && kThreads <= 512, "64 to 512 threads");
  static constexpr int kKeysPerLane = kBlockN / 8;
  static constexpr int kDimVecsPerLane = kHeadDim / 32;  // float4s of head dims per lane
  static constexpr int kQPitch = kHeadDim + 4;
  static constexpr int kVPitch = kHeadDim;
  static constexpr int kPPitch = kBlockN + 8;
  static constexpr int kQFloats = kBlockM * kQPitch;
  static constexpr int kKFloats = kBlockN * kQPitch;
  static constexpr int kVFloats = kBlockN * kVPitch;
  static constexpr int kPFloats = kBlockM * kPPitch;
  static constexpr int kSmemBytes = 4 * (kQFloats + kKFloats + kVFloats + kPFloats);
};

// The last of a query tile's splits to finish combines them: out = sum_s w_s O_s / sum_s w_s with
// w_s = exp2(lse_s - max lse). Partials are read through L2 (ld.cg): another SM wrote them, and this SM's
// L1 may still hold those addresses from an earlier launch.
template <int kHeadDim, int kBlockM, int kThreads, int kVec, bool kLse>
__device__ __forceinline__ void merge_splits(const Params& p, float* smem, long long tile_index, int m0, const Slice& slice,
                             int bh, int tid) {
  float* s_weight = smem;  // [splits][kBlockM]
  const float* lse = p.partial_lse + tile_index * p.splits * kBlockM;
  const float* part = p.partial_o + tile_index * p.splits * kBlockM * kHeadDim;
  for (int row = tid; row < kBlockM; row += kThreads) {
    float top = neg_inf();
    for (int s = 0; s < p.splits; ++s) top = fmaxf(top, __ldcg(lse + s * kBlockM + row));
    const float base = usable_max(top);
    float total = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = fast_exp2(__ldcg(lse + s * kBlockM + row) - base);
      s_weight[s * kBlockM + row] = w;
      total += w;
    }
    const float inv = total == 0.f ? 0.f : 1.f / total;  // a NaN total keeps the row NaN
    for (int s = 0; s < p.splits; ++s) s_weight[s * kBlockM + row] *= inv;
    // The splits' lse_s are log2 of their sums at their own maxima: the row's is log2(sum_s exp2(lse_s)).
    if (kLse && m0 + row < p.m) p.lse[static_cast<long long>(bh) * p.m + m0 + row] = row_lse(base, total);
  }
  __syncthreads();
  float* out = static_cast<float*>(p.o) + slice.o;
  constexpr int kVecsPerRow = kHeadDim / 4;
  for (int i = tid; i < kBlockM * kVecsPerRow; i += kThreads) {
    const int row = i / kVecsPerRow, col = (i % kVecsPerRow) * 4;
    if (m0 + row >= p.m || col >= p.d) continue;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.splits; ++s) {
      const float w = s_weight[s * kBlockM + row];
      if (w == 0.f) continue;  // a split that saw no key of this row (its partial output may be unwritten)
      const float4 x = __ldcg(reinterpret_cast<const float4*>(part + (static_cast<long long>(s) * kBlockM + row) * kHeadDim + col));
      acc.x = fmaf(w, x.x, acc.x);
      acc.y = fmaf(w, x.y, acc.y);
      acc.z = fmaf(w, x.z, acc.z);
      acc.w = fmaf(w, x.w, acc.w);
    }
    float* dst = out + (m0 + row) * p.o_row_stride + col;
    if constexpr (kVec == 4) {
      *reinterpret_cast<float4*>(dst) = acc;
    } else {
      const float a[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col + e < p.d) dst[e] = a[e];
    }
  }
}

// Grid: (query tiles x splits x batch*heads), blockIdx.x = slot * splits + split (TileSlot maps the slot).
// A causal split may start past its tile's last visible key: it computes nothing, publishes lse = -inf
// (weight 0 in the merge, which then never reads its partial output) and still arrives, so the count of
// arrivals is always p.splits.
// kVec: elements per global access, 4 (d % 4 == 0 and 16-byte-aligned rows) or 1. kWindow: windows and
// sinks (the key loop walks KeyTiles; splits divide its iterations).
// kLse: write each row's log-sum-exp to Params::lse.
template <int kHeadDim, int kBlockM, int kBlockN, int kRowsPerThread, int kVec, bool kWindow = false, bool kLse = false>
__global__ void __launch_bounds__(Fp32Tile<kHeadDim, kBlockM, kBlockN, kRowsPerThread>::kThreads, 1)
fused_fp32_kernel(const Params p) {
  using Tile = Fp32Tile<kHeadDim, kBlockM, kBlockN, kRowsPerThread>;
  constexpr int kR = kRowsPerThread, kC = Tile::kKeysPerLane, kDV = Tile::kDimVecsPerLane;
  static_assert(kVec == 1 || kVec == 4, "scalar or float4 global accesses");

  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sK = sQ + Tile::kQFloats;
  float* sV = sK + Tile::kKFloats;
  float* sP = sV + Tile::kVFloats;

  const int tid = threadIdx.x, lane = tid % ck::kWarpSize, warp = tid / ck::kWarpSize;
  const int ty = lane / 8, tx = lane % 8;
  const int query_tiles = (p.m + kBlockM - 1) / kBlockM;
  const int split = static_cast<int>(blockIdx.x % p.splits);
  const long long tile_index = blockIdx.x / p.splits;  // this query tile's slot: its workspace and counter
  const TileSlot where(tile_index, query_tiles, gridDim.x / (static_cast<long long>(p.splits) * query_tiles), p.causal);
  const int m0 = where.tile * kBlockM;
  const Slice slice(p, where.bh);
  const float* q = static_cast<const float*>(p.q) + slice.q + m0 * p.q_row_stride;
  const float* k = static_cast<const float*>(p.k) + slice.k;
  const float* v = static_cast<const float*>(p.v) + slice.v;

  // The key tiles of this split (iterations t_begin .. t_end - 1 of the key loop; tile_of maps one to its
  // tile); causal rows m0 .. m0 + kBlockM - 1 see no key past m0 + kBlockM - 1.
  KeyTiles window{};
  if constexpr (kWindow) window = window_key_tiles<kBlockM, kBlockN>(p, m0);
  const int key_end = p.causal ? min(p.n, min(p.m, m0 + kBlockM)) : p.n;
  const int key_tiles = kWindow ? window.count : (key_end + kBlockN - 1) / kBlockN;
  auto tile_of = [&](int i) { return kWindow ? window.tile(i) : i; };
  const int t_begin = split * p.tiles_per_split;
  const int t_end = min(key_tiles, t_begin + p.tiles_per_split);

  float o[kR][kDV][4];
  float m[kR], l[kR];  // running max (log2 domain) and this lane's part of the running sum
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = neg_inf();
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kDV; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[r][c][e] = 0.f;
  }
  const int row0 = warp * Tile::kWarpRows + ty;  // this lane's rows: row0 + 4 r

  if (t_begin < t_end) {
    copy_tile_async<float, kBlockM, kHeadDim, Tile::kQPitch, kVec, Tile::kThreads>(sQ, q, p.q_row_stride, p.m - m0, p.d, tid);
    const long long n0 = static_cast<long long>(tile_of(t_begin)) * kBlockN;
    copy_tile_async<float, kBlockN, kHeadDim, Tile::kQPitch, kVec, Tile::kThreads>(sK, k + n0 * p.k_row_stride, p.k_row_stride,
                                                                             p.n - static_cast<int>(n0), p.d, tid);
    cp_async_commit();
    copy_tile_async<float, kBlockN, kHeadDim, Tile::kVPitch, kVec, Tile::kThreads>(sV, v + n0 * p.v_row_stride, p.v_row_stride,
                                                                             p.n - static_cast<int>(n0), p.d, tid);
    cp_async_commit();
  }

  for (int t = t_begin; t < t_end; ++t) {
    const int n0 = tile_of(t) * kBlockN;
    cp_async_wait<1>();
    __syncthreads();

    // S = Q K^T for this lane's rows x keys, 4 head dims per step.
    float s[kR][kC];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int c = 0; c < kC; ++c) s[r][c] = 0.f;
#pragma unroll 4
    for (int k4 = 0; k4 < kHeadDim; k4 += 4) {
      float4 qv[kR], kv[kC];
#pragma unroll
      for (int r = 0; r < kR; ++r) qv[r] = *reinterpret_cast<const float4*>(sQ + (row0 + 4 * r) * Tile::kQPitch + k4);
#pragma unroll
      for (int c = 0; c < kC; ++c) kv[c] = *reinterpret_cast<const float4*>(sK + (tx + 8 * c) * Tile::kQPitch + k4);
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          s[r][c] = fmaf(qv[r].x, kv[c].x, s[r][c]);
          s[r][c] = fmaf(qv[r].y, kv[c].y, s[r][c]);
          s[r][c] = fmaf(qv[r].z, kv[c].z, s[r][c]);
          s[r][c] = fmaf(qv[r].w, kv[c].w, s[r][c]);
        }
    }
    __syncthreads();  // every warp is done with sK
    if (t + 1 < t_end) {
      const long long next = static_cast<long long>(tile_of(t + 1)) * kBlockN;
      copy_tile_async<float, kBlockN, kHeadDim, Tile::kQPitch, kVec, Tile::kThreads>(
          sK, k + next * p.k_row_stride, p.k_row_stride, p.n - static_cast<int>(next), p.d, tid);
    }
    cp_async_commit();

    // Online softmax. Masked scores (past N, causal keys past the row, keys outside the window and the
    // sinks) become -inf.
    const bool needs_mask = kWindow ? !window_tile_is_full<kBlockM, kBlockN>(p, m0, n0)
                                    : n0 + kBlockN > p.n || (p.causal && n0 + kBlockN - 1 > m0);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = m0 + row0 + 4 * r;
      float top = neg_inf();
      RowKeys row_keys{};
      if constexpr (kWindow) row_keys = RowKeys(p, row);
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float x = s[r][c] * p.scale_log2;
        if (needs_mask) {
          const int key = n0 + tx + 8 * c;
          if constexpr (kWindow) {
            if (!row_keys.sees(key)) x = neg_inf();
          } else if (key >= p.n || (p.causal && key > row)) {
            x = neg_inf();
          }
        }
        s[r][c] = x;
        top = fmaxf(top, x);
      }
      const float m_new = fmaxf(m[r], lanes_max<8>(top));
      const float base = usable_max(m_new);
      const float alpha = fast_exp2(m[r] - base);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        s[r][c] = fast_exp2(s[r][c] - base);
        sum += s[r][c];
        sP[(row0 + 4 * r) * Tile::kPPitch + tx + 8 * c] = s[r][c];
      }
      l[r] = fmaf(l[r], alpha, sum);
#pragma unroll
      for (int c = 0; c < kDV; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[r][c][e] *= alpha;
    }
    __syncwarp();

    cp_async_wait<1>();
    __syncthreads();  // V_t has landed for every thread's copies

    // O += P V: 4 keys per step, a float4 of P per row, then one row of V per key.
#pragma unroll 2
    for (int j4 = 0; j4 < kBlockN; j4 += 4) {
      float4 pv[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) pv[r] = *reinterpret_cast<const float4*>(sP + (row0 + 4 * r) * Tile::kPPitch + j4);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float4 vv[kDV];
#pragma unroll
        for (int c = 0; c < kDV; ++c) vv[c] = *reinterpret_cast<const float4*>(sV + (j4 + jj) * Tile::kVPitch + 4 * tx + 32 * c);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const float pr = jj == 0 ? pv[r].x : jj == 1 ? pv[r].y : jj == 2 ? pv[r].z : pv[r].w;
#pragma unroll
          for (int c = 0; c < kDV; ++c) {
            o[r][c][0] = fmaf(pr, vv[c].x, o[r][c][0]);
            o[r][c][1] = fmaf(pr, vv[c].y, o[r][c][1]);
            o[r][c][2] = fmaf(pr, vv[c].z, o[r][c][2]);
            o[r][c][3] = fmaf(pr, vv[c].w, o[r][c][3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with sV (and with its rows of sP)
    if (t + 1 < t_end) {
      const long long next = static_cast<long long>(tile_of(t + 1)) * kBlockN;
      copy_tile_async<float, kBlockN, kHeadDim, Tile::kVPitch, kVec, Tile::kThreads>(
          sV, v + next * p.v_row_stride, p.v_row_stride, p.n - static_cast<int>(next), p.d, tid);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();

  // Epilogue: the full row sums, then either the output (one split) or this split's partial result.
#pragma unroll
  for (int r = 0; r < kR; ++r) l[r] = lanes_sum<8>(l[r]);

  if (p.splits == 1) {
    float* out = static_cast<float*>(p.o) + slice.o;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = m0 + row0 + 4 * r;
      if (row >= p.m) continue;
      if (kLse && tx == 0) p.lse[static_cast<long long>(where.bh) * p.m + row] = row_lse(m[r], l[r]);
      const float inv = kWindow && l[r] == 0.f ? 0.f : 1.f / l[r];  // a windowed row may see no key: 0
#pragma unroll
      for (int c = 0; c < kDV; ++c) {
        const int col = 4 * tx + 32 * c;
        if (col >= p.d) continue;
        float* dst = out + row * p.o_row_stride + col;
        const float4 val = make_float4(o[r][c][0] * inv, o[r][c][1] * inv, o[r][c][2] * inv, o[r][c][3] * inv);
        if constexpr (kVec == 4) {
          *reinterpret_cast<float4*>(dst) = val;
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (col + e < p.d) dst[e] = o[r][c][e] * inv;
        }
      }
    }
    return;
  }

  float* part = p.partial_o + (tile_index * p.splits + split) * kBlockM * kHeadDim;
  float* lse = p.partial_lse + (tile_index * p.splits + split) * kBlockM;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int row = row0 + 4 * r;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int c = 0; c < kDV; ++c)
      if (t_begin < t_end) __stcg(reinterpret_cast<float4*>(part + row * kHeadDim + 4 * tx + 32 * c),
             make_float4(o[r][c][0] * inv, o[r][c][1] * inv, o[r][c][2] * inv, o[r][c][3] * inv));
    // -inf only for a split that summed nothing: a NaN sum stays NaN, so the merge does not drop it.
    if (tx == 0) __stcg(lse + row, l[r] == 0.f ? neg_inf() : m[r] + log2f(l[r]));
  }
  // Publish, count arrivals; the last split to arrive merges (threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  __shared__ bool s_last;
  if (tid == 0) {
    const unsigned before = atomicAdd(p.arrivals + tile_index, 1u);
    s_last = before == static_cast<unsigned>(p.splits - 1);
    if (s_last) p.arrivals[tile_index] = 0;  // ready for the next launch; nobody else touches it in this one
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  merge_splits<kHeadDim, kBlockM, Tile::kThreads, kVec, kLse>(p, smem, tile_index, m0, slice, where.bh, tid);
}


// =========================================================================================================
// flash2_mma: FlashAttention-2 on mma.sync.m16n8k16 (FP16/BF16 in, FP32 accumulate); T = float: 3xTF32
// =========================================================================================================
//
// CTA: kBlockM query rows, kWarps warps, each owning kM16 row blocks of 16 (rows w*16*kM16 + 16 r + ...).
// Per key tile of kBlockN:
//   S = Q K^T   A = Q from sQ by ldmatrix.x4, B = K from sK by ldmatrix.x4 (K is row-major [key][d], which
//               is the "col" (K-major) B operand as is); FP32 accumulators.
//   softmax     in registers: a lane holds rows g = lane/4 and g + 8 of each row block, 2 columns per n8
//               tile; a row's maximum is reduced over the 4 lanes of a quad with two shuffles. The running
//               sum stays per lane (reduced once at the end); O is rescaled by exp2(m_old - m_new).
//   O += P V    P goes from the S accumulators straight into A fragments (the m16n8 C layout of two n8
//               tiles is the m16k16 A layout), never through shared memory; B = V from sV by
//               ldmatrix.x4.trans (V is row-major [key][d]: the transposed load gives the K-major fragment).
// The division by the row sum happens once, at the end. Only the last tiles (past N, or crossing the causal
// diagonal) apply the mask; the others run a copy of the tile body without it.
//
// Shared memory: sQ [kBlockM][kHeadDim + 8], sK and sV [2][kBlockN][kHeadDim + 8]. The 16-byte pad makes
// the 8 row addresses of every ldmatrix phase (one 16-byte chunk per row) fall in 8 different bank groups,
// and the 16-byte cp.async writes of a warp (whole rows) are conflict-free as well.
//
// Pipeline: two buffers each for K and V, filled by cp.async. Commit groups: G0 = {Q, K0, V0}, G1 = {K1,
// V1}, then one per iteration t: {K_t+2, V_t+2} into the buffer tile t just used (empty past the end, so
// the count stays fixed). At the top of iteration t, G_t+1 may still be in flight: wait_group 1 leaves
// exactly it outstanding, and the barrier after the wait makes every thread's copies of tile t visible. The
// barrier after the products keeps the refill of buffer t % 2 behind every warp's last read of it.
//
// T = float (the flash2_tf32x3 entry): the same CTA, pipeline and softmax, with float tiles (16-byte cp.async
// of 4 floats), one 16-row block per warp, and the two products as qk_scores_tf32x3 and pv_tile_tf32x3
// (plain shared-memory reads, each product three TF32 mma; O's rescale rides the fold of each tile's P V).

using ck::Mma;  // mma16.cuh

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and receives, of each
// matrix, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (with .trans: of the transposed matrix).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr));
  }
}

// Every accumulator of a [kRows][kCols][4] fragment array to zero.
template <int kRows, int kCols>
__device__ __forceinline__ void zero_fragments(float (&x)[kRows][kCols][4]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[r][c][e] = 0.f;
}

// S = Q K^T for one warp's kM16 16-row blocks against one key tile of kN8 8-key columns, from shared memory
// through ldmatrix (Q and K rows at q_addr / k_addr, kPitch elements apart), into zeroed FP32 accumulators.
// Unrolled fully, the compiler loads the Q and K fragments of every k-step ahead; with 128 S accumulators per
// lane (64x128 per warp) those registers are not there, and two steps at a time is what avoids spills
// (ptxas -v, sm_90a). kUnroll > 0 sets the k-steps unrolled (the backward's kernels hold more live
// accumulators than their S tile).
template <typename T, int kM16, int kN8, int kHeadDim, int kPitch, int kUnroll = 0>
__device__ __forceinline__ void qk_scores(float (&s)[kM16][kN8][4], unsigned q_addr, unsigned k_addr) {
  zero_fragments(s);
  constexpr int kQkUnroll = kUnroll > 0 ? kUnroll : (kM16 * kN8 * 4 >= 128 ? 2 : kHeadDim / 16);
#pragma unroll kQkUnroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    unsigned a[kM16][4];
#pragma unroll
    for (int r = 0; r < kM16; ++r) ldmatrix_x4<false>(a[r], q_addr + (16 * r * kPitch + 16 * kk) * sizeof(T));
#pragma unroll
    for (int np = 0; np < kN8 / 2; ++np) {
      unsigned b[4];
      ldmatrix_x4<false>(b, k_addr + (16 * np * kPitch + 16 * kk) * sizeof(T));
#pragma unroll
      for (int r = 0; r < kM16; ++r) {
        Mma<T>::mma(s[r][2 * np], a[r], b[0], b[1]);
        Mma<T>::mma(s[r][2 * np + 1], a[r], b[2], b[3]);
      }
    }
  }
}

// P's 16-key slice kk of row block r as an mma A fragment: the FP32 probabilities of 8-key columns 2 kk and
// 2 kk + 1, straight from the S accumulators, packed to T.
template <typename T, int kN8>
__device__ __forceinline__ void p_fragment(unsigned (&a)[4], const float (&s)[kN8][4], int kk) {
  a[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
  a[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
  a[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// O += P V for one 16-key slice kk: every row block's A fragment against the slice's 16 rows of V (at
// v_addr, kPitch elements apart), read through transposing ldmatrix, two 8-column B fragments at a time.
template <typename T, int kM16, int kD8, int kPitch>
__device__ __forceinline__ void pv_slice(float (&o)[kM16][kD8][4], const unsigned (&a)[kM16][4], unsigned v_addr,
                                         int kk) {
#pragma unroll
  for (int dp = 0; dp < kD8 / 2; ++dp) {
    unsigned b[4];
    ldmatrix_x4<true>(b, v_addr + (16 * kk * kPitch + 16 * dp) * sizeof(T));
#pragma unroll
    for (int r = 0; r < kM16; ++r) {
      Mma<T>::mma(o[r][2 * dp], a[r], b[0], b[1]);
      Mma<T>::mma(o[r][2 * dp + 1], a[r], b[2], b[3]);
    }
  }
}

// ---- float32 on tensor cores: 3xTF32 ------------------------------------------------------------------
// A float x splits into big = x rounded to TF32 (10 mantissa bits) and small = x - big (exact in FP32, at
// most half of big's last place), which the tensor core reads truncated to TF32 (its top 19 bits); a product
// a b is then a_big b_big + a_big b_small + a_small b_big, each on mma.sync m16n8k8 TF32 with FP32
// accumulation. What it drops, a_small b_small and small's truncation, is about 2^-22 to 2^-21 of |a b|, with
// either sign: FP32-accurate products, as CUTLASS's OpMultiplyAddFastF32 (torch's own float32 attention
// kernels) computes them. Rounding is adding half of the last kept place to the bits; rounding small as
// well made no difference to the error (docs/notes/attention.md) and cost an IADD per element. The small
// terms are summed first.
//
// The tensor core rounds each mma's sum towards zero, not to nearest: accumulated over a key tile after
// key tile (3 mma per 8 keys), O drifted towards zero by ~2^-15 at N = 4096, and S over a head dim's 48
// mma by enough to fail the FP32 oracle. So no accumulator here outlives a few mma: each 16 dims of S and
// each key tile of P V go to zeroed fragments, which FP32 adds (to nearest) fold into S and O.
//
// m16n8k8 TF32 fragments (lane = 4 g + t4): A a0 (row g, k t4), a1 (row g + 8, k t4), a2 (row g, k t4 + 4),
// a3 (row g + 8, k t4 + 4); B b0 (k t4, col g), b1 (k t4 + 4, col g); D as m16n8k16's (rows g and g + 8,
// cols 2 t4 and 2 t4 + 1).
//
// Non-finite values: a NaN x gives a NaN small whatever big becomes (the rounding add carries the GPU's
// own NaN 0x7fffffff into the sign: big = -0); an infinite x gives big = x and small = inf - inf = NaN; a
// finite magnitude from 0x7f7ff000 (within 2^-12 of FLT_MAX) rounds to big = +-inf, small = -+inf. The sums
// they enter are NaN (inf - inf across the three products, or inf * 0, also where a probability is 0),
// where FP32 arithmetic would give an infinity or, for those last finite values, a finite sum.
struct Tf32Split {
  unsigned big, small;
  Tf32Split() = default;
  __device__ __forceinline__ explicit Tf32Split(float x) {
    const unsigned bits = __float_as_uint(x);
    big = (bits + 0x1000u) & 0xffffe000u;  // to nearest (ties away)
    small = __float_as_uint(x - __uint_as_float(big));  // the tensor core drops the low 13 bits
  }
};

__device__ __forceinline__ void mma_tf32(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a b in 3xTF32, from the four A and two B values of this lane's fragments.
__device__ __forceinline__ void mma_tf32x3(float (&d)[4], const Tf32Split (&a)[4], const Tf32Split (&b)[2]) {
  mma_tf32(d, a[0].small, a[1].small, a[2].small, a[3].small, b[0].big, b[1].big);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].small, b[1].small);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].big, b[1].big);
}

// S = Q K^T in 3xTF32 for one warp's kM16 16-row blocks against kN8 8-key columns. The k index of the
// fragments is a permutation of the head dims, the same for Q and K (so every dot product is unchanged):
// per 16 dims c, lane t4 reads the float4 at dims 16 c + 4 t4 of its rows and keys, and k-step 2 c takes its
// elements 0 and 1 as k = t4 and t4 + 4, step 2 c + 1 elements 2 and 3. One LDS.128 per row or key feeds
// two k-steps. sq: this lane's row g at column 4 t4; sk: its key g at column 4 t4 (kPitch floats a row).
template <int kM16, int kN8, int kHeadDim, int kPitch>
__device__ __forceinline__ void qk_scores_tf32x3(float (&s)[kM16][kN8][4], const float* sq, const float* sk) {
  zero_fragments(s);
#pragma unroll 1
  for (int c = 0; c < kHeadDim / 16; ++c) {
    float part[kM16][kN8][4];
    zero_fragments(part);
    Tf32Split a[kM16][2][4];
#pragma unroll
    for (int r = 0; r < kM16; ++r) {
      const float4 x = *reinterpret_cast<const float4*>(sq + 16 * r * kPitch + 16 * c);
      const float4 y = *reinterpret_cast<const float4*>(sq + (16 * r + 8) * kPitch + 16 * c);
      a[r][0][0] = Tf32Split(x.x), a[r][0][1] = Tf32Split(y.x), a[r][0][2] = Tf32Split(x.y), a[r][0][3] = Tf32Split(y.y);
      a[r][1][0] = Tf32Split(x.z), a[r][1][1] = Tf32Split(y.z), a[r][1][2] = Tf32Split(x.w), a[r][1][3] = Tf32Split(y.w);
    }
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
      const float4 kv = *reinterpret_cast<const float4*>(sk + 8 * n * kPitch + 16 * c);
      const Tf32Split b0[2] = {Tf32Split(kv.x), Tf32Split(kv.y)}, b1[2] = {Tf32Split(kv.z), Tf32Split(kv.w)};
#pragma unroll
      for (int r = 0; r < kM16; ++r) {
        mma_tf32x3(part[r][n], a[r][0], b0);
        mma_tf32x3(part[r][n], a[r][1], b1);
      }
    }
#pragma unroll
    for (int r = 0; r < kM16; ++r)
#pragma unroll
      for (int n = 0; n < kN8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][n][e] += part[r][n][e];
  }
}

// O = alpha O + P V in 3xTF32 over one key tile (alpha: each row's rescale, rows g and g + 8), kDChunk of
// O's 8-column blocks at a time (a chunk's partial sums live only while it runs: registers). k-step j is S's
// 8-key column j, whose accumulators (rows g, g + 8; keys 8 j + 2 t4, + 1) are the A fragment with k = t4
// for key 8 j + 2 t4 and k = t4 + 4 for 8 j + 2 t4 + 1; B then reads V's rows 8 j + 2 t4 and + 1 at column g
// of each 8-column block. sv: V's row 2 t4, column g (kPitch floats a row).
template <int kM16, int kN8, int kD8, int kPitch, int kDChunk = kD8>
__device__ __forceinline__ void pv_tile_tf32x3(float (&o)[kM16][kD8][4], const float (&alpha)[kM16][2],
                                               const float (&s)[kM16][kN8][4], const float* sv) {
  static_assert(kD8 % kDChunk == 0, "whole chunks");
#pragma unroll
  for (int d0 = 0; d0 < kD8; d0 += kDChunk) {
    float pv[kM16][kDChunk][4];
    zero_fragments(pv);
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      Tf32Split a[kM16][4];
#pragma unroll
      for (int r = 0; r < kM16; ++r)
        a[r][0] = Tf32Split(s[r][j][0]), a[r][1] = Tf32Split(s[r][j][2]), a[r][2] = Tf32Split(s[r][j][1]),
        a[r][3] = Tf32Split(s[r][j][3]);
#pragma unroll
      for (int dt = 0; dt < kDChunk; ++dt) {
        const Tf32Split b[2] = {Tf32Split(sv[8 * j * kPitch + 8 * (d0 + dt)]),
                                Tf32Split(sv[(8 * j + 1) * kPitch + 8 * (d0 + dt)])};
#pragma unroll
        for (int r = 0; r < kM16; ++r) mma_tf32x3(pv[r][dt], a[r], b);
      }
    }
#pragma unroll
    for (int r = 0; r < kM16; ++r)
#pragma unroll
      for (int dt = 0; dt < kDChunk; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[r][d0 + dt][e] = fmaf(o[r][d0 + dt][e], alpha[r][e / 2], pv[r][dt][e]);
  }
}

// A tile copy for 2- and 4-byte types: 16-byte cp.async when kVec == 16 / sizeof(T), else element by element
// through registers (odd d or misaligned rows: a correct, slower path; the barriers of the pipeline order
// these stores too).
//
// The 16-byte path gives each thread one fixed 16-byte column and every kRowStep-th row from its first, so
// the per-copy work is a predicate, a 64-bit pointer step and an immediate shared-memory offset. (The
// generic copy_tile_async recomputes row and column per chunk, and the compiler hoists all those 64-bit
// offsets out of the key loop: tens of registers that the 192 accumulators of a 128x64 tile need.)
template <typename T, int kRows, int kCols, int kPitch, int kVec, int kThreads>
__device__ __forceinline__ void copy_tile_striped(T* smem, const T* gmem, long long row_stride, int valid_rows, int d, int tid) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  if constexpr (kVec == kChunk) {
    constexpr int kChunksPerRow = kCols / kChunk;
    static_assert(kThreads % kChunksPerRow == 0, "a thread keeps one column");
    constexpr int kRowStep = kThreads / kChunksPerRow;
    static_assert(kRows % kRowStep == 0, "whole passes over the tile");
    const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * kChunk;
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem + row * kPitch + col));
    const T* src = gmem + row * row_stride + col;
    const bool col_ok = col < d;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowStep; ++pass) {
      const bool valid = col_ok && row + pass * kRowStep < valid_rows;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                   ::"r"(dst + pass * kRowStep * kPitch * static_cast<int>(sizeof(T))),
                   "l"(valid ? src : gmem), "r"(valid ? 16 : 0) : "memory");
      src += kRowStep * row_stride;
    }
  } else {
    static_assert(kVec == 1, "16-byte or element-wise copies");
    using Bits = typename ck::Conditional<sizeof(T) == 2, unsigned short, unsigned>::type;
    const Bits* src = reinterpret_cast<const Bits*>(gmem);
    Bits* dst = reinterpret_cast<Bits*>(smem);
    for (int i = tid; i < kRows * kCols; i += kThreads) {
      const int row = i / kCols, col = i % kCols;
      dst[row * kPitch + col] = row < valid_rows && col < d ? src[row * row_stride + col] : 0;
    }
  }
}

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kWarps>
struct FlashTile {
  static constexpr bool kTf32 = sizeof(T) == 4;  // float: the 3xTF32 products (m16n8k8), see below
  static_assert(kHeadDim % 16 == 0 && kBlockN % (kTf32 ? 8 : 16) == 0, "whole k steps of both products");
  static constexpr int kM16 = kBlockM / (16 * kWarps);  // 16-row blocks per warp
  static_assert(kM16 >= 1 && kM16 * 16 * kWarps == kBlockM, "whole 16-row blocks per warp");
  static constexpr int kThreads = 32 * kWarps;
  // 16-bit: rows padded by 16 bytes (conflict-free ldmatrix). float: Q and K rows by 16 floats (row pitch 16
  // mod 32 words: a float4 read by lanes (g, t4) of rows g covers 8 different 16-byte bank groups per
  // phase), V rows by 4 (rows 2 t4 apart, 8 t4 + g: 32 different banks for a warp's 4-byte reads).
  static constexpr int kPitch = kHeadDim + 8;  // the 16-bit kernels' one pitch
  static constexpr int kQKPitch = kTf32 ? kHeadDim + 16 : kPitch;
  static constexpr int kVPitch = kTf32 ? kHeadDim + 4 : kPitch;
  static constexpr int kQElems = kBlockM * kQKPitch;
  static constexpr int kKVElems = kBlockN * kPitch;  // 16-bit: each K and V buffer
  static constexpr int kKElems = kBlockN * kQKPitch;
  static constexpr int kVElems = kBlockN * kVPitch;
  static constexpr int kSmemBytes = static_cast<int>(sizeof(T)) * (kQElems + 2 * kKElems + 2 * kVElems);
};

// Grid: query tiles x batch*heads, one CTA per slot (TileSlot maps it). kVec: 8 (16-byte rows) or 1.
// kWindow: windows and sinks; the key loop walks KeyTiles (iteration i reads tile(i) into buffer i % 2), a
// tile skips the mask where every row sees all of it, and a CTA may have no key tile at all.
// kLse: write each row's log-sum-exp to Params::lse.
template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kVec, bool kWindow = false, bool kLse = false>
__global__ void __launch_bounds__(32 * kWarps, 1) flash2_mma_kernel(const Params p) {
  using Tile = FlashTile<T, kHeadDim, kBlockM, kBlockN, kWarps>;
  constexpr int kM16 = Tile::kM16, kN8 = kBlockN / 8, kD8 = kHeadDim / 8;
  constexpr int kQKPitch = Tile::kQKPitch, kVPitch = Tile::kVPitch;
  constexpr bool kTf32 = Tile::kTf32;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Tile::kQElems;       // [2][kBlockN][kQKPitch]
  T* sV = sK + 2 * Tile::kKElems;   // [2][kBlockN][kVPitch]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t4 = lane % 4;
  const int query_tiles = (p.m + kBlockM - 1) / kBlockM;
  const TileSlot where(blockIdx.x, query_tiles, gridDim.x / query_tiles, p.causal);
  const int m0 = where.tile * kBlockM;
  const Slice slice(p, where.bh);
  const T* q = static_cast<const T*>(p.q) + slice.q + m0 * p.q_row_stride;
  const T* k = static_cast<const T*>(p.k) + slice.k;
  const T* v = static_cast<const T*>(p.v) + slice.v;
  const int key_end = p.causal ? min(p.n, min(p.m, m0 + kBlockM)) : p.n;
  KeyTiles window{};
  if constexpr (kWindow) window = window_key_tiles<kBlockM, kBlockN>(p, m0);
  // Without a window >= 1: key 0 is always seen.
  const int key_tiles = kWindow ? window.count : (key_end + kBlockN - 1) / kBlockN;
  auto tile_of = [&](int i) { return kWindow ? window.tile(i) : i; };

  auto copy_kv = [&](int i) {  // iteration i's tile into buffer i % 2
    const int n0 = tile_of(i) * kBlockN;
    copy_tile_striped<T, kBlockN, kHeadDim, kQKPitch, kVec, Tile::kThreads>(sK + (i & 1) * Tile::kKElems, k + n0 * p.k_row_stride,
                                                                      p.k_row_stride, p.n - n0, p.d, tid);
    copy_tile_striped<T, kBlockN, kHeadDim, kVPitch, kVec, Tile::kThreads>(sV + (i & 1) * Tile::kVElems, v + n0 * p.v_row_stride,
                                                                      p.v_row_stride, p.n - n0, p.d, tid);
  };
  copy_tile_striped<T, kBlockM, kHeadDim, kQKPitch, kVec, Tile::kThreads>(sQ, q, p.q_row_stride, p.m - m0, p.d, tid);
  if (!kWindow || key_tiles > 0) copy_kv(0);
  cp_async_commit();
  if (key_tiles > 1) copy_kv(1);
  cp_async_commit();

  float o[kM16][kD8][4];
  float m[kM16][2], l[kM16][2];  // per row block: rows g and g + 8
#pragma unroll
  for (int r = 0; r < kM16; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) m[r][h] = neg_inf(), l[r][h] = 0.f;
#pragma unroll
    for (int c = 0; c < kD8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[r][c][e] = 0.f;
  }
  const int warp_row0 = warp * 16 * kM16;
  // ldmatrix row addresses: lane l points at row l % 16, column block l / 16 of a 16x16 tile (for A from
  // sQ and for B from sV.trans); for B from sK, at key (l / 16) * 8 + l % 8, column block (l / 8) % 2.
  // Shared-space byte addresses (32-bit: fewer registers than generic pointers), this lane's row folded in.
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  const int b_key = (lane / 16) * 8 + lane % 8, b_col = ((lane / 8) % 2) * 8;
  // float (3xTF32): plain shared-memory reads (see qk_scores_tf32x3 and pv_tile_tf32x3 for the lanes' rows
  // and columns).
  const unsigned q_addr = static_cast<unsigned>(__cvta_generic_to_shared(sQ + (warp_row0 + a_row) * kQKPitch + a_col));
  const unsigned k_addr0 = static_cast<unsigned>(__cvta_generic_to_shared(sK + b_key * kQKPitch + b_col));
  const unsigned v_addr0 = static_cast<unsigned>(__cvta_generic_to_shared(sV + a_row * kVPitch + a_col));
  constexpr unsigned kBufferBytes = Tile::kKElems * sizeof(T);
  const float* tf32_q = reinterpret_cast<const float*>(sQ) + (warp_row0 + g) * kQKPitch + 4 * t4;
  const float* tf32_k0 = reinterpret_cast<const float*>(sK) + g * kQKPitch + 4 * t4;
  const float* tf32_v0 = reinterpret_cast<const float*>(sV) + 2 * t4 * kVPitch + g;

  // One key tile: S = Q K^T, online softmax, O += P V. kMasked: the tile reaches past N or past the
  // diagonal; every other tile skips the per-element mask (a separate copy of the body, so the common
  // path carries neither the compares nor the branches around them).
  auto process_tile = [&](int t, auto masked_tag) {  // t: the iteration (its tile is tile_of(t))
    constexpr bool kMasked = decltype(masked_tag)::value;
    const int n0 = tile_of(t) * kBlockN;
    cp_async_wait<1>();
    __syncthreads();
    const unsigned k_addr = k_addr0 + (t & 1) * kBufferBytes;
    const unsigned v_addr = v_addr0 + (t & 1) * kBufferBytes;

    float s[kM16][kN8][4];
    if constexpr (kTf32) {
      qk_scores_tf32x3<kM16, kN8, kHeadDim, kQKPitch>(s, tf32_q, tf32_k0 + (t & 1) * Tile::kKElems);
    } else {
      qk_scores<T, kM16, kN8, kHeadDim, kQKPitch>(s, q_addr, k_addr);
    }
    // Windows: one body for every tile (a second, mask-free copy spills), the mask skipped under a uniform
    // branch where every row sees the whole tile.
    const bool apply_mask = !kWindow || !window_tile_is_full<kBlockM, kBlockN>(p, m0, n0);

    // Online softmax on the accumulators: element e of n8 tile c is row g + 8 (e / 2), key 8 c + 2 t4 + e % 2.
    [[maybe_unused]] float rescale[kM16][2];  // float: each row's alpha, for pv_tile_tf32x3
#pragma unroll
    for (int r = 0; r < kM16; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_row0 + 16 * r + g + 8 * h;
        float top = neg_inf();
        RowKeys row_keys{};
        if constexpr (kWindow && kMasked) row_keys = RowKeys(p, row);
#pragma unroll
        for (int c = 0; c < kN8; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[r][c][2 * h + e] * p.scale_log2;
            if constexpr (kMasked) {
              const int key = n0 + 8 * c + 2 * t4 + e;
              if constexpr (kWindow) {
                if (apply_mask && !row_keys.sees(key)) x = neg_inf();
              } else if (key >= p.n || (p.causal && key > row)) {
                x = neg_inf();
              }
            }
            s[r][c][2 * h + e] = x;
            top = fmaxf(top, x);
          }
        const float m_new = fmaxf(m[r][h], lanes_max<4>(top));
        // Unmasked tiles always hold a finite score per row; a masked one may hold none (without a window
        // the row's keys all lie past this tile only if it is not the first, and then m[r][h] is finite
        // already; with one, usable_max keeps a row that has seen no key at 0 * anything).
        const float base = kMasked ? usable_max(m_new) : m_new;
        const float alpha = fast_exp2(m[r][h] - base);
        m[r][h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int c = 0; c < kN8; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = fast_exp2(s[r][c][2 * h + e] - base);
            s[r][c][2 * h + e] = pe;
            sum += pe;
          }
        l[r][h] = fmaf(l[r][h], alpha, sum);
        if constexpr (kTf32) {
          rescale[r][h] = alpha;  // applied where P V is added
        } else {
#pragma unroll
          for (int c = 0; c < kD8; ++c) o[r][c][2 * h] *= alpha, o[r][c][2 * h + 1] *= alpha;
        }
      }
    }

    // O += P V, P converted from the accumulators to A fragments.
    if constexpr (kTf32) {
      pv_tile_tf32x3<kM16, kN8, kD8, kVPitch>(o, rescale, s, tf32_v0 + (t & 1) * Tile::kVElems);
    } else {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        unsigned a[kM16][4];
#pragma unroll
        for (int r = 0; r < kM16; ++r) p_fragment<T>(a[r], s[r], kk);
        pv_slice<T, kM16, kD8, kVPitch>(o, a, v_addr, kk);
      }
    }
    __syncthreads();  // every warp is done with buffer t % 2
    if (t + 2 < key_tiles) copy_kv(t + 2);
    cp_async_commit();
  };

  if constexpr (kWindow) {
    for (int t = 0; t < key_tiles; ++t) process_tile(t, ck::BoolConstant<true>());
  } else {
    // Tiles below unmasked_tiles lie wholly inside N and (causal) at or left of the diagonal of the CTA's
    // first row; the rest (at most ceil(kBlockM / kBlockN) + 1) are masked.
    const int unmasked_tiles = min(key_tiles, p.causal ? min(p.n, m0 + 1) / kBlockN : p.n / kBlockN);
    for (int t = 0; t < unmasked_tiles; ++t) process_tile(t, ck::BoolConstant<false>());
    for (int t = unmasked_tiles; t < key_tiles; ++t) process_tile(t, ck::BoolConstant<true>());
  }
  cp_async_wait<0>();

  // Epilogue: full row sums, normalise, store (rows g and g + 8, columns 8 c + 2 t4 and + 1).
  T* out = static_cast<T*>(p.o) + slice.o;
#pragma unroll
  for (int r = 0; r < kM16; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp_row0 + 16 * r + g + 8 * h;
      const float total = lanes_sum<4>(l[r][h]);
      const float inv = kWindow && total == 0.f ? 0.f : 1.f / total;  // a windowed row may see no key: 0
      if (row >= p.m) continue;
      if (kLse && t4 == 0) p.lse[static_cast<long long>(where.bh) * p.m + row] = row_lse(m[r][h], total);
      T* dst = out + row * p.o_row_stride;
#pragma unroll
      for (int c = 0; c < kD8; ++c) {
        const int col = 8 * c + 2 * t4;
        const float x0 = o[r][c][2 * h] * inv, x1 = o[r][c][2 * h + 1] * inv;
        if constexpr (kTf32) {
          if constexpr (kVec == 4) {
            if (col < p.d) *reinterpret_cast<float2*>(dst + col) = make_float2(x0, x1);
          } else {
            if (col < p.d) dst[col] = x0;
            if (col + 1 < p.d) dst[col + 1] = x1;
          }
        } else if constexpr (kVec == 8) {
          if (col < p.d) *reinterpret_cast<unsigned*>(dst + col) = Mma<T>::pack(x0, x1);
        } else {
          if (col < p.d) dst[col] = Mma<T>::from_float(x0);
          if (col + 1 < p.d) dst[col + 1] = Mma<T>::from_float(x1);
        }
      }
    }
}

// =========================================================================================================
// flash2_mma, lean main loop (FlashConfig.mainloop "lean" and "lean_eager")
// =========================================================================================================
//
// The tiles, fragments and shared-memory layout of flash2_mma_kernel, with fewer instructions per key tile:
// with two warps per scheduler, the time a warp spends outside the MMAs is what leaves the tensor pipe idle
// (the classic loop issues about 1000 instructions per warp and 128x64 tile at d=128 for its 256 HMMAs;
// docs/notes/attention.md#lean-key-loop).
//
// 1. One barrier per key tile instead of two. At the top of tile t a thread waits for its own copies of
//    tile t (the only group in flight); the barrier then publishes everyone's and proves that every warp
//    has left tile t - 1, so tile t + 1's copies may go into the buffers tile t - 1 read. They are issued
//    after this tile's S = Q K^T (where they cost the fewest registers at the peak), so they land while
//    the softmax and P V run, and the rest of the tile: about the classic loop's lead.
// 2. Each thread keeps two pointers to its chunks of the next K and V tiles, one fixed 16-byte column and
//    every kRowStep-th row; tiles wholly inside N skip the per-row predicate: a cp.async and a 64-bit
//    step per copy, without the classic loop's selects of pointer and size.
// 3. The scale is folded into the one FFMA that feeds ex2, p = exp2(s * c - m), and the row maximum is
//    taken on the raw scores: max(c s) = c max(s) needs c >= 0, so for a negative scale each thread
//    negates its own copy of Q in shared memory once (a sign flip, exact) and c = |scale * log2(e)|. The
//    classic loop spends an FMUL (scale) and an FADD (minus the maximum) per score. Tiles with a mask keep
//    the classic form (scaled first, then -inf), which stays right for a scale of 0 too.
// 4. The ex2 of each 16-key step feeds that step's P V MMAs directly (sums into l as they come), so MUFU
//    and tensor work of neighbouring steps can overlap.
// 5. kLazyRescale ("lean"; "lean_eager" rescales every tile, as the classic loop does): a row's reference
//    maximum m moves only when the tile's maximum exceeds it by more than kRescaleLog2 = 8. Until then
//    p <= 2^8, which FP32 sums and FP16/BF16 P hold as precisely as p <= 1 (no overflow: 2^8 x 64 keys),
//    and O and l, which share m, need no rescaling: the 128 FMULs and 4 ex2 of the rescale run under one
//    warp-uniform branch per tile, taken when any row of the warp grows past its reference; on scores of
//    unit size that is about the first key tile only. O / l is the same in exact arithmetic.
//
// 6. kWindow (windows and sinks): the key loop walks KeyTiles, as the classic kernel's does; a tile where
//    every row sees every key runs the unmasked body, the rest (the window's two edges, the diagonal, the
//    sink tiles' ends) the masked one with each row's RowKeys. The copy pointers step tile by tile and jump
//    once, from the sink tiles to the window's first. kLse: the epilogue writes each row's log-sum-exp.
//
// Registers: every one of these kernels is at the 255 cap. Which variants ptxas fits without spills is
// measured (nvrtc.resource_usage), not derived: flash_why_unsupported refuses the tiles that spill.

// Flip the sign of the 16-bit values this thread copied with copy_tile_striped (same thread-to-chunk map), after
// its own copies have landed. Zero-filled padding becomes -0, which changes no dot product.
template <typename T, int kRows, int kCols, int kPitch, int kVec, int kThreads>
__device__ __forceinline__ void negate_own_copies_b16(T* smem, int tid) {
  static_assert(sizeof(T) == 2, "the sign is bit 15 of a 16-bit float (half and bfloat16 alike)");
  if constexpr (kVec == 8) {
    constexpr int kChunksPerRow = kCols / 8;
    constexpr int kRowStep = kThreads / kChunksPerRow;
    const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowStep; ++pass) {
      uint4* chunk = reinterpret_cast<uint4*>(smem + (row + pass * kRowStep) * kPitch + col);
      uint4 x = *chunk;
      x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
      *chunk = x;
    }
  } else {
    unsigned short* s = reinterpret_cast<unsigned short*>(smem);
    for (int i = tid; i < kRows * kCols; i += kThreads) s[(i / kCols) * kPitch + i % kCols] ^= 0x8000u;
  }
}

// The state of one CTA of the lean kernel and its key-tile step. A struct rather than lambdas (NVRTC 13.0
// is picky about lambdas in kernels); every member lives in registers once the calls are inlined.
template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kVec, bool kLazyRescale, bool kWindow>
struct LeanFlash {
  using Tile = FlashTile<T, kHeadDim, kBlockM, kBlockN, kWarps>;
  static constexpr int kM16 = Tile::kM16, kN8 = kBlockN / 8, kD8 = kHeadDim / 8, kPitch = Tile::kPitch;
  static constexpr unsigned kBufferBytes = Tile::kKVElems * sizeof(T);
  static constexpr float kRescaleLog2 = 8.f;  // P <= 2^8 between rescales

  const Params& p;
  int tid, lane_row0, t4, key_tiles;  // lane_row0: global row of this lane's first row (g of row block 0)
  KeyTiles window;                    // kWindow: iteration i reads key tile window.tile(i)
  unsigned q_addr, k_addr0, v_addr0;
  float scale;  // |scale * log2(e)|
  float o[kM16][kD8][4];
  float m[kM16][2], l[kM16][2];  // reference maximum (log2 domain, -inf: none yet) and this lane's sum

  __device__ __forceinline__ LeanFlash(const Params& params) : p(params) {}

  // The shared buffers, from the kernel's dynamic shared memory (constant offsets: no registers held).
  static __device__ __forceinline__ T* smem_q() {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    return reinterpret_cast<T*>(smem_raw);
  }
  static __device__ __forceinline__ T* smem_k(int buffer) { return smem_q() + Tile::kQElems + buffer * Tile::kKVElems; }
  static __device__ __forceinline__ T* smem_v(int buffer) { return smem_k(2) + buffer * Tile::kKVElems; }

  // Copies of K and V (16-byte path): thread tid keeps one 16-byte column, col, and rows row, row +
  // kRowStep, ... of every tile; k_next / v_next point at its first chunk of the next tile to copy (column
  // 0 instead of col when col >= d: those chunks are zero-filled, and the address must stay inside a row).
  // Per copy that is one cp.async and one 64-bit pointer step, and the loop carries two pointers instead of
  // the tile bases plus per-thread offsets. Slow path (kVec == 1): k_next / v_next point at the tile's row 0.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static constexpr int kRowStep = Tile::kThreads / kChunksPerRow;
  static_assert(Tile::kThreads % kChunksPerRow == 0 && kBlockN % kRowStep == 0, "whole passes over a key tile");
  const T* k_next;
  const T* v_next;

  __device__ __forceinline__ void init_copies(const T* k, const T* v) {
    const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
    const int src_col = col < p.d ? col : 0;
    k_next = kVec == 8 ? k + row * p.k_row_stride + src_col : k;
    v_next = kVec == 8 ? v + row * p.v_row_stride + src_col : v;
  }

  __device__ __forceinline__ int tile_of(int i) const { return kWindow ? window.tile(i) : i; }

  // Copy iteration t's key tile (the tiles are copied in order, so k_next / v_next point at it; a window
  // jumps them from the sink tiles to its first tile) and step to the next tile.
  __device__ __forceinline__ void copy_kv(int t) {
    if constexpr (kWindow) {
      if (t == window.sink_tiles) {
        const int skipped = (window.window_first - window.sink_tiles) * kBlockN;
        k_next += skipped * p.k_row_stride;
        v_next += skipped * p.v_row_stride;
      }
    }
    const int n0 = tile_of(t) * kBlockN;
    if constexpr (kVec == 8) {
      const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
      const int bytes = col < p.d ? 16 : 0;
      const unsigned k_dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_k(t & 1) + row * kPitch + col));
      constexpr unsigned kVOffset = 2 * kBufferBytes;  // sV = sK + two buffers
      const T* ks = k_next;
      const T* vs = v_next;
      if (n0 + kBlockN <= p.n) {  // every row exists: no per-row predicate
#pragma unroll
        for (int pass = 0; pass < kBlockN / kRowStep; ++pass) {
          const unsigned dst = k_dst + pass * kRowStep * kPitch * sizeof(T);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(ks), "r"(bytes) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + kVOffset), "l"(vs), "r"(bytes) : "memory");
          ks += kRowStep * p.k_row_stride;
          vs += kRowStep * p.v_row_stride;
        }
      } else {  // the last tile, past N: rows that do not exist are zero-filled from a valid address
#pragma unroll
        for (int pass = 0; pass < kBlockN / kRowStep; ++pass) {
          const unsigned dst = k_dst + pass * kRowStep * kPitch * sizeof(T);
          const bool ok = n0 + row + pass * kRowStep < p.n;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(ok ? ks : static_cast<const T*>(p.k)),
                       "r"(ok ? bytes : 0) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + kVOffset),
                       "l"(ok ? vs : static_cast<const T*>(p.v)), "r"(ok ? bytes : 0) : "memory");
          ks += kRowStep * p.k_row_stride;
          vs += kRowStep * p.v_row_stride;
        }
      }
    } else {
      copy_tile_striped<T, kBlockN, kHeadDim, kPitch, kVec, Tile::kThreads>(smem_k(t & 1), k_next, p.k_row_stride, p.n - n0, p.d, tid);
      copy_tile_striped<T, kBlockN, kHeadDim, kPitch, kVec, Tile::kThreads>(smem_v(t & 1), v_next, p.v_row_stride, p.n - n0, p.d, tid);
    }
    k_next += kBlockN * p.k_row_stride;
    v_next += kBlockN * p.v_row_stride;
  }

  // Multiply row (r, h)'s sum and output by exp2(m_old - m_new) and make m_new its reference.
  template <bool kMasked>
  __device__ __forceinline__ void rescale_row(int r, int h, float m_new) {
    const float base = kMasked ? usable_max(m_new) : m_new;
    const float alpha = fast_exp2(m[r][h] - base);
    m[r][h] = m_new;
    l[r][h] *= alpha;
#pragma unroll
    for (int c = 0; c < kD8; ++c) o[r][c][2 * h] *= alpha, o[r][c][2 * h + 1] *= alpha;
  }

  // One key tile: S = Q K^T, online softmax, O += P V (see the notes above the struct).
  template <bool kMasked>
  __device__ __forceinline__ void step(int t) {
    const int n0 = tile_of(t) * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // tile t is visible to all; no warp still reads tile t - 1's buffers
    const unsigned k_addr = k_addr0 + (t & 1) * kBufferBytes;
    const unsigned v_addr = v_addr0 + (t & 1) * kBufferBytes;

    float s[kM16][kN8][4];
    qk_scores<T, kM16, kN8, kHeadDim, kPitch>(s, q_addr, k_addr);

    if (t + 1 < key_tiles) copy_kv(t + 1);
    cp_async_commit();
    // Row maxima of the tile in the log2 domain (element e of n8 tile c: row g + 8 (e / 2), key
    // 8 c + 2 t4 + e % 2). Unmasked tiles: the maximum of the raw scores, scaled once (note 3); masked
    // tiles scale the scores in place first and then mask them to -inf, as the classic loop does.
    constexpr bool kFold = !kMasked;
    float tile_max[kM16][2];
#pragma unroll
    for (int r = 0; r < kM16; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = lane_row0 + 16 * r + 8 * h;
        RowKeys row_keys;
        if constexpr (kWindow && kMasked) row_keys = RowKeys(p, row);
        float top = neg_inf();
#pragma unroll
        for (int c = 0; c < kN8; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[r][c][2 * h + e];
            if constexpr (!kFold) x *= scale;
            if constexpr (kMasked) {
              const int key = n0 + 8 * c + 2 * t4 + e;
              if constexpr (kWindow) {
                if (!row_keys.sees(key)) x = neg_inf();
              } else if (key >= p.n || (p.causal && key > row)) {
                x = neg_inf();
              }
            }
            s[r][c][2 * h + e] = x;
            top = fmaxf(top, x);
          }
        top = lanes_max<4>(top);
        tile_max[r][h] = kFold ? top * scale : top;
        if constexpr (!kLazyRescale) rescale_row<kMasked>(r, h, fmaxf(m[r][h], tile_max[r][h]));
      }
    if constexpr (kLazyRescale) {
      // One warp-uniform branch per tile (no divergence); rows that did not grow rescale by exp2(0) = 1.
      bool grows = false;
#pragma unroll
      for (int r = 0; r < kM16; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) grows |= tile_max[r][h] > m[r][h] + kRescaleLog2;
      if (__any_sync(ck::kFullMask, grows)) {
#pragma unroll
        for (int r = 0; r < kM16; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) rescale_row<kMasked>(r, h, fmaxf(m[r][h], tile_max[r][h]));
      }
    }

    // P = exp2(s c - m) (masked tiles: exp2(s - m), s already scaled), this lane's part of the row sums, and
    // O += P V, 16 keys at a time: each key step's probabilities go straight from the accumulators into A
    // fragments, so ex2 and the previous step's MMAs can overlap and P never needs all 64 registers at once.
    // In an unmasked tile every row's tile maximum is finite, so m is finite after the rescale above (which
    // tile 0 always takes: m starts at -inf); a masked tile may meet a row that has seen no key yet, hence
    // usable_max. The sums go straight into l (no separate per-tile sums: fewer registers at the peak).
    float base[kM16][2];
#pragma unroll
    for (int r = 0; r < kM16; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) base[r][h] = kMasked ? usable_max(m[r][h]) : m[r][h];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      unsigned a[kM16][4];
#pragma unroll
      for (int r = 0; r < kM16; ++r) {
#pragma unroll
        for (int c = 2 * kk; c < 2 * kk + 2; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = s[r][c][e], b = base[r][e / 2];
            s[r][c][e] = fast_exp2(kFold ? fmaf(x, scale, -b) : x - b);
            l[r][e / 2] += s[r][c][e];
          }
        p_fragment<T>(a[r], s[r], kk);
      }
      pv_slice<T, kM16, kD8, kPitch>(o, a, v_addr, kk);
    }
  }
};

// Grid and launch as flash2_mma_kernel (same shared memory, same threads); kLazyRescale: "lean", else
// "lean_eager"; kWindow and kLse as flash2_mma_kernel's.
template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kVec, bool kLazyRescale,
          bool kWindow = false, bool kLse = false>
__global__ void __launch_bounds__(32 * kWarps, 1) flash2_lean_kernel(const Params p) {
  using Loop = LeanFlash<T, kHeadDim, kBlockM, kBlockN, kWarps, kVec, kLazyRescale, kWindow>;
  using Tile = typename Loop::Tile;
  constexpr int kM16 = Loop::kM16, kD8 = Loop::kD8, kPitch = Loop::kPitch;

  T* sQ = Loop::smem_q();
  Loop loop(p);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4;
  loop.tid = tid;
  loop.t4 = lane % 4;
  const int query_tiles = (p.m + kBlockM - 1) / kBlockM;
  const TileSlot where(blockIdx.x, query_tiles, gridDim.x / query_tiles, p.causal);
  const int m0 = where.tile * kBlockM;
  const Slice slice(p, where.bh);
  const T* q = static_cast<const T*>(p.q) + slice.q + m0 * p.q_row_stride;
  if constexpr (kWindow) {
    loop.window = window_key_tiles<kBlockM, kBlockN>(p, m0);
    loop.key_tiles = loop.window.count;  // may be 0: the CTA's rows see no key
  } else {
    const int key_end = p.causal ? min(p.n, min(p.m, m0 + kBlockM)) : p.n;
    loop.key_tiles = (key_end + kBlockN - 1) / kBlockN;  // >= 1: key 0 is always seen
  }
  const int warp_row0 = warp * 16 * kM16;
  loop.lane_row0 = m0 + warp_row0 + g;

  copy_tile_striped<T, kBlockM, kHeadDim, kPitch, kVec, Tile::kThreads>(sQ, q, p.q_row_stride, p.m - m0, p.d, tid);
  loop.init_copies(static_cast<const T*>(p.k) + slice.k, static_cast<const T*>(p.v) + slice.v);
  if (!kWindow || loop.key_tiles > 0) loop.copy_kv(0);
  cp_async_commit();
  loop.scale = fabsf(p.scale_log2);  // a uniform register (ULOP3)
  if (p.scale_log2 < 0.f) {  // see note 3: q (-k) = -(q k); the first step's barrier publishes the flips
    cp_async_wait<0>();
    negate_own_copies_b16<T, kBlockM, kHeadDim, kPitch, kVec, Tile::kThreads>(sQ, tid);
  }

#pragma unroll
  for (int r = 0; r < kM16; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) loop.m[r][h] = neg_inf(), loop.l[r][h] = 0.f;
#pragma unroll
    for (int c = 0; c < kD8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) loop.o[r][c][e] = 0.f;
  }
  // ldmatrix row addresses, as in flash2_mma_kernel.
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  const int b_key = (lane / 16) * 8 + lane % 8, b_col = ((lane / 8) % 2) * 8;
  loop.q_addr = static_cast<unsigned>(__cvta_generic_to_shared(sQ + (warp_row0 + a_row) * kPitch + a_col));
  loop.k_addr0 = static_cast<unsigned>(__cvta_generic_to_shared(Loop::smem_k(0) + b_key * kPitch + b_col));
  loop.v_addr0 = static_cast<unsigned>(__cvta_generic_to_shared(Loop::smem_v(0) + a_row * kPitch + a_col));

  if constexpr (kWindow) {
    for (int t = 0; t < loop.key_tiles; ++t) {
      if (window_tile_is_full<kBlockM, kBlockN>(p, m0, loop.tile_of(t) * kBlockN)) {
        loop.template step<false>(t);
      } else {
        loop.template step<true>(t);
      }
    }
  } else {
    // Unmasked tiles: wholly inside N and (causal) at or left of the diagonal of the CTA's first row.
    const int unmasked_tiles = min(loop.key_tiles, p.causal ? min(p.n, m0 + 1) / kBlockN : p.n / kBlockN);
    for (int t = 0; t < unmasked_tiles; ++t) loop.template step<false>(t);
    for (int t = unmasked_tiles; t < loop.key_tiles; ++t) loop.template step<true>(t);
  }
  cp_async_wait<0>();  // a CTA without key tiles still has Q's copies in flight

  // Epilogue: full row sums, normalise, store (rows g and g + 8, columns 8 c + 2 t4 and + 1). The CTA's
  // (batch*head, tile) is worked out again from a fresh read of its index, so that neither it nor the
  // output's offset occupies registers through the key loop.
  const TileSlot here(fresh_block_index(), query_tiles, gridDim.x / query_tiles, p.causal);
  T* out = static_cast<T*>(p.o) + Slice(p, here.bh).o;
#pragma unroll
  for (int r = 0; r < kM16; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = loop.lane_row0 + 16 * r + 8 * h;
      const float total = lanes_sum<4>(loop.l[r][h]);
      const float inv = kWindow && total == 0.f ? 0.f : 1.f / total;  // a windowed row may see no key: 0
      if (row >= p.m) continue;
      if (kLse && loop.t4 == 0) p.lse[static_cast<long long>(here.bh) * p.m + row] = row_lse(loop.m[r][h], total);
      T* dst = out + row * p.o_row_stride;
#pragma unroll
      for (int c = 0; c < kD8; ++c) {
        const int col = 8 * c + 2 * loop.t4;
        const float x0 = loop.o[r][c][2 * h] * inv, x1 = loop.o[r][c][2 * h + 1] * inv;
        if constexpr (kVec == 8) {
          if (col < p.d) *reinterpret_cast<unsigned*>(dst + col) = Mma<T>::pack(x0, x1);
        } else {
          if (col < p.d) dst[col] = Mma<T>::from_float(x0);
          if (col + 1 < p.d) dst[col + 1] = Mma<T>::from_float(x1);
        }
      }
    }
}

// =========================================================================================================
// Backward (FlashAttention-2's math; docs/notes/attention-backward-plan.md)
// =========================================================================================================
//
// With S = scale * Q K^T, P = softmax(S) under the mask, O = P V and the incoming dO, per (batch, query head):
//   D_i = sum_c dO_ic O_ic (the host computes it),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),
//   dQ = scale * dS K,  dK = scale * dS^T Q.
// P is recomputed tile by tile from the forward's log-sum-exp: P_ij = exp(S_ij - lse_i), 0 where masked (a
// row that saw no key has lse = -inf and every P_ij = 0; a NaN lse keeps the row NaN). Two kernels and no
// atomics: one CTA per key tile accumulates dK and dV over every query tile and, for grouped-query
// attention, every query head of its group, in a fixed order; one CTA per query tile accumulates dQ over
// the key tiles. So the gradients are bitwise repeatable. float32 runs FFMA kernels (attention_bwd_*_fp32,
// at the end of this section), float16/bfloat16 mma.sync ones (attention_bwd_*_mma). The float32 dK/dV kernel
// also has a flavour that adds dQ with atomics instead (five products for seven; the host runs it unless
// torch's deterministic-algorithms flag is on).
//
struct BwdParams {
  const float* q;
  const float* k;
  const float* v;
  const float* dout;
  const float* lse;    // [batch * heads][m]: each row's log-sum-exp (natural log), from the forward
  const float* delta;  // [batch * heads][m]: D_i = sum_c dO_ic O_ic
  float* dq;
  float* dk;
  float* dv;
  long long q_batch_stride, q_head_stride, q_row_stride;
  long long k_batch_stride, k_head_stride, k_row_stride;
  long long v_batch_stride, v_head_stride, v_row_stride;
  long long do_batch_stride, do_head_stride, do_row_stride;
  long long dq_batch_stride, dq_head_stride, dq_row_stride;
  long long dk_batch_stride, dk_head_stride, dk_row_stride;
  long long dv_batch_stride, dv_head_stride, dv_row_stride;
  int heads, m, n, d;
  float scale;
  int causal;
  int kv_group;
  int window_left, window_right, num_sinks;  // kWindow: as Params'
};
static_assert(sizeof(BwdParams) == 280, "cute_kernels/ops/attention/backward.py packs this layout (BwdParams)");

// Whether row sees key (both in range): causal top-left aligned; with kWindow the window and sinks of RowKeys.
template <bool kWindow>
__device__ __forceinline__ bool bwd_sees(const BwdParams& p, int row, int key) {
  if (row >= p.m || key >= p.n) return false;
  if constexpr (!kWindow) {
    return !p.causal || key <= row;
  } else {
    const int lo = max(0, row - p.window_left);
    int hi = p.window_right >= p.n - 1 - row ? p.n - 1 : row + p.window_right;
    int sinks = min(p.num_sinks, p.n);
    if (p.causal) hi = min(hi, row), sinks = min(sinks, row + 1);
    return (key >= lo && key <= hi) || key < sinks;
  }
}

// Whether any row of [m0, m0 + kRows) may see any key of [n0, n0 + kKeys) (conservative: a tile that
// sees nothing is skipped, one that is kept computes its masked entries as 0).
template <bool kWindow, int kRows, int kKeys>
__device__ __forceinline__ bool bwd_tiles_meet(const BwdParams& p, int m0, int n0) {
  const long long last_row = min(m0 + kRows, p.m) - 1, last_key = min(n0 + kKeys, p.n) - 1;
  if (last_row < m0 || last_key < n0) return false;
  if (p.causal && last_row < n0) return false;
  if constexpr (!kWindow) {
    return true;
  } else {
    if (n0 < p.num_sinks) return true;
    // Row i sees keys i - left .. i + right, so key j is seen by rows j - right .. j + left.
    return last_row + p.window_right >= n0 && m0 - static_cast<long long>(p.window_left) <= last_key;
  }
}

// D_i = sum_c dO_ic O_ic - dlse_i of every row (dlse: the gradient reaching return_lse's output, if any), in
// FP32 from inputs of any of the three dtypes: kLanes lanes per row, each a strided part of the head dim in
// 16-byte vectors (kVector elements) where the rows and strides allow, else element by element (a warp a
// row), then a butterfly sum: element loads of a 64-wide fp16 row are 64-byte warp transactions with one
// row's worth in flight a warp, a quarter of the bandwidth (docs/notes/attention-backward-plan.md, "The D
// kernel's loads"). The 16-bit backward would otherwise spend ~6% of its time on torch's float copies of O
// and dO and their product. For the Hopper dK/dV kernel it also writes each row's lse2 and D where that
// kernel's TMA loads them (stage_rows).
struct DeltaParams {
  const void* out;
  const void* dout;
  const float* grad_lse;  // (batch * heads, m) or null
  float* delta;           // (batch * heads, m)
  const float* lse;       // (batch * heads, m), natural log; read where `stage_rows` is set
  // Or null: (batch * heads, 2, rows_pitch), a head's lse2 = lse * log2(e) (+inf where lse is -inf) and then
  // its D, as the Hopper dK/dV kernel's TMA loads them beside each streamed query tile (attention_sm90.cu).
  float* stage_rows;
  long long o_batch_stride, o_head_stride, o_row_stride;
  long long do_batch_stride, do_head_stride, do_row_stride;
  long long rows;        // batch * heads * m
  long long rows_pitch;  // stage_rows' row of a head: m rounded up to 4 floats (TMA's 16-byte strides)
  int heads, m, d;
};
static_assert(sizeof(DeltaParams) == 128, "cute_kernels/ops/attention/backward.py packs this layout (DeltaParams)");

template <typename T> __device__ __forceinline__ float to_float(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T, int kLanes, int kVector>
__global__ void __launch_bounds__(256) attention_bwd_delta(const DeltaParams p) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power-of-two part of a warp");
  static_assert(kVector == 1 || kVector * sizeof(T) == 16, "element loads, or 16-byte ones");
  constexpr int kRowsPerCta = 256 / kLanes;
  const long long row = blockIdx.x * static_cast<long long>(kRowsPerCta) + threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  // Every lane reaches the butterfly (its shuffles name the whole warp): a row past the end sums nothing.
  const bool live = row < p.rows;
  const long long bh = live ? row / p.m : 0, i = live ? row % p.m : 0, b = bh / p.heads, h = bh % p.heads;
  const T* o = static_cast<const T*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_row_stride;
  const T* dout = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride + i * p.do_row_stride;
  float sum = 0.f;
  if constexpr (kVector == 1) {
    for (int c = lane; live && c < p.d; c += kLanes) sum = fmaf(to_float(dout[c]), to_float(o[c]), sum);
  } else {
    // The host takes this path only where both rows and every stride are whole 16-byte vectors.
    for (int c = lane * kVector; live && c < p.d; c += kLanes * kVector) {
      const uint4 o_vector = *reinterpret_cast<const uint4*>(o + c);
      const uint4 do_vector = *reinterpret_cast<const uint4*>(dout + c);
      const T* o_elements = reinterpret_cast<const T*>(&o_vector);
      const T* do_elements = reinterpret_cast<const T*>(&do_vector);
#pragma unroll
      for (int e = 0; e < kVector; ++e) sum = fmaf(to_float(do_elements[e]), to_float(o_elements[e]), sum);
    }
  }
  sum = lanes_sum<kLanes>(sum);
  if (live && lane == 0) {
    const float delta = p.grad_lse ? sum - p.grad_lse[row] : sum;
    p.delta[row] = delta;
    if (p.stage_rows) {
      const float lse = p.lse[row];
      float* head_rows = p.stage_rows + bh * 2 * p.rows_pitch;
      head_rows[i] = lse == neg_inf() ? -neg_inf() : lse * 1.4426950408889634f;  // P = 0 in a row that saw no key
      head_rows[p.rows_pitch + i] = delta;
    }
  }
}

// =========================================================================================================
// Backward, FP16/BF16 on mma.sync m16n8k16 (the FP32 kernels' math and split, FP32 accumulators)
// =========================================================================================================
//
// Each kernel is the forward's loop turned around. A CTA of 4 warps keeps 64 * kM16 rows of one side in
// shared memory (a warp owns 16 * kM16 of them) and streams kStream-row tiles of the other; every product is
// one of the forward's two shapes: "scores" (qk_scores: the kept rows against the streamed tile, both by
// plain ldmatrix) or "P V" (pv_slice: a probability-shaped A fragment straight from FP32 accumulators,
// packed to T, against the streamed tile by transposing ldmatrix). With c = scale * log2(e) and
// lse2 = lse * log2(e):
//   dK/dV kernel (keeps K_j, V_j; streams Q_i, dO_i over every query tile and query head that meets it):
//     S^T = K Q^T,  P^T = exp2(S^T c - lse2) (lse of the column),  dP^T = V dO^T,
//     dV += P^T dO,  dS^T = P^T (dP^T - D),  dK += dS^T Q  (dK scaled by `scale` at the store).
//   dQ kernel (keeps Q_i, dO_i; streams K_j, V_j over every key tile that meets it):
//     S = Q K^T,  P = exp2(S c - lse2) (lse of the row),  dP = dO V^T,  dS = P (dP - D),  dQ += dS K.
// In the m16n8 accumulator layout, element e of n8 tile c of row block r is row 16 r + g + 8 (e / 2) of the
// warp's and column 8 c + 2 t4 + e % 2 (g = lane / 4, t4 = lane % 4). Masked entries get P = 0 by a select,
// so an infinite or NaN exponent in a masked entry cannot leak. A tile where every row sees every key (and,
// in the dK/dV kernel, every streamed row exists; in the dQ kernel, every streamed key) runs without the
// per-entry test: the rows a kernel keeps are independent of each other and past the end are never
// stored, so only the streamed side's edge needs the mask.
//
// Why kM16: every B fragment a warp loads from shared memory (the streamed tile, for all four or three
// products) feeds kM16 MMAs. At kM16 = 1 an m16n8k16 MMA costs 256 bytes of ldmatrix, which at the SM's 128
// bytes per clock holds the tensor pipe near half its mma.sync rate; kM16 = 2 halves that. Its registers
// (twice the accumulators) fit with 32-row streamed tiles, except the dK/dV kernel's at d = 128 (two
// accumulators of 16 x 128 per row block) and the windowed one's: they keep kM16 = 1 (the host's
// bwd_mma_shapes).
//
// Pipeline: commit group 0 holds the kept tiles and the first streamed tile. At the top of each streamed
// tile t a thread waits for its own copies (the only group in flight), and the barrier then publishes
// everyone's and proves that every warp has left tile t - 1, so tile t + 1's copies go into the buffer t - 1
// used, issued right after the barrier: they land while tile t computes. (The lean forward's scheme.)

constexpr int kBwdMmaThreads = 128;  // 4 warps

template <typename T, int kHeadDim, int kM16, int kStream>
struct BwdMmaTile {
  static constexpr int kKept = 64 * kM16;      // kept rows per CTA (16 * kM16 per warp)
  // 16-bit: the forward's 16-byte pad (conflict-free ldmatrix phases). float (3xTF32): a pitch of 12 mod 32
  // words, as every streamed tile is read both ways: as a score operand (float4s of rows g, lanes t4: one
  // 2-way conflict per 8-lane phase) and as a P V operand (words of rows 2 t4 and + 1, column g: 24 t4 + g,
  // 32 different banks).
  static constexpr int kPitch = sizeof(T) == 4 ? kHeadDim + 12 : kHeadDim + 8;
  static constexpr int kKeptElems = kKept * kPitch, kStreamElems = kStream * kPitch;
  static constexpr int kN8 = kStream / 8, kD8 = kHeadDim / 8;
  // k-steps of a score product unrolled: fewer than the forward, whose S tile is the only live accumulator
  // (here dK and dV, or dQ, are too); chosen by ptxas -v for no spills.
  static constexpr int kQkUnroll = kHeadDim >= 128 ? 1 : 2;
  // Two kept tiles, two buffers of two streamed tiles, and (dK/dV kernel) two buffers of lse and D rows.
  static constexpr int kSmemBytes =
      (2 * kKeptElems + 4 * kStreamElems) * static_cast<int>(sizeof(T)) + 4 * kStream * 4;
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 128, "mma backward: head dim a multiple of 16 up to 128");
  static_assert(kStream % 16 == 0 && kStream <= 64, "whole k16 steps of the P V products");
};

// Whether every row of [m0, m0 + kRows) sees every key of [n0, n0 + kKeys), both tiles whole (rows < m,
// keys < n).
template <bool kWindow, int kRows, int kKeys>
__device__ __forceinline__ bool bwd_tile_full(const BwdParams& p, int m0, int n0) {
  if (m0 + kRows > p.m || n0 + kKeys > p.n) return false;
  if (p.causal && n0 + kKeys - 1 > m0) return false;
  if constexpr (kWindow) {
    // Row i sees keys i - left .. i + right (sinks only add keys): the tile's last row's lower bound and
    // its first row's upper bound must hold the whole key tile.
    if (static_cast<long long>(m0) + kRows - 1 - p.window_left > n0) return false;
    if (static_cast<long long>(n0) + kKeys - 1 > static_cast<long long>(m0) + p.window_right) return false;
  }
  return true;
}

// P (or P^T) and dS (dS^T) of one warp's (16 kM16) x kStream tile, in place in the score accumulators s and
// dp. kRowsKept: the warp's rows are query rows (dQ kernel; lse2/D per row, given) or keys (dK/dV kernel;
// lse2/D per column, read from shared memory). row0/col0: the global index of the warp's first row and of
// the streamed tile's first column.
template <bool kMasked, bool kWindow, bool kRowsKept, int kM16, int kN8>
__device__ __forceinline__ void bwd_probabilities(const BwdParams& p, float (&s)[kM16][kN8][4],
                                                  float (&dp)[kM16][kN8][4], const float (&row_lse2)[kM16][2],
                                                  const float (&row_delta)[kM16][2], const float* col_lse,
                                                  const float* col_delta, float c, int row0, int col0, int g, int t4) {
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int n8 = 0; n8 < kN8; ++n8)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2, col = 8 * n8 + 2 * t4 + e % 2;
      float col_l2 = 0.f, col_d = 0.f;
      if constexpr (!kRowsKept) col_l2 = col_lse[col] * kLog2e, col_d = col_delta[col];
#pragma unroll
      for (int r = 0; r < kM16; ++r) {
        const float lse2 = kRowsKept ? row_lse2[r][h] : col_l2;
        const float delta = kRowsKept ? row_delta[r][h] : col_d;
        float prob = fast_exp2(fmaf(s[r][n8][e], c, -lse2));
        if constexpr (kMasked) {
          const int kept = row0 + 16 * r + g + 8 * h, streamed = col0 + col;
          const bool sees = kRowsKept ? bwd_sees<kWindow>(p, kept, streamed) : bwd_sees<kWindow>(p, streamed, kept);
          prob = sees ? prob : 0.f;
        }
        s[r][n8][e] = prob;
        dp[r][n8][e] = prob * (dp[r][n8][e] - delta);
      }
    }
}

// Store a warp's (16 kM16) x kHeadDim FP32 accumulator rows times `factor` as T (rows past `rows` skipped).
template <typename T, int kM16, int kD8, int kVec>
__device__ __forceinline__ void bwd_store_rows(T* base, long long row_stride, const float (&acc)[kM16][kD8][4],
                                               float factor, int first_row, int rows, int d, int g, int t4) {
#pragma unroll
  for (int r = 0; r < kM16; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + 16 * r + g + 8 * h;
      if (row >= rows) continue;
      T* dst = base + row * row_stride;
#pragma unroll
      for (int n8 = 0; n8 < kD8; ++n8) {
        const int col = 8 * n8 + 2 * t4;
        const float x0 = acc[r][n8][2 * h] * factor, x1 = acc[r][n8][2 * h + 1] * factor;
        if constexpr (sizeof(T) == 4) {
          if constexpr (kVec == 4) {
            if (col < d) *reinterpret_cast<float2*>(dst + col) = make_float2(x0, x1);
          } else {
            if (col < d) dst[col] = x0;
            if (col + 1 < d) dst[col + 1] = x1;
          }
        } else if constexpr (kVec == 8) {
          if (col < d) *reinterpret_cast<unsigned*>(dst + col) = Mma<T>::pack(x0, x1);
        } else {
          if (col < d) dst[col] = Mma<T>::from_float(x0);
          if (col + 1 < d) dst[col + 1] = Mma<T>::from_float(x1);
        }
      }
    }
}

// A kRows-row tile of the backward by kThreads threads. float: copy_tile_async (16- or 4-byte copies). 16-bit:
// copy_tile_striped, whose element-by-element path (kVec 1) runs here as a loop the compiler may not unroll:
// unrolled, its loads in flight spill the dK/dV kernel at d = 128.
template <typename T, int kRows, int kHeadDim, int kPitch, int kVec, int kThreads = kBwdMmaThreads>
__device__ __forceinline__ void bwd_copy_tile(T* smem, const T* gmem, long long row_stride, int valid_rows, int d, int tid) {
  if constexpr (sizeof(T) == 4) {
    copy_tile_async<T, kRows, kHeadDim, kPitch, kVec, kThreads>(smem, gmem, row_stride, valid_rows, d, tid);
  } else if constexpr (kVec == 8) {
    copy_tile_striped<T, kRows, kHeadDim, kPitch, kVec, kThreads>(smem, gmem, row_stride, valid_rows, d, tid);
  } else {
    const unsigned short* src = reinterpret_cast<const unsigned short*>(gmem);
    unsigned short* dst = reinterpret_cast<unsigned short*>(smem);
#pragma unroll 1
    for (int i = tid; i < kRows * kHeadDim; i += kThreads) {
      const int row = i / kHeadDim, col = i % kHeadDim;
      dst[row * kPitch + col] = row < valid_rows && col < d ? src[row * row_stride + col] : 0;
    }
  }
}

// kCount floats of a row statistic into shared memory by 4-byte cp.async (zero past `valid`), by threads
// [first_thread, first_thread + kCount).
template <int kCount>
__device__ __forceinline__ void bwd_copy_row_floats(float* smem, const float* gmem, int valid, int tid, int first_thread) {
  const int i = tid - first_thread;
  if (i < 0 || i >= kCount) return;
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem + i));
  const bool ok = i < valid;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(ok ? gmem + i : gmem), "r"(ok ? 4 : 0)
               : "memory");
}

// Copy step `it` of the dK/dV kernel's walk (query head g = it / per_head of the group, query tile
// last - it % per_head) into buffer it % kStages: Q and dO rows, and their lse and D.
template <typename T, int kStream, int kHeadDim, int kPitch, int kVec, int kThreads = kBwdMmaThreads, int kStages = 2>
__device__ __forceinline__ void bwd_copy_query_tile(const BwdParams& p, T* sQ, T* sdO, float* sLse, float* sDelta,
                                                    const T* q_head0, const T* do_head0, long long bh0, int it,
                                                    int per_head, int last, int tid) {
  constexpr int kStreamElems = kStream * kPitch;
  const int g_head = it / per_head, m0 = (last - it % per_head) * kStream, buf = it % kStages;
  bwd_copy_tile<T, kStream, kHeadDim, kPitch, kVec, kThreads>(sQ + buf * kStreamElems,
      q_head0 + g_head * p.q_head_stride + m0 * p.q_row_stride, p.q_row_stride, p.m - m0, p.d, tid);
  bwd_copy_tile<T, kStream, kHeadDim, kPitch, kVec, kThreads>(sdO + buf * kStreamElems,
      do_head0 + g_head * p.do_head_stride + m0 * p.do_row_stride, p.do_row_stride, p.m - m0, p.d, tid);
  const long long row0 = (bh0 + g_head) * p.m + m0;
  bwd_copy_row_floats<kStream>(sLse + buf * kStream, p.lse + row0, p.m - m0, tid, 0);
  bwd_copy_row_floats<kStream>(sDelta + buf * kStream, p.delta + row0, p.m - m0, tid, 64);
}

// A key tile of the dQ kernel's walk (keys t * kStream ...) into buffer `buf`: K and V rows.
template <typename T, int kStream, int kHeadDim, int kPitch, int kVec, int kThreads = kBwdMmaThreads>
__device__ __forceinline__ void bwd_copy_key_tile(const BwdParams& p, T* sK, T* sV, const T* k_head, const T* v_head,
                                                  int t, int buf, int tid) {
  constexpr int kStreamElems = kStream * kPitch;
  const int n0 = t * kStream;
  bwd_copy_tile<T, kStream, kHeadDim, kPitch, kVec, kThreads>(sK + buf * kStreamElems, k_head + n0 * p.k_row_stride,
                                                              p.k_row_stride, p.n - n0, p.d, tid);
  bwd_copy_tile<T, kStream, kHeadDim, kPitch, kVec, kThreads>(sV + buf * kStreamElems, v_head + n0 * p.v_row_stride,
                                                              p.v_row_stride, p.n - n0, p.d, tid);
}

// ldmatrix lane addresses (as the forward's): rows of a tile as A fragments (16 rows x 16 columns per x4
// load), as plain B fragments (the scores' K-major B: 16 rows x 16 columns as two n8 tiles) and as
// transposed B fragments (the P V products).
struct BwdLanes {
  int a_row, a_col, b_row, b_col;
  __device__ __forceinline__ explicit BwdLanes(int lane)
      : a_row(lane % 16), a_col((lane / 16) * 8), b_row((lane / 16) * 8 + lane % 8), b_col(((lane / 8) % 2) * 8) {}
  template <typename T>
  __device__ __forceinline__ unsigned a(const T* tile, int row0, int pitch) const {
    return static_cast<unsigned>(__cvta_generic_to_shared(tile + (row0 + a_row) * pitch + a_col));
  }
  template <typename T>
  __device__ __forceinline__ unsigned b(const T* tile, int pitch) const {
    return static_cast<unsigned>(__cvta_generic_to_shared(tile + b_row * pitch + b_col));
  }
};

// The float kernels' lanes into their tiles (3xTF32, qk_scores_tf32x3 and pv_tile_tf32x3): the warp's kept
// rows g (and + 8) at column 4 t4, a streamed tile's rows g at column 4 t4 as the scores' B operand, and its
// rows 2 t4 (and + 1) at column g as the B operand of a P V product.
template <typename T, int kPitch, int kStreamElems>
struct BwdTf32Lanes {
  int kept_offset, scored_offset, multiplied_offset;
  __device__ __forceinline__ BwdTf32Lanes(int g, int t4, int warp_row0)
      : kept_offset((warp_row0 + g) * kPitch + 4 * t4), scored_offset(g * kPitch + 4 * t4),
        multiplied_offset(2 * t4 * kPitch + g) {}
  __device__ __forceinline__ const float* kept(const T* tile) const {
    return reinterpret_cast<const float*>(tile) + kept_offset;
  }
  __device__ __forceinline__ const float* scored(const T* tiles, int buf) const {
    return reinterpret_cast<const float*>(tiles) + buf * kStreamElems + scored_offset;
  }
  __device__ __forceinline__ const float* multiplied(const T* tiles, int buf) const {
    return reinterpret_cast<const float*>(tiles) + buf * kStreamElems + multiplied_offset;
  }
};

// BwdTf32Lanes' stand-in in the 16-bit kernels.
struct NoLanes {
  __device__ __forceinline__ NoLanes(int, int, int) {}
};

// acc += P B in 3xTF32 for the backward's products (pv_tile_tf32x3 without a rescale), in chunks of 4 of acc's
// 8-column blocks, 2 at d = 128 (the partial sums' registers: 16 or 8).
template <int kM16, int kN8, int kD8, int kPitch>
__device__ __forceinline__ void pv_accumulate_tf32x3(float (&acc)[kM16][kD8][4], const float (&p)[kM16][kN8][4],
                                                     const float* sb) {
  float ones[kM16][2];
#pragma unroll
  for (int r = 0; r < kM16; ++r) ones[r][0] = ones[r][1] = 1.f;
  pv_tile_tf32x3<kM16, kN8, kD8, kPitch, kD8 >= 16 ? 2 : 4>(acc, ones, p, sb);
}

// The query tiles of kStream rows that meet the key tile of kKept keys at n0, [first, last] (first =
// query_tiles: none), as bwd_tiles_meet decides tile by tile (the two agree on every case of an exhaustive
// check, docs/notes/attention-backward-plan.md): a tile meets once its last row reaches `lower` (the causal
// diagonal, or the window's reach back from the first key), and with a window until its first row passes
// the last key's reach forward; sink keys meet every later row. A contiguous range: as a tile moves down,
// "reaches the key tile" turns true once and "is still inside its window" false once. kFormula: by the
// formula, which holds unwindowed too (the host sets the window bounds to m and n, no sinks), or by the walk.
template <bool kWindow, int kStream, int kKept, bool kFormula = kWindow>
__device__ __forceinline__ void bwd_query_tiles(const BwdParams& p, int n0, int query_tiles, int& first, int& last) {
  first = 0;
  if constexpr (kFormula) {
    int lower = p.causal ? n0 : 0;
    last = query_tiles - 1;
    if (n0 >= p.num_sinks) {  // window bounds are at most m and n (the host clamps them)
      lower = max(lower, n0 - p.window_right);
      // 64-bit: window_left may be as large as m, and m + n may pass 2^31.
      last = min(last, int((static_cast<long long>(min(n0 + kKept, p.n)) - 1 + p.window_left) / kStream));
    }
    first = lower > p.m - 1 || lower / kStream > last ? query_tiles : lower / kStream;
  } else {  // the walk (ptxas spilled the unwindowed mma kernels, at their register edge, with the formula)
    while (first < query_tiles && !bwd_tiles_meet<kWindow, kStream, kKept>(p, first * kStream, n0)) ++first;
    last = first;
    while (last + 1 < query_tiles && bwd_tiles_meet<kWindow, kStream, kKept>(p, (last + 1) * kStream, n0)) ++last;
  }
}

// Grid: (batch * kv heads, key tiles of 64 kM16). dK and dV of one key tile over every query head of its group
// and every query tile of kStream rows that meets it (a contiguous range: as a tile moves down, "reaches the
// key tile" turns true once and "is still inside its window" false once), in a fixed order: no atomics. The
// walk goes up each head's range, last query tile first (bwd_copy_query_tile), so a causal key's many small
// late probabilities are summed before its few large ones near the diagonal: summed the other way they are
// added to a running sum already near its final size, each addition rounding at that size (in float32 at
// S 2048 past the oracle's bound: docs/notes/attention-backward-plan.md).
template <typename T, int kHeadDim, int kM16, int kStream, int kVec, bool kWindow>
__global__ void __launch_bounds__(kBwdMmaThreads, 1) attention_bwd_dkdv_mma(const BwdParams p) {
  using Tile = BwdMmaTile<T, kHeadDim, kM16, kStream>;
  constexpr int kPitch = Tile::kPitch, kN8 = Tile::kN8, kD8 = Tile::kD8, kKept = Tile::kKept;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Tile::kKeptElems;
  T* sQ = sV + Tile::kKeptElems;           // [2 buffers][kStreamElems]
  T* sdO = sQ + 2 * Tile::kStreamElems;    // [2 buffers][kStreamElems]
  float* sLse = reinterpret_cast<float*>(sdO + 2 * Tile::kStreamElems);  // [2 buffers][kStream]
  float* sDelta = sLse + 2 * kStream;                                    // [2 buffers][kStream]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
  const int n0 = blockIdx.y * kKept;
  const int kv_heads = p.heads / p.kv_group;
  const long long b = blockIdx.x / kv_heads, h_kv = blockIdx.x % kv_heads;
  const T* q_head0 = reinterpret_cast<const T*>(p.q) + b * p.q_batch_stride + h_kv * p.kv_group * p.q_head_stride;
  const T* do_head0 = reinterpret_cast<const T*>(p.dout) + b * p.do_batch_stride + h_kv * p.kv_group * p.do_head_stride;
  const long long bh0 = b * p.heads + h_kv * p.kv_group;

  int first, last;
  const int query_tiles = (p.m + kStream - 1) / kStream;
  bwd_query_tiles<kWindow, kStream, kKept>(p, n0, query_tiles, first, last);
  const int per_head = first < query_tiles ? last - first + 1 : 0;
  const int steps = per_head * p.kv_group;

  if (steps > 0) {  // else no query sees these keys: dK = dV = 0, nothing to read
    bwd_copy_tile<T, kKept, kHeadDim, kPitch, kVec>(
        sK, reinterpret_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride + n0 * p.k_row_stride,
        p.k_row_stride, p.n - n0, p.d, tid);
    bwd_copy_tile<T, kKept, kHeadDim, kPitch, kVec>(
        sV, reinterpret_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride + n0 * p.v_row_stride,
        p.v_row_stride, p.n - n0, p.d, tid);
    bwd_copy_query_tile<T, kStream, kHeadDim, kPitch, kVec>(p, sQ, sdO, sLse, sDelta, q_head0, do_head0, bh0, 0,
                                                            per_head, last, tid);
  }
  cp_async_commit();

  float dk[kM16][kD8][4], dv[kM16][kD8][4];
  zero_fragments(dk);
  zero_fragments(dv);

  const BwdLanes lanes(lane);
  const int warp_row0 = 16 * kM16 * warp;
  const unsigned k_addr = lanes.a(sK, warp_row0, kPitch), v_addr = lanes.a(sV, warp_row0, kPitch);
  const unsigned q_addr_b = lanes.b(sQ, kPitch), do_addr_b = lanes.b(sdO, kPitch);
  const unsigned q_addr_t = lanes.a(sQ, 0, kPitch), do_addr_t = lanes.a(sdO, 0, kPitch);
  constexpr unsigned kBufferBytes = Tile::kStreamElems * sizeof(T);
  const float c = p.scale * 1.4426950408889634f;
  const float unused[kM16][2] = {};
  constexpr bool kTf32 = sizeof(T) == 4;
  // float: the lanes' offsets into the tiles; 16-bit: nothing (no registers, not even for a moment).
  const typename ck::Conditional<kTf32, BwdTf32Lanes<T, kPitch, Tile::kStreamElems>, NoLanes>::type tf32(g, t4,
                                                                                                        warp_row0);

  for (int it = 0; it < steps; ++it) {
    const int m0 = (last - it % per_head) * kStream, buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();  // step it's tiles visible to all; every warp has left step it - 1's buffer
    if (it + 1 < steps) {
      bwd_copy_query_tile<T, kStream, kHeadDim, kPitch, kVec>(p, sQ, sdO, sLse, sDelta, q_head0, do_head0, bh0, it + 1,
                                                              per_head, last, tid);
    }
    cp_async_commit();
    const unsigned offset = buf * kBufferBytes;
    float s[kM16][kN8][4], dp[kM16][kN8][4];
    if constexpr (kTf32) {
      qk_scores_tf32x3<kM16, kN8, kHeadDim, kPitch>(s, tf32.kept(sK), tf32.scored(sQ, buf));
      qk_scores_tf32x3<kM16, kN8, kHeadDim, kPitch>(dp, tf32.kept(sV), tf32.scored(sdO, buf));
    } else {
      qk_scores<T, kM16, kN8, kHeadDim, kPitch, Tile::kQkUnroll>(s, k_addr, q_addr_b + offset);
      qk_scores<T, kM16, kN8, kHeadDim, kPitch, Tile::kQkUnroll>(dp, v_addr, do_addr_b + offset);
    }
    const float* lse = sLse + buf * kStream;
    const float* delta = sDelta + buf * kStream;
    if (bwd_tile_full<kWindow, kStream, kKept>(p, m0, n0)) {
      bwd_probabilities<false, kWindow, false, kM16, kN8>(p, s, dp, unused, unused, lse, delta, c, n0 + warp_row0, m0,
                                                          g, t4);
    } else {
      bwd_probabilities<true, kWindow, false, kM16, kN8>(p, s, dp, unused, unused, lse, delta, c, n0 + warp_row0, m0,
                                                         g, t4);
    }
    if constexpr (kTf32) {
      pv_accumulate_tf32x3<kM16, kN8, kD8, kPitch>(dv, s, tf32.multiplied(sdO, buf));
      pv_accumulate_tf32x3<kM16, kN8, kD8, kPitch>(dk, dp, tf32.multiplied(sQ, buf));
    } else {
#pragma unroll
      for (int kk = 0; kk < kStream / 16; ++kk) {
        unsigned a[kM16][4];
#pragma unroll
        for (int r = 0; r < kM16; ++r) p_fragment<T, kN8>(a[r], s[r], kk);
        pv_slice<T, kM16, kD8, kPitch>(dv, a, do_addr_t + offset, kk);
#pragma unroll
        for (int r = 0; r < kM16; ++r) p_fragment<T, kN8>(a[r], dp[r], kk);
        pv_slice<T, kM16, kD8, kPitch>(dk, a, q_addr_t + offset, kk);
      }
    }
  }

  T* dk_tile = reinterpret_cast<T*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride + n0 * p.dk_row_stride;
  T* dv_tile = reinterpret_cast<T*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride + n0 * p.dv_row_stride;
  bwd_store_rows<T, kM16, kD8, kVec>(dk_tile, p.dk_row_stride, dk, p.scale, warp_row0, p.n - n0, p.d, g, t4);
  bwd_store_rows<T, kM16, kD8, kVec>(dv_tile, p.dv_row_stride, dv, 1.f, warp_row0, p.n - n0, p.d, g, t4);
}

// The key tiles of kKeys that meet a windowed query tile of kRows at m0, as bwd_tiles_meet decides tile by
// tile (the two agree on every case of an exhaustive check, docs/notes/attention-backward-plan.md): the sink
// tiles [0, sink_end) and the window's [lo, hi]. Unwindowed, it holds nothing (see bwd_next_key_tile).
template <bool kWindow, int kRows, int kKeys>
struct BwdKeyWalk {
  int sink_end = 0, lo = 0, hi = -1;
  __device__ __forceinline__ BwdKeyWalk(const BwdParams& p, int m0) {
    if constexpr (kWindow) {
      // Window bounds are at most m and n (the host clamps them); m + n may pass 2^31, so their sums with
      // row indices are taken in 64 bits below.
      const int key_tiles = (p.n + kKeys - 1) / kKeys, last_row = min(m0 + kRows, p.m) - 1;
      const int last = p.causal ? min(key_tiles - 1, last_row / kKeys) : key_tiles - 1;
      sink_end = min((p.num_sinks + kKeys - 1) / kKeys, last + 1);
      const int lo_row = m0 - p.window_left;  // the first key the rows reach
      lo = lo_row > 0 ? lo_row / kKeys : 0;
      hi = lo_row > p.n - 1 ? -1 : min(last, int((static_cast<long long>(last_row) + p.window_right) / kKeys));
    }
  }
};

// The first key tile at or after `t` that meets the query tile at m0 (key_tiles if none): windowed, from the
// walk's ranges, where a search would cross the gap between the sinks and the window (O(N) tests per CTA);
// unwindowed, a search (ptxas spilled these kernels, at their register edge, with the causal bound as a
// formula; past the diagonal the search runs once to the end).
template <bool kWindow, int kRows, int kKeys>
__device__ __forceinline__ int bwd_next_key_tile(const BwdParams& p, const BwdKeyWalk<kWindow, kRows, kKeys>& walk,
                                                 int m0, int t, int key_tiles) {
  if constexpr (kWindow) {
    if (t < walk.sink_end) return t;
    t = max(t, walk.lo);
    return t <= walk.hi ? t : key_tiles;
  } else {
    while (t < key_tiles && !bwd_tiles_meet<kWindow, kRows, kKeys>(p, m0, t * kKeys)) ++t;
    return t;
  }
}

// Grid: (batch * heads, query tiles of 64 kM16). dQ of one query tile over every key tile of kStream that
// meets it.
// Up to d = 64 (unwindowed) ptxas fits it in 168 registers without spills on sm_90a, so three CTAs share an
// SM there (3 x 55 KB of shared memory of its 228); sm_80's 164 KB hold two, so it gets no register cap
// (at 168 it spills there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kBwdDqCtasPerSm = 3;
#else
constexpr int kBwdDqCtasPerSm = 1;
#endif
template <typename T, int kHeadDim, int kM16, int kStream, int kVec, bool kWindow>
__global__ void __launch_bounds__(kBwdMmaThreads, kHeadDim <= 64 && !kWindow ? kBwdDqCtasPerSm : 1)
    attention_bwd_dq_mma(const BwdParams p) {
  using Tile = BwdMmaTile<T, kHeadDim, kM16, kStream>;
  constexpr int kPitch = Tile::kPitch, kN8 = Tile::kN8, kD8 = Tile::kD8, kKept = Tile::kKept;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + Tile::kKeptElems;
  T* sK = sdO + Tile::kKeptElems;         // [2 buffers][kStreamElems]
  T* sV = sK + 2 * Tile::kStreamElems;    // [2 buffers][kStreamElems]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
  // Causal: query tile i meets i + 1 key tiles, so the last tiles go first (the block scheduler hands out
  // low blockIdx.y first), and the short ones fill the tail. (The dK/dV kernel's heavy tiles, key tile 0
  // meeting every query tile, are its first already.)
  const int m0 = (p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * kKept;
  const long long bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long h_kv = static_cast<unsigned>(h) / static_cast<unsigned>(p.kv_group);
  const T* k_head = reinterpret_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v_head = reinterpret_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;
  const int key_tiles = (p.n + kStream - 1) / kStream;
  const BwdKeyWalk<kWindow, kKept, kStream> walk(p, m0);

  bwd_copy_tile<T, kKept, kHeadDim, kPitch, kVec>(
      sQ, reinterpret_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_row_stride,
      p.q_row_stride, p.m - m0, p.d, tid);
  bwd_copy_tile<T, kKept, kHeadDim, kPitch, kVec>(
      sdO, reinterpret_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride + m0 * p.do_row_stride,
      p.do_row_stride, p.m - m0, p.d, tid);
  int t = bwd_next_key_tile<kWindow, kKept, kStream>(p, walk, m0, 0, key_tiles);
  if (t < key_tiles) bwd_copy_key_tile<T, kStream, kHeadDim, kPitch, kVec>(p, sK, sV, k_head, v_head, t, 0, tid);
  cp_async_commit();

  const int warp_row0 = 16 * kM16 * warp;
  // This lane's rows' statistics (rows past m: 0, never stored).
  float row_lse2[kM16][2], row_delta[kM16][2];
#pragma unroll
  for (int r = 0; r < kM16; ++r)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = m0 + warp_row0 + 16 * r + g + 8 * hh;
      row_lse2[r][hh] = row < p.m ? p.lse[bh * p.m + row] * kLog2e : 0.f;
      row_delta[r][hh] = row < p.m ? p.delta[bh * p.m + row] : 0.f;
    }
  float dq[kM16][kD8][4];
  zero_fragments(dq);

  const BwdLanes lanes(lane);
  const unsigned q_addr = lanes.a(sQ, warp_row0, kPitch), do_addr = lanes.a(sdO, warp_row0, kPitch);
  const unsigned k_addr_b = lanes.b(sK, kPitch), v_addr_b = lanes.b(sV, kPitch);
  const unsigned k_addr_t = lanes.a(sK, 0, kPitch);
  constexpr unsigned kBufferBytes = Tile::kStreamElems * sizeof(T);
  const float c = p.scale * kLog2e;
  constexpr bool kTf32 = sizeof(T) == 4;
  // float: the lanes' offsets into the tiles; 16-bit: nothing (no registers, not even for a moment).
  const typename ck::Conditional<kTf32, BwdTf32Lanes<T, kPitch, Tile::kStreamElems>, NoLanes>::type tf32(g, t4,
                                                                                                        warp_row0);

  for (int buf = 0; t < key_tiles; buf ^= 1) {
    const int n0 = t * kStream;
    cp_async_wait<0>();
    __syncthreads();  // tile t visible to all; every warp has left the previous tile's buffer
    const int next = bwd_next_key_tile<kWindow, kKept, kStream>(p, walk, m0, t + 1, key_tiles);
    if (next < key_tiles) {
      bwd_copy_key_tile<T, kStream, kHeadDim, kPitch, kVec>(p, sK, sV, k_head, v_head, next, buf ^ 1, tid);
    }
    cp_async_commit();
    const unsigned offset = buf * kBufferBytes;
    float s[kM16][kN8][4], dp[kM16][kN8][4];
    if constexpr (kTf32) {
      qk_scores_tf32x3<kM16, kN8, kHeadDim, kPitch>(s, tf32.kept(sQ), tf32.scored(sK, buf));
      qk_scores_tf32x3<kM16, kN8, kHeadDim, kPitch>(dp, tf32.kept(sdO), tf32.scored(sV, buf));
    } else {
      qk_scores<T, kM16, kN8, kHeadDim, kPitch, Tile::kQkUnroll>(s, q_addr, k_addr_b + offset);
      qk_scores<T, kM16, kN8, kHeadDim, kPitch, Tile::kQkUnroll>(dp, do_addr, v_addr_b + offset);
    }
    if (bwd_tile_full<kWindow, kKept, kStream>(p, m0, n0)) {
      bwd_probabilities<false, kWindow, true, kM16, kN8>(p, s, dp, row_lse2, row_delta, nullptr, nullptr, c,
                                                         m0 + warp_row0, n0, g, t4);
    } else {
      bwd_probabilities<true, kWindow, true, kM16, kN8>(p, s, dp, row_lse2, row_delta, nullptr, nullptr, c,
                                                        m0 + warp_row0, n0, g, t4);
    }
    if constexpr (kTf32) {
      pv_accumulate_tf32x3<kM16, kN8, kD8, kPitch>(dq, dp, tf32.multiplied(sK, buf));
    } else {
#pragma unroll
      for (int kk = 0; kk < kStream / 16; ++kk) {
        unsigned a[kM16][4];
#pragma unroll
        for (int r = 0; r < kM16; ++r) p_fragment<T, kN8>(a[r], dp[r], kk);
        pv_slice<T, kM16, kD8, kPitch>(dq, a, k_addr_t + offset, kk);
      }
    }
    t = next;
  }

  T* dq_tile = reinterpret_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + m0 * p.dq_row_stride;
  bwd_store_rows<T, kM16, kD8, kVec>(dq_tile, p.dq_row_stride, dq, p.scale, warp_row0, p.m - m0, p.d, g, t4);
}

// =========================================================================================================
// Backward, FP32: register-tiled FFMA kernels
// =========================================================================================================
//
// The same two kernels as the 16-bit path (a CTA keeps kKept rows of one side in shared memory and streams
// kStream-row tiles of the other: keys kept for dK/dV, query rows kept for dQ), in exact FP32 arithmetic.
// 256 threads; the score tile is kRows query rows x kKeys keys (dK/dV: kStream x kKept; dQ: kKept x kStream).
//
// Thread (a, b), a = 4 (warp / 2) + lane / 8 and b = 8 (warp % 2) + lane % 8, both in [0, 16):
// - scores: S = Q K^T and dP = dO V^T for rows a + 16 i and keys b + 16 j, as dot products over the head
//   dim, 4 columns per 16-byte shared-memory read (pitch d + 4: rows 16-byte aligned, 8 consecutive rows on
//   8 distinct 4-bank groups). A warp's read of one operand row index is 4 distinct Q rows (each a
//   broadcast to 8 lanes) or 8 distinct K rows: one wavefront each, so a 4 x 4 micro-tile costs 8 reads per
//   64 FFMAs of S and as many of dP.
// - accumulators: kept rows kOwned a + t (t < kOwned = kKept / 16, contiguous) x head dims kDimVec b +
//   16 kDimVec c + u (u < kDimVec, c < kDimChunks). Per streamed row r a thread reads kOwned contiguous
//   weights (P or dS; one 8- or 16-byte read) and kDimChunks 16-byte chunks of the operand row: a warp's
//   chunks are one contiguous 128-byte segment.
// P, dS go through shared memory between the two: dK/dV as sP / sdS [query row][key] (pitch kKeys + 8, so
// a warp's 4 rows x 8 keys of writes land on 32 distinct banks), dQ as sdS^T [key][query row] (pitch
// kRows + 4, likewise). Every sum runs in the order of a scalar loop: over the head dim for S and dP, over
// the streamed rows (tile after tile) for dK, dV and dQ.
//
// Pipeline: commit group 0 holds the kept tiles and the first streamed tile. At the top of each streamed
// tile a thread waits for its own copies and the barrier publishes everyone's. With two stages (kStages 2:
// where shared memory allows) the next tile's copies are issued right after that barrier into the other
// buffer, which every warp left before it; with one, after a barrier at the end of the tile (every read of
// the buffer done), and two CTAs per SM (kCtasPerSm, where shared memory and registers allow) overlap one's
// copies with the other's arithmetic. A barrier between the scores and the accumulation publishes P and dS.

constexpr int kBwdFp32Threads = 256;

template <int N>
struct alignas(4 * N) BwdFloats {
  float v[N];
};
template <int N>
__device__ __forceinline__ BwdFloats<N> bwd_lds(const float* p) {
  return *reinterpret_cast<const BwdFloats<N>*>(p);
}

template <int kHeadDim, int kKept, int kStream, int kStages, bool kKeysKept, bool kAtomicDq = false>
struct BwdFp32Tile {
  static constexpr int kPitch = kHeadDim + 4;
  static constexpr int kRows = kKeysKept ? kStream : kKept;  // query rows of a score tile
  static constexpr int kKeys = kKeysKept ? kKept : kStream;  // keys of a score tile
  static constexpr int kRowsPer = kRows / 16, kKeysPer = kKeys / 16, kOwned = kKept / 16;
  static constexpr int kDimVec = kHeadDim >= 64 ? 4 : 2;
  static constexpr int kDimChunks = kHeadDim / (16 * kDimVec);
  static constexpr int kScorePitch = kKeysKept ? kKeys + 8 : kRows + 4;
  static constexpr int kKeptFloats = kKept * kPitch, kStreamFloats = kStream * kPitch;
  // Two kept tiles; kStages buffers of two streamed tiles; sP and sdS (dK/dV) or sdS^T (dQ); dK/dV: kStages
  // buffers of the streamed rows' lse and D.
  // The atomic-dQ dK/dV kernel's dS^T [key][query row] (pitch kStream + 4, as the dQ kernel's).
  static constexpr int kTransposedPitch = kStream + 4;
  static constexpr int kSmemFloats = 2 * kKeptFloats + 2 * kStages * kStreamFloats +
                                     (kKeysKept ? 2 * kStream * kScorePitch + 2 * kStages * kStream
                                                : kStream * kScorePitch) +
                                     (kAtomicDq ? kKept * kTransposedPitch : 0);
  static constexpr int kSmemBytes = 4 * kSmemFloats;
  static constexpr int kCtasPerSm = kHeadDim <= 64 && !kKeysKept ? 2 : 1;
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim: a multiple of 32 up to 256 (pad d to it)");
  static_assert((kKept == 32 || kKept == 64) && (kStream == 32 || kStream == 64), "tiles of 32 or 64 rows");
  static_assert(kStages == 1 || kStages == 2, "one or two buffers");
  static_assert(kKeysKept || !kAtomicDq, "dQ by atomics comes from the dK/dV kernel");
  static_assert(kSmemBytes <= 227 * 1024, "the SM's shared memory per block");
};

// acc[i][j] = x[a + 16 i] . y[b + 16 j] over the head dim (rows of two shared-memory tiles, pitch d + 4).
template <int kHeadDim, int kRI, int kKJ, int kUnroll>
__device__ __forceinline__ void bwd_fp32_dots(float (&acc)[kRI][kKJ], const float* x, const float* y, int a, int b) {
  constexpr int kPitch = kHeadDim + 4;
#pragma unroll
  for (int i = 0; i < kRI; ++i)
#pragma unroll
    for (int j = 0; j < kKJ; ++j) acc[i][j] = 0.f;
#pragma unroll kUnroll
  for (int c = 0; c < kHeadDim; c += 4) {
    BwdFloats<4> xc[kRI], yc[kKJ];
#pragma unroll
    for (int i = 0; i < kRI; ++i) xc[i] = bwd_lds<4>(x + (a + 16 * i) * kPitch + c);
#pragma unroll
    for (int j = 0; j < kKJ; ++j) yc[j] = bwd_lds<4>(y + (b + 16 * j) * kPitch + c);
#pragma unroll
    for (int i = 0; i < kRI; ++i)
#pragma unroll
      for (int j = 0; j < kKJ; ++j)
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[i][j] = fmaf(xc[i].v[u], yc[j].v[u], acc[i][j]);
  }
}

// S and dP of the thread's rows a + 16 i and keys b + 16 j, then P and dS into shared memory. lse / delta:
// the thread's rows' statistics.
template <int kHeadDim, int kRows, int kKeys, int kScorePitch, bool kKeysKept, bool kWindow, bool kMasked,
          bool kAlsoTransposed = false>
__device__ __forceinline__ void bwd_fp32_scores(const BwdParams& p, const float* sQ, const float* sdO, const float* sK,
                                                const float* sV, const float (&lse)[kRows / 16],
                                                const float (&delta)[kRows / 16], float* sP, float* sdS, int m0,
                                                int n0, int a, int b, float* sdSt = nullptr) {
  constexpr int kRI = kRows / 16, kKJ = kKeys / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  // Two passes (S, then dP): one pair of operands' reads live at a time.
  float s[kRI][kKJ], dp[kRI][kKJ];
  // Unrolled twice where registers allow: one CTA per SM (the 128 registers of two spill at 4 x 4 entries).
  constexpr int kUnroll = kHeadDim <= 64 ? 1 : 2;
  bwd_fp32_dots<kHeadDim, kRI, kKJ, kUnroll>(s, sQ, sK, a, b);
  bwd_fp32_dots<kHeadDim, kRI, kKJ, kUnroll>(dp, sdO, sV, a, b);
#pragma unroll
  for (int i = 0; i < kRI; ++i) {
    const int row = a + 16 * i;
#pragma unroll
    for (int j = 0; j < kKJ; ++j) {
      const int key = b + 16 * j;
      float prob = 0.f;
      if (!kMasked || bwd_sees<kWindow>(p, m0 + row, n0 + key)) prob = exp2f((s[i][j] * p.scale - lse[i]) * kLog2e);
      const float ds = prob * (dp[i][j] - delta[i]);
      if constexpr (kKeysKept) {
        sP[row * kScorePitch + key] = prob;
        sdS[row * kScorePitch + key] = ds;
        if constexpr (kAlsoTransposed) sdSt[key * (kRows + 4) + row] = ds;
      } else {
        sdS[key * kScorePitch + row] = ds;
      }
    }
  }
}

// acc[t][c][u] += w[t] * x[kDimVec b + 16 kDimVec c + u]: w the thread's kOwned kept rows' weights (P or dS
// of one streamed row), x one streamed operand row.
template <int kOwned, int kDimChunks, int kDimVec>
__device__ __forceinline__ void bwd_fp32_outer(float (&acc)[kOwned][kDimChunks][kDimVec], const float* w,
                                               const float* x, int b) {
  const BwdFloats<kOwned> weight = bwd_lds<kOwned>(w);
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c) {
    const BwdFloats<kDimVec> chunk = bwd_lds<kDimVec>(x + kDimVec * b + 16 * kDimVec * c);
#pragma unroll
    for (int t = 0; t < kOwned; ++t)
#pragma unroll
      for (int u = 0; u < kDimVec; ++u) acc[t][c][u] = fmaf(weight.v[t], chunk.v[u], acc[t][c][u]);
  }
}

// The thread's kept rows row0 + t (valid below valid_rows) times `scale` into a row-major global tile:
// whole chunks (kVec 4: d a multiple of 4 and rows 16-byte aligned, so a chunk is wholly inside d or
// outside) or element by element.
template <int kOwned, int kDimChunks, int kDimVec, int kVec>
__device__ __forceinline__ void bwd_fp32_store(float* tile, long long row_stride,
                                               const float (&acc)[kOwned][kDimChunks][kDimVec], float scale,
                                               int row0, int valid_rows, int d, int b) {
#pragma unroll
  for (int t = 0; t < kOwned; ++t) {
    if (row0 + t >= valid_rows) break;
    float* row = tile + (row0 + t) * row_stride;
#pragma unroll
    for (int c = 0; c < kDimChunks; ++c) {
      const int col = kDimVec * b + 16 * kDimVec * c;
      if constexpr (kVec == 4) {
        if (col < d) {
          BwdFloats<kDimVec> out;
#pragma unroll
          for (int u = 0; u < kDimVec; ++u) out.v[u] = acc[t][c][u] * scale;
          *reinterpret_cast<BwdFloats<kDimVec>*>(row + col) = out;
        }
      } else {
#pragma unroll
        for (int u = 0; u < kDimVec; ++u)
          if (col + u < d) row[col + u] = acc[t][c][u] * scale;
      }
    }
  }
}

// dst[u] += v[u] (u < N) in global memory, unordered: one vector reduction where sm_90 has it (16 or 8 bytes,
// aligned), else one atomic per float. With kVec 1 (no alignment to rely on) element by element, below d.
template <int N, int kVec>
__device__ __forceinline__ void bwd_red_add(float* dst, const float (&v)[N], int valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kVec == 4 && N == 4) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v[0]), "f"(v[1]), "f"(v[2]),
                 "f"(v[3]) : "memory");
    return;
  } else if constexpr (kVec == 4 && N == 2) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(v[0]), "f"(v[1]) : "memory");
    return;
  }
#endif
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (kVec == 4 || u < valid) atomicAdd(dst + u, v[u]);
}

// Grid: (batch * kv heads, key tiles of kKept). dK and dV of one key tile over every query head of its group
// and every query tile of kStream rows that meets it (bwd_query_tiles), in the mma kernel's fixed order (last
// query tile first: its comment says why): no atomics. With
// kAtomicDq, also dQ (FlashAttention-2's five products instead of the two kernels' seven): each tile's
// scale * dS K added into dq (zeroed by the host) with unordered atomics, so dq is not bitwise repeatable; the
// dQ kernel is then not launched.
template <int kHeadDim, int kKept, int kStream, int kStages, int kVec, bool kWindow, bool kAtomicDq>
__global__ void __launch_bounds__(kBwdFp32Threads,
                                  (BwdFp32Tile<kHeadDim, kKept, kStream, kStages, true, kAtomicDq>::kCtasPerSm))
    attention_bwd_dkdv_fp32(const BwdParams p) {
  using Tile = BwdFp32Tile<kHeadDim, kKept, kStream, kStages, true, kAtomicDq>;
  constexpr int kPitch = Tile::kPitch, kSP = Tile::kScorePitch, kOwned = Tile::kOwned, kRI = Tile::kRowsPer;
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;
  float* sV = sK + Tile::kKeptFloats;
  float* sQ = sV + Tile::kKeptFloats;                  // [kStages][kStreamFloats]
  float* sdO = sQ + kStages * Tile::kStreamFloats;     // [kStages][kStreamFloats]
  float* sP = sdO + kStages * Tile::kStreamFloats;     // [kStream][kSP]
  float* sdS = sP + kStream * kSP;                     // [kStream][kSP]
  float* sLse = sdS + kStream * kSP;                   // [kStages][kStream]
  float* sDelta = sLse + kStages * kStream;            // [kStages][kStream]
  float* sdSt = sDelta + kStages * kStream;            // kAtomicDq: [kKept][kTransposedPitch]
  if (ck::dynamic_smem_bytes() < Tile::kSmemBytes) __trap();  // backward.py sizes it by hand

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int a = 4 * (warp / 2) + lane / 8, b = 8 * (warp % 2) + lane % 8;
  const int n0 = blockIdx.y * kKept;
  const int kv_heads = p.heads / p.kv_group;
  const long long bb = blockIdx.x / kv_heads, h_kv = blockIdx.x % kv_heads;
  const float* q_head0 = p.q + bb * p.q_batch_stride + h_kv * p.kv_group * p.q_head_stride;
  const float* do_head0 = p.dout + bb * p.do_batch_stride + h_kv * p.kv_group * p.do_head_stride;
  const long long bh0 = bb * p.heads + h_kv * p.kv_group;

  int first, last;
  const int query_tiles = (p.m + kStream - 1) / kStream;
  bwd_query_tiles<kWindow, kStream, kKept, true>(p, n0, query_tiles, first, last);
  const int per_head = first < query_tiles ? last - first + 1 : 0;
  const int steps = per_head * p.kv_group;

  if (steps > 0) {  // else no query sees these keys: dK = dV = 0, nothing to read
    bwd_copy_tile<float, kKept, kHeadDim, kPitch, kVec, kBwdFp32Threads>(
        sK, p.k + bb * p.k_batch_stride + h_kv * p.k_head_stride + n0 * p.k_row_stride, p.k_row_stride, p.n - n0,
        p.d, tid);
    bwd_copy_tile<float, kKept, kHeadDim, kPitch, kVec, kBwdFp32Threads>(
        sV, p.v + bb * p.v_batch_stride + h_kv * p.v_head_stride + n0 * p.v_row_stride, p.v_row_stride, p.n - n0,
        p.d, tid);
    bwd_copy_query_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads, kStages>(p, sQ, sdO, sLse, sDelta, q_head0,
                                                                                 do_head0, bh0, 0, per_head, last, tid);
  }
  cp_async_commit();

  float dk[kOwned][Tile::kDimChunks][Tile::kDimVec], dv[kOwned][Tile::kDimChunks][Tile::kDimVec];
#pragma unroll
  for (int t = 0; t < kOwned; ++t)
#pragma unroll
    for (int c = 0; c < Tile::kDimChunks; ++c)
#pragma unroll
      for (int u = 0; u < Tile::kDimVec; ++u) dk[t][c][u] = dv[t][c][u] = 0.f;

  for (int it = 0; it < steps; ++it) {
    const int m0 = (last - it % per_head) * kStream, buf = kStages == 2 ? it & 1 : 0;
    cp_async_wait<0>();
    __syncthreads();  // step it's tiles visible to all; every warp has left the other buffer and sP / sdS
    if (kStages == 2 && it + 1 < steps) {
      bwd_copy_query_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads, kStages>(
          p, sQ, sdO, sLse, sDelta, q_head0, do_head0, bh0, it + 1, per_head, last, tid);
      cp_async_commit();
    }
    const float* q_tile = sQ + buf * Tile::kStreamFloats;
    const float* do_tile = sdO + buf * Tile::kStreamFloats;
    float lse[kRI], delta[kRI];
#pragma unroll
    for (int i = 0; i < kRI; ++i) lse[i] = sLse[buf * kStream + a + 16 * i], delta[i] = sDelta[buf * kStream + a + 16 * i];
    if (bwd_tile_full<kWindow, kStream, kKept>(p, m0, n0)) {
      bwd_fp32_scores<kHeadDim, kStream, kKept, kSP, true, kWindow, false, kAtomicDq>(
          p, q_tile, do_tile, sK, sV, lse, delta, sP, sdS, m0, n0, a, b, sdSt);
    } else {
      bwd_fp32_scores<kHeadDim, kStream, kKept, kSP, true, kWindow, true, kAtomicDq>(
          p, q_tile, do_tile, sK, sV, lse, delta, sP, sdS, m0, n0, a, b, sdSt);
    }
    __syncthreads();  // P and dS visible to all
    // dV[key] += sum_r P[r][key] dO[r],  dK[key] += sum_r dS[r][key] Q[r]  (keys kOwned a + t)
#pragma unroll 4
    for (int r = 0; r < kStream; ++r) {
      bwd_fp32_outer<kOwned, Tile::kDimChunks, Tile::kDimVec>(dv, sP + r * kSP + kOwned * a, do_tile + r * kPitch, b);
      bwd_fp32_outer<kOwned, Tile::kDimChunks, Tile::kDimVec>(dk, sdS + r * kSP + kOwned * a, q_tile + r * kPitch, b);
    }
    if constexpr (kAtomicDq) {
      // dQ[row] += scale * sum_key dS[row][key] K[key] for the streamed rows kStream / 16 a + t, one head-dim
      // chunk at a time (its kStream / 16 x kDimVec sums live beside dK and dV), then into dq.
      constexpr int kRowsOwned = kStream / 16, kTP = Tile::kTransposedPitch;
      const int g_head = it / per_head;
      float* dq_rows = p.dq + bb * p.dq_batch_stride + (h_kv * p.kv_group + g_head) * p.dq_head_stride +
                       static_cast<long long>(m0 + kRowsOwned * a) * p.dq_row_stride;
#pragma unroll
      for (int c = 0; c < Tile::kDimChunks; ++c) {
        float part[kRowsOwned][1][Tile::kDimVec];
#pragma unroll
        for (int t = 0; t < kRowsOwned; ++t)
#pragma unroll
          for (int u = 0; u < Tile::kDimVec; ++u) part[t][0][u] = 0.f;
#pragma unroll 4
        for (int key = 0; key < kKept; ++key) {
          bwd_fp32_outer<kRowsOwned, 1, Tile::kDimVec>(part, sdSt + key * kTP + kRowsOwned * a,
                                                       sK + key * kPitch + 16 * Tile::kDimVec * c, b);
        }
        const int col = Tile::kDimVec * b + 16 * Tile::kDimVec * c;
#pragma unroll
        for (int t = 0; t < kRowsOwned; ++t) {
          if (m0 + kRowsOwned * a + t >= p.m || col >= p.d) break;
          float scaled[Tile::kDimVec];
#pragma unroll
          for (int u = 0; u < Tile::kDimVec; ++u) scaled[u] = part[t][0][u] * p.scale;
          bwd_red_add<Tile::kDimVec, kVec>(dq_rows + t * p.dq_row_stride + col, scaled, p.d - col);
        }
      }
    }
    if (kStages == 1 && it + 1 < steps) {
      __syncthreads();  // every read of the one buffer done
      bwd_copy_query_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads, kStages>(
          p, sQ, sdO, sLse, sDelta, q_head0, do_head0, bh0, it + 1, per_head, last, tid);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();  // no copy outlives the CTA

  float* dk_tile = p.dk + bb * p.dk_batch_stride + h_kv * p.dk_head_stride + n0 * p.dk_row_stride;
  float* dv_tile = p.dv + bb * p.dv_batch_stride + h_kv * p.dv_head_stride + n0 * p.dv_row_stride;
  bwd_fp32_store<kOwned, Tile::kDimChunks, Tile::kDimVec, kVec>(dk_tile, p.dk_row_stride, dk, p.scale, kOwned * a,
                                                               p.n - n0, p.d, b);
  bwd_fp32_store<kOwned, Tile::kDimChunks, Tile::kDimVec, kVec>(dv_tile, p.dv_row_stride, dv, 1.f, kOwned * a,
                                                               p.n - n0, p.d, b);
}

// Grid: (batch * heads, query tiles of kKept). dQ of one query tile over every key tile of kStream that meets
// it (bwd_next_key_tile), causal long tiles first (as the mma dQ kernel).
template <int kHeadDim, int kKept, int kStream, int kStages, int kVec, bool kWindow>
__global__ void __launch_bounds__(kBwdFp32Threads, (BwdFp32Tile<kHeadDim, kKept, kStream, kStages, false>::kCtasPerSm))
    attention_bwd_dq_fp32(const BwdParams p) {
  using Tile = BwdFp32Tile<kHeadDim, kKept, kStream, kStages, false>;
  constexpr int kPitch = Tile::kPitch, kSP = Tile::kScorePitch, kOwned = Tile::kOwned, kRI = Tile::kRowsPer;
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sdO = sQ + Tile::kKeptFloats;
  float* sK = sdO + Tile::kKeptFloats;                 // [kStages][kStreamFloats]
  float* sV = sK + kStages * Tile::kStreamFloats;      // [kStages][kStreamFloats]
  float* sdSt = sV + kStages * Tile::kStreamFloats;    // [kStream][kSP]: dS^T
  if (ck::dynamic_smem_bytes() < Tile::kSmemBytes) __trap();  // backward.py sizes it by hand

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int a = 4 * (warp / 2) + lane / 8, b = 8 * (warp % 2) + lane % 8;
  const int m0 = (p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * kKept;
  const long long bh = blockIdx.x, bb = bh / p.heads, h = bh % p.heads;
  const long long h_kv = static_cast<unsigned>(h) / static_cast<unsigned>(p.kv_group);
  const float* k_head = p.k + bb * p.k_batch_stride + h_kv * p.k_head_stride;
  const float* v_head = p.v + bb * p.v_batch_stride + h_kv * p.v_head_stride;
  const int key_tiles = (p.n + kStream - 1) / kStream;
  const BwdKeyWalk<kWindow, kKept, kStream> walk(p, m0);

  bwd_copy_tile<float, kKept, kHeadDim, kPitch, kVec, kBwdFp32Threads>(
      sQ, p.q + bb * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_row_stride, p.q_row_stride, p.m - m0, p.d, tid);
  bwd_copy_tile<float, kKept, kHeadDim, kPitch, kVec, kBwdFp32Threads>(
      sdO, p.dout + bb * p.do_batch_stride + h * p.do_head_stride + m0 * p.do_row_stride, p.do_row_stride, p.m - m0,
      p.d, tid);
  int t = bwd_next_key_tile<kWindow, kKept, kStream>(p, walk, m0, 0, key_tiles);
  if (t < key_tiles) {
    bwd_copy_key_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads>(p, sK, sV, k_head, v_head, t, 0, tid);
  }
  cp_async_commit();

  // The thread's score rows' statistics (rows past m: 0; their entries are masked).
  float lse[kRI], delta[kRI];
#pragma unroll
  for (int i = 0; i < kRI; ++i) {
    const int row = m0 + a + 16 * i;
    lse[i] = row < p.m ? p.lse[bh * p.m + row] : 0.f;
    delta[i] = row < p.m ? p.delta[bh * p.m + row] : 0.f;
  }
  float dq[kOwned][Tile::kDimChunks][Tile::kDimVec];
#pragma unroll
  for (int r = 0; r < kOwned; ++r)
#pragma unroll
    for (int c = 0; c < Tile::kDimChunks; ++c)
#pragma unroll
      for (int u = 0; u < Tile::kDimVec; ++u) dq[r][c][u] = 0.f;

  for (int buf = 0; t < key_tiles;) {
    const int n0 = t * kStream;
    cp_async_wait<0>();
    __syncthreads();  // tile t visible to all; every warp has left the other buffer and sdS^T
    const int next = bwd_next_key_tile<kWindow, kKept, kStream>(p, walk, m0, t + 1, key_tiles);
    if (kStages == 2 && next < key_tiles) {
      bwd_copy_key_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads>(p, sK, sV, k_head, v_head, next,
                                                                                 buf ^ 1, tid);
      cp_async_commit();
    }
    const float* k_tile = sK + buf * Tile::kStreamFloats;
    const float* v_tile = sV + buf * Tile::kStreamFloats;
    if (bwd_tile_full<kWindow, kKept, kStream>(p, m0, n0)) {
      bwd_fp32_scores<kHeadDim, kKept, kStream, kSP, false, kWindow, false>(p, sQ, sdO, k_tile, v_tile, lse, delta,
                                                                            nullptr, sdSt, m0, n0, a, b);
    } else {
      bwd_fp32_scores<kHeadDim, kKept, kStream, kSP, false, kWindow, true>(p, sQ, sdO, k_tile, v_tile, lse, delta,
                                                                           nullptr, sdSt, m0, n0, a, b);
    }
    __syncthreads();  // dS^T visible to all
    // dQ[row] += sum_key dS[row][key] K[key]  (rows kOwned a + t)
#pragma unroll 2
    for (int key = 0; key < kStream; ++key) {
      bwd_fp32_outer<kOwned, Tile::kDimChunks, Tile::kDimVec>(dq, sdSt + key * kSP + kOwned * a, k_tile + key * kPitch,
                                                              b);
    }
    if (kStages == 1 && next < key_tiles) {
      __syncthreads();  // every read of the one buffer done
      bwd_copy_key_tile<float, kStream, kHeadDim, kPitch, kVec, kBwdFp32Threads>(p, sK, sV, k_head, v_head, next, 0,
                                                                                 tid);
      cp_async_commit();
    }
    if (kStages == 2) buf ^= 1;
    t = next;
  }
  cp_async_wait<0>();  // no copy outlives the CTA (a CTA without key tiles still has Q's in flight)

  float* dq_tile = p.dq + bb * p.dq_batch_stride + h * p.dq_head_stride + m0 * p.dq_row_stride;
  bwd_fp32_store<kOwned, Tile::kDimChunks, Tile::kDimVec, kVec>(dq_tile, p.dq_row_stride, dq, p.scale, kOwned * a,
                                                               p.m - m0, p.d, b);
}

}  // namespace attention
