// Single-pass prefix sum (inclusive or exclusive) with decoupled look-back (Merrill & Garland, 2016).
//
// One launch reads every element once and writes it once. CTAs take tiles in the order they ask, from an
// atomic counter (not blockIdx: a CTA may then only wait on tiles that CTAs already running hold, so the
// look-back cannot deadlock); in a launch of several waves the first wave asks in 8 groups a few
// microseconds apart (claim_tile: the first wave's ramp). Each tile:
//   1. loads THREADS x ITEMS elements, warp-striped: load j of a warp covers 32 consecutive vectors of VEC
//      elements, so every load instruction is one coalesced 16-byte-per-lane access and no shared-memory
//      transpose is needed; into registers, or (staged) into shared memory with cp.async;
//   2. reduces each vector in registers, scans the vector sums across the warp with shuffles (one warp scan
//      per load j, carried from j to j+1) and across warps through shared memory;
//   3. publishes its aggregate (status A), looks back over its predecessors' published states, 32 at a time,
//      summing aggregates until it meets an inclusive prefix (status P), then publishes its own P;
//   4. adds the tile's exclusive prefix and writes the results with the same striped vector stores.
//
// Three schedules of steps 2-3 (ScanConfig.lookback):
//   inline    -- scan_kernel: every warp scans, a CTA barrier, warp 0 computes the aggregate and looks back
//                while the other warps wait at a second barrier;
//   early     -- scan_kernel_early_aggregate: as inline, but the aggregate is published before the in-tile
//                scan, from a plain sum of the tile, so that successors find it sooner;
//   dedicated -- scan_kernel_lookback_warp: one extra warp, holding no data, does the look-back. The data
//                warps first reduce their vectors to a plain sum (no scan, no ordered combine) and hand the
//                warp sums over at a named barrier, so the aggregate is published after one reduction
//                instead of after the full in-tile scan; they then do the in-tile warp scans while the
//                look-back runs, and wait only for the tile prefix before the stores.
// (Persistent CTAs with two shared-memory stages, loading the next tile during this one's look-back and
// stores, lose at every size: too few CTAs fit per SM. docs/notes/scan.md#dropped-ideas.)
// A fourth schedule has no look-back: rows -- linear_scan_rows_kernel: one CTA per row of whole tiles walks
// them in order (scan_row_tiles_in_order).
//
// Batched rows (SEGMENTED): the rows of a contiguous (rows, row_len) tensor are scanned as one flattened
// array in which every element at a multiple of row_len is a segment head. The scan operator on
// (has_head, value) pairs, (f1, v1) + (f2, v2) = (f1 | f2, f2 ? v2 : v1 + v2), is associative, so the same
// single pass handles any mix of short and long rows at full memory bandwidth. A tile that contains a head
// publishes its aggregate directly as P: nothing before the head can change what follows it.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "common.cuh"

namespace scan {

// ---- The associative operators (ScanProblem.op) ----------------------------------------------------------
// Each names its accumulator type Acc and gives identity(), lift(x) (an input element as an Acc) and
// combine(a, b), where a covers the elements before b's. The accumulator follows torch: cumsum and
// cumprod of integers accumulate in int64 (wrapping like torch's int64 arithmetic), of 16-bit floats in
// float32; cummax and cummin keep integer inputs' own type. Every operator here is commutative as well as
// associative, which the schedules that reduce a tile in any order (early, dedicated, the column reduce)
// rely on: kCommutative says so.
template <typename T> __device__ __forceinline__ T lowest();
template <> __device__ __forceinline__ float lowest<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double lowest<double>() { return -__longlong_as_double(0x7ff0000000000000ll); }
template <> __device__ __forceinline__ int lowest<int>() { return -2147483647 - 1; }
template <> __device__ __forceinline__ long long lowest<long long>() { return -9223372036854775807ll - 1; }
template <typename T> __device__ __forceinline__ T highest();
template <> __device__ __forceinline__ float highest<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double highest<double>() { return __longlong_as_double(0x7ff0000000000000ll); }
template <> __device__ __forceinline__ int highest<int>() { return 2147483647; }
template <> __device__ __forceinline__ long long highest<long long>() { return 9223372036854775807ll; }

// What the five reductions share: commutative, and an input element converted to the accumulator.
template <typename A>
struct CommutativeReduction {
  static constexpr bool kCommutative = true;
  template <typename In> static __device__ __forceinline__ A lift(In x) { return static_cast<A>(x); }
};

template <typename A>
struct Sum : CommutativeReduction<A> {
  using Acc = A;
  static __device__ __forceinline__ Acc identity() { return Acc(0); }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) { return ck::wrapping_add(a, b); }
};

template <typename A>
struct Prod : CommutativeReduction<A> {
  using Acc = A;
  static __device__ __forceinline__ Acc identity() { return Acc(1); }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) {
    if constexpr (sizeof(Acc) == 8 && Acc(0.5) == Acc(0)) {  // int64: wraps, as the sum does
      return static_cast<Acc>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
    } else {
      return a * b;
    }
  }
};

// torch.cummax / cummin values: a NaN, once seen, is the result from there on (a != a: NaN, for floats); on a
// tie the later element wins, as torch's >= does (it shows in the sign of a zero). The out-of-order
// reductions of the early and dedicated schedules may pick either zero of a tie in a tile aggregate.
template <typename A>
struct Max : CommutativeReduction<A> {
  using Acc = A;
  static __device__ __forceinline__ Acc identity() { return lowest<Acc>(); }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) { return a != a ? a : (b != b || b >= a) ? b : a; }
};

template <typename A>
struct Min : CommutativeReduction<A> {
  using Acc = A;
  static __device__ __forceinline__ Acc identity() { return highest<Acc>(); }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) { return a != a ? a : (b != b || b <= a) ? b : a; }
};

// torch.logcumsumexp: log(exp(a) + exp(b)) as max + log1p(exp(-|a - b|)), exact for -inf operands (the
// identity) and +inf ones, NaN in, NaN out. A float accumulator takes the SFU's exponential and logarithm
// (__expf, __logf): the precise ones made the scan compute-bound at 20% of copy bandwidth, while the fast
// ones' error (a few 1e-7 absolute, on an addend below log 2) stays under the float result's own rounding
// for results of magnitude 1 or more.
template <typename A>
struct LogSumExp : CommutativeReduction<A> {
  using Acc = A;
  static __device__ __forceinline__ Acc identity() { return lowest<Acc>(); }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) {
    const Acc hi = a < b ? b : a, lo = a < b ? a : b;  // a NaN lands in hi or lo, and the result is NaN
    if (lo == lowest<Acc>() || hi == highest<Acc>()) return hi == hi && lo == lo ? hi : lo + hi;
    if constexpr (sizeof(Acc) == 4) {
      return hi + __logf(1.0f + __expf(lo - hi));
    } else {
      return hi + log1p(exp(lo - hi));
    }
  }
};

// A first-order linear recurrence h_t = a_t h_{t-1} + x_t (ck.linear_scan) scans affine maps h -> a h + b:
// the map of a range is the composition of its elements' maps, (a1, b1) then (a2, b2) = (a2 a1, a2 b1 + b2),
// associative but not commutative, so only the ordered schedule (inline) and the ordered look-back window
// take it. An element is the map (a_t, x_t); the result is the composed map's b (h_{-1} = 0). An h0 enters
// the look-back kernels folded into each row's first element by the stage, and the rows kernel as the
// constant map (0, h0) its row starts from.
struct Affine {
  float a, b;
};

struct Linear {
  using Acc = Affine;
  static constexpr bool kCommutative = false;
  static __device__ __forceinline__ Acc identity() { return {1.0f, 0.0f}; }
  static __device__ __forceinline__ Acc lift(Affine v) { return v; }
  static __device__ __forceinline__ Acc combine(Acc f, Acc g) { return {g.a * f.a, fmaf(g.a, f.b, g.b)}; }
};

// An accumulator as the output element: itself for the reductions, the map's b for a recurrence.
template <typename Out, typename Acc>
__device__ __forceinline__ Out to_output(Acc v) { return static_cast<Out>(v); }
template <typename Out>
__device__ __forceinline__ Out to_output(Affine v) { return static_cast<Out>(v.b); }

// Warp shuffles of an accumulator: the hardware's for scalars, member by member for a map.
template <typename T> __device__ __forceinline__ T shfl_up(T v, int delta) { return __shfl_up_sync(ck::kFullMask, v, delta); }
template <typename T> __device__ __forceinline__ T shfl_xor(T v, int mask) { return __shfl_xor_sync(ck::kFullMask, v, mask); }
template <typename T> __device__ __forceinline__ T shfl(T v, int lane) { return __shfl_sync(ck::kFullMask, v, lane); }
template <> __device__ __forceinline__ Affine shfl_up(Affine v, int delta) {
  return {__shfl_up_sync(ck::kFullMask, v.a, delta), __shfl_up_sync(ck::kFullMask, v.b, delta)};
}
template <> __device__ __forceinline__ Affine shfl_xor(Affine v, int mask) {
  return {__shfl_xor_sync(ck::kFullMask, v.a, mask), __shfl_xor_sync(ck::kFullMask, v.b, mask)};
}
template <> __device__ __forceinline__ Affine shfl(Affine v, int lane) {
  return {__shfl_sync(ck::kFullMask, v.a, lane), __shfl_sync(ck::kFullMask, v.b, lane)};
}

}  // namespace scan

namespace ck {
// A map's two floats as one u64 state value (the 8-byte TileStates layouts), declared before the states use it.
__device__ __forceinline__ unsigned long long to_bits64(scan::Affine v) {
  return static_cast<unsigned long long>(__float_as_uint(v.b)) << 32 | __float_as_uint(v.a);
}
template <>
__device__ __forceinline__ scan::Affine from_bits64<scan::Affine>(unsigned long long w) {
  return {__uint_as_float(static_cast<unsigned>(w)), __uint_as_float(static_cast<unsigned>(w >> 32))};
}
}  // namespace ck

namespace scan {

// ---- Tile states -------------------------------------------------------------------------------------
enum : unsigned { kStatusX = 0, kStatusA = 1, kStatusP = 2 };  // X: not yet published

// Workspace layout (cute_kernels/ops/scan/lookback.py: workspace_bytes mirrors it):
//   [0, 8)    two tile counters; a launch claims tiles from counters[epoch & 1];
//   [16, ...) the tile states as below: tile t's at a fixed offset (8 t bytes packed, 16 t as a pair), so
//             every launch on a workspace puts a tile's status words at the same address and never over
//             another launch's values, whatever its tile count. (The host keeps the two layouts in separate
//             workspaces for the same reason: a packed word read over a pair's could carry the right tag.)
// Every launch on a workspace gets the next epoch (1, 2, ..., 2^30 - 1), and a status word holds
// (epoch << 2) | status: a word another launch left behind carries another epoch and reads as X. So the
// states are never cleared between launches, and the host zeroes the workspace only when it is allocated
// and when the epochs wrap. The counter of the next launch, counters[(epoch + 1) & 1], is the one the
// launch before this one used; CTA 0 zeroes it, and the stream orders that store before the next launch.
constexpr long long kWorkspaceHeaderBytes = 16;
constexpr unsigned kStatusBits = 2;

__device__ __forceinline__ unsigned tagged_status(unsigned epoch, unsigned status) { return epoch << kStatusBits | status; }
// The status a tagged word holds in `epoch`: X unless the word carries that epoch. One subtract: a word of
// this epoch leaves its status (0-2); a word of another epoch (0 included) leaves a non-zero multiple of 4
// (mod 2^32; epochs are below 2^30) plus its status, which is 4 or more. (Shift-and-compare costs ptxas
// enough registers to drop the 384x32 register tile from 3 CTAs per SM to 2:
// docs/notes/scan.md#status-check-in-one-subtract.)
__device__ __forceinline__ unsigned status_in_epoch(unsigned epoch, unsigned tagged) {
  const unsigned status = tagged - (epoch << kStatusBits);
  return status < (1u << kStatusBits) ? status : kStatusX;
}

// The first wave's ramp (ScanConfig.ramp_ns). Launched all at once, the first wave (the CTAs resident
// together, blockIdx < first_wave) asks for its whole input in the same instant, so its tiles land
// together, look back together and store together, and the next waves inherit that rhythm: the DRAM
// idles while whole waves wait for their predecessors' prefixes. With a ramp, first-wave CTA b waits
// (b % kRampGroups) * ramp_step_ns before it claims a tile: blockIdx % groups puts every group on every
// SM, early tiles land sooner, and the waves after the first no longer move in step. The host passes
// ramp_step_ns = 0 (no wait) unless the launch has at least two waves. The trace and the timings:
// docs/notes/scan.md#first-wave-ramp.
constexpr unsigned kRampGroups = 8;

__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Claims this CTA's tile, the next unclaimed one of this launch (thread 0), after the first wave's ramp, and
// readies the next launch's counter (CTA 0, which never waits).
__device__ __forceinline__ unsigned claim_tile(unsigned* tile_counters, unsigned epoch, unsigned first_wave,
                                               unsigned ramp_step_ns) {
  if (blockIdx.x == 0) tile_counters[(epoch + 1) & 1] = 0;
  const unsigned group = blockIdx.x % kRampGroups;
  if (ramp_step_ns && group && blockIdx.x < first_wave) {
    // globaltimer, not one __nanosleep: that sleeps anywhere in [0, 2t], which makes the ramp slower.
    // (The H200's globaltimer ticks every 32 ns; a GPU whose timer ticks more coarsely rounds the steps.)
    const unsigned long long until = global_time_ns() + static_cast<unsigned long long>(group) * ramp_step_ns;
    while (global_time_ns() < until) __nanosleep(100);
  }
  return atomicAdd(tile_counters + (epoch & 1), 1u);
}

// 4-byte values: status and value in one 64-bit word, so that one relaxed access publishes or reads both.
template <typename Acc, bool kPacked = sizeof(Acc) == 4>
struct TileStates {
  unsigned long long* words;
  unsigned epoch;
  __device__ TileStates(void* states, unsigned epoch_)
      : words(static_cast<unsigned long long*>(states)), epoch(epoch_) {}
  __device__ __forceinline__ void publish(long long tile, unsigned status, Acc value) const {
    ck::store_relaxed_u64(words + tile, (static_cast<unsigned long long>(tagged_status(epoch, status)) << 32) | ck::to_bits32(value));
  }
  __device__ __forceinline__ void read(long long tile, unsigned& status, Acc& value) const {
    const unsigned long long w = ck::load_relaxed_u64(words + tile);
    status = status_in_epoch(epoch, static_cast<unsigned>(w >> 32));
    value = ck::from_bits32<Acc>(static_cast<unsigned>(w));
  }
};

// 8-byte values (double, long long, a recurrence's map): two 8-byte words per tile, each the tagged status
// beside one half of the value's bits, written and read as one 16-byte access, so that one L2 round trip
// reads a status and its value, as in the packed layout. Each 8-byte word is single-copy atomic, the
// 16-byte pair is not promised to be: a reader whose two tags differ read the pair in the middle of an
// update and takes the tile as not yet published (X), which makes the look-back read it again. A P written
// over an A in place is safe for the same reason: a reader sees both words of one publish, or two different
// tags. (The layout before kept status words apart from the values, read with acquire and then the value:
// two dependent round trips per read; docs/notes/scan.md#linear-recurrences.)
template <typename Acc>
struct TileStates<Acc, false> {
  static_assert(sizeof(Acc) == 8, "two 4-byte halves beside their tags");
  unsigned long long* words;  // 2 per tile, 16-byte aligned (the states start 16 bytes into the workspace)
  unsigned epoch;
  __device__ TileStates(void* states, unsigned epoch_)
      : words(static_cast<unsigned long long*>(states)), epoch(epoch_) {}
  // The value's 64 bits (ck::to_bits64; a map: a low, b high) split into the two words' low halves.
  __device__ __forceinline__ void publish(long long tile, unsigned status, Acc value) const {
    const unsigned long long tag = static_cast<unsigned long long>(tagged_status(epoch, status)) << 32;
    const unsigned long long bits = ck::to_bits64(value);
    ck::store_relaxed_u64x2(words + 2 * tile, tag | (bits & 0xffffffffull), tag | (bits >> 32));
  }
  __device__ __forceinline__ void read(long long tile, unsigned& status, Acc& value) const {
    unsigned long long lo, hi;
    ck::load_relaxed_u64x2(words + 2 * tile, lo, hi);
    const unsigned lo_status = status_in_epoch(epoch, static_cast<unsigned>(lo >> 32));
    status = lo_status == status_in_epoch(epoch, static_cast<unsigned>(hi >> 32)) ? lo_status : kStatusX;
    value = ck::from_bits64<Acc>((hi << 32) | (lo & 0xffffffffull));
  }
};

// ---- The (has_head, value) scan operator ----------------------------------------------------------------
template <typename Acc>
struct Pair {
  bool head;  // a segment starts inside the range this pair summarises
  Acc value;  // the sum from the last head in the range (or from its start) to its end
};

template <bool kSegmented, typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Pair<Acc> combine(Pair<Acc> a, Pair<Acc> b) {
  if constexpr (kSegmented) {
    return {a.head || b.head, b.head ? b.value : Op::combine(a.value, b.value)};
  } else {
    return {false, Op::combine(a.value, b.value)};
  }
}

// Inclusive scan of one pair per lane (Hillis-Steele, 5 shuffles). Segmented: a lane adds a partner's
// partial sum only if no head lies between them, i.e. the partner is at or after the lane's segment start.
template <bool kSegmented, typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Pair<Acc> warp_inclusive_scan(Pair<Acc> p, int lane) {
  int segment_start = 0;
  if constexpr (kSegmented) {
    const unsigned heads = __ballot_sync(ck::kFullMask, p.head);
    const unsigned heads_at_or_below = heads & (ck::kFullMask >> (31 - lane));
    segment_start = heads_at_or_below ? 31 - __clz(heads_at_or_below) : 0;
    p.head = heads_at_or_below != 0;
  }
#pragma unroll
  for (int offset = 1; offset < ck::kWarpSize; offset <<= 1) {
    const Acc other = shfl_up(p.value, offset);
    if (lane - offset >= segment_start) p.value = Op::combine(other, p.value);
  }
  return p;
}

// The warp's 32 values combined, in every lane (a butterfly: any order, so commutative operators only).
template <typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc warp_reduce(Acc v) {
  static_assert(Op::kCommutative, "the butterfly combines lanes out of order");
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = Op::combine(v, shfl_xor(v, offset));
  return v;
}

// The same with lane 0 holding the newest value and lane 31 the oldest (a look-back window), in order for an
// operator that is not commutative: at each step the lane whose `offset` bit is set holds the older half.
template <typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc warp_reduce_newest_first(Acc v, int lane) {
  if constexpr (Op::kCommutative) {
    return warp_reduce<Op>(v);
  } else {
#pragma unroll
    for (int offset = 1; offset < ck::kWarpSize; offset <<= 1) {
      const Acc other = shfl_xor(v, offset);
      v = (lane & offset) ? Op::combine(v, other) : Op::combine(other, v);
    }
    return v;
  }
}

// The warp's 32 pairs combined in lane order, lane 0 the oldest, in every lane (the early schedule's warp
// aggregate for an operator that is not commutative): at each step the lane whose `offset` bit is set holds
// the newer half.
template <bool kSegmented, typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Pair<Acc> warp_reduce_in_order(Pair<Acc> p, int lane) {
#pragma unroll
  for (int offset = 1; offset < ck::kWarpSize; offset <<= 1) {
    const Pair<Acc> other{kSegmented && __shfl_xor_sync(ck::kFullMask, p.head, offset) != 0, shfl_xor(p.value, offset)};
    p = (lane & offset) ? combine<kSegmented, Op>(other, p) : combine<kSegmented, Op>(p, other);
  }
  return p;
}

// One warp of a tile: the sum of the aggregates of the tiles before `tile`, back to and including the
// nearest inclusive prefix. Reads 32 predecessors per step: lane i looks at tile - 1 - i. A predecessor that
// has not published yet is still running (it started before us): the window waits for it.
// kNeededOnly: a window waits only for the predecessors it will sum, those newer than its newest inclusive
// prefix. Otherwise it waits until all 32 have published, so one slow tile older than a published prefix
// (whose value would not even be read) holds it up. The warp-0 schedules (inline, early) take the plain
// wait, which ran faster there (docs/notes/scan.md#waiting-only-for-the-predecessors-summed); the dedicated
// look-back warp takes the other.
template <bool kNeededOnly, typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc look_back(const TileStates<Acc>& states, long long tile, int lane) {
  Acc exclusive = Op::identity();
  for (long long newest = tile - 1;; newest -= ck::kWarpSize) {
    const long long t = newest - lane;
    unsigned status = kStatusP;  // before tile 0: the identity, as an inclusive prefix
    Acc value = Op::identity();
    if (t >= 0) states.read(t, status, value);
    unsigned prefixes;
    if constexpr (kNeededOnly) {
      while (true) {
        prefixes = __ballot_sync(ck::kFullMask, status == kStatusP);
        const unsigned unpublished = __ballot_sync(ck::kFullMask, status == kStatusX);
        // Lanes 0..(first P lane), or all 32 if none holds a prefix (2u << 31 wraps to 0, and 0 - 1 to all).
        const unsigned needed = prefixes ? (2u << (__ffs(prefixes) - 1)) - 1u : ck::kFullMask;
        if (!(unpublished & needed)) break;
        __nanosleep(32);
        if (status == kStatusX) states.read(t, status, value);
      }
    } else {
      while (__any_sync(ck::kFullMask, status == kStatusX)) {
        __nanosleep(32);
        if (status == kStatusX) states.read(t, status, value);
      }
      prefixes = __ballot_sync(ck::kFullMask, status == kStatusP);
    }
    const int last_lane = prefixes ? __ffs(prefixes) - 1 : ck::kWarpSize - 1;
    // The window lies before what `exclusive` holds (lane 0 is the newest tile).
    exclusive = Op::combine(warp_reduce_newest_first<Op>(lane <= last_lane ? value : Op::identity(), lane), exclusive);
    if (prefixes) return exclusive;
  }
}

// One warp, after the tile published its aggregate: the tile's exclusive prefix (0 where the tile starts a
// segment, or is tile 0), and, unless the aggregate already was the inclusive prefix, publishes that (P).
template <bool kNeededOnly, typename Op, typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc look_back_and_publish(const TileStates<Acc>& states, long long tile, int lane,
                                                     bool starts_segment, bool aggregate_is_prefix, Acc aggregate) {
  if (starts_segment) return Op::identity();
  const Acc prefix = look_back<kNeededOnly, Op>(states, tile, lane);
  if (!aggregate_is_prefix && lane == 0) states.publish(tile, kStatusP, Op::combine(prefix, aggregate));
  return prefix;
}

// Where a thread's input vectors wait between the two passes over them (the scan, then the stores).
// Registers: loaded up front; the loads in flight per SM are bounded by the register file, which with other
// state leaves room for ~64 KB per SM. Shared memory: filled by cp.async, which holds no registers while the
// data is in flight, so a CTA can keep a much larger tile in flight (the H200 needs ~60 KB per SM in flight
// to stay near its copy bandwidth).
//
// Reversed scans (kReverse) run over the logical index g = n - 1 - (memory index): the vector of logical
// elements [g, g + kVec) is the memory vector at n - g - kVec, read back to front. The host gives a
// reversed scan a vector width that divides n, so that those memory vectors are aligned and a vector lies
// either wholly inside the array or wholly past its end (no partial vectors).
template <bool kReverse, int kVec>
__device__ __forceinline__ long long memory_vector(long long g, long long n) {
  return kReverse ? n - g - kVec : g;
}
template <bool kReverse>
__device__ __forceinline__ long long memory_element(long long g, long long n) {
  return kReverse ? n - 1 - g : g;
}

template <typename In, int kVecs, int kVec, long long kStride, bool kReverse>
struct RegisterStage {
  static constexpr bool kWarpAggregates = false;  // the early schedule sums the tile itself (thread_sum_from)
  In v[kVecs][kVec];
  __device__ __forceinline__ void load(const In* x, long long n, long long first, bool full) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const long long g = first + j * kStride;
      if (full || g + kVec <= n) {
        const auto a = ck::load_stream(reinterpret_cast<const ck::Array<In, kVec>*>(x + memory_vector<kReverse, kVec>(g, n)));
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[j][e] = a.v[kReverse ? kVec - 1 - e : e];
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[j][e] = g + e < n ? x[memory_element<kReverse>(g + e, n)] : In(0);
      }
    }
  }
  __device__ __forceinline__ ck::Array<In, kVec> get(int j) const {
    ck::Array<In, kVec> a;
#pragma unroll
    for (int e = 0; e < kVec; ++e) a.v[e] = v[j][e];
    return a;
  }
};

template <typename In, int kVecs, int kVec, long long kStride, bool kReverse>
struct SharedStage {
  static constexpr bool kWarpAggregates = false;
  static constexpr int kBytes = kVec * static_cast<int>(sizeof(In));
  In* s;  // this thread's vector 0; vector j sits kStride elements further, as in global memory
  // Each thread copies, waits for and later reads only its own vectors: no barrier is needed. Elements
  // past n are zero-filled by the copy (a source size below the copy size; never in a reversed scan, whose
  // vectors are whole). A vector sits in shared memory as in global memory and is reversed as it is read.
  __device__ __forceinline__ void load(const In* x, long long n, long long first, bool /*full*/) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const long long g = first + j * kStride;
      const long long left = n - g;
      const int bytes = left >= kVec ? kBytes : left > 0 ? static_cast<int>(left) * static_cast<int>(sizeof(In)) : 0;
      ck::cp_async_zfill<kBytes>(s + j * kStride, x + (bytes ? memory_vector<kReverse, kVec>(g, n) : 0), bytes);
    }
    ck::cp_async_wait_all();
  }
  __device__ __forceinline__ ck::Array<In, kVec> get(int j) const {
    const auto a = *reinterpret_cast<const ck::Array<In, kVec>*>(s + j * kStride);
    if constexpr (kReverse) {
      ck::Array<In, kVec> r;
#pragma unroll
      for (int e = 0; e < kVec; ++e) r.v[e] = a.v[kVec - 1 - e];
      return r;
    } else {
      return a;
    }
  }
  // As load, without the wait: the copies go out as kGroups commit groups of kVecs / kGroups vectors each,
  // in order, so that the caller can wait for them one group at a time (cp_async_wait_group) and work on
  // the vectors that have landed while the rest are in flight.
  template <int kGroups>
  __device__ __forceinline__ void load_in_groups(const In* x, long long n, long long first) {
    static_assert(kVecs % kGroups == 0, "whole vectors per group");
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const long long g = first + j * kStride;
      const long long left = n - g;
      const int bytes = left >= kVec ? kBytes : left > 0 ? static_cast<int>(left) * static_cast<int>(sizeof(In)) : 0;
      ck::cp_async_zfill<kBytes>(s + j * kStride, x + (bytes ? memory_vector<kReverse, kVec>(g, n) : 0), bytes);
      if ((j + 1) % (kVecs / kGroups) == 0) ck::cp_async_commit();
    }
  }
};

// Segment starts from a flag array (ck.scan's segment_starts), one byte per element beside the values: a
// stage that loads the values as Inner does and each vector's kVec flags as a bit mask (bit e: logical
// element e starts a segment). Memory vector j's flags are read as its values are. A reversed scan meets a
// segment at its last element, the one before a flagged one: logical element e of a vector (memory element
// mv + kVec - 1 - e) starts a segment where flag[mv + kVec - e] is set, this vector's own flag for e >= 1 and
// for e = 0 the first flag of the next memory vector, which the lane before holds (the warp's loads are
// striped: lane L - 1's vector follows lane L's in memory); lane 0 reads that one byte itself. Staged values
// sit in dynamic shared memory at the thread's offset in the tile (tiles start at multiples of kTileSize).
template <typename In>
struct FlaggedSource {
  const In* x;
  const unsigned char* starts;
};

template <typename In, typename Inner, int kVecs, int kVec, long long kStride, long long kTileSize, bool kStaged,
          bool kReverse>
struct FlaggedStage {
  Inner values;
  unsigned flags[kVecs];
  __device__ __forceinline__ void load(const FlaggedSource<In>& src, long long n, long long first, bool full) {
    if constexpr (kStaged) {
      // The values' copies go out first and the flags' loads behind them, and only then does the thread wait
      // for the copies: both streams in flight at once, one DRAM latency per tile, not two.
      extern __shared__ __align__(16) unsigned char s_stage[];
      values.s = reinterpret_cast<In*>(s_stage) + first % kTileSize;
      values.template load_in_groups<1>(src.x, n, first);
    } else {
      values.load(src.x, n, first, full);
    }
    load_flags(src, n, first, full);
    if constexpr (kStaged) ck::cp_async_wait_all();
  }
  // Every vector's flag bytes are loaded before any is turned into bits, so that the loads are all in flight
  // together.
  __device__ __forceinline__ void load_flags(const FlaggedSource<In>& src, long long n, long long first, bool full) {
    ck::Array<unsigned char, kVec> bytes[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const long long g = first + j * kStride;
      ck::Array<unsigned char, kVec>& f = bytes[j];
      if (full || g + kVec <= n) {
        f = *reinterpret_cast<const ck::Array<unsigned char, kVec>*>(src.starts + memory_vector<kReverse, kVec>(g, n));
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) f.v[e] = g + e < n ? src.starts[memory_element<kReverse>(g + e, n)] : 0;
        if constexpr (kReverse) {  // undo the reversal below: these were read element by element
#pragma unroll
          for (int e = 0; e < kVec / 2; ++e) { const unsigned char t = f.v[e]; f.v[e] = f.v[kVec - 1 - e]; f.v[kVec - 1 - e] = t; }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const long long g = first + j * kStride;
      const ck::Array<unsigned char, kVec>& f = bytes[j];
      unsigned bits = 0;
      if constexpr (kReverse) {
        // (Reversed vectors are whole or wholly past n: the host gives a reversed scan a width dividing n.)
        const int lane = threadIdx.x % ck::kWarpSize;
        const long long next = n - g;  // mv + kVec: the next memory vector's first element
        int after = __shfl_up_sync(ck::kFullMask, static_cast<int>(f.v[0]), 1);
        if (lane == 0) after = g + kVec <= n && next < n ? src.starts[next] : 0;
        bits = after != 0 ? 1u : 0u;
#pragma unroll
        for (int e = 1; e < kVec; ++e) bits |= (f.v[kVec - e] != 0 ? 1u : 0u) << e;
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) bits |= (f.v[e] != 0 ? 1u : 0u) << e;
      }
      flags[j] = bits;
    }
  }
  __device__ __forceinline__ auto get(int j) const { return values.get(j); }

  // The early schedule's aggregate of this warp's chunk: (a segment starts in it, the combined values from
  // its last head to its end). The last head is the latest flagged or row-starting element of the chunk (a
  // max across the warp); from there on the operator is commutative, so a masked combine in any order and a
  // butterfly finish it. Offsets count from the warp chunk's first element (warp-striped: vector j of lane
  // L starts at j * kStride + L * kVec). Elements past n are zeros with no flag: only the last tile's
  // aggregate, which no tile reads, sees them.
  static constexpr bool kWarpAggregates = true;
  template <bool kSegmented, typename Op, typename Src, typename Acc = typename Op::Acc>
  __device__ __forceinline__ Pair<Acc> warp_aggregate(const Src&, long long /*n*/, long long /*first*/,
                                                      const long long (&row_pos)[kVecs], long long row_len, int lane) const {
    static_assert(kSegmented && Op::kCommutative, "flags restart segments of a commutative operator");
    int last_head = -1;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      long long pos = row_pos[j];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (pos == 0 || (flags[j] >> e & 1u)) last_head = static_cast<int>(j * kStride) + lane * kVec + e;
        pos = pos + 1 == row_len ? 0 : pos + 1;
      }
    }
    last_head = __reduce_max_sync(ck::kFullMask, last_head);
    Acc sum = Op::identity();
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const auto items = get(j);
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (static_cast<int>(j * kStride) + lane * kVec + e >= last_head) sum = Op::combine(sum, Op::lift(items.v[e]));
    }
    return {last_head >= 0, warp_reduce<Op>(sum)};
  }
};

// A stage's segment-start bits of vector j: none unless it carries flags.
template <typename Stage>
__device__ __forceinline__ unsigned segment_flags(const Stage&, int) { return 0u; }
template <typename In, typename Inner, int kVecs, int kVec, long long kStride, long long kTileSize, bool kStaged, bool kReverse>
__device__ __forceinline__ unsigned segment_flags(const FlaggedStage<In, Inner, kVecs, kVec, kStride, kTileSize, kStaged, kReverse>& stage, int j) {
  return stage.flags[j];
}

// Tile geometry and the per-thread work, shared by every step of the kernel below.
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kSegmented, bool kExclusive,
          bool kReverse>
struct Tile {
  using Acc = typename Op::Acc;
  static_assert(kThreads % ck::kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static_assert(kItems % kVec == 0, "each thread loads whole vectors");
  static constexpr int kWarps = kThreads / ck::kWarpSize;
  static constexpr int kVecs = kItems / kVec;  // vector loads per thread
  static constexpr long long kSize = static_cast<long long>(kThreads) * kItems;
  static constexpr long long kWarpChunk = static_cast<long long>(ck::kWarpSize) * kItems;
  static constexpr long long kStride = static_cast<long long>(ck::kWarpSize) * kVec;  // load j to j + 1

  // The tile's last segment head (at or before tile_start - 1 if none lies in the tile): its aggregate sums
  // the elements from there on. Flat arrays: tile_start. tile_end: one past the tile's last element.
  static __device__ __forceinline__ long long last_head(long long tile_start, long long tile_end, long long row_len) {
    return kSegmented ? ((tile_end - 1) / row_len) * row_len : tile_start;
  }

  // Offset of this thread's first element in its tile: warp-striped, so load j of a warp covers 32
  // consecutive vectors (one coalesced access) and the thread's vectors sit kStride apart.
  static __device__ __forceinline__ long long offset_in_tile(int warp, int lane) {
    return warp * kWarpChunk + static_cast<long long>(lane) * kVec;
  }

  // Position of each vector's first element within its row (segment heads sit at position 0).
  static __device__ __forceinline__ void row_positions(long long first, long long row_len, long long (&pos)[kVecs]) {
    if constexpr (kSegmented) {
#pragma unroll
      for (int j = 0; j < kVecs; ++j) pos[j] = (first + j * kStride) % row_len;
    }
  }

  // Reduce each vector, scan the vector sums across the warp (one warp scan per load j, carried to j + 1).
  // Returns the warp's aggregate; vector_prefix[j] is vector j's exclusive prefix within the warp's chunk.
  // A segment starts at each row's position 0 and, with a flagged stage, where its flag bits say.
  template <typename Stage>
  static __device__ __forceinline__ Pair<Acc> warp_scan(const Stage& stage, const long long (&row_pos)[kVecs],
                                                        long long row_len, int lane, Pair<Acc> (&vector_prefix)[kVecs]) {
    Pair<Acc> carry{false, Op::identity()};
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const auto items = stage.get(j);
      const unsigned flags = segment_flags(stage, j);
      Pair<Acc> sum{false, Op::identity()};
      long long pos = kSegmented ? row_pos[j] : 1;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (kSegmented && (pos == 0 || (flags >> e & 1u))) sum = {true, Op::identity()};
        sum.value = Op::combine(sum.value, Op::lift(items.v[e]));
        if constexpr (kSegmented) pos = pos + 1 == row_len ? 0 : pos + 1;
      }
      const Pair<Acc> inclusive = warp_inclusive_scan<kSegmented, Op>(sum, lane);
      Pair<Acc> exclusive{__shfl_up_sync(ck::kFullMask, inclusive.head, 1) != 0, shfl_up(inclusive.value, 1)};
      if (lane == 0) exclusive = {false, Op::identity()};
      vector_prefix[j] = combine<kSegmented, Op>(carry, exclusive);
      const Pair<Acc> total{__shfl_sync(ck::kFullMask, inclusive.head, 31) != 0, shfl(inclusive.value, 31)};
      carry = combine<kSegmented, Op>(carry, total);
    }
    return carry;
  }

  // After the warp scans: the tile's aggregate (returned) and, in warp_prefix, the combined aggregates of
  // the warps before this one, from every warp's aggregate in shared memory.
  static __device__ __forceinline__ Pair<Acc> tile_aggregate_and_warp_prefix(const Pair<Acc> (&warp_aggregates)[kWarps],
                                                                             int warp, Pair<Acc>& warp_prefix) {
    Pair<Acc> tile_aggregate{false, Op::identity()};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w == warp) warp_prefix = tile_aggregate;
      tile_aggregate = combine<kSegmented, Op>(tile_aggregate, warp_aggregates[w]);
    }
    return tile_aggregate;
  }

  // Finish each vector from its exclusive prefix and store it.
  template <typename Stage>
  static __device__ __forceinline__ void store(Out* y, long long n, long long first, bool full, const Stage& stage,
                                               const long long (&row_pos)[kVecs], long long row_len, Pair<Acc> warp_prefix,
                                               const Pair<Acc> (&vector_prefix)[kVecs], Acc tile_prefix) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const auto items = stage.get(j);
      const unsigned flags = segment_flags(stage, j);
      const Pair<Acc> prefix = combine<kSegmented, Op>(warp_prefix, vector_prefix[j]);
      Acc running = prefix.head ? prefix.value : Op::combine(tile_prefix, prefix.value);
      long long pos = kSegmented ? row_pos[j] : 1;
      ck::Array<Out, kVec> out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (kSegmented && (pos == 0 || (flags >> e & 1u))) running = Op::identity();
        const Acc before = running;
        running = Op::combine(running, Op::lift(items.v[e]));
        out.v[e] = to_output<Out>(kExclusive ? before : running);
        if constexpr (kSegmented) pos = pos + 1 == row_len ? 0 : pos + 1;
      }
      const long long g = first + j * kStride;
      if (full || g + kVec <= n) {
        if constexpr (kReverse) {
          ck::Array<Out, kVec> back;
#pragma unroll
          for (int e = 0; e < kVec; ++e) back.v[e] = out.v[kVec - 1 - e];
          out = back;
        }
        ck::store_stream(reinterpret_cast<ck::Array<Out, kVec>*>(y + memory_vector<kReverse, kVec>(g, n)), out);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (g + e < n) y[memory_element<kReverse>(g + e, n)] = out.v[e];
      }
    }
  }
};

// What the tile aggregate needs from one thread: the plain sum of its elements at or after `from` (the
// tile's last segment head; elements past n are zero in the stage). A tile's aggregate under the
// (has_head, value) operator is (a head lies in the tile, the sum from the last head to the tile's end),
// and where the heads sit is known from the element index alone, so the aggregate is a masked sum, which
// any order may add: no scan and no ordered combine across lanes or warps.
template <typename Op, int kBegin, int kEnd, int kVec, long long kStride, bool kSegmented, typename Stage,
          typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc thread_sum_from(const Stage& stage, long long first, long long from, Acc sum = Op::identity()) {
  static_assert(Op::kCommutative, "a thread's vectors are not adjacent in the tile");
#pragma unroll
  for (int j = kBegin; j < kEnd; ++j) {
    const auto items = stage.get(j);
    const long long g = first + j * kStride;
    if (!kSegmented || g >= from) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum = Op::combine(sum, Op::lift(items.v[e]));
    } else if (g + kVec > from) {
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (g + e >= from) sum = Op::combine(sum, Op::lift(items.v[e]));
    }
  }
  return sum;
}

// x: (n) or (rows, row_len) flattened, contiguous; y: same shape, Out dtype. x may equal y (in place):
// every element is read before it is written and by the same thread. One CTA per tile. first_wave and
// ramp_step_ns: the first wave's ramp (claim_tile).
// kStaged: the tile waits in dynamic shared memory (kThreads * kItems * sizeof(In) bytes), else in registers.
// kEarlyAggregate (the "early" schedule): the tile's aggregate goes out as soon as the tile has landed, from
// a plain masked sum of it (thread_sum_from) and one more CTA barrier, instead of after the in-tile scan.
// A successor's look-back waits for its predecessors' aggregates, and on the H200 that wait, not the
// look-back's own L2 round trips, is most of what the look-back costs
// (docs/notes/scan.md#where-the-look-back-time-goes).
// Barriers: (early only: the warp sums are in shared memory), after the warp scans (the warp aggregates
// are), and after the look-back (the tile prefix is).
// Where a tile of a one-input scan waits (the kernels' kStaged).
template <typename In, int kThreads, int kItems, int kVec, bool kStaged, bool kReverse>
struct StageFor {
  static constexpr int kVecs = kItems / kVec;
  static constexpr long long kStride = static_cast<long long>(ck::kWarpSize) * kVec;
  using type = typename ck::Conditional<kStaged, SharedStage<In, kVecs, kVec, kStride, kReverse>,
                                        RegisterStage<In, kVecs, kVec, kStride, kReverse>>::type;
};

// Stage: where the thread's vectors wait (StageFor's, or LinearStage for a recurrence); Src: what its load
// reads (the input pointer, or LinearSource).
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kSegmented, bool kExclusive,
          bool kStaged, bool kReverse, bool kEarlyAggregate, typename Stage, typename Src>
__device__ __forceinline__ void scan_tile_warp0_looks_back(const Src& x, Out* y, long long n, long long row_len,
                                                           unsigned* tile_counters, void* tile_states,
                                                           unsigned epoch, unsigned first_wave,
                                                           unsigned ramp_step_ns) {
  using T = Tile<In, Out, Op, kThreads, kItems, kVec, kSegmented, kExclusive, kReverse>;
  using Acc = typename T::Acc;

  extern __shared__ __align__(16) unsigned char s_stage[];
  __shared__ unsigned s_tile;
  __shared__ Acc s_warp_sum[kEarlyAggregate ? T::kWarps : 1];
  __shared__ Pair<Acc> s_warp_aggregate[T::kWarps];
  __shared__ Acc s_tile_prefix;

  const int lane = threadIdx.x % ck::kWarpSize;
  const int warp = threadIdx.x / ck::kWarpSize;
  if (threadIdx.x == 0) s_tile = claim_tile(tile_counters, epoch, first_wave, ramp_step_ns);
  __syncthreads();
  const long long tile = s_tile;
  const long long tile_start = tile * T::kSize;
  const long long first = tile_start + T::offset_in_tile(warp, lane);
  const bool full = tile_start + T::kSize <= n;

  Stage stage;
  if constexpr (kStaged) stage.s = reinterpret_cast<In*>(s_stage) + T::offset_in_tile(warp, lane);
  stage.load(x, n, first, full);

  long long row_pos[T::kVecs];
  T::row_positions(first, row_len, row_pos);

  // Early: the aggregate from the masked sum (as scan_kernel_lookback_warp computes it), published by thread
  // 0, which keeps it for the inclusive prefix it publishes after the look-back. Stages with kWarpAggregates
  // (flags, maps) give each warp's aggregate pair instead, which thread 0 combines in warp order.
  Pair<Acc> early_aggregate{false, Op::identity()};
  if constexpr (kEarlyAggregate) {
    if constexpr (Stage::kWarpAggregates) {
      __shared__ Pair<Acc> s_warp_early[T::kWarps];
      const Pair<Acc> warp_total = stage.template warp_aggregate<kSegmented, Op>(x, n, first, row_pos, row_len, lane);
      if (lane == 0) s_warp_early[warp] = warp_total;
      __syncthreads();
      if (threadIdx.x == 0) {
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) early_aggregate = combine<kSegmented, Op>(early_aggregate, s_warp_early[w]);
        early_aggregate.head = early_aggregate.head || tile == 0;
      }
    } else {
      const long long last_head = T::last_head(tile_start, full ? tile_start + T::kSize : n, row_len);
      const Acc warp_total = warp_reduce<Op>(thread_sum_from<Op, 0, T::kVecs, kVec, T::kStride, kSegmented>(stage, first, last_head));
      if (lane == 0) s_warp_sum[warp] = warp_total;
      __syncthreads();
      if (threadIdx.x == 0) {
        early_aggregate = {kSegmented ? last_head >= tile_start : tile == 0, Op::identity()};
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) early_aggregate.value = Op::combine(early_aggregate.value, s_warp_sum[w]);
      }
    }
    if (threadIdx.x == 0) {
      TileStates<Acc>(tile_states, epoch).publish(tile, early_aggregate.head ? kStatusP : kStatusA, early_aggregate.value);
    }
  }

  // Scan in registers and across warps.
  Pair<Acc> vector_prefix[T::kVecs];
  const Pair<Acc> warp_aggregate = T::warp_scan(stage, row_pos, row_len, lane, vector_prefix);
  if (lane == 0) s_warp_aggregate[warp] = warp_aggregate;
  __syncthreads();
  Pair<Acc> warp_prefix{false, Op::identity()};
  const Pair<Acc> scanned_aggregate = T::tile_aggregate_and_warp_prefix(s_warp_aggregate, warp, warp_prefix);

  // Decoupled look-back. A tile whose aggregate already starts at a head (or tile 0) is its own prefix.
  if (warp == 0) {
    const TileStates<Acc> states(tile_states, epoch);
    // (early: meaningful in thread 0 only, the one lane that publishes)
    const Pair<Acc> tile_aggregate = kEarlyAggregate ? early_aggregate : scanned_aggregate;
    const bool aggregate_is_prefix = kSegmented ? tile_aggregate.head : tile == 0;
    const bool starts_segment = kSegmented ? tile_start % row_len == 0 : tile == 0;
    if (!kEarlyAggregate && lane == 0) states.publish(tile, aggregate_is_prefix ? kStatusP : kStatusA, tile_aggregate.value);
    const Acc prefix = look_back_and_publish<false, Op>(states, tile, lane, starts_segment, aggregate_is_prefix,
                                                    tile_aggregate.value);
    if (lane == 0) s_tile_prefix = prefix;
  }
  __syncthreads();

  T::store(y, n, first, full, stage, row_pos, row_len, warp_prefix, vector_prefix, s_tile_prefix);
}

// The inline schedule: warp 0 looks back once the tile is scanned; the other warps wait at a CTA barrier.
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kSegmented, bool kExclusive,
          bool kStaged, bool kReverse>
__global__ void __launch_bounds__(kThreads)
scan_kernel(const In* x, Out* y, long long n, long long row_len, unsigned* tile_counters, void* tile_states,
            unsigned epoch, unsigned first_wave, unsigned ramp_step_ns) {
  scan_tile_warp0_looks_back<In, Out, Op, kThreads, kItems, kVec, kSegmented, kExclusive, kStaged, kReverse, false,
                             typename StageFor<In, kThreads, kItems, kVec, kStaged, kReverse>::type>(
      x, y, n, row_len, tile_counters, tile_states, epoch, first_wave, ramp_step_ns);
}

// The early schedule: as inline, with the aggregate published before the in-tile scan.
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kSegmented, bool kExclusive,
          bool kStaged, bool kReverse>
__global__ void __launch_bounds__(kThreads)
scan_kernel_early_aggregate(const In* x, Out* y, long long n, long long row_len, unsigned* tile_counters,
                            void* tile_states, unsigned epoch, unsigned first_wave,
                            unsigned ramp_step_ns) {
  scan_tile_warp0_looks_back<In, Out, Op, kThreads, kItems, kVec, kSegmented, kExclusive, kStaged, kReverse, true,
                             typename StageFor<In, kThreads, kItems, kVec, kStaged, kReverse>::type>(
      x, y, n, row_len, tile_counters, tile_states, epoch, first_wave, ramp_step_ns);
}

// A segmented scan (ck.scan's segment_starts): scan_kernel's schedules over a flagged stage, rows and
// flagged elements both starting segments. kEarlyAggregate: the early schedule, each warp's aggregate from
// its last flagged head (FlaggedStage::warp_aggregate). (The dedicated schedule finds a tile's last head
// from the row length alone, so it does not take flags.)
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kExclusive, bool kStaged,
          bool kReverse, bool kEarlyAggregate>
__global__ void __launch_bounds__(kThreads)
segmented_scan_kernel(const In* x, const unsigned char* starts, Out* y, long long n, long long row_len,
                      unsigned* tile_counters, void* tile_states, unsigned epoch,
                      unsigned first_wave, unsigned ramp_step_ns) {
  using Inner = typename StageFor<In, kThreads, kItems, kVec, kStaged, kReverse>::type;
  using Stage = FlaggedStage<In, Inner, kItems / kVec, kVec, static_cast<long long>(ck::kWarpSize) * kVec,
                             static_cast<long long>(kThreads) * kItems, kStaged, kReverse>;
  scan_tile_warp0_looks_back<In, Out, Op, kThreads, kItems, kVec, true, kExclusive, false, kReverse, kEarlyAggregate, Stage>(
      FlaggedSource<In>{x, starts}, y, n, row_len, tile_counters, tile_states, epoch, first_wave,
      ramp_step_ns);
}

// ---- Linear recurrences (ck.linear_scan) ---------------------------------------------------------------
// What a recurrence's stage reads: a (or, with kScalarA, the one decay a_scalar), x, and h0 (one value per
// row, with kH0; row_len elements per row).
template <typename In>
struct LinearSource {
  const In* a;
  float a_scalar;
  const In* x;
  const float* h0;
  long long row_len;
};

// A thread's elements as maps (a_t, x_t): in registers, or (kStaged) both inputs copied by cp.async into the
// CTA's shared memory, x's tile then a's, each element at its offset in the tile (the thread reads back only
// its own vectors: no barrier). Each row's logical first element takes h0 in: its map becomes
// (a, x + a h0), so that the scanned map's b is h_t from h_{-1} = h0.
template <typename In, int kVecs, int kVec, long long kStride, long long kTileSize, bool kStaged, bool kReverse,
          bool kScalarA, bool kH0>
struct LinearStage {
  using XStage = typename ck::Conditional<kStaged, SharedStage<In, kVecs, kVec, kStride, kReverse>,
                                          RegisterStage<In, kVecs, kVec, kStride, kReverse>>::type;
  using AStage = typename ck::Conditional<kStaged, SharedStage<In, kScalarA ? 1 : kVecs, kVec, kStride, kReverse>,
                                          RegisterStage<In, kScalarA ? 1 : kVecs, kVec, kStride, kReverse>>::type;
  XStage xs;
  AStage as;  // unused with kScalarA
  float a_scalar;
  float h0_term[kVecs][kVec];  // a h0 where the element starts a row, else 0 (kH0)
  __device__ __forceinline__ void load(const LinearSource<In>& src, long long n, long long first, bool full) {
    if constexpr (kStaged) {
      extern __shared__ __align__(16) unsigned char s_stage[];
      // first - tile start: this thread's offset in the tile (tiles start at multiples of kTileSize)
      xs.s = reinterpret_cast<In*>(s_stage) + first % kTileSize;
      as.s = xs.s + kTileSize;
      xs.template load_in_groups<1>(src.x, n, first);
      if constexpr (!kScalarA) as.template load_in_groups<1>(src.a, n, first);
      ck::cp_async_wait_all();
    } else {
      xs.load(src.x, n, first, full);
      if constexpr (!kScalarA) as.load(src.a, n, first, full);
    }
    a_scalar = src.a_scalar;
    if constexpr (kH0) {
      // One 64-bit division a vector (its first element's row and position), not two an element. A
      // vector's heads are the elements a whole number of rows past its first head; rows shorter than a
      // vector may start more than one in it, longer ones at most one.
      const long long rows = n / src.row_len;
      const bool short_rows = src.row_len < kVec;
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        const long long g = first + j * kStride;
        const long long row = g / src.row_len;
        const long long pos = g - row * src.row_len;  // the row position of the vector's first element
        const long long to_next = src.row_len - pos;  // elements to the next row's start (pos > 0)
        const int first_head = pos == 0 ? 0 : (to_next < kVec ? static_cast<int>(to_next) : kVec);
        const long long first_row = pos == 0 ? row : row + 1;  // the row that starts at first_head
        const auto a = a_vector(j);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int past = e - first_head;
          bool head = past == 0;
          long long head_row = first_row;
          if (short_rows && past > 0) {
            const int len = static_cast<int>(src.row_len);
            head = past % len == 0;
            head_row = first_row + past / len;
          }
          head = head && g + e < n;
          // h0 is indexed by the row in memory (a reversed scan's logical row r is memory row rows-1-r).
          h0_term[j][e] = head ? a.v[e] * src.h0[kReverse ? rows - 1 - head_row : head_row] : 0.0f;
        }
      }
    }
  }
  __device__ __forceinline__ ck::Array<float, kVec> a_vector(int j) const {
    ck::Array<float, kVec> a;
    if constexpr (kScalarA) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) a.v[e] = a_scalar;
    } else {
      const auto v = as.get(j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) a.v[e] = static_cast<float>(v.v[e]);
    }
    return a;
  }
  // The early schedule's aggregate of this warp's chunk (kStaged only): the chunk's maps composed in order.
  // Lane L composes the chunk's elements [L * kItems, (L + 1) * kItems), consecutive in the tile, from shared
  // memory, and an ordered butterfly combines the lanes (warp-striped, each lane's own vectors would be 32
  // vectors apart, and composing them in order would take a warp reduction per vector). The warp copied its
  // whole chunk itself, so after each lane's cp.async wait a __syncwarp makes the chunk visible to every
  // lane. Row heads restart (the pair's head), taking h0 in as get() does; elements past n are zero maps,
  // seen only by the last tile's aggregate, which no tile reads.
  static constexpr bool kWarpAggregates = kStaged;
  template <bool kSegmented, typename Op, typename Acc = typename Op::Acc>
  __device__ __forceinline__ Pair<Acc> warp_aggregate(const LinearSource<In>& src, long long n, long long first,
                                                      const long long (&)[kVecs], long long row_len, int lane) const {
    static_assert(kStaged, "the lanes read each other's elements from the staged tile");
    constexpr int kItems = kVecs * kVec;
    __syncwarp();
    const In* block_x = xs.s - lane * kVec + lane * kItems;  // the warp chunk's start, then this lane's block
    const long long block_first = first - lane * kVec + lane * kItems;
    long long pos = kSegmented ? block_first % row_len : 1;
    Pair<Acc> p{false, Op::identity()};
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      auto xv = *reinterpret_cast<const ck::Array<In, kVec>*>(block_x + v * kVec);
      ck::Array<In, kVec> av;
      if constexpr (!kScalarA) av = *reinterpret_cast<const ck::Array<In, kVec>*>(block_x + kTileSize + v * kVec);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int m = kReverse ? kVec - 1 - e : e;  // a reversed vector sits in memory order
        const float a = kScalarA ? a_scalar : static_cast<float>(av.v[m]);
        float b = static_cast<float>(xv.v[m]);
        if (kSegmented && pos == 0) {
          p = {true, Op::identity()};
          const long long g = block_first + v * kVec + e;
          if (kH0 && g < n) b += a * src.h0[(kReverse ? n - 1 - g : g) / row_len];
        }
        p.value = Op::combine(p.value, Affine{a, b});
        if constexpr (kSegmented) pos = pos + 1 == row_len ? 0 : pos + 1;
      }
    }
    return warp_reduce_in_order<kSegmented, Op>(p, lane);
  }

  __device__ __forceinline__ ck::Array<Affine, kVec> get(int j) const {
    const auto xv = xs.get(j);
    const auto a = a_vector(j);
    ck::Array<Affine, kVec> maps;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float x = static_cast<float>(xv.v[e]);
      maps.v[e] = {a.v[e], kH0 ? x + h0_term[j][e] : x};
    }
    return maps;
  }
};

// h_t = a_t h_{t-1} + x_t along the last dim of a contiguous (rows, row_len) array (rows as segments, each
// from its own h0), as scan_kernel's inline schedule with the Linear operator: ordered warp scans, the
// ordered look-back window, float32 state in the pair TileStates layout. kStaged: the tile waits in shared
// memory (2 x kThreads x kItems elements of dynamic shared memory). kEarlyAggregate (staged only): the early
// schedule, the tile's map composed in order from the staged tile (LinearStage::warp_aggregate) and
// published before the in-tile scan.
template <typename In, typename Out, int kThreads, int kItems, int kVec, bool kSegmented, bool kStaged, bool kReverse,
          bool kScalarA, bool kH0, bool kEarlyAggregate>
__global__ void __launch_bounds__(kThreads)
linear_scan_kernel(const In* a, float a_scalar, const In* x, const float* h0, Out* y, long long n, long long row_len,
                   unsigned* tile_counters, void* tile_states, unsigned epoch,
                   unsigned first_wave, unsigned ramp_step_ns) {
  using Stage = LinearStage<In, kItems / kVec, kVec, static_cast<long long>(ck::kWarpSize) * kVec,
                            static_cast<long long>(kThreads) * kItems, kStaged, kReverse, kScalarA, kH0>;
  const LinearSource<In> src{a, a_scalar, x, h0, row_len};
  scan_tile_warp0_looks_back<In, Out, Linear, kThreads, kItems, kVec, kSegmented, false, false, kReverse, kEarlyAggregate, Stage>(
      src, y, n, row_len, tile_counters, tile_states, epoch, first_wave, ramp_step_ns);
}

// ---- The rows schedule: no look-back ------------------------------------------------------------------
// ScanConfig.lookback "rows", for many rows of whole tiles: one CTA per row walks the row's tiles in order
// and carries the combined value of the tiles before (every thread combines it from the same warp
// aggregates), so no tile waits on another CTA and nothing goes through a workspace. A look-back tile's
// critical path is its load, its scan, an L2 round trip and its stores one after the other; here the next
// tile's loads are issued into the other of two register stages before the current tile is scanned, so a
// tile's load latency lies under its predecessor's scan and stores. The price is parallelism: rows CTAs,
// each streaming its row (what the op's default weighs).
// Why it waits where it waits: one CTA barrier per tile, after the warp scans (the warp aggregates are in
// shared memory, one buffer per tile parity, so the next tile's writes need no barrier of their own: a
// warp writes a buffer again only after the barrier of the tile between, which every reader of that
// buffer has passed after reading it).
// The tile is not segmented: a CTA's tiles are one row, which starts from `carry` (the identity, or the map
// that yields a recurrence's start value), so no position is tracked and no head flag travels.
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kExclusive, bool kReverse,
          typename Stage, typename Src>
__device__ __forceinline__ void scan_row_tiles_in_order(const Src& src, Out* y, long long n, long long row_len,
                                                        typename Op::Acc carry) {
  using T = Tile<In, Out, Op, kThreads, kItems, kVec, false, kExclusive, kReverse>;
  using Acc = typename T::Acc;
  __shared__ Pair<Acc> s_warp_aggregate[2][T::kWarps];

  const int lane = threadIdx.x % ck::kWarpSize;
  const int warp = threadIdx.x / ck::kWarpSize;
  const long long row_first = static_cast<long long>(blockIdx.x) * row_len + T::offset_in_tile(warp, lane);
  const long long tiles = row_len / T::kSize;  // whole tiles (the host's rule): every load and store is full
  // carry: the combined value of the row's tiles before this one (the row's start before the first)

  auto scan_tile = [&](const Stage& stage, long long t, int parity) {
    const long long first = row_first + t * T::kSize;
    long long row_pos[T::kVecs];
    T::row_positions(first, row_len, row_pos);
    Pair<Acc> vector_prefix[T::kVecs];
    const Pair<Acc> warp_aggregate = T::warp_scan(stage, row_pos, row_len, lane, vector_prefix);
    if (lane == 0) s_warp_aggregate[parity][warp] = warp_aggregate;
    __syncthreads();
    Pair<Acc> warp_prefix{false, Op::identity()};
    const Pair<Acc> tile_aggregate = T::tile_aggregate_and_warp_prefix(s_warp_aggregate[parity], warp, warp_prefix);
    T::store(y, n, first, true, stage, row_pos, row_len, warp_prefix, vector_prefix, carry);
    carry = Op::combine(carry, tile_aggregate.value);
  };

  Stage even, odd;
  even.load(src, n, row_first, true);
  for (long long t = 0; t < tiles; t += 2) {
    if (t + 1 < tiles) odd.load(src, n, row_first + (t + 1) * T::kSize, true);
    scan_tile(even, t, 0);
    if (t + 1 < tiles) {
      if (t + 2 < tiles) even.load(src, n, row_first + (t + 2) * T::kSize, true);
      scan_tile(odd, t + 1, 1);
    }
  }
}

// h_t = a_t h_{t-1} + x_t on the rows schedule: rows of row_len elements, a multiple of kThreads x kItems;
// the maps wait in registers (two stages). One CTA per row. A start value enters as the row's first carry,
// the constant map h -> h0 (a = 0, b = h0), whose composition with the row's maps gives A_t h0 + B_t: the
// stage then loads plain maps, where folding a_0 h0 into the first element (as the look-back stage does)
// would make every prefetch wait for its a and work out row positions with 64-bit divisions.
template <typename In, typename Out, int kThreads, int kItems, int kVec, bool kReverse, bool kScalarA, bool kH0>
__global__ void __launch_bounds__(kThreads, 1)
linear_scan_rows_kernel(const In* a, float a_scalar, const In* x, const float* h0, Out* y, long long n,
                        long long row_len) {
  using Stage = LinearStage<In, kItems / kVec, kVec, static_cast<long long>(ck::kWarpSize) * kVec,
                            static_cast<long long>(kThreads) * kItems, false, kReverse, kScalarA, false>;
  const LinearSource<In> src{a, a_scalar, x, h0, row_len};
  // h0 is indexed by the row in memory: a reversed scan's logical row r is memory row rows - 1 - r.
  const long long row = kReverse ? n / row_len - 1 - blockIdx.x : blockIdx.x;
  const Affine start = kH0 ? Affine{0.0f, h0[row]} : Linear::identity();
  scan_row_tiles_in_order<In, Out, Linear, kThreads, kItems, kVec, false, kReverse, Stage>(src, y, n, row_len, start);
}

// ---- Dedicated look-back warp ------------------------------------------------------------------------
// Named barriers (0 is __syncthreads'). Barrier 2 is a one-way hand-over: the look-back warp arrives
// (never waits) and exits, the data warps sync; the arrive orders the arriving threads' earlier
// shared-memory writes before the syncing threads' later reads. Barrier 1 is a sync on both sides: an
// arrive there would order the writes just as well, but compute-sanitizer's racecheck does not follow a
// barrier some threads only arrive at before another hand-over, and reports the hand-over as a hazard (a
// probe of both: the arrive is reported, this schedule is clean). The sync costs the data warps only the
// wait for the slowest warp's reduction (docs/notes/scan.md#racecheck-and-arrive-only-barriers).
// The barriers are ck::barrier_sync / barrier_arrive, the non-.aligned forms (common.cuh): the look-back
// warp and the data warps reach each at different instructions.
constexpr unsigned kBarrierWarpSums = 1;    // data warps -> look-back warp: s_warp_sum[] is written
constexpr unsigned kBarrierTilePrefix = 2;  // look-back warp -> data warps: s_tile_prefix is written


// Staged tiles: wait for the thread's copies one commit group at a time and add each group's vectors while
// the later groups are still in flight, so that when the last group lands only its share of the reduction
// is left before the aggregate can go out. Returns with every copy of this thread complete.
template <typename Op, int kGroup, int kGroups, int kVecs, int kVec, long long kStride, bool kSegmented, typename Stage,
          typename Acc = typename Op::Acc>
__device__ __forceinline__ Acc thread_sum_as_groups_land(const Stage& stage, long long first, long long from, Acc sum) {
  constexpr int kPerGroup = kVecs / kGroups;
  ck::cp_async_wait_group<kGroups - 1 - kGroup>();
  sum = thread_sum_from<Op, kGroup * kPerGroup, (kGroup + 1) * kPerGroup, kVec, kStride, kSegmented>(stage, first, from, sum);
  if constexpr (kGroup + 1 < kGroups) {
    return thread_sum_as_groups_land<Op, kGroup + 1, kGroups, kVecs, kVec, kStride, kSegmented>(stage, first, from, sum);
  } else {
    return sum;
  }
}

// Commit groups for a thread's kVecs staged vectors: up to 4, whole vectors each.
template <int kVecs>
constexpr int load_groups() {
  return kVecs % 4 == 0 ? 4 : kVecs % 3 == 0 ? 3 : kVecs % 2 == 0 ? 2 : 1;
}

// As scan_kernel, with kThreads data threads plus one look-back warp (blockDim = kThreads + 32). One CTA
// barrier remains (the tile claim); then two hand-overs:
//   data warps:     load + reduce -> sync(warp sums)   -> in-tile warp scans -> sync(tile prefix) -> store
//   look-back warp:                   sync(warp sums) -> publish A -> look back -> publish P -> arrive(prefix)
// so the look-back overlaps the in-tile scans, and no data warp waits for the look-back before its in-tile
// scan. The look-back waits only for the predecessors it sums (look_back<true>).
template <typename In, typename Out, typename Op, int kThreads, int kItems, int kVec, bool kSegmented, bool kExclusive,
          bool kStaged, bool kReverse>
__global__ void __launch_bounds__(kThreads + ck::kWarpSize)
scan_kernel_lookback_warp(const In* x, Out* y, long long n, long long row_len, unsigned* tile_counters, void* tile_states,
                          unsigned epoch, unsigned first_wave, unsigned ramp_step_ns) {
  using T = Tile<In, Out, Op, kThreads, kItems, kVec, kSegmented, kExclusive, kReverse>;
  using Acc = typename T::Acc;
  using Stage = typename ck::Conditional<kStaged, SharedStage<In, T::kVecs, kVec, T::kStride, kReverse>,
                                         RegisterStage<In, T::kVecs, kVec, T::kStride, kReverse>>::type;
  static_assert(kThreads + ck::kWarpSize <= 1024, "the data threads and the look-back warp fit in one CTA");
  static_assert(T::kWarps <= ck::kWarpSize, "the look-back warp sums one warp sum per lane");
  constexpr unsigned kAllThreads = kThreads + ck::kWarpSize;

  extern __shared__ __align__(16) unsigned char s_stage[];
  __shared__ unsigned s_tile;
  __shared__ Acc s_warp_sum[T::kWarps];                 // for the aggregate (masked plain sums)
  __shared__ Pair<Acc> s_warp_aggregate[T::kWarps];     // for each warp's prefix within the tile
  __shared__ Acc s_tile_prefix;

  const int lane = threadIdx.x % ck::kWarpSize;
  const int warp = threadIdx.x / ck::kWarpSize;
  if (threadIdx.x == 0) s_tile = claim_tile(tile_counters, epoch, first_wave, ramp_step_ns);
  __syncthreads();
  const long long tile = s_tile;
  const long long tile_start = tile * T::kSize;
  const long long tile_end = tile_start + T::kSize < n ? tile_start + T::kSize : n;
  const long long last_head = T::last_head(tile_start, tile_end, row_len);

  if (warp == T::kWarps) {  // the look-back warp
    const TileStates<Acc> states(tile_states, epoch);
    ck::barrier_sync(kBarrierWarpSums, kAllThreads);
    const Acc tile_aggregate = warp_reduce<Op>(lane < T::kWarps ? s_warp_sum[lane] : Op::identity());
    const bool aggregate_is_prefix = kSegmented ? last_head >= tile_start : tile == 0;
    const bool starts_segment = kSegmented ? tile_start % row_len == 0 : tile == 0;
    if (lane == 0) states.publish(tile, aggregate_is_prefix ? kStatusP : kStatusA, tile_aggregate);
    const Acc prefix = look_back_and_publish<true, Op>(states, tile, lane, starts_segment, aggregate_is_prefix,
                                                   tile_aggregate);
    if (lane == 0) s_tile_prefix = prefix;
    ck::barrier_arrive(kBarrierTilePrefix, kAllThreads);
    return;
  }

  const long long first = tile_start + T::offset_in_tile(warp, lane);
  const bool full = tile_end - tile_start == T::kSize;
  Stage stage;
  // The aggregate first: one reduction (staged: group by group as the copies land), then hand the warp sums
  // to the look-back warp.
  Acc thread_total;
  if constexpr (kStaged) {
    stage.s = reinterpret_cast<In*>(s_stage) + T::offset_in_tile(warp, lane);
    constexpr int kGroups = load_groups<T::kVecs>();
    stage.template load_in_groups<kGroups>(x, n, first);
    thread_total = thread_sum_as_groups_land<Op, 0, kGroups, T::kVecs, kVec, T::kStride, kSegmented>(stage, first, last_head, Op::identity());
  } else {
    stage.load(x, n, first, full);
    thread_total = thread_sum_from<Op, 0, T::kVecs, kVec, T::kStride, kSegmented>(stage, first, last_head);
  }
  const Acc warp_total = warp_reduce<Op>(thread_total);
  if (lane == 0) s_warp_sum[warp] = warp_total;
  ck::barrier_sync(kBarrierWarpSums, kAllThreads);

  // The in-tile scan, while the look-back runs.
  long long row_pos[T::kVecs];
  T::row_positions(first, row_len, row_pos);
  Pair<Acc> vector_prefix[T::kVecs];
  const Pair<Acc> warp_aggregate = T::warp_scan(stage, row_pos, row_len, lane, vector_prefix);
  if (lane == 0) s_warp_aggregate[warp] = warp_aggregate;
  ck::barrier_sync(kBarrierTilePrefix, kAllThreads);  // also: every data warp's aggregate is in shared memory
  Pair<Acc> warp_prefix{false, Op::identity()};
#pragma unroll
  for (int w = 0; w < T::kWarps; ++w)
    if (w < warp) warp_prefix = combine<kSegmented, Op>(warp_prefix, s_warp_aggregate[w]);

  T::store(y, n, first, full, stage, row_pos, row_len, warp_prefix, vector_prefix, s_tile_prefix);
}

// ---- Scans along a strided dim ----------------------------------------------------------------------
// x viewed as a contiguous (outer, length, inner) array with inner > 1, scanned along length (torch's
// dim): a column of length elements, inner apart, for every (outer, inner) pair. The columns are read as
// they lie, with no transposing copy: a tile is kWidth = kLanes * kVec adjacent columns, each thread holding
// kVec of them (one vector access per row), and the kThreads / kLanes row groups of a CTA take the rows of
// a step in blocks of kRows. Columns sit side by side in memory, so a CTA's row accesses are coalesced.
//
// Reduce, then scan: a column is cut into `chunks` chunks of rows_per_chunk rows (a multiple of the step),
// and a tile is one chunk of kWidth columns (grid: chains x chunks, a chain being the chunks of one
// (outer, column block)). column_reduce writes every tile's aggregate per column; column_scan then
// combines the aggregates of the chunks before its own (in the same chain; at most a few hundred, from L2),
// walks its chunk step by step carrying the running value, and stores. Two reads and one write of x
// instead of one and one, but no waiting between CTAs: a look-back here would wait on a chain of
// predecessors as long as the tiles one chain has in flight, one column per thread. With one chunk the
// host skips column_reduce.
// What a column tile reads, element by element of its columns: the values of x (the reductions), or the
// maps (a_t, x_t) of a linear recurrence (ColumnMaps, below the kernels' shared code).
template <typename In>
struct ColumnValues {
  using Element = In;
  const In* x;
  // The kVec elements at `offset` (logical row r of column `column` of outer index `outer`).
  template <int kVec>
  __device__ __forceinline__ ck::Array<In, kVec> load(long long offset, long long, long long, long long) const {
    return ck::load_stream(reinterpret_cast<const ck::Array<In, kVec>*>(x + offset));
  }
};

template <typename Src, typename Out, typename Op, int kThreads, int kLanes, int kVec, int kRows, bool kReverse>
struct ColumnTile {
  using Acc = typename Op::Acc;
  using Element = typename Src::Element;
  static_assert(kThreads % kLanes == 0 && kThreads <= 1024, "whole row groups");
  static constexpr int kWidth = kLanes * kVec;       // columns per tile
  static constexpr int kGroups = kThreads / kLanes;  // row groups per CTA
  static constexpr int kStep = kGroups * kRows;      // rows per step

  Src src;
  long long outer, outer_base;  // this tile's outer index and the element offset of its (row 0, column 0)
  long long length, inner, column;  // column: this thread's first column
  bool columns_in;  // this thread's columns exist (the last column block may be partial)
  int lane, group;

  __device__ __forceinline__ ColumnTile(const Src& src_, long long chain, long long length_, long long inner_,
                                        long long column_blocks)
      : src(src_), length(length_), inner(inner_) {
    lane = threadIdx.x % kLanes;
    group = threadIdx.x / kLanes;
    outer = chain / column_blocks;
    column = (chain % column_blocks) * kWidth + static_cast<long long>(lane) * kVec;
    columns_in = column < inner;  // the host picks kVec dividing inner: a vector is wholly in or out
    outer_base = outer * length * inner;
  }

  // The kVec elements of logical row r (0 <= r < length) in this thread's columns.
  __device__ __forceinline__ ck::Array<Element, kVec> load(long long r) const {
    const long long row = kReverse ? length - 1 - r : r;
    return src.template load<kVec>(outer_base + row * inner + column, outer, column, r);
  }
  // This thread's block of kRows rows from r0 into v (rows at or past end skipped; every load before the
  // first combine), combined into acc in row order.
  __device__ __forceinline__ void load_and_reduce(long long r0, long long end, ck::Array<Element, kVec> (&v)[kRows],
                                                  Acc (&acc)[kVec]) const {
#pragma unroll
    for (int k = 0; k < kRows; ++k)
      if (r0 + k < end) v[k] = load(r0 + k);
#pragma unroll
    for (int k = 0; k < kRows; ++k)
      if (r0 + k < end) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] = Op::combine(acc[e], Op::lift(v[k].v[e]));
      }
  }
  __device__ __forceinline__ void store(Out* y, long long r, const ck::Array<Out, kVec>& v) const {
    const long long row = kReverse ? length - 1 - r : r;
    ck::store_stream(reinterpret_cast<ck::Array<Out, kVec>*>(y + outer_base + row * inner + column), v);
  }
};

// One chunk's aggregate per column: aggregates[tile * kWidth + c] for the tile's columns c. The row groups'
// aggregates meet in shared memory and combine in group order. For a commutative operator the groups take
// the chunk's steps interleaved (group g the rows g * kRows .. of each step); for one that is not (a
// recurrence's maps) each group walks one contiguous block of the chunk's rows, so that its aggregate and
// the combination in group order keep the rows' order.
template <typename Src, typename Out, typename Op, int kThreads, int kLanes, int kVec, int kRows, bool kReverse>
__device__ __forceinline__ void reduce_column_chunk(const Src& src, typename Op::Acc* aggregates, long long length,
                                                    long long inner, long long column_blocks, long long chunks,
                                                    long long rows_per_chunk) {
  using T = ColumnTile<Src, Out, Op, kThreads, kLanes, kVec, kRows, kReverse>;
  using Acc = typename Op::Acc;
  __shared__ Acc s_group[T::kGroups][T::kWidth];
  const long long tile = blockIdx.x;
  T t(src, tile / chunks, length, inner, column_blocks);
  const long long begin = (tile % chunks) * rows_per_chunk;
  const long long end = begin + rows_per_chunk < length ? begin + rows_per_chunk : length;
  Acc acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = Op::identity();
  if (t.columns_in) {
    if constexpr (Op::kCommutative) {
      for (long long r0 = begin + t.group * kRows; r0 < end; r0 += T::kStep) {
        ck::Array<typename T::Element, kVec> v[kRows];
        t.load_and_reduce(r0, end, v, acc);
      }
    } else {
      const long long per_group = (end - begin + T::kStep - 1) / T::kStep * kRows;
      const long long group_begin = begin + t.group * per_group;
      const long long group_end = group_begin + per_group < end ? group_begin + per_group : end;
      for (long long r0 = group_begin; r0 < group_end; r0 += kRows) {
        ck::Array<typename T::Element, kVec> v[kRows];
        t.load_and_reduce(r0, group_end, v, acc);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) s_group[t.group][t.lane * kVec + e] = acc[e];
  __syncthreads();
  for (int c = threadIdx.x; c < T::kWidth; c += kThreads) {
    Acc total = Op::identity();
#pragma unroll 1
    for (int g = 0; g < T::kGroups; ++g) total = Op::combine(total, s_group[g][c]);
    aggregates[tile * T::kWidth + c] = total;
  }
}

// Scans one chunk: its prefix from the aggregates of the chunks before it, then step by step. Per step
// each thread scans its kRows rows in registers, the row groups' totals go through shared memory (two CTA
// barriers: the totals are written; they are read before the next step overwrites them), and each thread
// adds the groups before its own and the carry of the steps before. The prefix's groups take the earlier
// chunks interleaved for a commutative operator, in contiguous runs otherwise (then combined in group
// order, as the steps are).
template <typename Src, typename Out, typename Op, int kThreads, int kLanes, int kVec, int kRows, bool kExclusive,
          bool kReverse>
__device__ __forceinline__ void scan_column_chunk(const Src& src, Out* y, const typename Op::Acc* aggregates,
                                                  long long length, long long inner, long long column_blocks,
                                                  long long chunks, long long rows_per_chunk) {
  using T = ColumnTile<Src, Out, Op, kThreads, kLanes, kVec, kRows, kReverse>;
  using Acc = typename Op::Acc;
  __shared__ Acc s_group[T::kGroups][T::kWidth];
  const long long tile = blockIdx.x;
  const long long chunk = tile % chunks;
  T t(src, tile / chunks, length, inner, column_blocks);

  // The chunk's prefix per column: each row group combines its share of the earlier chunks' aggregates (one
  // vector of kVec columns per chunk, four chunks' loads in flight at a time).
  Acc carry[kVec];
  {
    Acc p[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[e] = Op::identity();
    using Vector = ck::Array<Acc, kVec>;
    const Vector* chain_aggregates = reinterpret_cast<const Vector*>(aggregates + (tile - chunk) * T::kWidth) + t.lane;
    if constexpr (Op::kCommutative) {
#pragma unroll 4
      for (long long c = t.group; c < chunk; c += T::kGroups) {
        const Vector a = chain_aggregates[c * kLanes];
#pragma unroll
        for (int e = 0; e < kVec; ++e) p[e] = Op::combine(p[e], a.v[e]);
      }
    } else {
      const long long per_group = (chunk + T::kGroups - 1) / T::kGroups;
      const long long first = t.group * per_group;
      const long long last = first + per_group < chunk ? first + per_group : chunk;
#pragma unroll 4
      for (long long c = first; c < last; ++c) {
        const Vector a = chain_aggregates[c * kLanes];
#pragma unroll
        for (int e = 0; e < kVec; ++e) p[e] = Op::combine(p[e], a.v[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) s_group[t.group][t.lane * kVec + e] = p[e];
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kVec; ++e) carry[e] = Op::identity();
  // (The loops over row groups stay rolled: unrolled, kGroups x kVec combines per loop made kernels of an
  // expensive operator take minutes to compile.)
#pragma unroll 1
  for (int g = 0; g < T::kGroups; ++g) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) carry[e] = Op::combine(carry[e], s_group[g][t.lane * kVec + e]);
  }

  const long long begin = chunk * rows_per_chunk;
  const long long end = begin + rows_per_chunk < length ? begin + rows_per_chunk : length;
  for (long long step = begin; step < end; step += T::kStep) {
    const long long r0 = step + t.group * kRows;
    ck::Array<typename T::Element, kVec> v[kRows];
    Acc total[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) total[e] = Op::identity();
    if (t.columns_in) t.load_and_reduce(r0, end, v, total);
    __syncthreads();  // the previous step's totals have been read
#pragma unroll
    for (int e = 0; e < kVec; ++e) s_group[t.group][t.lane * kVec + e] = total[e];
    __syncthreads();
    Acc running[kVec];
#pragma unroll 1
    for (int g = 0; g < t.group; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) carry[e] = Op::combine(carry[e], s_group[g][t.lane * kVec + e]);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) running[e] = carry[e];  // the row groups before this one's
#pragma unroll 1
    for (int g = t.group; g < T::kGroups; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) carry[e] = Op::combine(carry[e], s_group[g][t.lane * kVec + e]);
    }
    if (t.columns_in) {
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        if (r0 + k < end) {
          ck::Array<Out, kVec> out;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const Acc before = running[e];
            running[e] = Op::combine(running[e], Op::lift(v[k].v[e]));
            out.v[e] = to_output<Out>(kExclusive ? before : running[e]);
          }
          t.store(y, r0 + k, out);
        }
    }
  }
}

template <typename In, typename Out, typename Op, int kThreads, int kLanes, int kVec, int kRows, bool kReverse>
__global__ void __launch_bounds__(kThreads)
column_reduce(const In* x, typename Op::Acc* aggregates, long long length, long long inner, long long column_blocks,
              long long chunks, long long rows_per_chunk) {
  reduce_column_chunk<ColumnValues<In>, Out, Op, kThreads, kLanes, kVec, kRows, kReverse>(
      ColumnValues<In>{x}, aggregates, length, inner, column_blocks, chunks, rows_per_chunk);
}

template <typename In, typename Out, typename Op, int kThreads, int kLanes, int kVec, int kRows, bool kExclusive,
          bool kReverse>
__global__ void __launch_bounds__(kThreads)
column_scan(const In* x, Out* y, const typename Op::Acc* aggregates, long long length, long long inner,
            long long column_blocks, long long chunks, long long rows_per_chunk) {
  scan_column_chunk<ColumnValues<In>, Out, Op, kThreads, kLanes, kVec, kRows, kExclusive, kReverse>(
      ColumnValues<In>{x}, y, aggregates, length, inner, column_blocks, chunks, rows_per_chunk);
}

// ---- A linear recurrence along a strided dim (ck.linear_scan with inner > 1) ----------------------------
// The column kernels over the maps (a_t, x_t) of each column (a, or the one decay a_scalar with kScalarA,
// laid out as x): h0 (one value per (outer, column), as x's shape without the scanned dim) enters logical
// row 0 as the map (a, x + a h0), so that the composed map's b is h_t from h_{-1} = h0.
template <typename In, bool kScalarA, bool kH0>
struct ColumnMaps {
  using Element = Affine;
  const In* a;
  float a_scalar;
  const In* x;
  const float* h0;
  long long inner;
  template <int kVec>
  __device__ __forceinline__ ck::Array<Affine, kVec> load(long long offset, long long outer, long long column,
                                                           long long r) const {
    const auto xv = ck::load_stream(reinterpret_cast<const ck::Array<In, kVec>*>(x + offset));
    ck::Array<In, kVec> av;
    if constexpr (!kScalarA) av = ck::load_stream(reinterpret_cast<const ck::Array<In, kVec>*>(a + offset));
    ck::Array<Affine, kVec> maps;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float ae = kScalarA ? a_scalar : static_cast<float>(av.v[e]);
      float be = static_cast<float>(xv.v[e]);
      if constexpr (kH0) {
        if (r == 0) be = fmaf(ae, h0[outer * inner + column + e], be);
      }
      maps.v[e] = {ae, be};
    }
    return maps;
  }
};

template <typename In, int kThreads, int kLanes, int kVec, int kRows, bool kReverse, bool kScalarA, bool kH0>
__global__ void __launch_bounds__(kThreads, 1)
linear_column_reduce(const In* a, float a_scalar, const In* x, const float* h0, Affine* aggregates, long long length,
                     long long inner, long long column_blocks, long long chunks, long long rows_per_chunk) {
  reduce_column_chunk<ColumnMaps<In, kScalarA, kH0>, In, Linear, kThreads, kLanes, kVec, kRows, kReverse>(
      ColumnMaps<In, kScalarA, kH0>{a, a_scalar, x, h0, inner}, aggregates, length, inner, column_blocks, chunks,
      rows_per_chunk);
}

template <typename In, int kThreads, int kLanes, int kVec, int kRows, bool kReverse, bool kScalarA, bool kH0>
__global__ void __launch_bounds__(kThreads, 1)
linear_column_scan(const In* a, float a_scalar, const In* x, const float* h0, In* y, const Affine* aggregates,
                   long long length, long long inner, long long column_blocks, long long chunks,
                   long long rows_per_chunk) {
  scan_column_chunk<ColumnMaps<In, kScalarA, kH0>, In, Linear, kThreads, kLanes, kVec, kRows, false, kReverse>(
      ColumnMaps<In, kScalarA, kH0>{a, a_scalar, x, h0, inner}, y, aggregates, length, inner, column_blocks, chunks,
      rows_per_chunk);
}

}  // namespace scan
