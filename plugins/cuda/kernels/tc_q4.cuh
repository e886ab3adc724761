// Tensor-core kernels for int4 weights (Q4_G64, Q4_ROW): y = W · x for a chunk of tokens, or the fused expert
// gate/up h = silu(gate · x) ⊙ (up · x), on mma.sync, for sm_90 and newer. Two modes (S):
//
//   S = kI8Splits (exact mode, the default): mma.m16n8k32 on signed bytes, int32 accumulation. A (weights) is
//        16 (nibble - 8) as a signed byte, made from a word of 8 nibbles by one lop3 per 4 (q4_i8_even/odd).
//        B holds each token as 4 columns, the int8 digit planes of a fixed-point form per 64-column group
//        (prep_operands.cu: x = 2^(e - 30) m, |m| <= 2^30, m = d0 + 256 d1 + 65536 d2 + 2^24 d3). A group's
//        int32 sums are exact (|sum| <= 2^20). A thread's two columns of a token are adjacent planes (p, p + 1,
//        p even): their sums are joined in int32 (s_p + 256 s_(p+1), |.| < 2^29), converted once (rounded to
//        f32's 24 bits) and added to the pair's f32 accumulator with the group multiplier 2^(e - 34) times the
//        group scale (exact: a power of two); the two pairs are combined at the end, the upper first. The
//        roundings are the encoding (2^-31 of the group's largest |x|), the pair's conversion and the f32
//        accumulation over the groups, so the result is an f32-accurate dot product (measured against
//        cpu_generic: below 1e-6 relative to the largest output).
//        A token's value never depends on the other tokens of the chunk, the chunk size or the n-tile count
//        (every output column of an mma is computed on its own), so prefill and decode agree bit for bit.
//   S = 1 (W4A16): mma.m16n8k16 on bf16, f32 accumulation; B is the activation rounded to bf16 (relative error
//        ~2^-9 per element; see plugins/cuda/README.md); A (nibble - 8) is exact in bf16 (q4_pair_bf16x2).
//        Each group of 64 columns is reduced by the tensor cores from zero, then added to the f32 accumulator
//        with its scale.
//
// Thread (g = lane / 4, q = lane % 4) of a warp owns, in every 64-column group, columns 16q .. 16q + 15 of rows
// g and g + 8 of its 16-row tile: one 8-byte load per row (two words w0, w1 of 8 nibbles). int8: k-step j
// (0, 1) of the group takes word j: its even nibbles are the k-slots 4q .. 4q + 3 of A, its odd ones
// 16 + 4q ..; bf16: k-step s (0..3) takes the nibble pairs (s, s + 4) of w0 and w1, i.e. columns
// 16q + {s, s+4, s+8, s+12}. The mma only needs A and B to agree on which column each k-slot is, so B is
// stored in that order (i8_pos, operand_slot): a thread's B values of a group are 16 contiguous bytes (int8:
// both k-steps, and the next group's beside them; bf16: two k-steps, so two loads).
// There is no shape constraint: rows past the matrix are computed from a clamped row and never stored; columns
// are padded to 64 with zero activations.
//
// Split K: a block's 4 warps split the work by parts (a 16-row tile of a matrix) and K slices. linear:
// kTcLinearTiles = 4 16-row tiles (64 rows), one warp each over the whole K (since run32: a GLM-5.2 down warp
// runs 8 load batches instead of 4 with two tiles in 2 slices, less of it pipeline start: the decode layer
// 57.2 -> 56.5 us queued at 1 row, 79.6 -> 77.3 at 3-4 rows, the projection shape at n = 4 45.3 -> 42.6;
// before, 4 slices of one tile had the down pass at 39 % of DRAM against gate/up's 54 %, ncu run8). gate/up
// (one matrix per warp keeps the registers low: a warp with both gate and up took 192 registers, 8 warps per
// SM), in KSG K slices (Settings::gate_up_slices): 2 (the default) one 16-row tile of h, warps 0-1 the gate and
// 2-3 the up matrix, each the half of K; 1: two 16-row tiles (32 rows), warps 0 and 2 the gate, 1 and 3 the up
// matrix of tiles 0 and 1, each over the whole K (runs 153-154, an H100: the wide kernels at 16-256 rows 11-12 %
// faster; the decode layer 0.3-1.7 us slower on the full card, 1.8-5.5 faster on the H200 stand-in). A slice is a
// whole number of load batches (KS slices of n groups: slice w is [w L, (w + 1) L) with L = U * ceil(n / (KS
// U))); each is summed as above, then a part's slices are added in order (s0 + s1) through shared memory. The
// split depends only on the matrix shape and kind and the setting, never on the token count, so a token's
// value is the same in any chunk (prefill == decode); the two gate/up splits give different bits.
#pragma once

#include <type_traits>

#include "device_util.cuh"

namespace strata_cuda {

// Blocks per SM asked of the register allocator. W4A16 (bf16): gate/up with 1 n-tile 96 registers (20 warps
// per SM), 2 n-tiles 128 (16), 3-4 n-tiles 168 (12); linear (its epilogue needs a few more) one step less
// below 3 n-tiles. Exact (int8, units of two groups): 128 registers (16 warps per SM) with 1 n-tile, 168 (12)
// with more. sm_90, nvcc 13 (tools/sass_loops.py): the exact instances up to 2 n-tiles and the layer kernel's
// have no spill; 2-8 spill loads (from L1) run in each main-loop iteration of 32-128 mma in the W4A16 gate/up
// instances, the W4A16 Q4_G64 4-n-tile linear, the exact 4-n-tile gate/up and the exact Q4_ROW 4-n-tile
// linear (so since 4782298 at least); not measured against asking a block less.
constexpr int tc_min_blocks(int s, int nt, bool gate_up) {
  if (s == kI8Splits) return nt <= 1 ? 4 : 3;
  return (nt <= 1 ? 5 : nt <= 2 ? 4 : 3) - (gate_up || nt > 2 ? 0 : 1);
}

// The weight pipeline of both modes: a warp's nb batches through two register buffers (wa/sa, wb/sb: weights,
// and their Q4_G64 scales). Batches 0 and 1 are requested before waiting for the previous kernel (the
// operand's producer; wait_inputs(), called by every warp of the block): with a dependent launch they load
// while its last wave runs. Then batch i runs while batch i + 1 loads. load_w(w, s): the next batch into a
// buffer; first(): what the first batch needs besides (its B values); run(w, s, last, parity): parity is 0 for
// the batches in wa (0, 2, ..), 1 for those in wb (a constant at each inlined call).
// primed (0..2): the first batches already sit in wa (and wb), loaded by the tile before on this block (the
// persistent layer kernel); skip_w() advances the pointers past one of them instead. near_end(): called once
// as the last two batches begin (the layer kernel takes its next ticket there).
template <class W, class LoadW, class SkipW, class Wait, class First, class Run, class NearEnd>
__device__ __forceinline__ void run_batches(int nb, W& wa, W& wb, float4 (&sa)[2], float4 (&sb)[2], LoadW&& load_w,
                                            SkipW&& skip_w, int primed, Wait&& wait_inputs, First&& first,
                                            Run&& run, NearEnd&& near_end) {
  if (nb > 0) {
    if (primed > 0)
      skip_w();
    else
      load_w(wa, sa);
  }
  if (nb > 1) {
    if (primed > 1)
      skip_w();
    else
      load_w(wb, sb);
  }
  wait_inputs();
  if (nb <= 0) return;
  first();
  for (int bi = 0; bi < nb; bi += 2) {
    if (bi + 2 >= nb) near_end();
    if (bi > 0 && bi + 1 < nb) load_w(wb, sb);  // (the first was loaded before the wait)
    run(wa, sa, bi + 1 == nb, 0);
    if (bi + 1 < nb) {
      if (bi + 2 < nb) load_w(wa, sa);
      run(wb, sb, bi + 2 == nb, 1);
    }
  }
}

// Exact mode, group k (0, 1) of a unit for one n-tile: w[0], w[1] the unit's words of rows g, g + 8 (x, y: group
// 0's two words; z, w: group 1's), bv the n-tile's B values of the group's two k-steps. Its two chained mma
// (word j feeds k-step j: its even nibbles k-slots 4q.., its odd ones 16 + 4q..), then each row's plane pair
// joined in int32 and added with the factor sc * mult (Q4_ROW: mult) to acc_g (row g) and acc_h (row g + 8).
// |c| <= 64 * 128 * 128 = 2^20, so a plane pair's c[0] + 256 c[1] < 2^29 in int32 (one conversion instead of
// two: sm_90, 2 instructions less per group and n-tile, half the accumulators); the multiplier times the scale
// is exact (a power of 2). The narrow kernels' units and the wide kernels' last groups run this.
template <bool kGrouped>
__device__ __forceinline__ void i8_group(const uint4 (&w)[2], int k, uint4 bv, uint32_t magic, float sg, float sh,
                                         float mult, float& acc_g, float& acc_h) {
  int32_t c[4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint32_t wg = k == 0 ? (j == 0 ? w[0].x : w[0].y) : (j == 0 ? w[0].z : w[0].w);
    const uint32_t wh = k == 0 ? (j == 0 ? w[1].x : w[1].y) : (j == 0 ? w[1].z : w[1].w);
    const uint32_t a0 = q4_i8_even(wg, magic), a1 = q4_i8_even(wh, magic);
    const uint32_t a2 = q4_i8_odd(wg, magic), a3 = q4_i8_odd(wh, magic);
    const uint32_t b0 = j == 0 ? bv.x : bv.z, b1 = j == 0 ? bv.y : bv.w;
    if (j == 0) {
      mma_s8_16832(c, a0, a1, a2, a3, b0, b1, 0, 0, 0, 0);
    } else {
      mma_s8_16832(c, a0, a1, a2, a3, b0, b1, c[0], c[1], c[2], c[3]);
    }
  }
  const float f0 = kGrouped ? sg * mult : mult;
  const float f1 = kGrouped ? sh * mult : mult;
  acc_g = fmaf(f0, static_cast<float>(c[0] + 256 * c[1]), acc_g);
  acc_h = fmaf(f1, static_cast<float>(c[2] + 256 * c[3]), acc_h);
}

// One warp's share of tile bx of a work item: its matrix, its two rows (g, g + 8 of its 16-row tile; rows past
// the matrix clamped to the last, their results never stored) and its K slice of 64-column groups,
// [g_first, n_groups), whole batches of U. Depends on the shape only. false: the tile is past the item's rows
// (the whole block).
// The block's 4 warps: kParts parts x KS K slices (warp w: slice w % KS of part w / KS); a part is 16-row tile
// part / kMats of matrix part % kMats. gate/up: KSG slices (2: one row tile, parts gate and up; 1: two row
// tiles, parts gate 0, up 0, gate 1, up 1); linear: kTcLinearTiles row tiles of its matrix, one slice each
// (KSG does not apply: linear instances take the default).
template <bool GATE_UP, int KSG = 2>
struct TileShape {
  static constexpr int kMats = GATE_UP ? 2 : 1;
  static constexpr int KS = GATE_UP ? KSG : 1;
  static constexpr int kRowTiles = kTcWarps / (kMats * KS);  // 16-row tiles of the block's output
  static constexpr int kParts = kMats * kRowTiles;
  static constexpr int U = 4;  // 64-column groups per load batch
  static_assert((KSG == 1 || KSG == 2) && kParts * KS == kTcWarps && (kRowTiles & (kRowTiles - 1)) == 0,
                "parts of KS warps");
  static_assert(!GATE_UP || kRowTiles * kTcRowsPerBlock == tc_gate_up_rows(KSG), "work.hpp's block rows");
};
struct WarpSlice {
  const DevMatrix* mat;
  int m0, part, n_groups_all, g_first, n_groups;
  int rows[2];
  int tile_d = 0;  // MT = 2: rows from the warp's first 16-row tile to its second (16; 0 past the matrix)
};
// K slice s of KS (whole batches of U groups: [s L, (s + 1) L) with L = U ceil(n / (KS U))) of a matrix of
// n_all groups, and this thread's rows g, g + 8 of the 16-row tile at row tb. TILES: the matrices are known to be
// in kTiles, whose rows are padded to a multiple of 16: the rows are the tile's own (rows[1] = rows[0] + 8; a
// tile past the matrix is its last one), never clamped one by one. The wide kernels' warps share it.
__device__ __forceinline__ int slice_groups(int n_all, int ks, int u) { return (n_all + ks * u - 1) / (ks * u) * u; }
template <bool TILES>
__device__ __forceinline__ void slice_rows(WarpSlice& ws, int n_all, int ks, int u, int s, int tb, int g,
                                           int rows_out) {
  ws.n_groups_all = n_all;
  const int slice = slice_groups(n_all, ks, u);
  ws.g_first = imin(s * slice, n_all);
  ws.n_groups = imin(ws.g_first + slice, n_all);
  if (TILES) {
    ws.rows[0] = imin(tb, (rows_out - 1) & ~15) + g;
    ws.rows[1] = ws.rows[0] + 8;
  } else {
    ws.rows[0] = imin(tb + g, rows_out - 1);
    ws.rows[1] = imin(tb + g + 8, rows_out - 1);
  }
}
// MT (1, 2): 16-row tiles per warp (2: the layer kernel's two-row-tile form, TILES only; a block's rows double,
// and the warp's second tile is the next 16 rows of its matrix, clamped to the last).
template <bool GATE_UP, bool TILES = false, int MT = 1, int KSG = 2>
__device__ __forceinline__ bool warp_slice(const WorkItem& it, int bx, int warp, int g, WarpSlice& ws) {
  using Sh = TileShape<GATE_UP, KSG>;
  static_assert(MT == 1 || (MT == 2 && TILES), "two row tiles per warp only in kTiles");
  const int rows_out = it.w0.rows;
  ws.part = warp / Sh::KS;
  ws.m0 = bx * (Sh::kRowTiles * kTcRowsPerBlock * MT);
  if (ws.m0 >= rows_out) return false;
  // (a block of one row tile, parts 0 and 1 at most: no arithmetic on part where none is needed; sm_90: the
  // lean 2-n-tile layer instance's spills 2 -> 13 with `part % 2` and `part / 2` there)
  const int rt = Sh::kRowTiles == 1 ? 0 : ws.part / Sh::kMats;
  ws.mat = GATE_UP && (Sh::kRowTiles == 1 ? ws.part == 1 : (ws.part & 1) == 1) ? &it.w1 : &it.w0;
  const int tb = ws.m0 + 16 * MT * rt;
  slice_rows<TILES>(ws, it.w0.kp / kColPad, Sh::KS, Sh::U, warp % Sh::KS, tb, g, rows_out);
  ws.tile_d = MT == 2 ? imin(tb + 16, (rows_out - 1) & ~15) - imin(tb, (rows_out - 1) & ~15) : 0;
  return true;
}

// A warp's weight stream over its slice: byte b of row rows[0] is at q4_row_byte(mat, rows[0], b) from the
// data, row rows[1]'s w_d further (in tiles: 512); a 128-column unit (64 bytes of a row) is w_u bytes after the
// previous (tiles: 1024). w0: the next load of thread q (columns 16q .. of the next group). Q4_G64 scales: in
// both layouts a batch's 4 groups of scales per row are adjacent (row rows[1]'s s_d further) and the next
// batch's are 1/8 of the weights' distance further (rows in order: 16 bytes for 128; tiles: 256 for 2048).
// TIED: s = s0 - w0 / 8, and the scales of the batch at w are at s + w / 8 (no second pointer to advance);
// otherwise s0 is the next batch's scales, advanced by s_b floats per batch. Which is faster is
// the compiler's schedule: TIED for the exact instances of up to 2 n-tiles (the layer kernel's; with a second
// pointer its lean 2-n-tile instance loaded B later and ran 3.5 us slower at 3-4 rows), the pointer for the
// others (TIED made the 4-n-tile exact instances spill: 8 rows 4 us slower; H100, runs 64-67).
struct WeightStream {
  const uint8_t* w0;
  intptr_t s;          // TIED
  const float* s0;     // not TIED
  int32_t w_d, s_d, s_b;
  int w_u;
  int32_t w_m, s_m;  // MT = 2 (TILES): the second row tile's weights (bytes) and scales (floats) from the first
  int32_t su;        // MT = 2: units loaded (their parity places a unit's scales in its 4-group block)
  bool scales_x4;  // a batch's U scales per row as one 16-byte load
  bool tiles;      // kTiles: a thread's bytes of a unit's two groups side by side (ld_unit_row)
};
template <int S, int NT>
inline constexpr bool kTiedScales = S == kI8Splits && NT <= 2;
// TILES (warp_slice's): every distance is a constant, so each address of a batch is a base plus immediates
// (sm_90: the layer kernel's main loop 383 -> 336 instructions per 4 KB of weights).
template <bool kGrouped, bool TIED, bool TILES = false>
__device__ __forceinline__ WeightStream weight_stream(const WarpSlice& ws, int q) {
  const DevMatrix& mat = *ws.mat;
  const bool tiles = TILES || mat.layout == kTiles;
  WeightStream st;
  const uint8_t* wbase = static_cast<const uint8_t*>(mat.data);
  static_assert(TileShape<true>::U == 4 && TileShape<false>::U == 4, "a batch is a 4-group scale block");
  const float* s0;
  if (TILES) {
    st.w_d = 512;  // rows g + 8 and g of a tile (tile_scale_row: 8 rows of 4 scales)
    st.s_d = 32;
    st.w0 = wbase + q4_tile_byte(mat, ws.rows[0], q * 8 + ws.g_first * 32);
    s0 = mat.scales + (kGrouped ? tile_scale_row(ws.rows[0], mat.kp / kColPad) : ws.rows[0]);
    st.w_m = static_cast<int32_t>(ws.tile_d * mat.stride);
    st.s_m = (ws.tile_d >> 4) * ((mat.kp / kColPad + 3) >> 2) * 64;
    st.su = 0;
  } else {
    st.w_d = static_cast<int32_t>(q4_row_byte(mat, ws.rows[1], 0) - q4_row_byte(mat, ws.rows[0], 0));
    const float* sp[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) sp[rr] = mat.scales + (kGrouped ? q4_scale_row(mat, ws.rows[rr]) : ws.rows[rr]);
    st.s_d = static_cast<int32_t>(sp[1] - sp[0]);
    st.w0 = wbase + q4_row_byte(mat, ws.rows[0], q * 8 + ws.g_first * 32);
    s0 = sp[0];
  }
  st.w_u = tiles ? 1024 : 64;
  st.tiles = tiles;
  st.scales_x4 = tiles || (ws.n_groups_all & 3) == 0;
  s0 += q4_scale_grp(tiles, ws.g_first);  // (g_first: a multiple of 4)
  if (TIED) {
    st.s = reinterpret_cast<intptr_t>(s0) - (reinterpret_cast<intptr_t>(st.w0) >> 3);
  } else {
    st.s0 = s0;
    st.s_b = tiles ? 64 : 4;
  }
  return st;
}
// The scales of the batch whose weights (row rows[0], thread q) start at w (w - st.w0: a multiple of 128; not
// TIED: w is the stream's next batch).
template <bool TIED>
__device__ __forceinline__ const float* scale_at(const WeightStream& st, const uint8_t* w) {
  if (TIED) return reinterpret_cast<const float*>(st.s + (reinterpret_cast<intptr_t>(w) >> 3));
  (void)w;
  return st.s0;
}
// The scale pointer past one batch (not TIED; TIED: nothing to do).
template <bool TIED>
__device__ __forceinline__ void next_scales(WeightStream& st) {
  if (!TIED) st.s0 += st.s_b;
}

// The Q4_G64 scales (U per row) of the batch at w into sv.
template <bool kGrouped, bool TIED>
__device__ __forceinline__ void load_scales(float4 (&sv)[2], const WeightStream& st, const uint8_t* w) {
  if (kGrouped) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float* sr = scale_at<TIED>(st, w) + rr * st.s_d;
      sv[rr] = st.scales_x4 ? __ldg(reinterpret_cast<const float4*>(sr))
                            : make_float4(__ldg(sr), __ldg(sr + 1), __ldg(sr + 2), __ldg(sr + 3));
    }
  }
}

// Exact mode: a row's 16 bytes of a unit: its group-0 and group-1 words (the second absent in a last half unit).
// tiles: one 16-byte load (kTiles: a thread's 8 bytes of each group side by side); rows in order: two 8-byte
// loads 32 bytes apart.
__device__ __forceinline__ uint4 ld_unit_row(const uint8_t* p, bool two, bool tiles) {
  if (tiles) {
    const uint4 v = ld_stream_u4(p);
    return two ? v : make_uint4(v.x, v.y, 0u, 0u);
  }
  const uint2 lo = ld_stream_u2(p), hi = two ? ld_stream_u2(p + 32) : make_uint2(0u, 0u);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}
// Exact mode: skip_i8_batch advances the stream past a batch (2 units of rows g, g + 8, and their scales);
// load_i8_batch loads it first.
template <bool kGrouped, bool TIED>
__device__ __forceinline__ void skip_i8_batch(WeightStream& st) {
  st.w0 += st.w_u * 2;
  if (kGrouped) next_scales<TIED>(st);
}
template <bool kGrouped, bool TIED>
__device__ __forceinline__ void load_i8_batch(uint4 (&wv)[2][2], float4 (&sv)[2], WeightStream& st) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    wv[u][0] = ld_unit_row(st.w0 + st.w_u * u, true, st.tiles);
    wv[u][1] = ld_unit_row(st.w0 + st.w_d + st.w_u * u, true, st.tiles);
  }
  load_scales<kGrouped, TIED>(sv, st, st.w0);
  skip_i8_batch<kGrouped, TIED>(st);
}

// Exact mode, two row tiles per warp (MT = 2, kTiles, not TIED: st.s0 is the next unit's scales): a batch is one
// unit of both tiles, wv[m][0], wv[m][1] tile m's rows g, g + 8; sv[0] (row g) and sv[1] (row g + 8) hold the
// unit's two group scales of tile 0 (x, y) and of tile 1 (z, w). A unit's scales are 8 bytes of its 4-group
// block (the first or second half of each row's 16 bytes), the next block 256 bytes on.
template <bool kGrouped>
__device__ __forceinline__ void skip_i8_pair(WeightStream& st) {
  st.w0 += 1024;
  if (kGrouped) st.s0 += (st.su & 1) != 0 ? 62 : 2;
  ++st.su;
}
template <bool kGrouped>
__device__ __forceinline__ void load_i8_pair(uint4 (&wv)[2][2], float4 (&sv)[2], WeightStream& st) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    wv[m][0] = ld_stream_u4(st.w0 + m * st.w_m);
    wv[m][1] = ld_stream_u4(st.w0 + m * st.w_m + 512);
  }
  if (kGrouped) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float2 a = __ldg(reinterpret_cast<const float2*>(st.s0 + rr * 32));
      const float2 b = __ldg(reinterpret_cast<const float2*>(st.s0 + st.s_m + rr * 32));
      sv[rr] = make_float4(a.x, a.y, b.x, b.y);
    }
  }
  skip_i8_pair<kGrouped>(st);
}

// The exact-mode weight registers of a warp: two batches (see run_batches). The persistent layer kernel keeps
// them across tiles, so a block loads its next tile's first batches before its current tile's epilogue.
struct I8Regs {
  uint4 wa[2][2], wb[2][2];
  float4 sa[2], sb[2];
};
// Loads the first batches (up to 2) of tile bx of `it` (this thread's warp's slice) into r; returns how many.
// (The layer kernel's: exact, up to 2 n-tiles, resident tiles, so its scales are TIED and its strides TILES.)
// MT: row tiles per warp (MT = 2: batches of one unit of both, load_i8_pair).
template <int FMT, bool GATE_UP, int MT = 1, int KSG = 2>
__device__ __forceinline__ int prime_i8_tile(const WorkItem& it, int bx, I8Regs& r) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  WarpSlice ws;
  if (!warp_slice<GATE_UP, true, MT, KSG>(it, bx, warp, lane >> 2, ws)) return 0;
  constexpr bool kGrouped = FMT == kQ4G64;
  WeightStream st = weight_stream<kGrouped, MT == 1, true>(ws, lane & 3);
  const int nb = (ws.n_groups - ws.g_first) / (MT == 1 ? TileShape<GATE_UP>::U : 2);
  if constexpr (MT == 1) {
    if (nb > 0) load_i8_batch<kGrouped, true>(r.wa, r.sa, st);
    if (nb > 1) load_i8_batch<kGrouped, true>(r.wb, r.sb, st);
  } else {
    if (nb > 0) load_i8_pair<kGrouped>(r.wa, r.sa, st);
    if (nb > 1) load_i8_pair<kGrouped>(r.wb, r.sb, st);
  }
  return imin(nb, 2);
}

// What a tile does for the launch around it beyond its own work (the persistent layer kernel; NoCarry: nothing).
// kOn: the exact-mode weight registers are regs(), of which primed() batches are loaded already, and the
// epilogue stages through stage() (shared memory of the launch's tiles of both kinds); near_end()
// as the last two batches begin; before_stage() before the epilogue's shared-memory staging; refill() right
// after its barrier (the next tile's first loads, while this one's epilogue runs); skip() instead of all of
// these for a tile past the item's rows (called by the whole block: it may hold a barrier).
struct NoCarry {
  static constexpr bool kOn = false;
  __device__ __forceinline__ int primed() const { return 0; }
  __device__ __forceinline__ void near_end() {}
  __device__ __forceinline__ void before_stage() {}
  __device__ __forceinline__ void refill() {}
  __device__ __forceinline__ void skip() {}
};
// The epilogue's staging: the carry's (the layer kernel's one buffer for its gate/up and its down tiles; with a
// buffer per instance it had twice the shared memory, which the L1 holding the B operands gives up) or the
// tile's own.
template <class Stage, class Carry>
__device__ __forceinline__ Stage& stage_buffer(Carry& carry) {
  if constexpr (std::decay_t<Carry>::kOn) {
    return *reinterpret_cast<Stage*>(carry.stage());
  } else {
    (void)carry;
    __shared__ Stage own;
    return own;
  }
}
template <class Carry>
__device__ __forceinline__ I8Regs& pick_regs(Carry& carry, I8Regs& own) {
  if constexpr (std::decay_t<Carry>::kOn) {
    (void)own;
    return carry.regs();
  } else {
    (void)carry;
    return own;
  }
}

// One block's work: tile(s) bx of item `it`. wait_inputs() returns once the operand (and anything else an
// earlier launch or block writes) may be read; every warp calls it once (block-uniformly: it may hold a
// barrier). FRESH: the operand and its multipliers are written during this launch (the layer kernel's down
// tiles), so they are read with weak loads ordered after wait_inputs' acquire, never through the read-only
// path (ld_weak_u4). AHEAD_B: each unit's (group's) B values are loaded one unit ahead, in a second set of
// registers (by default up to 2 n-tiles); without, just before their k-steps. TILES: the item's matrices are
// in kTiles (the layer kernel's; see warp_slice, weight_stream). MT (exact mode, TILES): 16-row tiles per warp; with
// 2, each B value loaded feeds both (half the B loads per weight byte) and the block's rows double; every row's
// arithmetic, K slices and order are the same, so the same bits.
template <int FMT, int S, int NT, bool GATE_UP, bool FRESH = false, bool AHEAD_B = (NT <= 2), bool TILES = false,
          int MT = 1, int KSG = 2, class Wait, class Carry = NoCarry>
__device__ __forceinline__ void tc_q4_tile(const WorkItem& it, int bx, Wait&& wait_inputs, Carry&& carry = Carry{}) {
  static_assert(FMT == kQ4G64 || FMT == kQ4Row, "int4 formats only");
  static_assert(kTcWarps == 4, "4 warps per tile");
  static_assert(S == kI8Splits || S == 1, "exact (int8 digit planes) or W4A16 (bf16) operands");
  constexpr bool kI8 = S == kI8Splits;
  static_assert(kI8 || !std::decay_t<Carry>::kOn, "a carry only in exact mode");
  static_assert(MT == 1 || (MT == 2 && kI8 && TILES), "two row tiles per warp: exact mode, kTiles");
  constexpr int kColsPerTok = kI8 ? kI8Planes : 1;  // operand columns per token
  using Shape = TileShape<GATE_UP, KSG>;
  constexpr int KS = Shape::KS;
  constexpr int U = Shape::U;
  constexpr bool kGrouped = FMT == kQ4G64;

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rows_out = it.w0.rows;
  WarpSlice ws;
  if (!warp_slice<GATE_UP, TILES, MT, KSG>(it, bx, warp, g, ws)) {  // the whole block (m0 depends on the block only)
    carry.skip();
    return;
  }
  const int m0 = ws.m0;
  const int kp = it.w0.kp;
  const int n_groups_all = ws.n_groups_all;
  const int g_first = ws.g_first, n_groups = ws.n_groups;
  constexpr bool kTied = kTiedScales<S, NT> && MT == 1;  // (MT = 2: load_i8_pair's own scale pointer)
  static_assert(kTied || MT == 2 || !std::decay_t<Carry>::kOn, "the layer kernel's first batches are loaded TIED");
  WeightStream st = weight_stream<kGrouped, kTied, TILES>(ws, q);
  // This thread's B column is g of each n-tile. With one n-tile, a thread whose column holds no token (at one
  // decode token, int8: 4 of the 8 columns) loads the last live column instead: the address of another lane's
  // load (no more L1 traffic), and no predicate or zeroing (sm_90: 24 instructions less per 4 KB of weights in
  // the layer kernel than feeding zeros). Such an output column belongs to no token and is never stored.
  // (With more n-tiles every column is loaded: the clamp per n-tile costs registers.)
  constexpr int kElem = kI8 ? 1 : 2;  // bytes per operand element
  const int g_b = NT == 1 ? imax(imin(g, it.n_tok * kColsPerTok - 1), 0) : g;
  const uint8_t* bp = static_cast<const uint8_t*>(it.in) + static_cast<int64_t>(g_b) * kp * kElem;
  const int64_t ntile_stride = static_cast<int64_t>(8) * kp * kElem;  // bytes
  // int8: the group multipliers of this thread's output columns 2q, 2q + 1 (token q / 2 of each n-tile).
  auto ld_m = [](const float* a) { return FRESH ? ld_weak_f32(a) : __ldg(a); };
  const float* mp = reinterpret_cast<const float*>(static_cast<const uint8_t*>(it.in) + NT * ntile_stride) +
                    static_cast<int64_t>(q >> 1) * n_groups_all;

  float accm[MT][NT][4];  // per row tile
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) accm[m][t][i] = 0.0f;
  auto& acc = accm[0];
  // The conversion constant (bf16: 0x43004300, see q4_pair_bf16x2; int8: 0x80808080, see q4_i8_bytes), or'ed
  // with a zero the compiler cannot prove (n_tok is never negative), so that it stays in a register.
  const uint32_t magic = (kI8 ? 0x80808080u : 0x43004300u) | (static_cast<uint32_t>(it.n_tok) >> 31);

  // With 3 or more n-tiles a second set of B registers would spill: there B is loaded just before its k-steps.
  constexpr bool kAheadB = AHEAD_B;
  // Q4_G64 scales of rows g, g + 8 from this warp's first group on (row g + 8's s_d further): a batch's U
  // scales per row as one 16-byte load when the row's group count allows it.
  const int n_mine = n_groups - g_first;  // g_first is a multiple of U
  const int nb = n_mine / (MT == 1 ? U : 2);  // whole batches (MT = 2: of one unit)
  // One 16-byte B load of n-tile t (k-steps 2h, 2h + 1) at p; zeros for a column past the tokens. fetch_b:
  // all of a unit's (int8) or group's (bf16) B values at p into registers, when they are loaded ahead.
  auto b_load = [&](const uint8_t* p, int t, int h) {
    const uint8_t* a = p + t * ntile_stride + (kI8 ? 512 : 16) * h;  // (int8: the halves of a unit, i8_at)
    return FRESH ? ld_weak_u4(a) : ld_cached_u4(a);
  };
  auto fetch_b = [&](uint4 (&bv)[NT][2], const uint8_t* p) {
    if (kAheadB) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) bv[t][h] = b_load(p, t, h);
      }
    }
  };
  if constexpr (kI8) {
    // int8: units of two groups (128 columns, 64 bytes of a row). Thread q reads 8 bytes of each of its rows
    // from each group of the unit: columns 16q .. 16q + 15 of the group (row bytes 8q .. and 32 + 8q ..), as a
    // warp load of 8 rows x 32 bytes. Word j (0, 1) of a group's 8 bytes feeds k-step j of that group: even
    // nibbles k-slots 4q.., odd ones 16 + 4q.. (the operand's B bytes are in that order: i8_pos, thread q's 32
    // bytes of a unit at 32q, the first 16 its group-0 k-steps, the next 16 its group-1 ones). So every mma
    // takes one group's columns only: 4 per unit and n-tile, each group's two chained into its exact int32 sums.
    // (i8_at: unit u of this thread's column at u 1024 + 64 g_b, thread q's 16 bytes of each half at 16 q)
    const uint8_t* bnext =
        static_cast<const uint8_t*>(it.in) + g_b * 64 + q * 16 + static_cast<int64_t>(g_first / 2) * 1024;
    const float* mnext = mp + g_first;
    constexpr int UN = U / 2;  // units per batch
    static_assert(U % 2 == 0, "whole units per batch");
    // One unit: w[0], w[1] rows g, g + 8 (x, y: group 0's two words; z, w: group 1's); sg[k], sh[k] the scales
    // of its group k (rows g, g + 8); b(t, k) the B values of n-tile t for group k's two k-steps; mult[t][k];
    // `two`: both groups exist.
    auto mma_unit = [&](const uint4 (&w)[2], const float (&sg)[2], const float (&sh)[2], auto&& b,
                        const float (&mult)[NT][2], bool two) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (k == 1 && !two) break;  // warp-uniform
          i8_group<kGrouped>(w, k, b(t, k), magic, sg[k], sh[k], mult[t][k], acc[t][0], acc[t][2]);
        }
      }
    };
    // The next batch's weights and scales.
    auto load_w = [&](uint4 (&wv)[UN][2], float4 (&sv)[2]) { load_i8_batch<kGrouped, kTied>(wv, sv, st); };
    // The next unit's B values (kept, or only their address noted) and multipliers; advances the pointers.
    const uint8_t* b_at = bnext;
    auto load_b = [&](uint4 (&bv)[NT][2], float (&mv)[NT][2]) {
      fetch_b(bv, bnext);
      b_at = bnext;
      bnext += 1024;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        mv[t][0] = ld_m(mnext + 2 * t * n_groups_all);
        mv[t][1] = ld_m(mnext + 2 * t * n_groups_all + 1);
      }
      mnext += 2;
    };
    uint4 bc[NT][2] = {}, bn[NT][2] = {};
    float mc[NT][2] = {}, mn[NT][2] = {};
    auto from_c = [&](int t, int h) { return kAheadB ? bc[t][h] : b_load(b_at, t, h); };
    auto from_n = [&](int t, int h) { return bn[t][h]; };
    // A unit's B values and multipliers past the whole batches, at bnext (`two` false: a last half unit, its
    // second group zeros: column g_b's 64 bytes, thread q's 16 at 16 q, i8_at).
    auto load_rest_b = [&](uint4 (&bt)[NT][2], float (&mt)[NT][2], bool two) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        bt[t][0] = b_load(bnext, t, 0);
        bt[t][1] = two ? b_load(bnext, t, 1) : make_uint4(0u, 0u, 0u, 0u);
        mt[t][0] = ld_m(mnext + 2 * t * n_groups_all);
        mt[t][1] = two ? ld_m(mnext + 2 * t * n_groups_all + 1) : 0.0f;
      }
    };
    static_assert(UN == 2, "a batch is two units (c/n buffers alternate per unit)");
    auto run_batch = [&](const uint4 (&wv)[UN][2], const float4 (&sv)[2], bool last, int) {
      const float sg0[2] = {sv[0].x, sv[0].y}, sh0[2] = {sv[1].x, sv[1].y};
      const float sg1[2] = {sv[0].z, sv[0].w}, sh1[2] = {sv[1].z, sv[1].w};
      if (!kAheadB) {
        load_b(bc, mc);
        mma_unit(wv[0], sg0, sh0, from_c, mc, true);
        load_b(bc, mc);
        mma_unit(wv[1], sg1, sh1, from_c, mc, true);
        return;
      }
      load_b(bn, mn);
      mma_unit(wv[0], sg0, sh0, from_c, mc, true);
      if (!last) load_b(bc, mc);
      mma_unit(wv[1], sg1, sh1, from_n, mn, true);
    };
    // The weight registers: the carry's (the persistent layer kernel: its first batches may be loaded) or own.
    I8Regs own;
    I8Regs& R = pick_regs(carry, own);
    if constexpr (!std::decay_t<Carry>::kOn) {
      R.sa[0] = R.sa[1] = R.sb[0] = R.sb[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if constexpr (MT == 2) {
      // A batch is one unit of both row tiles (load_i8_pair): each n-tile's B values of a group are taken once
      // (b(t, k): loaded ahead, or a load) and feed tile 0's mma, then tile 1's. B ahead: batches in wa take
      // bc/mc and load the next unit's into bn/mn, those in wb the reverse.
      auto mma_pair = [&](const uint4 (&wv)[2][2], const float4 (&sv)[2], auto&& b, const float (&mult)[NT][2],
                          bool two) {
        const float sg[2][2] = {{sv[0].x, sv[0].y}, {sv[0].z, sv[0].w}};
        const float sh[2][2] = {{sv[1].x, sv[1].y}, {sv[1].z, sv[1].w}};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if (k == 1 && !two) break;  // warp-uniform
            const uint4 bv = b(t, k);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              i8_group<kGrouped>(wv[m], k, bv, magic, sg[m][k], sh[m][k], mult[t][k], accm[m][t][0],
                                 accm[m][t][2]);
            }
          }
        }
      };
      auto run_pair = [&](const uint4 (&wv)[2][2], const float4 (&sv)[2], bool last, int parity) {
        if (!kAheadB) {
          load_b(bc, mc);
          mma_pair(wv, sv, from_c, mc, true);
        } else if (parity == 0) {
          if (!last) load_b(bn, mn);
          mma_pair(wv, sv, from_c, mc, true);
        } else {
          if (!last) load_b(bc, mc);
          mma_pair(wv, sv, from_n, mn, true);
        }
      };
      auto load_pair = [&](uint4(&wv)[2][2], float4(&sv)[2]) { load_i8_pair<kGrouped>(wv, sv, st); };
      run_batches(
          nb, R.wa, R.wb, R.sa, R.sb, load_pair, [&] { skip_i8_pair<kGrouped>(st); }, carry.primed(), wait_inputs,
          [&] {
            if (kAheadB) load_b(bc, mc);
          },
          run_pair, [&] { carry.near_end(); });
      if (nb * 2 < n_mine) {  // a last odd group (the last slice of a matrix with an odd group count): a half unit
        const uint8_t* w1 = st.w0 + st.w_m;
        const uint4 w[2][2] = {{ld_unit_row(st.w0, false, true), ld_unit_row(st.w0 + 512, false, true)},
                               {ld_unit_row(w1, false, true), ld_unit_row(w1 + 512, false, true)}};
        float4 sv[2] = {};
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          if (kGrouped) sv[rr] = make_float4(__ldg(st.s0 + rr * 32), 0.0f, __ldg(st.s0 + st.s_m + rr * 32), 0.0f);
        }
        uint4 bt[NT][2];
        float mt[NT][2];
        load_rest_b(bt, mt, false);
        mma_pair(w, sv, [&](int t, int h) { return bt[t][h]; }, mt, false);
      }
    } else {
      run_batches(
          nb, R.wa, R.wb, R.sa, R.sb, load_w, [&] { skip_i8_batch<kGrouped, kTied>(st); }, carry.primed(),
          wait_inputs,
          [&] {
            if (kAheadB) load_b(bc, mc);
          },
          run_batch, [&] { carry.near_end(); });
    }
    // The remaining n_mine % U groups (only in the last slice of a matrix whose group count does not divide
    // evenly): a unit at a time. A last odd group is a half unit: its B bytes keep their chunks in order
    // (i8_pos), thread q's 16 at 16q, and its rows' second group is not loaded.
    const float* s_rem = scale_at<kTied>(st, st.w0);  // (the partial batch's: its groups adjacent)
    for (int r = nb * U; MT == 1 && r < n_mine; r += 2) {  // (MT = 2: its half unit above)
      const bool two = r + 1 < n_mine;  // warp-uniform
      const uint4 w[2] = {ld_unit_row(st.w0, two, st.tiles), ld_unit_row(st.w0 + st.w_d, two, st.tiles)};
      st.w0 += st.w_u;
      const int32_t s_d = st.s_d;
      const float sg[2] = {kGrouped ? __ldg(s_rem) : 0.0f, kGrouped && two ? __ldg(s_rem + 1) : 0.0f};
      const float sh[2] = {kGrouped ? __ldg(s_rem + s_d) : 0.0f, kGrouped && two ? __ldg(s_rem + s_d + 1) : 0.0f};
      s_rem += 2;
      uint4 bt[NT][2];
      float mt[NT][2];
      load_rest_b(bt, mt, two);
      bnext += 1024;
      mnext += 2;
      mma_unit(w, sg, sh, [&](int t, int h) { return bt[t][h]; }, mt, two);
    }
  } else {
    // bf16 (W4A16): the slice's groups in order, whole batches of U groups through the pipeline below, then
    // the remaining n_mine % U one at a time. The weights (and Q4_G64 scales) of a batch are loaded one batch
    // ahead (two register buffers), each group's B values one group ahead, so their L1/L2 latency hides behind
    // the previous group's mma (when loaded just before use, ncu showed 52-58 % of cycles without an eligible
    // warp). Pointers advance per load; no bounds checks inside a batch.
    // Row g + 8 is at most 8 rows past row g: one pointer per stream and 32-bit distances save registers.
    // Group u of a batch is at (u / 2) w_u + (u % 2) w_g (its unit, then its half: 32 bytes on in rows, 8 in
    // kTiles, q4_tile_byte).
    const uint8_t* w0 = st.w0;  // columns 16q .. 16q + 15
    const int w_u = st.w_u;
    const int w_g = st.tiles ? 8 : 32;  // group 1's 8 bytes of a unit from group 0's (see q4_tile_byte)
    const int32_t w_d = st.w_d;
    const uint8_t* bnext = bp + (q * 16 + static_cast<int64_t>(g_first) * kColPad) * kElem;
    // One group's mma: rows g, g + 8 (w[0], w[1]), its scales, b(t, h) (the B values of n-tile t for k-steps
    // 2h, 2h + 1: registers loaded ahead, or a load). Reduced from zero, then added with the group's scale.
    auto mma_group = [&](const uint2 (&w)[2], float sc0, float sc1, auto&& b) {
      float c[NT][4];
#pragma unroll
      for (int s2 = 0; s2 < 4; s2 += 2) {
        uint4 bh[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) bh[t] = b(t, s2 >> 1);
#pragma unroll
        for (int s = s2; s < s2 + 2; ++s) {
          const uint32_t a0 = q4_pair_bf16x2(w[0].x, s, magic), a1 = q4_pair_bf16x2(w[1].x, s, magic);
          const uint32_t a2 = q4_pair_bf16x2(w[0].y, s, magic), a3 = q4_pair_bf16x2(w[1].y, s, magic);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint32_t b0 = s == s2 ? bh[t].x : bh[t].z, b1 = s == s2 ? bh[t].y : bh[t].w;
            if (s == 0) {
              mma_bf16_16816(c[t], a0, a1, a2, a3, b0, b1, 0.0f, 0.0f, 0.0f, 0.0f);
            } else {
              mma_bf16_16816(c[t], a0, a1, a2, a3, b0, b1, c[t][0], c[t][1], c[t][2], c[t][3]);
            }
          }
        }
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (kGrouped) {
          acc[t][0] = fmaf(sc0, c[t][0], acc[t][0]);
          acc[t][1] = fmaf(sc0, c[t][1], acc[t][1]);
          acc[t][2] = fmaf(sc1, c[t][2], acc[t][2]);
          acc[t][3] = fmaf(sc1, c[t][3], acc[t][3]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][i] += c[t][i];
        }
      }
    };
    auto load_w = [&](uint2 (&wv)[U][2], float4 (&sv)[2]) {  // the next batch's weights and scales
      // A unit row's two groups as exact mode loads them (ld_unit_row: one 16-byte load in kTiles). (It spills a
      // few registers in the 1-2 n-tile instances; 8-byte loads through L1 were slower at most row counts,
      // run120-121.)
#pragma unroll
      for (int k = 0; k < U / 2; ++k) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const uint4 v = ld_unit_row(w0 + rr * w_d + k * w_u, true, st.tiles);
          wv[2 * k][rr] = make_uint2(v.x, v.y);
          wv[2 * k + 1][rr] = make_uint2(v.z, v.w);
        }
      }
      load_scales<kGrouped, kTied>(sv, st, w0);
      if (kGrouped) next_scales<kTied>(st);
      w0 += w_u * (U / 2);
    };
    // The next group's B values (kept in bv, or only their address noted in b_at); advances the pointer.
    const uint8_t* b_at = bnext;
    auto load_b = [&](uint4 (&bv)[NT][2]) {
      fetch_b(bv, bnext);
      b_at = bnext;
      bnext += kColPad * kElem;
    };
    uint4 bc[NT][2] = {}, bn[NT][2] = {};
    auto from_c = [&](int t, int h) { return kAheadB ? bc[t][h] : b_load(b_at, t, h); };
    auto from_n = [&](int t, int h) { return bn[t][h]; };
    // A batch: group u + 1's B values are requested before group u's mma (the c/n buffers swap roles every
    // group; U is even, so a batch starts and ends with the same roles). The last batch requests nothing past
    // the slice.
    static_assert(U % 2 == 0, "B buffers alternate per group");
    auto run_batch = [&](const uint2 (&wv)[U][2], const float4 (&sv)[2], bool last, int) {
      const float s_g[U] = {sv[0].x, sv[0].y, sv[0].z, sv[0].w}, s_h[U] = {sv[1].x, sv[1].y, sv[1].z, sv[1].w};
#pragma unroll
      for (int u = 0; u < U; u += 2) {
        if (!kAheadB) {
          load_b(bc);
          mma_group(wv[u], s_g[u], s_h[u], from_c);
          load_b(bc);
          mma_group(wv[u + 1], s_g[u + 1], s_h[u + 1], from_c);
          continue;
        }
        if (!last || u + 1 < U) load_b(bn);
        mma_group(wv[u], s_g[u], s_h[u], from_c);
        if (!last || u + 2 < U) load_b(bc);
        mma_group(wv[u + 1], s_g[u + 1], s_h[u + 1], from_n);
      }
    };
    uint2 wa[U][2], wb[U][2];
    float4 sa[2] = {}, sb[2] = {};
    run_batches(
        nb, wa, wb, sa, sb, load_w, [] {}, 0, wait_inputs,
        [&] {
          if (kAheadB) load_b(bc);
        },
        run_batch, [] {});
    const float* s_rem = scale_at<kTied>(st, w0);  // (the partial batch's: its groups adjacent)
    for (int r = nb * U; r < n_mine; ++r) {
      const int j = r - nb * U;  // within the last, partial batch
      const uint8_t* wr = w0 + (j >> 1) * w_u + (j & 1) * w_g;
      const uint2 w[2] = {ld_stream_u2(wr), ld_stream_u2(wr + w_d)};
      const float sg = kGrouped ? __ldg(s_rem + j) : 0.0f, sh = kGrouped ? __ldg(s_rem + j + st.s_d) : 0.0f;
      load_b(bc);
      mma_group(w, sg, sh, from_c);
    }
  }

  // Epilogue: the slices' accumulators (rows g, g+8; columns 2q, 2q+1 of each n-tile) go through shared memory;
  // then each (row, token) adds its matrices' slices in order (Q4_ROW: times the row scale), combines its digit
  // planes (int8) and is stored.
  constexpr int kCols = NT * 8 + 1;
  using Stage = float[kTcWarps][16 * MT][kCols];  // (row 16 m + i: row i of the warp's row tile m)
  Stage& stage = stage_buffer<Stage>(carry);
  carry.before_stage();
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if constexpr (kI8) {  // plane pair q % 2 of token 2 t + q / 2: column 4 t + q
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        stage[warp][16 * m + g][t * 4 + q] = accm[m][t][0];
        stage[warp][16 * m + g + 8][t * 4 + q] = accm[m][t][2];
      }
    } else {
      stage[warp][g][t * 8 + 2 * q] = acc[t][0];
      stage[warp][g][t * 8 + 2 * q + 1] = acc[t][1];
      stage[warp][g + 8][t * 8 + 2 * q] = acc[t][2];
      stage[warp][g + 8][t * 8 + 2 * q + 1] = acc[t][3];
    }
  }
  __syncthreads();
  carry.refill();
  // Column c of stage row i of part p (row tile p / kMats of matrix p % kMats), over the whole K; o: the output row.
  constexpr int kMats = Shape::kMats;
  auto total = [&](int p, int i, int c, int o) {
    float v = stage[p * KS][i][c];
#pragma unroll
    for (int w = 1; w < KS; ++w) v += stage[p * KS + w][i][c];
    if (!kGrouped) v *= __ldg((p % kMats == 1 ? it.w1.scales : it.w0.scales) + imin(o, rows_out - 1));
    return v;
  };
  const int n_tok = it.n_tok;
  constexpr int kTiles16 = Shape::kRowTiles * MT;  // 16-row tiles of the block's output
  constexpr int kRows = 16 * kTiles16;
  static_assert((kTiles16 & (kTiles16 - 1)) == 0, "a power of two of 16-row tiles");
  for (int idx = static_cast<int>(threadIdx.x); idx < kRows * n_tok; idx += kTcWarps * 32) {
    const int i = idx & 15, tile = (idx >> 4) & (kTiles16 - 1), r = idx / kRows;
    const int o = m0 + 16 * tile + i;
    if (o >= rows_out) continue;
    const int si = 16 * (tile % MT) + i;  // its stage row (in the warps of its row tile tile / MT)
    const int p0 = (tile / MT) * kMats;   // its first part (gate/up: the gate, then p0 + 1 the up matrix)
    // int8: the token's plane pairs (columns 2 r + 1: planes 2, 3; 2 r: planes 0, 1), the upper first.
    auto token = [&](int p) {
      if constexpr (kI8) {
        return total(p, si, 2 * r + 1, o) * 65536.0f + total(p, si, 2 * r, o);
      } else {
        return total(p, si, r, o);
      }
    };
    const float v0 = token(p0);
    if constexpr (GATE_UP) {
      store_h(it, r, o, silu(v0) * token(p0 + 1));
    } else {
      it.y[static_cast<int64_t>(r) * it.y_ld + o] = v0;
    }
  }
}

// TILES: every matrix of the launch is resident in kTiles (compile-time strides; exact mode only).
// KSG: gate/up K slices (TileShape; linear: the default only).
template <int FMT, int S, int NT, bool GATE_UP, bool TILES = false, int KSG = 2>
__global__ void __launch_bounds__(kTcWarps * 32, tc_min_blocks(S, NT, GATE_UP))
    tc_q4_kernel(const WorkItem* __restrict__ items) {
  grid_dep_launch();
  tc_q4_tile<FMT, S, NT, GATE_UP, false, (NT <= 2), TILES, 1, KSG>(items[blockIdx.y], static_cast<int>(blockIdx.x),
                                                                   [] { grid_dep_wait(); });
}

// Launches the instance for (splits, nt, tiles, ksg); cudaErrorInvalidValue for a combination that is not
// instantiated. tiles: every matrix of the items is resident in kTiles (exact mode: the TILES instances;
// W4A16 has none and reads them as any layout). ksg: gate/up K slices, 1 or 2 (linear: ignored).
template <int FMT, bool GATE_UP>
cudaError_t launch_tc_q4(int splits, int nt, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                         const Queue& on) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items));
  const dim3 block(kTcWarps * 32);
  auto with = [&](auto ksg_tag) {
    constexpr int K = decltype(ksg_tag)::value;
    auto run = [&](auto kernel) { return launch_kernel(kernel, grid, block, on, true, items); };
    auto exact = [&](auto tiles_tag) {
      constexpr bool T = decltype(tiles_tag)::value;
      if (nt == 1) return run(&tc_q4_kernel<FMT, kI8Splits, 1, GATE_UP, T, K>);
      if (nt == 2) return run(&tc_q4_kernel<FMT, kI8Splits, 2, GATE_UP, T, K>);
      if (nt == 3) return run(&tc_q4_kernel<FMT, kI8Splits, 3, GATE_UP, T, K>);
      if (nt == 4) return run(&tc_q4_kernel<FMT, kI8Splits, 4, GATE_UP, T, K>);
      return cudaErrorInvalidValue;
    };
    if (splits == kI8Splits) return tiles ? exact(std::true_type{}) : exact(std::false_type{});
    if (splits == 1 && nt == 1) return run(&tc_q4_kernel<FMT, 1, 1, GATE_UP, false, K>);
    if (splits == 1 && nt == 2) return run(&tc_q4_kernel<FMT, 1, 2, GATE_UP, false, K>);
    if (splits == 1 && nt == 4) return run(&tc_q4_kernel<FMT, 1, 4, GATE_UP, false, K>);
    return cudaErrorInvalidValue;
  };
  if (GATE_UP && ksg == 1) return with(std::integral_constant<int, GATE_UP ? 1 : 2>{});
  if (ksg != 1 && ksg != 2) return cudaErrorInvalidValue;
  return with(std::integral_constant<int, 2>{});
}

}  // namespace strata_cuda
