// Sliding windows and sinks, for both attention sources (attention.cu's kWindow kernels and
// attention_sm90.cu's): which keys a row sees, which key tiles a query tile reads, and which of those need
// no mask. Templated on the kernel's parameter struct, which has n, m, causal, window_left, window_right and
// num_sinks (the host clamps window_left to M and window_right to N).
#pragma once

namespace attention_windows {

// Row i sees key j iff j < N, j <= i when causal, and (j < num_sinks or i - window_left <= j <= i +
// window_right). Rows past M count as none of a CTA's rows, so its tile range and its "full tile" test
// only answer for real rows (the others are computed on zero queries and never stored).

// The keys one row sees: the window lo .. hi (none when hi < lo) and the sinks 0 .. sinks - 1.
struct RowKeys {
  int lo, hi, sinks;
  RowKeys() = default;
  // 32-bit throughout (the host clamps window_left to M and window_right to N, so nothing overflows): the
  // masked tiles of the 16-bit kernels have no registers to spare for 64-bit bounds.
  template <typename Params>
  __device__ __forceinline__ RowKeys(const Params& p, int row) {
    lo = max(0, row - p.window_left);
    hi = p.window_right >= p.n - 1 - row ? p.n - 1 : row + p.window_right;
    sinks = min(p.num_sinks, p.n);
    if (p.causal) hi = min(hi, row), sinks = min(sinks, row + 1);
  }
  __device__ __forceinline__ bool sees(int key) const { return (key >= lo && key <= hi) || key < sinks; }
};

// A CTA's key tiles: the sink tiles 0 .. sink_tiles - 1, then the window's tiles from window_first (past
// the sink tiles), count in all; iteration i of the key loop reads tile(i). Rows m0 .. last real row.
struct KeyTiles {
  int sink_tiles, window_first, count;
  __device__ __forceinline__ int tile(int i) const { return i < sink_tiles ? i : window_first + (i - sink_tiles); }
};

template <int kBlockM, int kBlockN, typename Params>
__device__ __forceinline__ KeyTiles window_key_tiles(const Params& p, int m0) {
  const long long first_row = m0, last_row = min(m0 + kBlockM, p.m) - 1;
  long long hi = min(static_cast<long long>(p.n) - 1, last_row + p.window_right);
  long long sink_end = min(static_cast<long long>(p.num_sinks), static_cast<long long>(p.n));
  if (p.causal) hi = min(hi, last_row), sink_end = min(sink_end, last_row + 1);
  const long long lo = max(0LL, first_row - p.window_left);
  KeyTiles t;
  t.sink_tiles = static_cast<int>((sink_end + kBlockN - 1) / kBlockN);
  t.window_first = max(static_cast<int>(min(lo, static_cast<long long>(p.n)) / kBlockN), t.sink_tiles);
  const int window_end = hi >= lo ? static_cast<int>(hi / kBlockN) + 1 : 0;
  t.count = t.sink_tiles + max(0, window_end - t.window_first);
  return t;
}

// Whether every real row of the CTA sees every key of the tile at n0 (then it runs without the mask).
template <int kBlockM, int kBlockN, typename Params>
__device__ __forceinline__ bool window_tile_is_full(const Params& p, int m0, int n0) {
  const long long first_row = m0, last_row = min(m0 + kBlockM, p.m) - 1, last_key = n0 + kBlockN - 1;
  if (last_key >= p.n) return false;
  const long long sink_end = p.causal ? min(static_cast<long long>(p.num_sinks), first_row + 1) : p.num_sinks;
  if (last_key < sink_end) return true;
  if (p.causal && last_key > first_row) return false;
  return n0 >= last_row - p.window_left && last_key <= first_row + p.window_right;
}

}  // namespace attention_windows
