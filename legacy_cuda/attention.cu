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
// - flash2_mma (FP16/BF16): FlashAttention-2 on mma.sync m16n8k16 (see the second half of this file).
//
// Masking follows torch's SDPA: causal is top-left aligned (query i sees keys 0..i, also when M != N).
// Key 0 is never masked, so a row's maximum is finite once the first key tile is in; a key split that
// starts later may see a whole row masked, which the -inf guards below handle.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "common.cuh"

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
  int heads, m, n, d;
  int splits, tiles_per_split;  // key splits, and key tiles per split
  float scale_log2;             // scale * log2(e)
  int causal;
};
static_assert(sizeof(Params) == 184, "cute_kernels/attention_fused.py packs this layout (PARAMS_BYTES)");

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Offsets of one (batch, head) slice of each tensor; blockIdx-derived indices, 64-bit from the start.
struct Slice {
  long long q, k, v, o;
  __device__ Slice(const Params& p, int bh) {
    const long long b = bh / p.heads, h = bh % p.heads;
    q = b * p.q_batch_stride + h * p.q_head_stride;
    k = b * p.k_batch_stride + h * p.k_head_stride;
    v = b * p.v_batch_stride + h * p.v_head_stride;
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

// The maximum to subtract: -inf (a row with no unmasked key so far) becomes 0 so that exp2(-inf - m) is 0,
// never exp2(-inf + inf) = NaN.
__device__ __forceinline__ float usable_max(float m) { return m == neg_inf() ? 0.f : m; }

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
template <int kHeadDim, int kBlockM, int kThreads, int kVec>
__device__ __forceinline__ void merge_splits(const Params& p, float* smem, long long tile_index, int m0, const Slice& slice,
                             int tid) {
  float* s_weight = smem;  // [splits][kBlockM]
  const float* lse = p.partial_lse + tile_index * p.splits * kBlockM;
  const float* part = p.partial_o + tile_index * p.splits * kBlockM * kHeadDim;
  for (int row = tid; row < kBlockM; row += kThreads) {
    float top = neg_inf();
    for (int s = 0; s < p.splits; ++s) top = fmaxf(top, __ldcg(lse + s * kBlockM + row));
    const float base = usable_max(top);
    float total = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = exp2f(__ldcg(lse + s * kBlockM + row) - base);
      s_weight[s * kBlockM + row] = w;
      total += w;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int s = 0; s < p.splits; ++s) s_weight[s * kBlockM + row] *= inv;
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

// Grid: (query tiles x splits x batch*heads), blockIdx.x = (bh * query_tiles + tile) * splits + split.
// kVec: elements per global access, 4 (d % 4 == 0 and 16-byte-aligned rows) or 1.
template <int kHeadDim, int kBlockM, int kBlockN, int kRowsPerThread, int kVec>
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
  const long long tile_index = blockIdx.x / p.splits;  // bh * query_tiles + tile
  const int bh = static_cast<int>(tile_index / query_tiles);
  int tile = static_cast<int>(tile_index % query_tiles);
  if (p.causal) tile = query_tiles - 1 - tile;  // the longest rows start first
  const int m0 = tile * kBlockM;
  const Slice slice(p, bh);
  const float* q = static_cast<const float*>(p.q) + slice.q + m0 * p.q_row_stride;
  const float* k = static_cast<const float*>(p.k) + slice.k;
  const float* v = static_cast<const float*>(p.v) + slice.v;

  // The key tiles of this split; causal rows m0 .. m0 + kBlockM - 1 see no key past m0 + kBlockM - 1.
  const int key_end = p.causal ? min(p.n, m0 + kBlockM) : p.n;
  const int key_tiles = (key_end + kBlockN - 1) / kBlockN;
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
    const long long n0 = static_cast<long long>(t_begin) * kBlockN;
    copy_tile_async<float, kBlockN, kHeadDim, Tile::kQPitch, kVec, Tile::kThreads>(sK, k + n0 * p.k_row_stride, p.k_row_stride,
                                                                             p.n - static_cast<int>(n0), p.d, tid);
    cp_async_commit();
    copy_tile_async<float, kBlockN, kHeadDim, Tile::kVPitch, kVec, Tile::kThreads>(sV, v + n0 * p.v_row_stride, p.v_row_stride,
                                                                             p.n - static_cast<int>(n0), p.d, tid);
    cp_async_commit();
  }

  for (int t = t_begin; t < t_end; ++t) {
    const int n0 = t * kBlockN;
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
      const long long next = static_cast<long long>(n0 + kBlockN);
      copy_tile_async<float, kBlockN, kHeadDim, Tile::kQPitch, kVec, Tile::kThreads>(
          sK, k + next * p.k_row_stride, p.k_row_stride, p.n - static_cast<int>(next), p.d, tid);
    }
    cp_async_commit();

    // Online softmax. Masked scores (past N, or causal keys past the row) become -inf.
    const bool needs_mask = n0 + kBlockN > p.n || (p.causal && n0 + kBlockN - 1 > m0);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = m0 + row0 + 4 * r;
      float top = neg_inf();
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float x = s[r][c] * p.scale_log2;
        if (needs_mask) {
          const int key = n0 + tx + 8 * c;
          if (key >= p.n || (p.causal && key > row)) x = neg_inf();
        }
        s[r][c] = x;
        top = fmaxf(top, x);
      }
      const float m_new = fmaxf(m[r], lanes_max<8>(top));
      const float base = usable_max(m_new);
      const float alpha = exp2f(m[r] - base);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        s[r][c] = exp2f(s[r][c] - base);
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
      const long long next = static_cast<long long>(n0 + kBlockN);
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
      const float inv = 1.f / l[r];
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
      __stcg(reinterpret_cast<float4*>(part + row * kHeadDim + 4 * tx + 32 * c),
             make_float4(o[r][c][0] * inv, o[r][c][1] * inv, o[r][c][2] * inv, o[r][c][3] * inv));
    if (tx == 0) __stcg(lse + row, l[r] > 0.f ? m[r] + log2f(l[r]) : neg_inf());
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
  merge_splits<kHeadDim, kBlockM, Tile::kThreads, kVec>(p, smem, tile_index, m0, slice, tid);
}

}  // namespace attention
