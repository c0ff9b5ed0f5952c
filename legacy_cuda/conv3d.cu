// 3-D cross-correlation in FP32: O[n, i, j, k] = sum_{d, r, c} V[n, i + d - pd, j + r - ph, k + c - pw] * K[d, r, c],
// V zero outside the volume: "valid" with no padding (pd = ph = pw = 0), or zero-padded by pd, ph, pw before
// the first plane, row and column (the host sizes the output for whatever padding follows the last ones).
// The padding is never stored: the copies that would read it are zero-filled (a source size of 0).
//
// Direct convolution with "2.5-D" blocking. A CTA owns an output tile of kTileH x kTileW (rows x columns)
// through a run of `chunk_depth` output planes, and streams the input planes that run needs, one at a time:
//   1. input plane p (its kTileH + KH - 1 rows by kPitch columns, halo included) arrives in a ring of
//      kStages shared-memory buffers through cp.async, 16 bytes per copy where the volume's rows allow
//      (kVec = 4), 8 or 4 bytes where they do not (W not a multiple of 4, or a sliced view);
//   2. every thread owns kThreadH x kThreadW outputs of the tile in each of KD consecutive output planes
//      (the KD planes the current input plane contributes to), KD * kThreadH * kThreadW accumulators in
//      registers. It reads its window of plane p from shared memory a row at a time with 128-bit loads and
//      applies every tap of the kernel to it: input plane p feeds output plane p - d through kernel plane d.
//      So each value read from shared memory feeds KD * KW (* kThreadH) FMAs, not KW;
//   3. once plane p has been applied, the oldest output plane of the KD in registers is complete: it is
//      stored, and the accumulators shift by one plane.
// The weights are staged once per CTA in shared memory and read with broadcast 128-bit loads. They are not
// in __constant__ memory because that is one buffer per module, shared by every launch of the kernel on
// every stream: two convolutions with different weights on two streams would race for it. They are not
// kernel parameters either, which would need them on the host (a device-to-host copy and a synchronisation
// per call, and a CUDA graph would keep the values seen at capture).
//
// Kernel sides are template arguments so that every loop over taps unrolls and every weight and window
// index is a compile-time constant: the compiler keeps accumulators, windows and weights in registers.

#include "common.cuh"

namespace conv3d {

// Which part of the output a CTA computes, the grid every kernel of this file shares: blockIdx.x counts
// column tiles fastest, then row tiles, then runs of chunk_depth output planes, then batch items.
struct CtaTile {
  int n, h0, w0, z0, planes_out;  // batch item; first output row, column and plane; planes in its run

  template <int kTileH, int kTileW, typename A>
  static __device__ __forceinline__ CtaTile of(const A& args) {
    unsigned block = blockIdx.x;
    const int tile_w = block % args.tiles_w;
    block /= args.tiles_w;
    const int tile_h = block % args.tiles_h;
    block /= args.tiles_h;
    const int chunk = block % args.chunks_d;
    CtaTile t;
    t.n = block / args.chunks_d;
    t.h0 = tile_h * kTileH;
    t.w0 = tile_w * kTileW;
    t.z0 = chunk * args.chunk_depth;
    t.planes_out = min(args.chunk_depth, args.out_depth - t.z0);
    return t;
  }
};

// The kernel's only parameter, passed by value. Mirrored field for field by Conv3dArgs in
// cute_kernels/ops/conv3d/direct.py (ctypes lays both out with C's natural alignment; a test checks the size).
struct Args {
  const float* volume;   // (N, D, H, W), strides (stride_n, stride_d, stride_h, 1) in elements
  const float* weights;  // (KD, KH, KW), contiguous
  float* out;            // (N, D - KD + 1, H - KH + 1, W - KW + 1), contiguous
  long long stride_n;
  long long stride_d;
  long long stride_h;
  int depth, height, width;
  int out_depth, out_height, out_width;
  int tiles_w, tiles_h, chunks_d;  // the grid is tiles_w * tiles_h * chunks_d * N CTAs, W tiles fastest
  int chunk_depth;                 // output planes per CTA (the last chunk of a volume may hold fewer)
  int pad_d, pad_h, pad_w;         // zeros before the first plane, row and column (pad_w a multiple of kVec)
};
// Size only: NVRTC 13.0 has no __builtin_offsetof, and with natural alignment on both sides the size
// catches a field added or dropped on one side.
static_assert(sizeof(Args) == 104, "the host packs Args with ctypes (Conv3dArgs); change both together");

template <int KD, int KH, int KW, int kTileH, int kTileW, int kThreadH, int kThreadW, int kStages, int kVec, int kOutVec>
struct Geometry {
  static_assert(KD >= 1 && KH >= 1 && KW >= 1 && KD <= 15 && KH <= 15 && KW <= 15, "kernel sides are 1..15");
  static_assert(kThreadW % 4 == 0, "a thread's window starts on a 16-byte boundary so it is read with 128-bit loads");
  static_assert(kTileW % (8 * kThreadW) == 0,
                "at least 8 threads along W: the 8 lanes of each 128-bit shared-memory phase then read 128 "
                "consecutive bytes, free of bank conflicts");
  static_assert(kTileH % kThreadH == 0, "whole thread rows");
  static_assert(kStages >= 2, "one buffer being read while at least one is being filled");
  static_assert(kVec == 1 || kVec == 2 || kVec == 4, "cp.async copies 4, 8 or 16 bytes");
  static_assert(kOutVec == 1 || kOutVec == 2 || kOutVec == 4, "stores of 4, 8 or 16 bytes");
  static_assert(kThreadW % kOutVec == 0, "a thread's outputs in a row are whole store vectors");

  static constexpr int kThreadsW = kTileW / kThreadW;
  static constexpr int kThreadsH = kTileH / kThreadH;
  static constexpr int kThreads = kThreadsW * kThreadsH;
  static_assert(kThreads % ck::kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");

  // A thread reads kWindow floats per input row: its kThreadW + KW - 1 inputs, rounded up to whole 128-bit
  // loads. The last thread's window then reaches kTileW - kThreadW + kWindow = kTileW + round_up(KW - 1, 4)
  // columns: the pitch of a row in shared memory, a multiple of 4 floats so every row starts 16-byte aligned.
  static constexpr int kWindow = ck::round_up(kThreadW + KW - 1, 4);
  static constexpr int kPitch = kTileW + ck::round_up(KW - 1, 4);
  static constexpr int kRows = kTileH + KH - 1;
  static constexpr int kPlaneFloats = kRows * kPitch;
  // Copies that fill one plane buffer: kPitch / kVec per row, spread over the threads in order, so
  // consecutive threads copy consecutive pieces of a row (coalesced).
  static_assert(kPitch % kVec == 0, "whole copies per row");
  static constexpr int kCopiesPerRow = kPitch / kVec;
  static constexpr int kCopies = kRows * kCopiesPerRow;
  static constexpr int kCopiesPerThread = ck::ceil_div(kCopies, kThreads);
  // Weights in shared memory as [kr][d][kc], each row padded to whole 128-bit loads: the order in which
  // accumulate_plane reads them.
  static constexpr int kWeightPitch = ck::round_up(KW, 4);
  static constexpr int kWeightFloats = KH * KD * kWeightPitch;
  static constexpr int kSharedBytes = (kStages * kPlaneFloats + kWeightFloats) * static_cast<int>(sizeof(float));
  static constexpr int kAccumulators = KD * kThreadH * kThreadW;
  static_assert(kAccumulators <= 64, "more accumulators than this do not fit in registers next to the window");
};

// Adds one input plane to the accumulators. Slot s of acc holds the output plane that the input plane
// reaches through kernel plane d = KD - 1 - s (so slot 0 is the oldest output plane, the next to complete).
// kChecked: the first and last KD - 1 planes of a run reach output planes outside it; slot s is then
// skipped unless slot_lo <= s <= slot_hi (a uniform branch). The planes in between take the unchecked copy
// of this code, with no branches between the FMAs.
template <bool kChecked, int KD, int KH, int KW, int kThreadH, int kThreadW, int kPitch, int kWindow, int kWeightPitch>
__device__ __forceinline__ void accumulate_plane(const float* plane, const float* weights, int slot_lo, int slot_hi,
                                                 float (&acc)[KD][kThreadH][kThreadW]) {
  // Output row t takes kernel row kr from window row t + kr: with kr outermost, rows kr .. kr + kThreadH - 1
  // are live at a time, and each weight row loaded feeds kThreadH * kThreadW * KW FMAs.
  float window[kThreadH + KH - 1][kWindow];
#pragma unroll
  for (int kr = 0; kr < KH; ++kr) {
#pragma unroll
    for (int i = (kr == 0 ? 0 : kr + kThreadH - 1); i < kr + kThreadH; ++i) {
#pragma unroll
      for (int q = 0; q < kWindow / 4; ++q)
        *reinterpret_cast<float4*>(&window[i][4 * q]) = *reinterpret_cast<const float4*>(plane + i * kPitch + 4 * q);
    }
#pragma unroll
    for (int s = 0; s < KD; ++s) {
      if (kChecked && (s < slot_lo || s > slot_hi)) continue;
      const int d = KD - 1 - s;
      float w[kWeightPitch];
#pragma unroll
      for (int q = 0; q < kWeightPitch / 4; ++q)
        *reinterpret_cast<float4*>(&w[4 * q]) =
            *reinterpret_cast<const float4*>(weights + (kr * KD + d) * kWeightPitch + 4 * q);
#pragma unroll
      for (int kc = 0; kc < KW; ++kc)
#pragma unroll
        for (int t = 0; t < kThreadH; ++t)
#pragma unroll
          for (int x = 0; x < kThreadW; ++x) acc[s][t][x] = fmaf(window[t + kr][x + kc], w[kc], acc[s][t][x]);
    }
  }
}

// One CTA per (batch item, run of output planes, tile of rows, tile of columns). Dynamic shared memory:
// Geometry::kSharedBytes. One barrier per input plane: it publishes the plane that arrived to every thread
// and proves that every thread has finished with the buffer the next copy overwrites.
template <int KD, int KH, int KW, int kTileH, int kTileW, int kThreadH, int kThreadW, int kStages, int kVec, int kOutVec>
__global__ void __launch_bounds__(Geometry<KD, KH, KW, kTileH, kTileW, kThreadH, kThreadW, kStages, kVec, kOutVec>::kThreads)
conv3d_kernel(const Args args) {
  using G = Geometry<KD, KH, KW, kTileH, kTileW, kThreadH, kThreadW, kStages, kVec, kOutVec>;
  extern __shared__ __align__(16) float smem[];
  // The host computes this size from the config (Conv3dConfig.shared_bytes); a launch with less would
  // overrun shared memory silently, so it stops here instead.
  unsigned dynamic_smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
  if (dynamic_smem < G::kSharedBytes) __trap();
  float* s_planes = smem;
  float* s_weights = smem + kStages * G::kPlaneFloats;

  const int tid = threadIdx.x;
  const int tx = tid % G::kThreadsW;
  const int ty = tid / G::kThreadsW;
  const CtaTile cta = CtaTile::of<kTileH, kTileW>(args);
  const int n = cta.n;
  const int h0 = cta.h0;  // first output row = first (padded) input row of the tile
  const int w0 = cta.w0;
  const int z0 = cta.z0;  // first output plane of the run
  const int planes_out = cta.planes_out;
  const int planes_in = planes_out + KD - 1;
  const float* volume = args.volume + n * args.stride_n;
  const int z_in = z0 - args.pad_d;  // the volume plane of the run's first (padded) input plane

  // Weights to shared memory as [kr][d][kc], rows padded with zeros; visible after the first barrier below.
  for (int i = tid; i < G::kWeightFloats; i += G::kThreads) {
    const int kc = i % G::kWeightPitch;
    const int d = (i / G::kWeightPitch) % KD;
    const int kr = i / (G::kWeightPitch * KD);
    s_weights[i] = kc < KW ? args.weights[(d * KH + kr) * KW + kc] : 0.0f;
  }

  // This thread's copies of every plane: the same offsets within each plane, so they are computed once.
  // Pieces in the padding (before the first row or column) or past the volume's last row or column are
  // zero-filled: the padding's zeros, or inputs that only feed outputs that are not stored. A piece lies
  // wholly before column 0 or wholly after it: w0 is a multiple of 4 and pad_w of kVec.
  long long src_offset[G::kCopiesPerThread];
  int src_bytes[G::kCopiesPerThread];
#pragma unroll
  for (int k = 0; k < G::kCopiesPerThread; ++k) {
    const int c = tid + k * G::kThreads;
    const int row = h0 - args.pad_h + c / G::kCopiesPerRow;
    const int col = w0 - args.pad_w + (c % G::kCopiesPerRow) * kVec;
    const bool inside = c < G::kCopies && row >= 0 && row < args.height && col >= 0 && col < args.width;
    src_offset[k] = inside ? row * args.stride_h + col : 0;
    src_bytes[k] = inside ? min(kVec, args.width - col) * static_cast<int>(sizeof(float)) : 0;
  }
  // Input plane p of the run is volume plane z_in + p; one in the depth padding is all zeros.
  auto load_plane = [&](int p, float* buffer) {
    const int z = z_in + p;
    const bool plane_inside = z >= 0 && z < args.depth;
    const float* src = volume + (plane_inside ? z : 0) * args.stride_d;
#pragma unroll
    for (int k = 0; k < G::kCopiesPerThread; ++k) {
      const int c = tid + k * G::kThreads;
      if (G::kCopies % G::kThreads == 0 || c < G::kCopies)
        ck::cp_async_zfill<kVec * sizeof(float)>(buffer + c * kVec, src + src_offset[k], plane_inside ? src_bytes[k] : 0);
    }
  };

  // Prologue: planes 0 .. kStages - 2 in flight, one commit group each (empty past the last plane).
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    if (p < planes_in) load_plane(p, s_planes + p * G::kPlaneFloats);
    ck::cp_async_commit();
  }

  float acc[KD][kThreadH][kThreadW];
#pragma unroll
  for (int j = 0; j < KD; ++j)
#pragma unroll
    for (int t = 0; t < kThreadH; ++t)
#pragma unroll
      for (int x = 0; x < kThreadW; ++x) acc[j][t][x] = 0.0f;

  const int out_row = h0 + ty * kThreadH;
  const int out_col = w0 + tx * kThreadW;
  float* out = args.out + ((static_cast<long long>(n) * args.out_depth + z0) * args.out_height + out_row) * args.out_width + out_col;
  const long long out_plane_stride = static_cast<long long>(args.out_height) * args.out_width;
  const int thread_offset = ty * kThreadH * G::kPitch + tx * kThreadW;

  int read_stage = 0;
  int write_stage = kStages - 1;
  for (int p = 0; p < planes_in; ++p) {
    // Groups committed so far: kStages - 1 + p, one per plane 0 .. p + kStages - 2. Allowing kStages - 2 of
    // them to be pending means this thread's copies of plane p have landed; the barrier makes every
    // thread's visible, and shows that all threads are done with plane p - 1, whose buffer is refilled next.
    ck::cp_async_wait_group<kStages - 2>();
    __syncthreads();
    if (p + kStages - 1 < planes_in) load_plane(p + kStages - 1, s_planes + write_stage * G::kPlaneFloats);
    ck::cp_async_commit();

    const float* plane = s_planes + read_stage * G::kPlaneFloats + thread_offset;
    if (p >= KD - 1 && p < planes_out) {
      accumulate_plane<false, KD, KH, KW, kThreadH, kThreadW, G::kPitch, G::kWindow, G::kWeightPitch>(
          plane, s_weights, 0, KD - 1, acc);
    } else {
      // Slot s holds output plane p - (KD - 1) + s, which must lie in [0, planes_out).
      accumulate_plane<true, KD, KH, KW, kThreadH, kThreadW, G::kPitch, G::kWindow, G::kWeightPitch>(
          plane, s_weights, KD - 1 - p, planes_out + KD - 2 - p, acc);
    }

    // Slot 0, output plane p - (KD - 1), has all its taps now. out_width is a multiple of kOutVec (the host
    // picks kOutVec so), so a vector is all inside a row or all past its end.
    if (p >= KD - 1) {
      float* dst = out + (p - (KD - 1)) * out_plane_stride;
#pragma unroll
      for (int t = 0; t < kThreadH; ++t) {
        if (out_row + t >= args.out_height) break;
#pragma unroll
        for (int x = 0; x < kThreadW; x += kOutVec) {
          if (out_col + x < args.out_width) {
            ck::Array<float, kOutVec> v;
#pragma unroll
            for (int e = 0; e < kOutVec; ++e) v.v[e] = acc[0][t][x + e];
            ck::store_stream(reinterpret_cast<ck::Array<float, kOutVec>*>(dst + t * args.out_width + x), v);
          }
        }
      }
    }
    // The accumulators move down a slot (the register copies cost 1 / (KH * KW) of the FMAs; rotating the
    // slots instead needs a runtime slot index, which makes the compiler shuffle every register at the
    // branches that pick the slot to store: docs/notes/conv3d.md#dropped-ideas).
#pragma unroll
    for (int s = 0; s + 1 < KD; ++s)
#pragma unroll
      for (int t = 0; t < kThreadH; ++t)
#pragma unroll
        for (int x = 0; x < kThreadW; ++x) acc[s][t][x] = acc[s + 1][t][x];
#pragma unroll
    for (int t = 0; t < kThreadH; ++t)
#pragma unroll
      for (int x = 0; x < kThreadW; ++x) acc[KD - 1][t][x] = 0.0f;

    read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
  }
}

// ---- The kernel's gradient ----------------------------------------------------------------------------------
// dK[d, r, c] = sum over n and outputs o of G[n, o] * Vpad[n, o + (d, r, c)] (Vpad: the volume with the
// forward's zeros around it). One CTA per (batch item, run of output planes, tile of rows, tile of columns),
// as the forward's grid; each CTA writes its own sums of every tap to `partials` (CTA-major), which the host
// adds in a fixed order: no atomics, so the gradient is bitwise repeatable.
// Per output plane o, the CTA holds G's tile of o and, for each kernel plane d, the tile of input plane
// o + d with its halo in shared memory. Thread tid takes tap tid % (KH * KW) of plane d (taps past the
// threads' count go round again) and every kGroups-th output of the tile from its group (tid / (KH * KW)),
// so a small kernel plane still keeps every thread busy, in a one-row tile too; the groups' sums are added
// in group order at the end. Barriers: before a
// tile is overwritten (everyone is done reading it) and after it is written (it is there to read).
struct GradArgs {
  const float* volume;  // (N, D, H, W), strides (stride_n, stride_d, stride_h, 1) in elements
  const float* grad;    // (N, OD, OH, OW), contiguous: the output's gradient
  float* partials;      // (CTAs, KD * KH * KW): each CTA's sums
  long long stride_n;
  long long stride_d;
  long long stride_h;
  int depth, height, width;
  int out_depth, out_height, out_width;
  int tiles_w, tiles_h, chunks_d;
  int chunk_depth;
  int pad_d, pad_h, pad_w;
};
static_assert(sizeof(GradArgs) == 104, "the host packs GradArgs with ctypes (Conv3dGradArgs); change both together");

template <int KD, int KH, int KW, int kTileH, int kTileW, int kThreads>
struct GradGeometry {
  static_assert(KD >= 1 && KH >= 1 && KW >= 1 && KD <= 15 && KH <= 15 && KW <= 15, "kernel sides are 1..15");
  static_assert(kThreads % ck::kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static constexpr int kPlaneTaps = KH * KW;
  static constexpr int kTaps = KD * kPlaneTaps;
  // Taps of one kernel plane per thread, and groups of threads sharing the tile's rows.
  static constexpr int kTapsPerThread = ck::ceil_div(kPlaneTaps, kThreads);
  static constexpr int kGroups = kPlaneTaps >= kThreads ? 1 : kThreads / kPlaneTaps;
  static constexpr int kInRows = kTileH + KH - 1;
  static constexpr int kInCols = kTileW + KW - 1;
  // A warp's threads read input (t + kr, x + kc) for consecutive taps kr * KW + kc: with a row pitch equal to
  // KW modulo 32 those addresses are consecutive modulo 32, so they fall in distinct banks.
  static constexpr int kPitch = kInCols + ((KW - kInCols) % 32 + 32) % 32;
};

template <int KD, int KH, int KW, int kTileH, int kTileW, int kThreads>
__global__ void __launch_bounds__(kThreads) conv3d_kernel_grad(const GradArgs args) {
  using G = GradGeometry<KD, KH, KW, kTileH, kTileW, kThreads>;
  __shared__ float s_grad[kTileH * kTileW];
  __shared__ float s_in[G::kInRows * G::kPitch];
  __shared__ float s_sums[G::kGroups > 1 ? G::kGroups * G::kPlaneTaps : 1];

  const int tid = threadIdx.x;
  const CtaTile cta = CtaTile::of<kTileH, kTileW>(args);
  const int n = cta.n, h0 = cta.h0, w0 = cta.w0, z0 = cta.z0, planes_out = cta.planes_out;
  const float* volume = args.volume + n * args.stride_n;
  const float* grad = args.grad + static_cast<long long>(n) * args.out_depth * args.out_height * args.out_width;

  const int group = G::kGroups > 1 ? tid / G::kPlaneTaps : 0;
  // Threads past the groups' taps (kThreads not a multiple of the plane's taps) hold none.
  const bool active = tid < G::kGroups * G::kPlaneTaps || G::kTapsPerThread > 1;
  float acc[KD][G::kTapsPerThread];
#pragma unroll
  for (int d = 0; d < KD; ++d)
#pragma unroll
    for (int j = 0; j < G::kTapsPerThread; ++j) acc[d][j] = 0.0f;

  for (int o = z0; o < z0 + planes_out; ++o) {
    __syncthreads();  // every thread is done with the last plane's tiles
    for (int i = tid; i < kTileH * kTileW; i += kThreads) {
      const int row = h0 + i / kTileW, col = w0 + i % kTileW;
      s_grad[i] = row < args.out_height && col < args.out_width
                      ? grad[(static_cast<long long>(o) * args.out_height + row) * args.out_width + col] : 0.0f;
    }
#pragma unroll
    for (int d = 0; d < KD; ++d) {
      if (d > 0) __syncthreads();  // every thread is done with plane d - 1's input tile
      const int z = o + d - args.pad_d;
      const bool plane_inside = z >= 0 && z < args.depth;
      for (int i = tid; i < G::kInRows * G::kInCols; i += kThreads) {
        const int r = i / G::kInCols, c = i % G::kInCols;
        const int row = h0 - args.pad_h + r, col = w0 - args.pad_w + c;
        const bool inside = plane_inside && row >= 0 && row < args.height && col >= 0 && col < args.width;
        s_in[r * G::kPitch + c] = inside ? volume[z * args.stride_d + row * args.stride_h + col] : 0.0f;
      }
      __syncthreads();  // the tiles are written
      if (!active) continue;
#pragma unroll
      for (int j = 0; j < G::kTapsPerThread; ++j) {
        const int tap = (G::kGroups > 1 ? tid % G::kPlaneTaps : tid) + j * kThreads;
        if (tap >= G::kPlaneTaps) break;
        const int kr = tap / KW, kc = tap % KW;
        float sum = 0.0f;
        const float* in = s_in + kr * G::kPitch + kc;
#pragma unroll 4
        for (int i = group; i < kTileH * kTileW; i += G::kGroups) {
          const int t = i / kTileW, x = i - t * kTileW;
          sum = fmaf(s_grad[i], in[t * G::kPitch + x], sum);
        }
        acc[d][j] += sum;
      }
    }
  }

  // This CTA's sums, the groups added in group order.
  float* out = args.partials + static_cast<long long>(blockIdx.x) * G::kTaps;
#pragma unroll
  for (int d = 0; d < KD; ++d) {
    if constexpr (G::kGroups > 1) {
      __syncthreads();
      if (active) s_sums[group * G::kPlaneTaps + tid % G::kPlaneTaps] = acc[d][0];
      __syncthreads();
      for (int tap = tid; tap < G::kPlaneTaps; tap += kThreads) {
        float total = 0.0f;
        for (int g = 0; g < G::kGroups; ++g) total += s_sums[g * G::kPlaneTaps + tap];
        out[d * G::kPlaneTaps + tap] = total;
      }
    } else {
#pragma unroll
      for (int j = 0; j < G::kTapsPerThread; ++j) {
        const int tap = tid + j * kThreads;
        if (tap < G::kPlaneTaps) out[d * G::kPlaneTaps + tap] = acc[d][j];
      }
    }
  }
}

// ---- Any kernel side: the kernel tiled through shared memory -----------------------------------------------
// Sides are launch arguments here (kd, kh, kw), for kernels too large to unroll (the direct kernel's sides
// are template arguments up to 15). A CTA owns an output tile of kTileH x kTileW through a run of output
// planes, as conv3d_kernel's grid; per output plane it walks the kernel in blocks of kBlockR rows x kBlockC
// columns of one kernel plane d: the block's weights and the input rows and columns the block reaches (tile
// plus the block's halo) come into shared memory, zero-filled outside the volume (the padding), and every
// thread adds the block's taps to its kThreadH x kThreadW outputs, 4 columns at a time from 128-bit window
// loads (a block narrower than 4-column steps has zero weights in its tail). Barriers: before a block's tiles
// are overwritten and after they are written. The loads are plain (no pipeline): the halo-to-taps ratio of a
// large kernel keeps them a small part of the time, and other CTAs on the SM overlap them.
struct TiledArgs {
  const float* volume;   // (N, D, H, W), strides (stride_n, stride_d, stride_h, 1) in elements
  const float* weights;  // (KD, KH, KW), contiguous
  float* out;            // (N, OD, OH, OW), contiguous
  long long stride_n;
  long long stride_d;
  long long stride_h;
  int depth, height, width;
  int out_depth, out_height, out_width;
  int tiles_w, tiles_h, chunks_d;
  int chunk_depth;
  int pad_d, pad_h, pad_w;
  int kd, kh, kw;
  // A small grid splits the kernel's planes across CTAs (blockIdx.y): split s takes planes
  // s * kd_per_split .. and writes its partial sums to out + s * split_stride; the host adds them.
  int kd_per_split;
  int splits;
  long long split_stride;
};
static_assert(sizeof(TiledArgs) == 128, "the host packs TiledArgs with ctypes (Conv3dTiledArgs); change both together");

template <int kTileH, int kTileW, int kThreadH, int kThreadW, int kBlockR, int kBlockC>
struct TiledGeometry {
  static_assert(kThreadW % 4 == 0, "a thread's outputs in a row are whole 128-bit window loads");
  static_assert(kBlockC % 4 == 0, "a block's columns are whole 4-column steps");
  static_assert(kTileW % kThreadW == 0 && kTileH % kThreadH == 0, "whole threads per tile");
  static constexpr int kThreadsW = kTileW / kThreadW;
  static constexpr int kThreads = kThreadsW * (kTileH / kThreadH);
  static_assert(kThreads % ck::kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static constexpr int kRows = kTileH + kBlockR - 1;
  // A thread reads columns x0 + c .. x0 + c + kThreadW + 3 of a row for c < kBlockC in steps of 4: up to
  // kTileW + kBlockC - 1.
  static constexpr int kPitch = ck::round_up(kTileW + kBlockC, 4);
  static constexpr int kWindow = kThreadW + 4;
};

template <int kTileH, int kTileW, int kThreadH, int kThreadW, int kBlockR, int kBlockC>
__global__ void __launch_bounds__(TiledGeometry<kTileH, kTileW, kThreadH, kThreadW, kBlockR, kBlockC>::kThreads)
conv3d_tiled_kernel(const TiledArgs args) {
  using G = TiledGeometry<kTileH, kTileW, kThreadH, kThreadW, kBlockR, kBlockC>;
  __shared__ __align__(16) float s_in[G::kRows * G::kPitch];
  __shared__ __align__(16) float s_w[kBlockR * kBlockC];

  const int tid = threadIdx.x;
  const int tx = tid % G::kThreadsW;
  const int ty = tid / G::kThreadsW;
  const CtaTile cta = CtaTile::of<kTileH, kTileW>(args);
  const int n = cta.n, h0 = cta.h0, w0 = cta.w0, z0 = cta.z0, planes_out = cta.planes_out;
  const float* volume = args.volume + n * args.stride_n;
  const int out_row = h0 + ty * kThreadH;
  const int out_col = w0 + tx * kThreadW;
  const int d_begin = blockIdx.y * args.kd_per_split;
  const int d_end = min(args.kd, d_begin + args.kd_per_split);
  float* const out_base = args.out + blockIdx.y * args.split_stride;

  for (int o = z0; o < z0 + planes_out; ++o) {
    float acc[kThreadH][kThreadW];
#pragma unroll
    for (int t = 0; t < kThreadH; ++t)
#pragma unroll
      for (int x = 0; x < kThreadW; ++x) acc[t][x] = 0.0f;
    for (int d = d_begin; d < d_end; ++d) {
      // A plane of the padding is zero-filled like the rows and columns, not skipped: a weight of inf or NaN
      // times its zeros is NaN, as torch's result has it.
      const int z = o + d - args.pad_d;
      const bool plane_inside = z >= 0 && z < args.depth;
      for (int r0 = 0; r0 < args.kh; r0 += kBlockR) {
        for (int c0 = 0; c0 < args.kw; c0 += kBlockC) {
          const int rows = min(kBlockR, args.kh - r0);
          const int cols = min(kBlockC, args.kw - c0);
          __syncthreads();  // every thread is done with the previous block
          for (int i = tid; i < G::kRows * G::kPitch; i += G::kThreads) {
            const int r = i / G::kPitch, c = i % G::kPitch;
            const int row = h0 - args.pad_h + r0 + r, col = w0 - args.pad_w + c0 + c;
            const bool inside = plane_inside && r < kTileH + rows - 1 && row >= 0 && row < args.height && col >= 0 &&
                                col < args.width;
            s_in[i] = inside ? volume[static_cast<long long>(z) * args.stride_d + row * args.stride_h + col] : 0.0f;
          }
          for (int i = tid; i < kBlockR * kBlockC; i += G::kThreads) {
            const int r = i / kBlockC, c = i % kBlockC;
            s_w[i] = r < rows && c < cols ? args.weights[(static_cast<long long>(d) * args.kh + r0 + r) * args.kw + c0 + c] : 0.0f;
          }
          __syncthreads();  // the block's tiles are written
          for (int r = 0; r < rows; ++r) {
            // Whole 4-column steps, then the block's last 1..3 columns alone: a window column past the
            // block is a real input (another output's), and 0 * inf would be NaN.
            for (int c = 0; c < cols; c += 4) {
              const int taps = min(4, cols - c);
              const float4 w = *reinterpret_cast<const float4*>(s_w + r * kBlockC + c);
#pragma unroll
              for (int t = 0; t < kThreadH; ++t) {
                const float* row = s_in + (ty * kThreadH + t + r) * G::kPitch + tx * kThreadW + c;
                float win[G::kWindow];
#pragma unroll
                for (int q = 0; q < G::kWindow / 4; ++q)
                  *reinterpret_cast<float4*>(&win[4 * q]) = *reinterpret_cast<const float4*>(row + 4 * q);
                if (taps == 4) {
#pragma unroll
                  for (int x = 0; x < kThreadW; ++x) {
                    acc[t][x] = fmaf(win[x], w.x, acc[t][x]);
                    acc[t][x] = fmaf(win[x + 1], w.y, acc[t][x]);
                    acc[t][x] = fmaf(win[x + 2], w.z, acc[t][x]);
                    acc[t][x] = fmaf(win[x + 3], w.w, acc[t][x]);
                  }
                } else {  // uniform: every thread is at the same block column
#pragma unroll
                  for (int x = 0; x < kThreadW; ++x) {
                    acc[t][x] = fmaf(win[x], w.x, acc[t][x]);
                    if (taps > 1) acc[t][x] = fmaf(win[x + 1], w.y, acc[t][x]);
                    if (taps > 2) acc[t][x] = fmaf(win[x + 2], w.z, acc[t][x]);
                  }
                }
              }
            }
          }
        }
      }
    }
    float* dst = out_base + ((static_cast<long long>(n) * args.out_depth + o) * args.out_height + out_row) * args.out_width + out_col;
#pragma unroll
    for (int t = 0; t < kThreadH; ++t) {
      if (out_row + t >= args.out_height) break;
#pragma unroll
      for (int x = 0; x < kThreadW; ++x)
        if (out_col + x < args.out_width) dst[t * args.out_width + x] = acc[t][x];
    }
  }
}

}  // namespace conv3d
