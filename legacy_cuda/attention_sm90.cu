// Attention forward for Hopper (sm_90a), FlashAttention-3's structure in raw CUDA: TMA brings Q once and K/V
// tiles through a ring of shared-memory stages, warpgroup MMAs (wgmma) compute S = Q K^T from shared memory
// and O += P V with P straight from registers, and one warpgroup only feeds the others. The backward's two
// kernels (dK/dV and dQ) follow at the end of the file, with their own notes ("Backward").
//
// Work unit: 64 kConsumers query rows of one (batch, head). A CTA walks units blockIdx.x, then every
// gridDim.x-th or, with a scheduler, whichever no CTA has taken yet (one CTA per SM when the host launches it
// persistent, one unit per CTA otherwise); 1 + kConsumers warpgroups.
// - Warpgroup 0, the producer, gives most of its registers away (setmaxnreg 24); one thread issues every TMA
//   load: per unit Q (128 x d), then per key tile K and V into the ring's next stage (the ring runs on
//   across units, so the next unit's first tiles load while this one finishes).
// - Warpgroups 1 .. kConsumers, the consumers, own 64 query rows each: S (64 x kBlockN) and O (64 x d) in
//   FP32 registers, wgmma m64nNk16, the online softmax in the log2 domain as attention.cu's kernels do it.
//   Two consumers get 240 registers each (any head dim); three get 160 (d 64, where O is 32 registers), so
//   that each K and V tile serves 192 query rows and each SM sub-partition has three consumer warps to hide
//   the exponentials' latency (at d 64 the MUFU's exponentials take as long as the tile's products).
// - kFmaExp2Every (0: none): one exponential in every kFmaExp2Every of a thread's scores runs as a polynomial
//   on the FP32 pipe (ck::fma_exp2) instead of the MUFU. At d 64 a 128-key tile's 64 exponentials a thread
//   hold the MUFU for as long as the tile's two products hold the tensor cores, so the softmax is bound by
//   the one unit; moving a share of them (each then costs nine issue slots instead of one) shortens it
//   where the issue slots have room. At d 128 and above the products take twice as long and this matters
//   less.
//
// Shared memory (1024-byte aligned, 128-byte swizzle as TMA writes it and the descriptors read it):
//   sQ: [kQBuffers][d / 64 chunks][kBlockM rows][64]    sK, sV: [kStages][d / 64 chunks][kBlockN keys][64]
//   kTmaStore, sO: [kConsumers][d / 64 chunks][64 rows][64], each consumer's O tile on its way to TMA
//   Q and K are K-major operands (d contiguous); V is the MN-major B operand of O += P V (d contiguous, keys
//   along K), so no tile is ever transposed.
//
// The pipeline, and why it waits where it waits:
// - full_q[b] / empty_q[b]: Q has kQBuffers buffers, unit n in buffer n % kQBuffers; the consumers free a
//   buffer once its unit's last S = Q K^T has retired (before that unit's last P V and its stores), and the
//   producer waits for that before loading a later unit's Q into it. With one buffer the next unit's Q
//   lands while this unit's last softmax, P V and stores run; with two it is loaded a whole unit ahead,
//   for short sequences, where a unit's work after its last Q K^T is too short to hide the load. full_q[b]
//   also orders the unit's index (with the scheduler a global word per CTA and buffer, written before the
//   producer arrives; at a fixed stride the consumers count the units themselves), and completes once more
//   without bytes past the last unit.
// - full_k[s] / full_v[s] (one producer arrival + the TMA bytes): a consumer waits on them before the wgmma
//   that reads the stage, since the data is only there once the bytes have landed.
// - empty_k[s] / empty_v[s] (one arrival per consumer warp): the producer waits on them before reusing a
//   stage, since the stage is free only once every consumer warp's wgmma that read it has been retired by
//   a wgmma.wait_group; each warp arrives right after that wait.
// - kOverlap (FlashAttention-3's intra-warpgroup overlap): tile j's S = Q K_j^T and tile j-1's O += P V_{j-1}
//   are issued back to back; wait_group 1 retires the first, so the softmax of tile j runs while the tensor
//   cores work through P V_{j-1}; wait_group 0 then retires that, and only then are O rescaled and P
//   overwritten (both are that wgmma's operands while it runs).
// - kPingPong (FlashAttention-3's inter-warpgroup schedule): the consumer warpgroups take turns issuing
//   their wgmmas in a cycle, through one named barrier each (consumer c waits on barrier 1 + c and then
//   opens the next one's), so one warpgroup's softmax runs while another's products occupy the tensor cores
//   instead of all computing exponentials at once. A warpgroup waits for its TMA data before taking its
//   turn, never while holding it.
//
// - kTmaStore, the epilogue: each consumer writes O / l into its tile of sO, then one of its threads stores
//   the tile with TMA. Before writing, that thread waits until its previous store has read the tile
//   (bulk_wait_read) and a warpgroup barrier passes that on; after writing, a proxy fence in every writer and
//   a second barrier hand the tile to the copy engine. The consumers then start the next unit while the
//   copy engine writes.
//
// A head dim d below kHeadDim (64, 128 or 256) runs as kHeadDim: the maps' boxes read zeros past column d
// of Q, K and V, so S is exact and O's extra columns are zero and never stored.
//
// Masking follows attention.cu: causal is top-left aligned (query i sees keys 0..i); key 0 is always seen,
// so every row's maximum is finite after the first tile. Rows past M (and, causal, before 0: the units' note)
// read zeros (TMA fills outside the tensor) and are not stored; keys past N are masked to -inf and read zero
// V rows.
//
// The CPU tier compiles every candidate for sm_90a and asserts from ptxas's report the setmaxnreg register
// split, no spills and no serialised wgmma (tests/test_attention_sm90_cpu.py). The SASS of the forward's
// default configs (d 64, 128 and 256; fp16 and bf16; causal, a window with sinks, grouped heads, lse) has
// HGMMA (24 a kernel at d 64, 32 at 128, 42 at 256), UTMALDG (3, 6, 12), UTMASTG where the epilogue stores
// by TMA (d <= 128) and no LDL or STL: `cuobjdump -sass` of `registry.get("attention", "flash3_wgmma")
// .compile(config, problem, "sm_90a").data` written to a .cubin, counting those opcodes (cuobjdump and
// nvdisasm from the CUDA toolkit or the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels, nvidia/cu13/bin
// on PATH), as tests/test_attention_sm90_cpu.py's test_the_sass_of_the_defaults_... does on four of them.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "attention_windows.cuh"
#include "common.cuh"
#include "sm90.cuh"

namespace attention_sm90 {

// The launch parameters (packed by cute_kernels/ops/attention/flash3_wgmma.py with ctypes, same layout).
struct alignas(64) Params {
  sm90::TmaMap q_map;  // 4-D (d, M, heads, batch), box (64, 128, 1, 1), 128-byte swizzle
  sm90::TmaMap k_map;  // 4-D (d, N, kv heads, batch), box (64, kBlockN, 1, 1)
  sm90::TmaMap v_map;  // as k_map
  sm90::TmaMap o_map;  // kTmaStore: 4-D (d, M, heads, batch) of the output, box (64, 64, 1, 1), 128-byte swizzle
  void* o;
  float* lse;  // kLse: [batch * heads][m], each row's log-sum-exp of its scaled scores (natural log)
  long long o_batch_stride, o_head_stride, o_row_stride;  // elements
  int heads, m, n, kv_group;
  float scale_log2;  // scale * log2(e)
  int m_blocks;      // query tiles per (batch, head)
  int units;         // work units: m_blocks * heads * batch; CTAs take blockIdx.x, then as `scheduler` says
  // Units in groups of this many (batch, head) pairs, each group's units by rank (m_index) first: 1 walks
  // the pairs one by one (see unit_of).
  int group_pairs;
  int causal;        // as kCausal (attention_windows.cuh reads it)
  int window_left, window_right, num_sinks;  // kWindow: row i sees keys i - left .. i + right and the sinks
  int d;  // the operands' head dim; kHeadDim rounds it up to 64, 128 or 256 (TMA reads zeros past d)
  int* scheduler;  // null: CTAs take units at a fixed stride; else two counters, zero before and after the launch
  // With the scheduler, how the consumers learn each unit (the unit note at full_q): a word per (CTA, Q
  // buffer), [gridDim.x][kQBuffers], any value at rest. It is global rather than shared memory because its
  // reuse is ordered by mbarriers alone, which racecheck does not model: a shared word draws its false
  // hazards, a global one is outside what it checks. Unread at a fixed stride.
  int* unit_slots;
};
static_assert(sizeof(Params) == 640, "flash3_wgmma.py packs this layout (PARAMS_BYTES)");

constexpr int kProducerRegisters = 24;
// 128 x 24 + 256 x 240 = 64512 and 128 x 24 + 384 x 160 = 64512, within the SM's 65536.
template <int kConsumers> constexpr int consumer_registers() { return kConsumers == 2 ? 240 : 160; }

template <int kConsumers, int kHeadDim, int kBlockN, int kStages, bool kTmaStore, int kQBuffers = 1>
struct Layout {
  static constexpr int kBlockM = 64 * kConsumers;  // a unit's query rows, 64 per consumer warpgroup
  static constexpr int kChunks = kHeadDim / 64;  // 64-element (128-byte) column chunks of a row
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one K or V stage
  static constexpr int kKOffset = kQBuffers * kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kTileBytes;
  static constexpr int kOOffset = kVOffset + kStages * kTileBytes;  // kTmaStore: each consumer's O tile
  static constexpr int kOTileBytes = 64 * kHeadDim * 2;                // [d / 64 chunks][64 rows][64]
  static constexpr int kBarrierOffset = kOOffset + (kTmaStore ? kConsumers * kOTileBytes : 0);
  // full_q, empty_q (kQBuffers each), full_k, full_v, empty_k, empty_v (kStages each)
  static constexpr int kBarriers = 2 * kQBuffers + 4 * kStages;
  static constexpr int kPinOffset = kBarrierOffset + 8 * kBarriers;  // a float per consumer warpgroup, never read
  static constexpr int kBytes = kPinOffset + 16;
  static constexpr int kAllocBytes = kBytes + 1024;  // the dynamic base is aligned up to 1024 by hand
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

template <typename T, int kConsumers, int kHeadDim, int kBlockN, int kStages, bool kCausal, bool kOverlap,
          bool kPingPong, bool kLse, bool kWindow, bool kTmaStore, int kQBuffers = 1, int kFmaExp2Every = 0>
__global__ void __launch_bounds__(128 * (1 + kConsumers), 1) forward_kernel(const __grid_constant__ Params p) {
#if CK_SM90A
  static_assert(kFmaExp2Every >= 0 && kFmaExp2Every <= kBlockN / 2, "one exponential in kFmaExp2Every, or none");
  static_assert(kConsumers == 2 || (kConsumers == 3 && kHeadDim == 64), "three consumers only at d 64");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dims 64, 128 and 256");
  static_assert(kBlockN == 64 || kBlockN == 80 || kBlockN == 128 || kBlockN == 176, "key tiles of 64, 80, 128 or 176");
  static_assert(kQBuffers == 1 || kQBuffers == 2, "one or two Q buffers");
  using L = Layout<kConsumers, kHeadDim, kBlockN, kStages, kTmaStore, kQBuffers>;
  constexpr int kBlockM = L::kBlockM;
  constexpr int kConsumerWarps = 4 * kConsumers;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (sm90::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + L::kBarrierOffset);
  unsigned long long* full_q = bars;                // [kQBuffers]
  unsigned long long* empty_q = bars + kQBuffers;   // [kQBuffers]
  unsigned long long* full_k = bars + 2 * kQBuffers;
  unsigned long long* full_v = full_k + kStages;
  unsigned long long* empty_k = full_v + kStages;
  unsigned long long* empty_v = empty_k + kStages;

  if (threadIdx.x == 0) {
    if (ck::dynamic_smem_bytes() < L::kAllocBytes) __trap();  // the host's size disagrees with this layout
#pragma unroll
    for (int b = 0; b < kQBuffers; ++b) {
      sm90::barrier_init(&full_q[b], 1);
      sm90::barrier_init(&empty_q[b], kConsumerWarps);
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      sm90::barrier_init(&full_k[s], 1);
      sm90::barrier_init(&full_v[s], 1);
      sm90::barrier_init(&empty_k[s], kConsumerWarps);
      sm90::barrier_init(&empty_v[s], kConsumerWarps);
    }
    sm90::barrier_init_fence();
  }
  __syncthreads();

  // Work units: the producer takes blockIdx.x, then every gridDim.x-th, or with p.scheduler the next one no
  // CTA has taken, and hands each to the consumers (so the ring's stage and parity count on across units:
  // both sides walk the same units and tiles). Causal: the longest query tiles first. The pairs come in
  // groups of p.group_pairs, and within a group rank by rank (every pair's longest tile, then every pair's
  // next): causal units differ in cost up to m_blocks-fold, and taking the longest first across a group
  // leaves the short ones for the end, where they fill the SMs' last gaps (longest-processing-time-first),
  // where pair by pair the last pairs' long tiles came last and ran alone. The group stays small enough for
  // its pairs' K and V to share L2 (the host's choice; 1 walks the pairs one by one, query tile fastest).
  // Causal without a window tiles the rows from the end (units end at M, M - kBlockM, ...), so where M is
  // not a multiple of kBlockM the short unit is the one holding rows 0.., which sees the fewest keys, not the
  // one that sees all of them (B4 H16 S4096 d64 with 192-row units: 363 key tiles a head instead of 384). Its
  // rows before 0 read zeros (a TMA load fills outside the tensor on either side), see no key, and are never
  // stored.
  // kWindow: the unit reads key tiles keys.tile(0 .. tiles - 1), the sink tiles and then the window's (none
  // when its rows see no key); otherwise tiles 0 .. tiles - 1 (at least one: key 0 is always seen).
  struct Unit {
    int m0, head, batch, tiles;
    attention_windows::KeyTiles keys;
    __device__ __forceinline__ int key0(int j) const { return (kWindow ? keys.tile(j) : j) * kBlockN; }
  };
  auto unit_of = [&](int u) {
    Unit w;
    const int group_units = p.group_pairs * p.m_blocks;
    const int first_pair = u / group_units * p.group_pairs;
    const int pairs = min(p.group_pairs, p.units / p.m_blocks - first_pair);  // the last group may be short
    const int in_group = u - first_pair * p.m_blocks;
    const int m_index = in_group / pairs, bh = first_pair + in_group % pairs;
    if constexpr (kCausal && !kWindow)
      w.m0 = p.m - (m_index + 1) * kBlockM;
    else
      w.m0 = (kCausal ? p.m_blocks - 1 - m_index : m_index) * kBlockM;
    w.head = bh % p.heads;
    w.batch = bh / p.heads;
    if constexpr (kWindow) {
      w.keys = attention_windows::window_key_tiles<kBlockM, kBlockN>(p, w.m0);
      w.tiles = w.keys.count;
    } else {
      const int key_end = kCausal ? min(p.n, w.m0 + kBlockM) : p.n;
      w.tiles = (key_end + kBlockN - 1) / kBlockN;
    }
    return w;
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    sm90::registers_release<kProducerRegisters>();
    if (threadIdx.x == 0) {
      sm90::prefetch_map(&p.q_map);
      sm90::prefetch_map(&p.k_map);
      sm90::prefetch_map(&p.v_map);
      int it = 0;  // key tiles loaded so far: the ring position
      for (int u = blockIdx.x, n = 0;; ++n) {
        // Unit n's Q goes to buffer n % kQBuffers once the consumers have freed it (after the last S = Q K^T
        // of the unit that held it, which is before that unit's last P V and its epilogue). With the
        // scheduler the unit's index goes to the consumers through this CTA's global word for the buffer
        // (full_q's arrival releases the store); at a fixed stride they count it themselves. Past the last
        // unit, full_q completes without bytes and the index tells them to stop.
        const int qb = n % kQBuffers;
        sm90::barrier_wait(&empty_q[qb], ((n / kQBuffers) & 1) ^ 1);
        if (p.scheduler) ck::store_relaxed_cta_i32(p.unit_slots + blockIdx.x * kQBuffers + qb, u);
        if (u >= p.units) {
          sm90::barrier_arrive(&full_q[qb]);
          break;
        }
        const Unit w = unit_of(u);
        const int kv_head = w.head / p.kv_group;
        sm90::barrier_arrive_expect(&full_q[qb], L::kQBytes);
#pragma unroll
        for (int c = 0; c < L::kChunks; ++c)
          sm90::tma_load_4d(smem + qb * L::kQBytes + c * kBlockM * 128, &p.q_map, &full_q[qb], 64 * c, w.m0,
                            w.head, w.batch);
        for (int j = 0; j < w.tiles; ++j, ++it) {
          const int s = it % kStages;
          const unsigned parity = (it / kStages) & 1;
          sm90::barrier_wait(&empty_k[s], parity ^ 1);
          sm90::barrier_arrive_expect(&full_k[s], L::kTileBytes);
#pragma unroll
          for (int c = 0; c < L::kChunks; ++c)
            sm90::tma_load_4d(smem + L::kKOffset + s * L::kTileBytes + c * kBlockN * 128, &p.k_map, &full_k[s],
                              64 * c, w.key0(j), kv_head, w.batch);
          sm90::barrier_wait(&empty_v[s], parity ^ 1);
          sm90::barrier_arrive_expect(&full_v[s], L::kTileBytes);
#pragma unroll
          for (int c = 0; c < L::kChunks; ++c)
            sm90::tma_load_4d(smem + L::kVOffset + s * L::kTileBytes + c * kBlockN * 128, &p.v_map, &full_v[s],
                              64 * c, w.key0(j), kv_head, w.batch);
        }
        // The next unit: a fixed stride, or the next one no CTA has taken (units in order, so the longest
        // causal tiles go first and each SM takes more as it frees up, whatever the units' costs).
        u = p.scheduler ? gridDim.x + atomicAdd(p.scheduler, 1) : u + gridDim.x;
      }
      if (p.scheduler) {
        // The last CTA to finish taking units zeroes both counters for the stream's next launch (every
        // CTA's last atomicAdd on the first has returned before its count on the second).
        __threadfence();
        if (atomicAdd(p.scheduler + 1, 1) == gridDim.x - 1) {
          p.scheduler[0] = 0;
          p.scheduler[1] = 0;
        }
      }
    }
    return;
  }
  sm90::registers_claim<consumer_registers<kConsumers>()>();

  // ---- consumers ----
  using Mma = sm90::Wgmma<T, kBlockN>;    // S (64 x kBlockN) += Q (64 x 16) K^T (16 x kBlockN)
  using MmaPV = sm90::Wgmma<T, kHeadDim>;  // O (64 x d) += P (64 x 16) V (16 x d)
  const int wg = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int row_in_tile = 64 * wg + 16 * warp + lane / 4;  // this thread's rows: that and 8 below, per unit
  const int col0 = 2 * (lane % 4);                         // its columns: 8 c + col0 + {0, 1}
  const unsigned q_base = sm90::smem_addr(smem) + 64 * wg * 128;
  const unsigned k_base = sm90::smem_addr(smem) + L::kKOffset;
  const unsigned v_base = sm90::smem_addr(smem) + L::kVOffset;
  const bool negative = p.scale_log2 < 0.f;  // then the scores are negated and scaled by |scale|
  // A zero scale becomes the smallest normal float: every finite score times it is below 2^-24, so exp2
  // gives exactly 1 (the uniform weights scale 0 means), and a masked score (-inf) or a row maximum not yet
  // set stays -inf instead of turning into NaN (-inf * 0).
  const float scale = fmaxf(fabsf(p.scale_log2), 1.17549435e-38f);

  float s[kBlockN / 2];
  float o[kHeadDim / 2];
  unsigned pf[kBlockN / 16][4];  // P as the A operand, one 64x16 slice per k16 step
  float row_max[2], row_sum[2];
  int row0 = 0, wg_row0 = 0;  // the unit's: this thread's first row, and its warpgroup's
  int m0 = 0;
  attention_windows::RowKeys row_keys[2];  // kWindow: the keys rows row0 and row0 + 8 see

  auto issue_qk = [&](int stage, unsigned q_buffer) {
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const unsigned chunk = kk / 4, step = (kk % 4) * 32;
      const auto a = sm90::descriptor(q_base + q_buffer * L::kQBytes + chunk * kBlockM * 128 + step, 16, 1024);
      const auto b = sm90::descriptor(k_base + stage * L::kTileBytes + chunk * kBlockN * 128 + step, 16, 1024);
      Mma::ss(s, a, b, kk > 0);
    }
    sm90::wgmma_commit();
  };
  auto issue_pv = [&](int stage) {
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const auto b = sm90::descriptor(v_base + stage * L::kTileBytes + kk * 2048, kBlockN * 128, 1024);
      MmaPV::rs(o, pf[kk], b, 1);
    }
    sm90::wgmma_commit();
  };
  // Named barriers 1 .. kConsumers (0 is __syncthreads): consumer wg takes its turn on barrier 1 + wg and
  // hands the next turn to the next consumer; each completes with 128 waiting + 128 arriving threads.
  // kTmaStore's epilogue syncs each warpgroup on its own barrier, 1 + kConsumers + wg.
  auto turn_begin = [&]() {
    if constexpr (kPingPong) sm90::named_barrier_sync(1 + wg, 256);
  };
  auto turn_end = [&]() {
    if constexpr (kPingPong) sm90::named_barrier_arrive(1 + (wg + 1) % kConsumers, 256);
  };
  auto release = [&](unsigned long long* bar) {
    if (lane == 0) sm90::barrier_arrive(bar);
  };
  // Freeing Q also lets the producer overwrite the scheduler's word for the buffer: the warp's syncwarp
  // orders every lane's read of it before lane 0's arrival (whose release the producer's wait acquires).
  auto release_q = [&](int q_buffer) {
    __syncwarp();
    release(&empty_q[q_buffer]);
  };
  // S -> P for key tile at n0: mask, new row maxima, exp2, row sums; `rescale` gets each row's factor for O.
  auto softmax = [&](int n0, float (&rescale)[2]) {
    if (negative) {
#pragma unroll
      for (int v = 0; v < kBlockN / 2; ++v) s[v] = -s[v];
    }
    const bool masked = kWindow ? !attention_windows::window_tile_is_full<kBlockM, kBlockN>(p, m0, n0)
                                : n0 + kBlockN > p.n || (kCausal && n0 + kBlockN - 1 > wg_row0);
    if (masked) {
#pragma unroll
      for (int v = 0; v < kBlockN / 2; ++v) {
        const int col = n0 + 8 * (v >> 2) + col0 + (v & 1);
        const int h = (v >> 1) & 1;
        const bool seen = kWindow ? col < p.n && row_keys[h].sees(col) : col < p.n && !(kCausal && col > row0 + 8 * h);
        if (!seen) s[v] = neg_inf();
      }
    }
    float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int v = 0; v < kBlockN / 2; ++v) mx[(v >> 1) & 1] = fmaxf(mx[(v >> 1) & 1], s[v]);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      base[h] = mx[h] == neg_inf() ? 0.f : mx[h] * scale;  // a row with no key yet: nothing to subtract
      rescale[h] = ck::fast_exp2(row_max[h] * scale - base[h]);  // 0 while the row had no key (row_max -inf)
      row_max[h] = mx[h];
      row_sum[h] *= rescale[h];
    }
#pragma unroll
    for (int v = 0; v < kBlockN / 2; ++v) {
      const int h = (v >> 1) & 1;
      const float x = fmaf(s[v], scale, -base[h]);
      bool on_fma = false;  // for k >= 4 the chosen scores all lie in the thread's second row (h = 1)
      if constexpr (kFmaExp2Every > 0) on_fma = v % kFmaExp2Every == kFmaExp2Every - 1;
      s[v] = on_fma ? ck::fma_exp2(x) : ck::fast_exp2(x);
      row_sum[h] += s[v];
    }
  };
  auto to_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pf[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  };
  auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
    for (int v = 0; v < kHeadDim / 2; ++v) o[v] *= rescale[(v >> 1) & 1];
  };
  using T2 = typename Pair<T>::type;

  if (kPingPong && wg == kConsumers - 1) sm90::named_barrier_arrive(1, 256);  // the first turn is consumer 0's
  int it = 0;  // key tiles consumed so far: the ring position, as the producer counts it
  for (int n = 0;; ++n) {
    const int qb = n % kQBuffers;
    sm90::barrier_wait(&full_q[qb], (n / kQBuffers) & 1);
    // The scheduler's word: read before this unit's release of empty_q lets the producer overwrite it;
    // full_q's wait acquires the producer's store (its arrival releases it; mbarrier arrive and wait are a
    // release and an acquire at CTA scope, which order global memory too). At a fixed stride (or one unit
    // a CTA) the producer's own walk, counted here.
    const int u = p.scheduler ? ck::load_relaxed_cta_i32(p.unit_slots + blockIdx.x * kQBuffers + qb)
                              : static_cast<int>(blockIdx.x + n * gridDim.x);
    if (u >= p.units) break;
    const Unit w = unit_of(u);
    m0 = w.m0;
    wg_row0 = w.m0 + 64 * wg;
    row0 = w.m0 + row_in_tile;
    if constexpr (kWindow) row_keys[0] = attention_windows::RowKeys(p, row0), row_keys[1] = attention_windows::RowKeys(p, row0 + 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[h] = neg_inf(), row_sum[h] = 0.f;
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
    auto stage_of = [&](int j) { return (it + j) % kStages; };
    auto parity_of = [&](int j) { return static_cast<unsigned>(((it + j) / kStages) & 1); };

    float rescale[2];
    if (kOverlap && w.tiles > 0) {
      sm90::barrier_wait(&full_k[stage_of(0)], parity_of(0));
      turn_begin();
      issue_qk(stage_of(0), qb);
      turn_end();
      sm90::wgmma_wait<0>();
      sm90::fence_operand(s);
      release(&empty_k[stage_of(0)]);
      softmax(w.key0(0), rescale);  // O is still zero: nothing to rescale
      to_p();
      for (int j = 1; j < w.tiles; ++j) {
        const int stage = stage_of(j), prev = stage_of(j - 1);
        sm90::barrier_wait(&full_k[stage], parity_of(j));
        sm90::barrier_wait(&full_v[prev], parity_of(j - 1));
        turn_begin();
        issue_qk(stage, qb);
        issue_pv(prev);
        turn_end();
        sm90::wgmma_wait<1>();  // S_j is in; P V_{j-1} may still run
        sm90::fence_operand(s);
        release(&empty_k[stage]);
        softmax(w.key0(j), rescale);
        // The exponentials above run while P V_{j-1} does (ptxas would hoist the wait above them).
        if (tid == 0)
          sm90::keep_above_next_wait(reinterpret_cast<float*>(smem + L::kPinOffset) + wg, row_sum[0] + row_sum[1]);
        sm90::wgmma_wait<0>();  // P V_{j-1} is done: O and P are free
        sm90::fence_operand(o);
        release(&empty_v[prev]);
        rescale_o(rescale);
        to_p();
      }
      release_q(qb);  // every S = Q K^T of the unit has retired
      const int last = stage_of(w.tiles - 1);
      sm90::barrier_wait(&full_v[last], parity_of(w.tiles - 1));
      turn_begin();
      issue_pv(last);
      turn_end();
      sm90::wgmma_wait<0>();
      sm90::fence_operand(o);
      release(&empty_v[last]);
    } else if (!kOverlap) {
      for (int j = 0; j < w.tiles; ++j) {
        const int stage = stage_of(j);
        sm90::barrier_wait(&full_k[stage], parity_of(j));
        turn_begin();
        issue_qk(stage, qb);
        turn_end();
        sm90::wgmma_wait<0>();
        sm90::fence_operand(s);
        release(&empty_k[stage]);
        softmax(w.key0(j), rescale);
        rescale_o(rescale);
        to_p();
        sm90::barrier_wait(&full_v[stage], parity_of(j));
        turn_begin();
        issue_pv(stage);
        turn_end();
        sm90::wgmma_wait<0>();
        sm90::fence_operand(o);
        release(&empty_v[stage]);
      }
      release_q(qb);
    } else {
      release_q(qb);  // kWindow: the unit's rows see no key; they are written as 0 (lse -inf)
    }
    it += w.tiles;

    // ---- epilogue: O / l, straight from registers to global memory (pairs of columns) ----
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = row_sum[h] + __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
      const float total = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[h] = total > 0.f ? 1.f / total : 0.f;
      if constexpr (kLse) {
        // log(sum_j exp(s_j * scale)) = (m * |scale| + log2(total)) * ln 2, m the row's maximum of the
        // (sign-adjusted) scores; a row that saw no key has total 0 and gets -inf.
        const int row = row0 + 8 * h;
        if ((lane & 3) == 0 && row >= 0 && row < p.m) {
          const float base = row_max[h] == neg_inf() ? 0.f : row_max[h] * scale;
          p.lse[(static_cast<long long>(w.batch) * p.heads + w.head) * p.m + row] =
              total == 0.f ? neg_inf() : (base + __log2f(total)) * 0.693147180559945309f;
        }
      }
    }
    // TMA takes no tile that starts before row 0 (an illegal instruction: the store clips only past the
    // end), so a warpgroup whose rows begin before 0 (a causal unit's, the units' note) stores from
    // registers below; wg_row0 is the same for the whole warpgroup, so its barriers stay matched.
    if (kTmaStore && wg_row0 >= 0) {
      // Through the warpgroup's tile of sO, one TMA store per 64-column chunk (rows past M and columns past
      // d are clipped); the header's pipeline notes say why it waits where it waits.
      unsigned char* tile = smem + L::kOOffset + wg * L::kOTileBytes;
      if (tid == 0) sm90::bulk_wait_read<0>();
      sm90::named_barrier_sync(1 + kConsumers + wg, 128);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_in_tile - 64 * wg + 8 * h;  // the row in the warpgroup's 64
#pragma unroll
        for (int c = 0; c < kHeadDim / 8; ++c) {
          // 16-byte unit c % 8 of the row's 128 bytes in chunk c / 8, swizzled by the row within its 8-row atom
          const int offset = (c / 8) * 64 * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16) + col0 * 2;
          *reinterpret_cast<unsigned*>(tile + offset) = pack2<T>(o[4 * c + 2 * h] * inv[h], o[4 * c + 2 * h + 1] * inv[h]);
        }
      }
      sm90::fence_async_shared();
      sm90::named_barrier_sync(1 + kConsumers + wg, 128);
      if (tid == 0) {
#pragma unroll
        for (int c = 0; c < L::kChunks; ++c)
          sm90::tma_store_4d(&p.o_map, tile + c * 64 * 128, 64 * c, wg_row0, w.head, w.batch);
        sm90::bulk_commit();
      }
      continue;
    }
    T* out = static_cast<T*>(p.o) + w.batch * p.o_batch_stride + w.head * p.o_head_stride;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= 0 && row < p.m) {
        T* dst = out + row * p.o_row_stride + col0;
#pragma unroll
        for (int c = 0; c < kHeadDim / 8; ++c) {
          if (8 * c + col0 >= p.d) break;  // a padded head dim's zero columns (d is even)
          const unsigned packed = pack2<T>(o[4 * c + 2 * h] * inv[h], o[4 * c + 2 * h + 1] * inv[h]);
          *reinterpret_cast<T2*>(dst + 8 * c) = *reinterpret_cast<const T2*>(&packed);
        }
      }
    }
  }

  // The last unit's O tile must stay in shared memory until its store has read it.
  if (kTmaStore && tid == 0) sm90::bulk_wait_read<0>();
  // Every consumer takes as many turns as it hands on, but barrier 1 also got the first turn: consumer 0
  // takes that one more, so no barrier is left half-arrived when the CTA exits.
  if (kPingPong && wg == 0) sm90::named_barrier_sync(1, 256);
#else
  __trap();  // built for another arch: the host never launches it there (flash3_why_unsupported)
#endif
}


// =========================================================================================================
// Backward (FlashAttention-2's math, as attention.cu's mma.sync pair: two kernels, no atomics)
// =========================================================================================================
//
// With c = scale * log2(e), lse2 = lse * log2(e) and D = rowsum(dO O) - dlse (attention_bwd_delta):
//   backward_dkdv_kernel keeps a block of K and V (64 keys per consumer warpgroup) and streams Q and dO tiles
//     over every query tile (and every query head of the kv head's group) that meets it:
//     S^T = K Q^T,  P^T = exp2(S^T c - lse2),  dP^T = V dO^T,  dS^T = P^T (dP^T - D),
//     dV += P^T dO,  dK += dS^T Q  (dK scaled by `scale` at the store).
//   backward_dq_kernel keeps a query tile of Q and dO (64 rows per consumer warpgroup) and streams K and V tiles:
//     S = Q K^T,  P = exp2(S c - lse2),  dP = dO V^T,  dS = P (dP - D),  dQ += dS K  (scaled at the store).
// Each kernel's products are wgmma m64nNk16 of one consumer warpgroup's 64 kept rows: S^T / S and dP^T / dP
// with both operands in shared memory (K-major: every tile is stored d-contiguous, as TMA writes it), and
// the accumulating products with P^T / dS^T / dS from registers (the accumulator layout packed in pairs is
// the A operand's, as P in the forward) against an MN-major view of the streamed (dK/dV) or kept-side
// (dQ) tile, so no tile is ever transposed. Summation orders are fixed (dK and dV over query heads and
// tiles in order), so the gradients are bitwise repeatable.
//
// The pipeline, and why it waits where it waits (both kernels; "kept" is K/V or Q/dO, "streamed" the other):
// - full_kept: the kept tiles' TMA bytes; every consumer waits once before its first product.
// - full[s] (the producer thread's arrival + the TMA bytes; in the dK/dV kernel these include the stage's
//   lse2 and D rows, which attention_bwd_delta wrote where a TMA load takes them): a consumer waits before
//   the products that read stage s. (Threads of the producer's second warp used to write those rows, and
//   racecheck, which does not take an mbarrier wait as ordering one thread's stores before another's
//   loads, reported every consumer read of them as a hazard; the copy engine's writes are no thread's.)
// - empty[s] (one arrival per consumer warp): the producer waits before refilling stage s, which is free
//   once every consumer warp's wgmma that read it has been retired by a wgmma.wait_group.
// - Inside a step the two score products are committed as two groups: wait_group 1 retires S^T (or S), whose
//   exponentials are meant to run while dP^T (dP) is still on the tensor cores - but ptxas moves the wait
//   for it up to the first exponential (nvdisasm; docs/notes/attention-backward-plan.md) - and wait_group 0
//   retires that before dS is formed. The accumulating products are retired before the stage is released.
//
// float32 (kPlanes = 3, TOut = float): the host splits q, k, v and dO into three bf16 planes each
// (split_bf16x3 says how and why), every tile holds its planes one after another, each product is six bf16
// products over plane pairs, P^T / dS^T / dS are split in registers, and the accumulating products of a step
// go to a fresh partial that FP32 adds fold into dK, dV and dQ (the tensor core's sums truncate). Three planes
// triple the shared memory: at d 64 the streamed tiles are 64 rows beside two consumers' 128 kept rows; at
// d 128 the kept tiles hold 64 rows beside 32-row streamed tiles (kSplitSteps: two consumers' own 128 kept
// rows alone would take 192 KB), both consumers keep the same 64 rows and take alternate steps (streamed
// tiles), so one's exponentials and folds run under the other's products; each sums its own steps, and
// consumer 0 adds consumer 1's sums (handed over through the drained stages) before the store: a fixed
// order. The dK/dV kernel folds its partial in two column halves (a full-width one would not fit beside dK
// and dV).
//
// Masks: a row past M reads zeros (dK/dV: its Q, dO, lse2 and D rows, so its P = exp2(0) meets a zero dO in
// dV and a zero dP - D in dS) or is never stored (dQ), so it adds nothing; keys past N read zeros and are
// masked in the dQ kernel (where they would meet a row's lse2) and never stored in the dK/dV kernel (each
// kept key's gradients depend on its own row of P^T and dS^T only).
// Causal tiles that cross the diagonal select P = 0 per entry, so an infinite exponent cannot leak.

// The backward's launch parameters (packed by cute_kernels/ops/attention/backward.py, same layout).
struct alignas(64) BwdParams {
  sm90::TmaMap q_map;   // 4-D (d, M, heads, batch), box (64, the kernel's query rows per tile)
  sm90::TmaMap k_map;   // 4-D (d, N, kv heads, batch), box (64, its keys per tile)
  sm90::TmaMap v_map;   // as k_map
  sm90::TmaMap do_map;  // as q_map
  // The dK/dV kernel's: 4-D (M, 2, batch * heads, 1) over attention_bwd_delta's stage_rows (a head's lse2
  // row, then its D row), box (its query rows, 2, 1, 1), no swizzle: a stage's [lse2 | D][rows] as one load.
  sm90::TmaMap rows_map;
  const float* lse;     // [batch * heads][m], natural log
  const float* delta;   // [batch * heads][m]
  void* dq;
  void* dk;
  void* dv;
  long long dq_batch_stride, dq_head_stride, dq_row_stride;  // elements
  long long dk_batch_stride, dk_head_stride, dk_row_stride;
  long long dv_batch_stride, dv_head_stride, dv_row_stride;
  int heads, m, n, d, kv_group;
  int causal;
  float scale, scale_log2;  // scale, and scale * log2(e)
};
static_assert(sizeof(BwdParams) == 832, "backward.py packs this layout (SM90_BWD_PARAMS_BYTES)");

constexpr float kLog2e = 1.4426950408889634f;
// The backward's warpgroups: a producer and two consumers.
constexpr int kBwdConsumers = 2;
// The producer warpgroup: one thread loops over the steps. 128 x 40 + 256 x 232 = 64512.
constexpr int kBwdProducerRegisters = 40;
constexpr int kBwdConsumerRegisters = 232;
// The float32 d 128 dK/dV kernel with kSplitSteps holds dK, dV, a half partial and the split P^T: 240 a
// consumer (128 x 24 + 256 x 240 = 64512), its producer thread's loop at 24.
constexpr int kBwdSplitProducerRegisters = 24;
constexpr int kBwdSplitConsumerRegisters = 240;

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// A consumer's 64 x kHeadDim FP32 accumulator (the wgmma layout) times `factor` into rows first_row + r
// (r < 64, rows past `rows` skipped) of `base`, pairs of columns (columns past d skipped; d is even).
template <typename T, int kHeadDim>
__device__ __forceinline__ void store_rows(T* base, long long row_stride, const float (&acc)[kHeadDim / 2],
                                           float factor, int first_row, int rows, int d, int warp, int lane) {
  const int col0 = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + 16 * warp + lane / 4 + 8 * h;
    if (row >= rows) continue;
    T* dst = base + row * row_stride + col0;
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c) {
      if (8 * c + col0 >= d) break;
      if constexpr (sizeof(T) == 4) {  // float gradients (the planes' kernels): a float2
        *reinterpret_cast<float2*>(dst + 8 * c) = make_float2(acc[4 * c + 2 * h] * factor, acc[4 * c + 2 * h + 1] * factor);
      } else {
        using T2 = typename Pair<T>::type;
        const unsigned packed = pack2<T>(acc[4 * c + 2 * h] * factor, acc[4 * c + 2 * h + 1] * factor);
        *reinterpret_cast<T2*>(dst + 8 * c) = *reinterpret_cast<const T2*>(&packed);
      }
    }
  }
}

// float32 operands as kPlanes = 3 bf16 planes: x = x0 + x1 + x2, x0 = bf16(x), x1 = bf16(x - x0),
// x2 = bf16(x - x0 - x1), each rounded to nearest (both differences are exact in FP32), so the three hold
// x's 24 significant bits. A product x y is the six terms xi yj with i + j <= 2; the three dropped ones are
// about 2^-24 of it. 16-bit wgmma takes MN-major shared-memory operands, which TF32 wgmma does not, so the
// 16-bit kernels' structure carries over whole; six bf16 products cost what three TF32 ones do.
// The plane pairs of a product, smallest terms first (the tensor core adds them to one FP32 accumulator).
// With one plane (16-bit operands) the product is pair 5 alone, (0, 0).
constexpr int plane_of_a(int pair) { return pair == 0 ? 2 : pair == 1 || pair == 3 ? 1 : 0; }
constexpr int plane_of_b(int pair) { return pair == 2 ? 2 : pair == 1 || pair == 4 ? 1 : 0; }
template <int kPlanes> constexpr int first_pair() {
  static_assert(kPlanes == 1 || kPlanes == 3, "one plane (16-bit operands) or three (float32 as bf16)");
  return kPlanes == 1 ? 5 : 0;
}

// A pair of floats as their three bf16 planes, each packed as an A-operand register.
__device__ __forceinline__ void split_bf16x3(float lo, float hi, unsigned& p0, unsigned& p1, unsigned& p2) {
  const __nv_bfloat162 h0 = __floats2bfloat162_rn(lo, hi);
  const float2 f0 = __bfloat1622float2(h0);
  const float r_lo = lo - f0.x, r_hi = hi - f0.y;
  const __nv_bfloat162 h1 = __floats2bfloat162_rn(r_lo, r_hi);
  const float2 f1 = __bfloat1622float2(h1);
  const __nv_bfloat162 h2 = __floats2bfloat162_rn(r_lo - f1.x, r_hi - f1.y);
  p0 = *reinterpret_cast<const unsigned*>(&h0);
  p1 = *reinterpret_cast<const unsigned*>(&h1);
  p2 = *reinterpret_cast<const unsigned*>(&h2);
}

// Pins every register of packed A operands (sm90::fence_operand): after the wait that retires the wgmmas
// reading them, so the compiler keeps them until then.
template <int kPlanes, int kSlices>
__device__ __forceinline__ void fence_planes(unsigned (&a)[kPlanes][kSlices][4]) {
#pragma unroll
  for (int plane = 0; plane < kPlanes; ++plane)
#pragma unroll
    for (int kk = 0; kk < kSlices; ++kk) sm90::fence_operand(a[plane][kk]);
}

// The float32 operands' bf16 planes for the kPlanes = 3 kernels, split_bf16x3's split of each element: x
// (batch, heads, rows, d), strides in elements, into planes [batch][3][heads][rows][width], width d rounded up
// to 8 so that every row is 16-byte aligned for TMA (columns past d are not written, and the maps read d).
// One pass: 4 bytes read and 6 written an element, one element a thread in a grid-stride loop.
struct SplitParams {
  const float* x;
  __nv_bfloat16* planes;
  long long x_batch_stride, x_head_stride, x_row_stride, x_col_stride;
  long long count;  // batch * heads * rows * d
  int heads, rows, d, width;
};
static_assert(sizeof(SplitParams) == 72, "backward.py packs this layout (SplitParams)");

__global__ void __launch_bounds__(256) split_planes_kernel(const SplitParams p) {
  const long long plane = static_cast<long long>(p.heads) * p.rows * p.width;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < p.count; i += gridDim.x * 256ll) {
    const int c = static_cast<int>(i % p.d);
    const long long row = i / p.d;  // over batch * heads * rows
    const int r = static_cast<int>(row % p.rows);
    const long long bh = row / p.rows;
    const int h = static_cast<int>(bh % p.heads);
    const long long b = bh / p.heads;
    const float x = p.x[b * p.x_batch_stride + h * p.x_head_stride + r * p.x_row_stride + c * p.x_col_stride];
    const __nv_bfloat16 x0 = __float2bfloat16_rn(x);
    const float rest = x - __bfloat162float(x0);
    const __nv_bfloat16 x1 = __float2bfloat16_rn(rest);
    const __nv_bfloat16 x2 = __float2bfloat16_rn(rest - __bfloat162float(x1));
    __nv_bfloat16* out = p.planes + 3 * b * plane + (static_cast<long long>(h) * p.rows + r) * p.width + c;
    out[0] = x0;
    out[plane] = x1;
    out[2 * plane] = x2;
  }
}

// An accumulator (64 x 16 kSlices, the wgmma layout) as kSlices A operands of 64 x 16 in each of kPlanes
// planes: packed to T (one plane), or split into bf16 planes.
template <typename T, int kPlanes, int kSlices>
__device__ __forceinline__ void pack_a(unsigned (&a)[kPlanes][kSlices][4], const float (&acc)[8 * kSlices]) {
#pragma unroll
  for (int kk = 0; kk < kSlices; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kPlanes == 1)
        a[0][kk][i] = pack2<T>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
      else
        split_bf16x3(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1], a[0][kk][i], a[1][kk][i], a[2][kk][i]);
    }
}

// The backward kernels' barriers, in shared memory from `at`: full_kept (the kept tiles' TMA bytes), then
// full[kStages] (`full_arrivals` arrivals plus the TMA bytes) and empty[kStages] (one arrival per consumer
// warp, `consumer_warps` of them). Thread 0 initialises them; every thread returns after the CTA barrier that
// publishes them.
template <int kStages>
struct BwdBarriers {
  unsigned long long* full_kept;
  unsigned long long* full;
  unsigned long long* empty;
  __device__ BwdBarriers(unsigned char* at, unsigned full_arrivals, unsigned alloc_bytes, unsigned consumer_warps) {
    full_kept = reinterpret_cast<unsigned long long*>(at);
    full = full_kept + 1;
    empty = full + kStages;
    if (threadIdx.x == 0) {
      if (ck::dynamic_smem_bytes() < alloc_bytes) __trap();  // the host's size disagrees with the layout
      sm90::barrier_init(full_kept, 1);
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        sm90::barrier_init(&full[s], full_arrivals);
        sm90::barrier_init(&empty[s], consumer_warps);
      }
      sm90::barrier_init_fence();
    }
    __syncthreads();
  }
};

// kSplitSteps: consumer 1's sums (arrays of floats, a consumer thread's each) added into consumer 0's through
// shared memory at `handed`, the streamed stages, drained (every load was waited for); the first barrier
// waits for both consumers' last reads of them. Thread t's value v of an array sits at t + 128 v, so a warp's
// stores and loads are 32 consecutive floats. Returns whether this thread stores the sums (consumer 0).
__device__ __forceinline__ void hand_sums(float*, int) {}
template <int N, typename... Rest>
__device__ __forceinline__ void hand_sums(float* at, int tid, const float (&sums)[N], const Rest&... rest) {
#pragma unroll
  for (int i = 0; i < N; ++i) at[i * 128 + tid] = sums[i];
  hand_sums(at + N * 128, tid, rest...);
}
__device__ __forceinline__ void take_sums(const float*, int) {}
template <int N, typename... Rest>
__device__ __forceinline__ void take_sums(const float* at, int tid, float (&sums)[N], Rest&... rest) {
#pragma unroll
  for (int i = 0; i < N; ++i) sums[i] += at[i * 128 + tid];
  take_sums(at + N * 128, tid, rest...);
}
template <typename... Sums>
__device__ __forceinline__ bool add_split_sums(float* handed, int wg, int tid, Sums&... sums) {
  sm90::named_barrier_sync(1, 256);
  if (wg == 1) hand_sums(handed, tid, sums...);
  sm90::named_barrier_sync(1, 256);
  if (wg == 1) return false;
  take_sums(handed, tid, sums...);
  return true;
}

// The producer thread's loads: two tiles of kRows rows ([kPlanes][d / 64 chunks][kRows][64] each) from two
// maps at the same (row0, head, batch), announced to `bar` as one arrival with their bytes (and `other_bytes`
// of loads the caller issues on it next). With planes the
// maps' last dim is batch * kPlanes + plane (the host's (B, kPlanes, H, S, d) split tensors).
template <int kChunks, int kRows, int kPlanes = 1>
__device__ __forceinline__ void load_tile_pair(unsigned char* a, const sm90::TmaMap* map_a, unsigned char* b,
                                               const sm90::TmaMap* map_b, unsigned long long* bar, int row0,
                                               int head, int batch, int other_bytes = 0) {
  constexpr int kPlaneBytes = kChunks * kRows * 128;
  sm90::barrier_arrive_expect(bar, 2 * kPlanes * kPlaneBytes + other_bytes);
#pragma unroll
  for (int plane = 0; plane < kPlanes; ++plane)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int offset = plane * kPlaneBytes + c * kRows * 128, coord = batch * kPlanes + plane;
      sm90::tma_load_4d(a + offset, map_a, bar, 64 * c, row0, head, coord);
      sm90::tma_load_4d(b + offset, map_b, bar, 64 * c, row0, head, coord);
    }
}

__device__ __forceinline__ void prefetch_maps(const BwdParams& p) {
  sm90::prefetch_map(&p.q_map);
  sm90::prefetch_map(&p.k_map);
  sm90::prefetch_map(&p.v_map);
  sm90::prefetch_map(&p.do_map);
}

// acc (64 x kRowsB) = A B^T over the head dim, one wgmma group: A the warpgroup's 64 rows of a K-major tile
// of kRowsA rows at a_base, B a K-major tile of kRowsB rows at b_base, both [kPlanes][d / 64 chunks][rows][64]
// (with planes: the sum over the plane pairs).
template <typename T, int kHeadDim, int kRowsA, int kRowsB, int kPlanes = 1>
__device__ __forceinline__ void issue_scores(float (&acc)[kRowsB / 2], unsigned a_base, unsigned b_base) {
  constexpr unsigned kPlaneA = kRowsA * kHeadDim * 2, kPlaneB = kRowsB * kHeadDim * 2;
  sm90::wgmma_fence();
#pragma unroll
  for (int pair = first_pair<kPlanes>(); pair < 6; ++pair)
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const unsigned chunk = kk / 4, step = (kk % 4) * 32;
      const auto a = sm90::descriptor(a_base + plane_of_a(pair) * kPlaneA + chunk * kRowsA * 128 + step, 16, 1024);
      const auto b = sm90::descriptor(b_base + plane_of_b(pair) * kPlaneB + chunk * kRowsB * 128 + step, 16, 1024);
      sm90::Wgmma<T, kRowsB>::ss(acc, a, b, pair > first_pair<kPlanes>() || kk > 0);
    }
  sm90::wgmma_commit();
}

// Shared memory of the dK/dV kernel (1024-byte aligned tiles in the 128-byte swizzle):
//   sK, sV: [kPlanes][d / 64 chunks][kBlockN keys][64]    sQ, sdO: [kStages][kPlanes][d / 64 chunks][kBlockM rows][64]
//   rows: [kStages][lse2 | D][kBlockM] floats    barriers: full_kept, full[kStages], empty[kStages]
template <int kHeadDim, int kBlockM, int kStages, int kPlanes = 1, int kKept = 128>
struct BwdKVLayout {
  static constexpr int kBlockN = kKept;  // kept keys: 64 per consumer warpgroup, or 64 shared by two
  static constexpr int kChunks = kHeadDim / 64;
  static constexpr int kStreamPlaneBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKeptBytes = kPlanes * kBlockN * kHeadDim * 2;
  static constexpr int kStreamBytes = kPlanes * kStreamPlaneBytes;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKeptBytes;
  static constexpr int kQOffset = 2 * kKeptBytes;
  static constexpr int kDOOffset = kQOffset + kStages * kStreamBytes;
  static constexpr int kRowsOffset = kDOOffset + kStages * kStreamBytes;
  static constexpr int kRowsBytes = 2 * kBlockM * 4;  // a stage's [lse2 | D][kBlockM] floats
  static constexpr int kBarrierOffset = kRowsOffset + kStages * kRowsBytes;
  static constexpr int kBytes = kBarrierOffset + 8 * (1 + 2 * kStages);
  static constexpr int kAllocBytes = kBytes + 1024;  // the dynamic base is aligned up to 1024 by hand
};

// Grid: (key blocks of 128 keys, or 64 with kSplitSteps, batch * kv heads); warpgroups: the producer, then
// two consumers of 64 keys each (kSplitSteps: two of the same 64 keys, alternate steps each).
// kPlanes 3: float32 gradients (TOut) from bf16 planes of float32 operands (split_bf16x3's comment).
template <typename T, int kHeadDim, int kBlockM, int kStages, bool kCausal, int kPlanes = 1, typename TOut = T,
          bool kSplitSteps = false>
__global__ void __launch_bounds__(128 * (1 + kBwdConsumers), 1) backward_dkdv_kernel(const __grid_constant__ BwdParams p) {
#if CK_SM90A
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert(kBlockM == 32 || kBlockM == 64 || kBlockM == 128, "query tiles of 32, 64 or 128 rows");
  constexpr int kConsumers = kBwdConsumers;
  // Each consumer's k-th wait on a stage must be that stage's k-th fill: every stage owned by one consumer.
  static_assert(!kSplitSteps || kStages % kConsumers == 0, "split steps need stages in whole rounds");
  using L = BwdKVLayout<kHeadDim, kBlockM, kStages, kPlanes, kSplitSteps ? 64 : 64 * kConsumers>;
  constexpr int kBlockN = L::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (sm90::smem_addr(smem_raw) & 1023u)) & 1023u);
  // A stage is released by the warps that read it: every consumer's, or with kSplitSteps its owner's.
  const BwdBarriers<kStages> bars(smem + L::kBarrierOffset, 1, L::kAllocBytes, kSplitSteps ? 4 : 4 * kConsumers);
  unsigned long long* const full_kept = bars.full_kept;
  unsigned long long* const full = bars.full;
  unsigned long long* const empty = bars.empty;

  const int n0 = blockIdx.x * kBlockN;
  const int kv_heads = p.heads / p.kv_group;
  const int kv_head = blockIdx.y % kv_heads, batch = blockIdx.y / kv_heads;
  const int m_tiles = (p.m + kBlockM - 1) / kBlockM;
  // Causal (top-left aligned): query tiles before the one holding row n0 see none of the block's keys.
  const int first_tile = kCausal ? min(n0 / kBlockM, m_tiles) : 0;
  const int tiles_per_head = m_tiles - first_tile;
  const int steps = tiles_per_head * p.kv_group;  // query heads of the group, each over its query tiles
  auto step_rows = [&](int i, int& head, int& q0) {
    head = kv_head * p.kv_group + i / tiles_per_head;
    q0 = (first_tile + i % tiles_per_head) * kBlockM;
  };

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    if constexpr (kSplitSteps) sm90::registers_release<kBwdSplitProducerRegisters>();
    else sm90::registers_release<kBwdProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_maps(p);
      sm90::prefetch_map(&p.rows_map);
      load_tile_pair<L::kChunks, kBlockN, kPlanes>(smem + L::kKOffset, &p.k_map, smem + L::kVOffset, &p.v_map,
                                                   full_kept, n0, kv_head, batch);
      for (int i = 0; i < steps; ++i) {
        const int s = i % kStages;
        int head, q0;
        step_rows(i, head, q0);
        sm90::barrier_wait(&empty[s], ((i / kStages) & 1) ^ 1);
        load_tile_pair<L::kChunks, kBlockM, kPlanes>(smem + L::kQOffset + s * L::kStreamBytes, &p.q_map,
                                                     smem + L::kDOOffset + s * L::kStreamBytes, &p.do_map, &full[s],
                                                     q0, head, batch, L::kRowsBytes);
        // The stage's lse2 and D rows, whose bytes the arrival above counted. Rows past M read zeros: such a
        // row's Q and dO rows are zeros too, so its P (exp2 of 0) meets a zero dO in dV and a zero dP - D in dS.
        sm90::tma_load_4d(smem + L::kRowsOffset + s * L::kRowsBytes, &p.rows_map, &full[s], q0, 0,
                          batch * p.heads + head, 0);
      }
    }
    return;
  }
  if constexpr (kSplitSteps) sm90::registers_claim<kBwdSplitConsumerRegisters>();
  else sm90::registers_claim<kBwdConsumerRegisters>();

  // ---- consumers: keys n0 + 64 wg .. + 63 ----
  const int wg = warpgroup - 1;
  const int kept = kSplitSteps ? 0 : wg;                // which 64 of the block's keys the warpgroup keeps
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int key0 = n0 + 64 * kept;                      // the warpgroup's first key
  const int key_row = key0 + 16 * warp + lane / 4;      // this thread's keys: that and 8 below
  const int col0 = 2 * (lane % 4);                      // its query columns: 8 c + col0 + {0, 1}
  const unsigned k_base = sm90::smem_addr(smem) + L::kKOffset + 64 * kept * 128;
  const unsigned v_base = sm90::smem_addr(smem) + L::kVOffset + 64 * kept * 128;
  const unsigned q_base = sm90::smem_addr(smem) + L::kQOffset;
  const unsigned do_base = sm90::smem_addr(smem) + L::kDOOffset;

  float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = 0.f, dv[i] = 0.f;
  float s[kBlockM / 2], dp[kBlockM / 2];
  unsigned pa[kPlanes][kBlockM / 16][4], dsa[kPlanes][kBlockM / 16][4];

  // acc (+)= A B over the step's query rows: A from registers, B the stream stage's MN-major view (kCols of
  // its columns from chunk `chunk0`: the whole head dim, or a half of it); `fresh` overwrites acc with the
  // first product.
  auto issue_accumulate = [&](auto& acc, const unsigned (&a)[kPlanes][kBlockM / 16][4], unsigned stream_stage,
                              bool fresh, int chunk0 = 0) {
    constexpr int kCols = 2 * static_cast<int>(sizeof(acc) / sizeof(float));
#pragma unroll
    for (int pair = first_pair<kPlanes>(); pair < 6; ++pair)
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        sm90::Wgmma<T, kCols>::rs(acc, a[plane_of_a(pair)][kk],
                                  sm90::descriptor(stream_stage + plane_of_b(pair) * L::kStreamPlaneBytes +
                                                   chunk0 * kBlockM * 128 + kk * 2048, kBlockM * 128, 1024),
                                  !fresh || pair > first_pair<kPlanes>() || kk > 0);
  };

  sm90::barrier_wait(full_kept, 0);
  for (int i = kSplitSteps ? wg : 0; i < steps; i += kSplitSteps ? kConsumers : 1) {
    const int st = i % kStages;
    int head, q0;
    step_rows(i, head, q0);
    sm90::barrier_wait(&full[st], (i / kStages) & 1);
    const unsigned q_stage = q_base + st * L::kStreamBytes, do_stage = do_base + st * L::kStreamBytes;
    const float* rows = reinterpret_cast<const float*>(smem + L::kRowsOffset) + st * 2 * kBlockM;
    issue_scores<T, kHeadDim, kBlockN, kBlockM, kPlanes>(s, k_base, q_stage);
    issue_scores<T, kHeadDim, kBlockN, kBlockM, kPlanes>(dp, v_base, do_stage);
    sm90::wgmma_wait<1>();  // S^T is in; dP^T may still run
    sm90::fence_operand(s);
    const bool masked = kCausal && key0 + 63 > q0;  // some key of the warpgroup's is after some query
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) {
      const float2 lse2 = *reinterpret_cast<const float2*>(rows + 8 * c + col0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int v = 4 * c + e;
        float prob = ck::fast_exp2(fmaf(s[v], p.scale_log2, -((e & 1) ? lse2.y : lse2.x)));
        if (masked && key_row + 8 * (e >> 1) > q0 + 8 * c + col0 + (e & 1)) prob = 0.f;
        s[v] = prob;
      }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operand(dp);
#pragma unroll
    for (int c = 0; c < kBlockM / 8; ++c) {
      const float2 delta = *reinterpret_cast<const float2*>(rows + kBlockM + 8 * c + col0);
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[4 * c + e] = s[4 * c + e] * (dp[4 * c + e] - ((e & 1) ? delta.y : delta.x));
    }
    if constexpr (kPlanes == 1) {
      // Packed only now: S^T, dP^T and their packed forms do not fit the registers together at 128 queries.
      pack_a<T, kPlanes, kBlockM / 16>(pa, s);
      pack_a<T, kPlanes, kBlockM / 16>(dsa, dp);
      sm90::wgmma_fence();
      issue_accumulate(dv, pa, do_stage, false);
      issue_accumulate(dk, dsa, q_stage, false);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operand(dv);
      sm90::fence_operand(dk);
    } else {
      // Planes: each step's products go to a fresh partial, which FP32 adds (round to nearest) fold into dV
      // and dK. The tensor core truncates as it accumulates; over every query tile of a long sequence that
      // would bias the sums (the 3xTF32 kernels fold for the same reason). Within a step the small plane
      // pairs come first, so the truncations at the partial's full size are those of the (0, 0) pair alone.
      // One partial, dV's products and then dK's; dS^T's planes are split while dV's first products run
      // (P^T's planes are pinned until the last wait that reads them, so the split cannot take their
      // registers while the tensor cores read them). At d 128 the partial covers half the columns (64 x 64),
      // each product in two halves: dK, dV and a full-width partial would not fit a thread's registers.
      constexpr int kHalves = kHeadDim == 64 ? 1 : 2;
      float part[kHeadDim / 2 / kHalves];
      auto fold = [&](float (&acc)[kHeadDim / 2], int half) {
#pragma unroll
        for (int i = 0; i < kHeadDim / 2 / kHalves; ++i) acc[half * (kHeadDim / 2 / kHalves) + i] += part[i];
      };
      pack_a<T, kPlanes, kBlockM / 16>(pa, s);
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        sm90::wgmma_fence();
        issue_accumulate(part, pa, do_stage, true, half * (kHeadDim / 64 / kHalves));
        sm90::wgmma_commit();
        if (half == 0) pack_a<T, kPlanes, kBlockM / 16>(dsa, dp);
        sm90::wgmma_wait<0>();
        sm90::fence_operand(part);
        if (half == kHalves - 1) fence_planes(pa);
        fold(dv, half);
      }
#pragma unroll
      for (int half = 0; half < kHalves; ++half) {
        sm90::wgmma_fence();
        issue_accumulate(part, dsa, q_stage, true, half * (kHeadDim / 64 / kHalves));
        sm90::wgmma_commit();
        sm90::wgmma_wait<0>();
        sm90::fence_operand(part);
        if (half == kHalves - 1) fence_planes(dsa);
        fold(dk, half);
      }
    }
    // The syncwarp orders every lane's reads of the stage's rows before lane 0's arrival (a release the
    // producer's wait acquires), so the TMA load that next refills them cannot overtake a read.
    __syncwarp();
    if (lane == 0) sm90::barrier_arrive(&empty[st]);
  }

  if constexpr (kSplitSteps) {  // the Q and dO stages, contiguous, hold consumer 1's dK and dV
    static_assert(kHeadDim * 128 * 4 <= 2 * kStages * L::kStreamBytes, "dK and dV fit the stages");
    if (!add_split_sums(reinterpret_cast<float*>(smem + L::kQOffset), wg, tid, dk, dv)) return;
  }
  TOut* dk_out = static_cast<TOut*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride;
  TOut* dv_out = static_cast<TOut*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride;
  store_rows<TOut, kHeadDim>(dk_out, p.dk_row_stride, dk, p.scale, key0, p.n, p.d, warp, lane);
  store_rows<TOut, kHeadDim>(dv_out, p.dv_row_stride, dv, 1.f, key0, p.n, p.d, warp, lane);
#else
  __trap();  // built for another arch: the host never launches it there
#endif
}

// Shared memory of the dQ kernel: sQ, sdO: [kPlanes][d / 64 chunks][kBlockM rows][64]
//   sK, sV: [kStages][kPlanes][d / 64 chunks][kBlockN keys][64]    barriers: full_kept, full[kStages], empty[kStages]
template <int kHeadDim, int kBlockN, int kStages, int kPlanes = 1, int kKept = 128>
struct BwdQLayout {
  static constexpr int kBlockM = kKept;  // kept query rows: 64 per consumer warpgroup, or 64 shared by two
  static constexpr int kChunks = kHeadDim / 64;
  static constexpr int kStreamPlaneBytes = kBlockN * kHeadDim * 2;
  static constexpr int kKeptBytes = kPlanes * kBlockM * kHeadDim * 2;
  static constexpr int kStreamBytes = kPlanes * kStreamPlaneBytes;
  static constexpr int kQOffset = 0;
  static constexpr int kDOOffset = kKeptBytes;
  static constexpr int kKOffset = 2 * kKeptBytes;
  static constexpr int kVOffset = kKOffset + kStages * kStreamBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * kStreamBytes;
  static constexpr int kBytes = kBarrierOffset + 8 * (1 + 2 * kStages);
  static constexpr int kAllocBytes = kBytes + 1024;
};

// Grid: (query tiles of 128 rows, or 64 with kSplitSteps, batch * heads), causal: the longest tiles
// first; warpgroups as above (kSplitSteps: two consumers of the same rows, alternate key tiles each).
template <typename T, int kHeadDim, int kBlockN, int kStages, bool kCausal, int kPlanes = 1, typename TOut = T,
          bool kSplitSteps = false>
__global__ void __launch_bounds__(128 * (1 + kBwdConsumers), 1) backward_dq_kernel(const __grid_constant__ BwdParams p) {
#if CK_SM90A
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "key tiles of 32, 64 or 128");
  constexpr int kConsumers = kBwdConsumers;
  // Each consumer's k-th wait on a stage must be that stage's k-th fill: every stage owned by one consumer.
  static_assert(!kSplitSteps || kStages % kConsumers == 0, "split steps need stages in whole rounds");
  using L = BwdQLayout<kHeadDim, kBlockN, kStages, kPlanes, kSplitSteps ? 64 : 64 * kConsumers>;
  constexpr int kBlockM = L::kBlockM;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (sm90::smem_addr(smem_raw) & 1023u)) & 1023u);
  const BwdBarriers<kStages> bars(smem + L::kBarrierOffset, 1, L::kAllocBytes, kSplitSteps ? 4 : 4 * kConsumers);
  unsigned long long* const full_kept = bars.full_kept;
  unsigned long long* const full = bars.full;
  unsigned long long* const empty = bars.empty;

  const int m0 = (kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBlockM;
  const int head = blockIdx.y % p.heads, batch = blockIdx.y / p.heads;
  const int kv_head = head / p.kv_group;
  const int key_end = kCausal ? min(p.n, m0 + kBlockM) : p.n;
  const int tiles = (key_end + kBlockN - 1) / kBlockN;

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    sm90::registers_release<kBwdProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_maps(p);
      load_tile_pair<L::kChunks, kBlockM, kPlanes>(smem + L::kQOffset, &p.q_map, smem + L::kDOOffset, &p.do_map,
                                                   full_kept, m0, head, batch);
      for (int j = 0; j < tiles; ++j) {
        const int s = j % kStages;
        sm90::barrier_wait(&empty[s], ((j / kStages) & 1) ^ 1);
        load_tile_pair<L::kChunks, kBlockN, kPlanes>(smem + L::kKOffset + s * L::kStreamBytes, &p.k_map,
                                                     smem + L::kVOffset + s * L::kStreamBytes, &p.v_map, &full[s],
                                                     j * kBlockN, kv_head, batch);
      }
    }
    return;
  }
  sm90::registers_claim<kBwdConsumerRegisters>();

  // ---- consumers: query rows m0 + 64 wg .. + 63 ----
  using MmaD = sm90::Wgmma<T, kHeadDim>;  // dQ (64 rows x d), k16 steps over the keys
  const int wg = warpgroup - 1;
  const int kept = kSplitSteps ? 0 : wg;  // which 64 of the tile's query rows the warpgroup keeps
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int wg_row0 = m0 + 64 * kept;
  const int row0 = wg_row0 + 16 * warp + lane / 4;  // this thread's rows: that and 8 below
  const int col0 = 2 * (lane % 4);
  const unsigned q_base = sm90::smem_addr(smem) + L::kQOffset + 64 * kept * 128;
  const unsigned do_base = sm90::smem_addr(smem) + L::kDOOffset + 64 * kept * 128;
  const unsigned k_base = sm90::smem_addr(smem) + L::kKOffset;
  const unsigned v_base = sm90::smem_addr(smem) + L::kVOffset;

  float lse2[2], delta[2];
  const long long base = (static_cast<long long>(batch) * p.heads + head) * p.m;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const float lse = row < p.m ? p.lse[base + row] : neg_inf();
    lse2[h] = lse == neg_inf() ? pos_inf() : lse * kLog2e;
    delta[h] = row < p.m ? p.delta[base + row] : 0.f;
  }
  float dq[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dq[i] = 0.f;
  float s[kBlockN / 2], dp[kBlockN / 2];
  unsigned dsa[kPlanes][kBlockN / 16][4];


  sm90::barrier_wait(full_kept, 0);
  for (int j = kSplitSteps ? wg : 0; j < tiles; j += kSplitSteps ? kConsumers : 1) {
    const int st = j % kStages;
    const int n0 = j * kBlockN;
    sm90::barrier_wait(&full[st], (j / kStages) & 1);
    const unsigned k_stage = k_base + st * L::kStreamBytes, v_stage = v_base + st * L::kStreamBytes;
    issue_scores<T, kHeadDim, kBlockM, kBlockN, kPlanes>(s, q_base, k_stage);
    issue_scores<T, kHeadDim, kBlockM, kBlockN, kPlanes>(dp, do_base, v_stage);
    sm90::wgmma_wait<1>();  // S is in; dP may still run
    sm90::fence_operand(s);
    // Keys past N (zeros from TMA) would meet the row's lse2; causal tiles crossing the diagonal.
    const bool masked = n0 + kBlockN > p.n || (kCausal && n0 + kBlockN - 1 > wg_row0);
#pragma unroll
    for (int v = 0; v < kBlockN / 2; ++v) {
      const int h = (v >> 1) & 1;
      float prob = ck::fast_exp2(fmaf(s[v], p.scale_log2, -lse2[h]));
      if (masked) {
        const int key = n0 + 8 * (v >> 2) + col0 + (v & 1);
        if (key >= p.n || (kCausal && key > row0 + 8 * h)) prob = 0.f;
      }
      s[v] = prob;
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operand(dp);
#pragma unroll
    for (int v = 0; v < kBlockN / 2; ++v) dp[v] = s[v] * (dp[v] - delta[(v >> 1) & 1]);
    pack_a<T, kPlanes, kBlockN / 16>(dsa, dp);
    // dQ += dS K; with planes into a fresh partial folded into dQ in FP32 (the dK/dV kernel says why).
    auto accumulate = [&](float (&acc)[kHeadDim / 2], bool fresh) {
      sm90::wgmma_fence();
#pragma unroll
      for (int pair = first_pair<kPlanes>(); pair < 6; ++pair)
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
          MmaD::rs(acc, dsa[plane_of_a(pair)][kk],
                   sm90::descriptor(k_stage + plane_of_b(pair) * L::kStreamPlaneBytes + kk * 2048, kBlockN * 128, 1024),
                   !fresh || pair > first_pair<kPlanes>() || kk > 0);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_operand(acc);
    };
    if constexpr (kPlanes == 1) {
      accumulate(dq, false);
    } else {
      float part[kHeadDim / 2];
      accumulate(part, true);
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) dq[i] += part[i];
    }
    if (lane == 0) sm90::barrier_arrive(&empty[st]);
  }

  if constexpr (kSplitSteps) {  // the K and V stages, contiguous, hold consumer 1's dQ
    static_assert(kHeadDim / 2 * 128 * 4 <= 2 * kStages * L::kStreamBytes, "dQ fits the stages");
    if (!add_split_sums(reinterpret_cast<float*>(smem + L::kKOffset), wg, tid, dq)) return;
  }
  TOut* dq_out = static_cast<TOut*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  store_rows<TOut, kHeadDim>(dq_out, p.dq_row_stride, dq, p.scale, wg_row0, p.m, p.d, warp, lane);
#else
  __trap();  // built for another arch: the host never launches it there
#endif
}

}  // namespace attention_sm90
