// The wide exact tensor-core kernels (prefill): tc_q4.cuh's exact mode for work items of kWideNt n-tiles (16
// tokens), in blocks of 8 warps that share each batch's operand through shared memory. Same bits as the narrow
// kernels for every token: the same K slices, the same group order within a slice, the same per-group int32
// sums, f32 conversions and fmas, the same epilogue (slices added in order, plane pairs combined upper first).
//
// Why: a narrow block (4 warps, 16 or 64 rows, at most 8 tokens) reads each token's operand from L2 once per
// block and the weights once per 8 tokens, and converts each weight nibble once per 8 tokens. At 512 rows per
// expert that is ~19 GB of L2 reads per GLM-5.2 layer (H100, a76b350: 5.0 ms, 62 TFLOP/s, instruction- and
// L2-bound). A wide block covers 32 rows of gate and of up (linear: 128 rows) for 16 tokens: its warps take the
// operand of each load batch from shared memory (one copy per block, by cp.async, the next batch's while one
// runs), and each warp converts a weight unit once for 8 n-tiles.
//
// Warps: warp w takes K slice w % KS of matrix (w / KS) % kMats (gate/up: gate, up) of row tile w / (KS kMats),
// i.e. gate/up 2 slices x 2 matrices x 2 row tiles (KSG 1: 1 x 2 x 4), linear 1 slice x 8 row tiles. Each runs
// its slice's whole batches of 4 groups with its weights in registers, one rolling batch (a unit's words of the
// next batch load as soon as the unit is converted), in step with the block: batch j of every slice is staged
// (stage j % kWideStages) before any warp computes it; a warp whose slice has fewer batches (the last slice of a
// K that does not divide evenly) only joins the barriers. The groups past the
// whole batches (K % 256 of a slice) then read their operand from global memory, as the narrow kernels do.
#pragma once

#include <atomic>

#include "tc_q4.cuh"

namespace strata_cuda {

constexpr int kWideWarps = 8;
// Batches of operand in flight: 2 (70,656 bytes a gate/up block, 35,840 a linear one) measured 11-12 % faster
// than 3 (106 KB) on an H100 at 16-512 rows per expert (run85), 2 blocks per SM either way: the shared memory
// left to the L1 is what differs. Every instance runs at the 128-register cap with a few spills (sm_90: 2-11
// spill instructions per main-loop iteration of 64 mma; tools/sass_loops.py); the forms without spills were
// slower (docs/benchmarks.md, runs 82-83).
constexpr int kWideStages = 2;
constexpr int kWideColBytes = 272;  // a column's 256 operand bytes of a batch + 16 (conflict-free 16-byte reads)

template <bool GATE_UP, int KSG = 2>
struct WideShape {
  static constexpr int NT = kWideNt;
  static constexpr int KS = TileShape<GATE_UP, KSG>::KS;  // the narrow kernels' K slices (the same bits)
  static constexpr int U = TileShape<GATE_UP, KSG>::U;    // groups per load batch
  static constexpr int kMats = GATE_UP ? 2 : 1;
  static constexpr int kRowTiles = kWideWarps / (KS * kMats);
  static constexpr int kRows = 16 * kRowTiles;  // output rows of a block
  static constexpr int kCols = NT * 8;  // operand columns of an item
  static constexpr int kTok = NT * 2;   // tokens of an item
  static constexpr int kSliceBytes = kCols * kWideColBytes;
  static constexpr int kMultOff = KS * kSliceBytes;  // a stage's multipliers: [KS][kTok][U] f32
  static constexpr int kStageBytes = kMultOff + KS * kTok * U * 4;
  static constexpr int kSmemBytes = kWideStages * kStageBytes;
  static_assert(kRows == (GATE_UP ? wide_gate_up_rows(KSG) : kWideRowsLinear), "work.hpp's block rows");
  static_assert(kWideWarps * 16 * (NT * 4 + 1) * 4 <= kSmemBytes, "the epilogue's staging fits the ring");
};

// 2 blocks per SM (128 registers; with 1 block and up to 255 registers, or 16 n-tiles per item in 1 block,
// the GLM-5.2 layer at 512 rows per expert took 4.0 ms instead of 3.75 on an H100; with each warp's weights and
// scales staged in shared memory too, 2 stages, also 4.0 ms).
template <int FMT, bool GATE_UP, bool TILES, int KSG = 2>
__global__ void __launch_bounds__(kWideWarps * 32, 2) tc_q4_wide_kernel(const WorkItem* __restrict__ items) {
  using Sh = WideShape<GATE_UP, KSG>;
  constexpr int KS = Sh::KS, U = Sh::U, NT = Sh::NT;
  constexpr bool kGrouped = FMT == kQ4G64;
  STRATA_DYN_SMEM(smem);
  grid_dep_launch();
  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rows_out = it.w0.rows;
  const int m0 = static_cast<int>(blockIdx.x) * Sh::kRows;
  if (m0 >= rows_out) return;  // (the whole block)
  const int kp = it.w0.kp;
  const int n_all = kp / kColPad;

  // This warp's slice and rows (the narrow kernels' K slices: slice_rows).
  const int my_slice = warp % KS, my_mat = (warp / KS) % Sh::kMats, rt = warp / (KS * Sh::kMats);
  const int slice = slice_groups(n_all, KS, U);
  auto first_of = [&](int s) { return imin(s * slice, n_all); };
  auto batches_of = [&](int s) { return (imin(first_of(s) + slice, n_all) - first_of(s)) / U; };
  WarpSlice ws;
  ws.mat = my_mat == 1 ? &it.w1 : &it.w0;
  ws.m0 = m0;
  ws.part = my_mat;
  slice_rows<TILES>(ws, n_all, KS, U, my_slice, m0 + 16 * rt, g, rows_out);
  const int nb_all = batches_of(0);  // slice 0 has the most
  const int n_mine = ws.n_groups - ws.g_first;
  const int nb = n_mine / U;

  // The weights: one batch in registers (wv, sv). Each unit's words are converted for the mma before its
  // n-tiles run, so the next batch's unit loads into them right after (rolling: one buffer, no second set of
  // registers); the first batch loads while the previous kernel (the operand's producer) finishes.
  WeightStream st = weight_stream<kGrouped, false, TILES>(ws, q);
  uint4 wv[2][2];
  float4 sv[2] = {};
  auto load_unit = [&](int uu) {  // unit uu of the batch at st.w0
    wv[uu][0] = ld_unit_row(st.w0 + st.w_u * uu, true, st.tiles);
    wv[uu][1] = ld_unit_row(st.w0 + st.w_d + st.w_u * uu, true, st.tiles);
  };
  auto load_scales_next = [&] {  // the batch's scales; the stream moves past it
    load_scales<kGrouped, false>(sv, st, st.w0);
    skip_i8_batch<kGrouped, false>(st);
  };
  if (nb > 0) {
    load_unit(0);
    load_unit(1);
    load_scales_next();
  }
  grid_dep_wait();

  // Batch j of every slice's operand (B bytes of the item's kCols columns, group multipliers of its kTok
  // tokens) into stage j % kWideStages; one commit per call, also when nothing is left to copy. Thread t copies
  // the 16-byte pieces t + 256 i: column t / 16 + 16 i, piece t % 16.
  const uint8_t* in = static_cast<const uint8_t*>(it.in);
  const float* mult = reinterpret_cast<const float*>(in + static_cast<int64_t>(Sh::kCols) * kp);
  constexpr int kPieces = Sh::kCols * 16 / (kWideWarps * 32);  // per thread and slice
  static_assert(Sh::kCols * 16 % (kWideWarps * 32) == 0 && Sh::kTok * U <= kWideWarps * 32, "copy shares");
  const int cp_col = static_cast<int>(threadIdx.x) >> 4, cp_piece = static_cast<int>(threadIdx.x) & 15;
  const uint8_t* cp_src = in + static_cast<int64_t>(cp_col) * kp + cp_piece * 16;
  const int cp_dst = cp_col * kWideColBytes + cp_piece * 16;
  const int64_t cp_step = static_cast<int64_t>(16) * kp;  // 16 columns
  const int m_r = static_cast<int>(threadIdx.x) / U, m_u = static_cast<int>(threadIdx.x) % U;
  auto stage_batch = [&](int j) {
    uint8_t* dst = smem + (j % kWideStages) * Sh::kStageBytes;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      if (j >= batches_of(s)) continue;  // (block-uniform)
      const int grp = first_of(s) + U * j;
      const uint8_t* src = cp_src + static_cast<int64_t>(grp) * kColPad;
#pragma unroll
      for (int i = 0; i < kPieces; ++i) cp_async16(dst + s * Sh::kSliceBytes + cp_dst + i * 16 * kWideColBytes, src + i * cp_step);
      if (m_r < Sh::kTok) {
        cp_async4(dst + Sh::kMultOff + ((s * Sh::kTok + m_r) * U + m_u) * 4,
                  mult + static_cast<int64_t>(m_r) * n_all + grp + m_u);
      }
    }
    cp_async_commit();
  };

  float acc[NT][2];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = 0.0f;
  const uint32_t magic = 0x80808080u | (static_cast<uint32_t>(it.n_tok) >> 31);  // (see tc_q4_tile)

  // One unit (2 groups) of the batch in wv/sv against a stage, for every n-tile: its words converted once; per
  // n-tile and group the narrow kernels' mma pair, pair join, conversion and fma. more: a next batch follows
  // (its unit uu loads into wv[uu] once converted; after unit 1, its scales).
  auto run_unit = [&](int uu, const uint8_t* stage, bool more) {
    const uint8_t* bs = stage + my_slice * Sh::kSliceBytes + g * kWideColBytes + q * 32 + uu * 128;
    const float* ms =
        reinterpret_cast<const float*>(stage + Sh::kMultOff) + (my_slice * Sh::kTok + (q >> 1)) * U + 2 * uu;
    const float sg[2] = {uu == 0 ? sv[0].x : sv[0].z, uu == 0 ? sv[0].y : sv[0].w};
    const float sh[2] = {uu == 0 ? sv[1].x : sv[1].z, uu == 0 ? sv[1].y : sv[1].w};
    // Group k's A registers (both k-steps), then its n-tiles; the unit's words are free after group 1's.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      uint32_t a[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint4(&w)[2] = wv[uu];
        const uint32_t wg = k == 0 ? (j == 0 ? w[0].x : w[0].y) : (j == 0 ? w[0].z : w[0].w);
        const uint32_t wh = k == 0 ? (j == 0 ? w[1].x : w[1].y) : (j == 0 ? w[1].z : w[1].w);
        a[j][0] = q4_i8_even(wg, magic);
        a[j][1] = q4_i8_even(wh, magic);
        a[j][2] = q4_i8_odd(wg, magic);
        a[j][3] = q4_i8_odd(wh, magic);
      }
      if (k == 1 && more) {
        load_unit(uu);
        if (uu == 1) load_scales_next();
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float mk = ms[2 * t * U + k];
        const uint4 bv = *reinterpret_cast<const uint4*>(bs + t * 8 * kWideColBytes + k * 16);
        int32_t c[4];
        mma_s8_16832(c, a[0][0], a[0][1], a[0][2], a[0][3], bv.x, bv.y, 0, 0, 0, 0);
        mma_s8_16832(c, a[1][0], a[1][1], a[1][2], a[1][3], bv.z, bv.w, c[0], c[1], c[2], c[3]);
        const float f0 = kGrouped ? sg[k] * mk : mk;
        const float f1 = kGrouped ? sh[k] * mk : mk;
        acc[t][0] = fmaf(f0, static_cast<float>(c[0] + 256 * c[1]), acc[t][0]);
        acc[t][1] = fmaf(f1, static_cast<float>(c[2] + 256 * c[3]), acc[t][1]);
      }
    }
  };
#pragma unroll
  for (int j = 0; j < kWideStages - 1; ++j) stage_batch(j);
  // Step j: stage j has landed (this thread's copies: the wait; everyone's: the barrier, which also frees the
  // stage of batch j - 1 for batch j + kWideStages - 1), then this warp's batch j.
  for (int j = 0; j < nb_all; ++j) {
    cp_async_wait<kWideStages - 2>();
    __syncthreads();
    stage_batch(j + kWideStages - 1);
    if (j < nb) {
      const uint8_t* stage = smem + (j % kWideStages) * Sh::kStageBytes;
      run_unit(0, stage, j + 1 < nb);
      run_unit(1, stage, j + 1 < nb);
    }
  }

  // The groups past the whole batches (n_mine % U; tc_q4_tile's remainder loop, operand from global memory).
  {
    const float* s_rem = scale_at<false>(st, st.w0);
    const uint8_t* bnext = in + static_cast<int64_t>(g) * kp + q * 32 + static_cast<int64_t>(ws.g_first + nb * U) * kColPad;
    const float* mnext = mult + static_cast<int64_t>(q >> 1) * n_all + ws.g_first + nb * U;
    const int64_t ntile_stride = static_cast<int64_t>(8) * kp;
    for (int r = nb * U; r < n_mine; r += 2) {
      const bool two = r + 1 < n_mine;  // warp-uniform
      const uint4 w[2] = {ld_unit_row(st.w0, two, st.tiles), ld_unit_row(st.w0 + st.w_d, two, st.tiles)};
      st.w0 += st.w_u;
      const float sg[2] = {kGrouped ? __ldg(s_rem) : 0.0f, kGrouped && two ? __ldg(s_rem + 1) : 0.0f};
      const float sh[2] = {kGrouped ? __ldg(s_rem + st.s_d) : 0.0f, kGrouped && two ? __ldg(s_rem + st.s_d + 1) : 0.0f};
      s_rem += 2;
      const uint8_t* bu = two ? bnext : bnext - 16 * q;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (k == 1 && !two) break;
          const uint4 bv = ld_cached_u4(bu + t * ntile_stride + 16 * k);
          i8_group<kGrouped>(w, k, bv, magic, sg[k], sh[k], __ldg(mnext + 2 * t * n_all + k), acc[t][0], acc[t][1]);
        }
      }
      bnext += 2 * kColPad;
      mnext += 2;
    }
  }

  // Epilogue (tc_q4_tile's): the accumulators through shared memory (the ring, once every copy has landed and
  // every warp is done with it), then each (row, token) adds its slices in order, combines its plane pairs
  // and is stored.
  cp_async_wait<0>();
  __syncthreads();
  constexpr int kCols = NT * 4 + 1;
  float* stage = reinterpret_cast<float*>(smem);  // [kWideWarps][16][kCols]
#pragma unroll
  for (int t = 0; t < NT; ++t) {  // plane pair q % 2 of token 2 t + q / 2: column 4 t + q
    stage[(warp * 16 + g) * kCols + t * 4 + q] = acc[t][0];
    stage[(warp * 16 + g + 8) * kCols + t * 4 + q] = acc[t][1];
  }
  __syncthreads();
  auto total = [&](int m, int r_t, int i, int c) {
    const int w0 = (r_t * Sh::kMats + m) * KS;
    float v = stage[(w0 * 16 + i) * kCols + c];
#pragma unroll
    for (int w = 1; w < KS; ++w) v += stage[((w0 + w) * 16 + i) * kCols + c];
    if (!kGrouped) v *= __ldg((m == 0 ? it.w0.scales : it.w1.scales) + imin(m0 + 16 * r_t + i, rows_out - 1));
    return v;
  };
  const int n_tok = it.n_tok;
  for (int idx = static_cast<int>(threadIdx.x); idx < Sh::kRows * n_tok; idx += kWideWarps * 32) {
    const int i = idx & 15, r_t = (idx >> 4) % Sh::kRowTiles, r = idx / Sh::kRows;
    const int o = m0 + 16 * r_t + i;
    if (o >= rows_out) continue;
    auto token = [&](int m) { return total(m, r_t, i, 2 * r + 1) * 65536.0f + total(m, r_t, i, 2 * r); };
    if constexpr (GATE_UP) {
      store_h(it, r, o, silu(token(0)) * token(1));
    } else {
      it.y[static_cast<int64_t>(r) * it.y_ld + o] = token(0);
    }
  }
}

// Launches the wide instance (gate/up or linear; tiles: every matrix of the items resident in kTiles). Its
// shared memory is above the default 48 KB: allowed once per device.
template <auto kernel, bool GATE_UP, int KSG = 2>
cudaError_t launch_wide_instance(const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  constexpr unsigned kBytes = WideShape<GATE_UP, KSG>::kSmemBytes;
  static std::atomic<uint64_t> allowed{0};  // a bit per device
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if ((allowed.load(std::memory_order_relaxed) & bit) == 0 || bit == 0) {
    e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kBytes));
    if (e != cudaSuccess) return e;
    allowed.fetch_or(bit, std::memory_order_relaxed);
  }
  return launch_kernel_smem(kernel, dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items)),
                            dim3(kWideWarps * 32), kBytes, on, true, items);
}

// ksg: gate/up K slices (1 or 2; linear: ignored).
template <int FMT>
cudaError_t launch_tc_q4_wide(bool gate_up, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                              const Queue& on) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  if (ksg != 1 && ksg != 2) return cudaErrorInvalidValue;
  auto go = [&](auto gate_up_tag, auto ksg_tag) {
    constexpr bool G = decltype(gate_up_tag)::value;
    constexpr int K = decltype(ksg_tag)::value;
    return tiles ? launch_wide_instance<&tc_q4_wide_kernel<FMT, G, true, K>, G, K>(items, n_items, grid_x, on)
                 : launch_wide_instance<&tc_q4_wide_kernel<FMT, G, false, K>, G, K>(items, n_items, grid_x, on);
  };
  using Two = std::integral_constant<int, 2>;
  if (!gate_up) return go(std::false_type{}, Two{});  // (linear: one instance, K slices do not apply)
  return ksg == 1 ? go(std::true_type{}, std::integral_constant<int, 1>{}) : go(std::true_type{}, Two{});
}

}  // namespace strata_cuda
