// Tensor-core kernels for int4 weights (Q4_G64, Q4_ROW): y = W · x for a chunk of tokens, or the fused expert
// gate/up h = silu(gate · x) ⊙ (up · x), on mma.sync m16n8k16 (bf16 in, f32 accumulate), for sm_90 and newer.
//
// The weights are the A operand (16 output rows per warp), the tokens the B operand (8 columns per n-tile).
// int4 values (nibble - 8) are exact in bf16, so A is exact; each group of 64 columns is reduced by the tensor
// cores from zero and then added to an f32 accumulator with its scale (Q4_G64: fma(scale, group, acc); Q4_ROW:
// acc += group, times the row scale at the end). B holds each token as `S` bf16 parts:
//   S = 3 (exact mode): hi + mid + lo represents the f32 activation to ~2^-24, so the result is an f32-accurate
//        dot product (relative error ~1e-6, within the 1e-5 conformance bound) whose value for a token does not
//        depend on the other tokens of the chunk, the chunk size or the n-tile count (every output column of an
//        mma is computed on its own), so prefill and decode agree bit for bit;
//   S = 1 (W4A16): the activation rounded to bf16 (relative error ~2^-9 per element; see plugins/cuda/README.md).
//
// Thread (g = lane / 4, q = lane % 4) of a warp owns, in every 64-column group, columns 16q .. 16q + 15 of rows
// g and g + 8 of its 16-row tile: one 8-byte load per row (two words w0, w1 of 8 nibbles). In k-step s (0..3)
// it feeds the mma with the nibble pairs (s, s + 4) of w0 and of w1, i.e. columns 16q + {s, s+4, s+8, s+12}.
// The mma only needs A and B to agree on which column each k-slot is, so B is stored in that order: each
// 16-column chunk of an operand row 4x4-transposed, so a thread's values for k-steps s and s + 1 are 16
// contiguous bytes (one load; the 4 lanes of a row read 64 contiguous bytes). The Q4_G64 scales of a batch of
// 4 groups are one 16-byte load where the rows' scales are 16-byte aligned.
// There is no shape constraint: rows past the matrix are computed from a clamped row and never stored; columns
// are padded to 64 with zero activations.
//
// Split K: a block is one 16-row tile and its kTcWarps warps share the work: linear, the 64-column groups in 4
// slices; gate/up, warps 0-1 take the gate and 2-3 the up matrix, each in 2 slices. A slice is a whole number
// of load batches (KS slices of n groups: slice w is [w L, (w + 1) L) with L = U * ceil(n / (KS U))); each is
// summed as above, then a matrix's slices are added in order, ((s0 + s1) + s2) + s3 (gate/up: s0 + s1),
// through shared memory. At decode sizes this is what keeps the memory busy: a GLM-5.2 gate/up pass has
// 2048 / 16 tiles per expert, so one warp per tile with both matrices (192 registers) gave 1024 warps for 8
// experts, 8 per SM; four warps per tile with one matrix each (96 registers) give 4096, 20 per SM. The split
// depends only on the matrix shape, never on the token count, so a token's value is the same in any chunk
// (prefill == decode).
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

// Blocks per SM asked of the register allocator (sm_90, no spills): gate/up with 1 n-tile 96 registers (20
// warps per SM), 2 n-tiles 128 (16), 3-4 n-tiles 168 (12); linear (its epilogue needs a few more) one step
// less below 3 n-tiles.
constexpr int tc_min_blocks(int nt, bool gate_up) {
  return (nt <= 1 ? 5 : nt <= 2 ? 4 : 3) - (gate_up || nt > 2 ? 0 : 1);
}

template <int FMT, int S, int NT, bool GATE_UP>
__global__ void __launch_bounds__(kTcWarps * 32, tc_min_blocks(NT, GATE_UP))
    tc_q4_kernel(const WorkItem* __restrict__ items) {
  static_assert(FMT == kQ4G64 || FMT == kQ4Row, "int4 formats only");
  static_assert(kTcWarps == 4, "4 warps per tile");
  constexpr int NM = GATE_UP ? 2 : 1;  // weight matrices of an item
  constexpr int KS = kTcWarps / NM;    // K slices per matrix
  constexpr int U = 4;                 // 64-column groups per load batch
  constexpr bool kGrouped = FMT == kQ4G64;

  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rows_out = it.w0.rows;
  const int m0 = static_cast<int>(blockIdx.x) * 16;
  if (m0 >= rows_out) return;  // the whole block (m0 depends on the block only)
  const DevMatrix& mat = warp / KS == 0 ? it.w0 : it.w1;  // this warp's matrix
  const int kp = it.w0.kp;
  const int n_groups_all = kp / kColPad;
  // This warp's slice of the groups: [g_first, n_groups), whole batches of U (depends on the shape only).
  const int slice = (n_groups_all + KS * U - 1) / (KS * U) * U;
  const int g_first = imin((warp % KS) * slice, n_groups_all);
  const int n_groups = imin(g_first + slice, n_groups_all);
  const bool scales_x4 = kGrouped && (n_groups_all & 3) == 0;  // every row's scales 16-byte aligned
  // Rows past the matrix read the last row (valid memory); their results are never stored.
  const int rows[2] = {imin(m0 + g, rows_out - 1), imin(m0 + g + 8, rows_out - 1)};

  const uint8_t* wp[2];
  const float* sp[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    wp[rr] = static_cast<const uint8_t*>(mat.data) + static_cast<int64_t>(rows[rr]) * mat.stride + q * 8;
    sp[rr] = mat.scales + (kGrouped ? static_cast<int64_t>(rows[rr]) * n_groups_all : rows[rr]);
  }
  // This thread's B column is g of each n-tile; its 16 slots of a group start at q * 16.
  const uint16_t* bp = static_cast<const uint16_t*>(it.in) + static_cast<int64_t>(g) * kp + q * 16;
  const int64_t ntile_stride = static_cast<int64_t>(8) * kp;
  // Operand columns past n_tok * S are zero: a thread whose column is one of them feeds zeros without loading
  // them (at one decode token 3 of the 8 columns are live: the B traffic, twice the weights' bytes when all 8
  // are read, drops by 8 / 3).
  // Only with one n-tile (up to 2 tokens in exact mode): with more, the predicate costs registers (spills).
  bool live[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) live[t] = NT > 1 || t * 8 + g < it.n_tok * S;

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

  // Weights of U groups are loaded ahead (two register buffers, software-pipelined): while one batch is turned
  // into mma, the next one's loads are in flight.
  static_assert(U == 4, "a batch's scales are one float4");
  auto load_batch = [&](uint2 (&wv)[U][2], float (&sv)[U][2], int g0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int gi = g0 + u;
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        wv[u][rr] = gi < n_groups ? ld_stream_u2(wp[rr] + static_cast<int64_t>(gi) * 32) : make_uint2(0u, 0u);
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      if (!kGrouped) {
#pragma unroll
        for (int u = 0; u < U; ++u) sv[u][rr] = 1.0f;
      } else if (scales_x4 && g0 + U <= n_groups) {  // g0 is a multiple of U
        const float4 v = __ldg(reinterpret_cast<const float4*>(sp[rr] + g0));
        sv[0][rr] = v.x;
        sv[1][rr] = v.y;
        sv[2][rr] = v.z;
        sv[3][rr] = v.w;
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u) sv[u][rr] = g0 + u < n_groups ? __ldg(sp[rr] + g0 + u) : 0.0f;
      }
    }
  };
  auto compute_batch = [&](const uint2 (&wv)[U][2], const float (&sv)[U][2], int g0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int gi = g0 + u;
      if (gi >= n_groups) return;  // warp-uniform
      float c[NT][4];
#pragma unroll
      for (int s2 = 0; s2 < 4; s2 += 2) {
        uint4 bq[NT];  // this thread's B values for k-steps s2 and s2 + 1
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          bq[t] = live[t] ? ld_cached_u4(bp + t * ntile_stride + static_cast<int64_t>(gi) * kColPad + s2 * 4)
                          : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int s = s2; s < s2 + 2; ++s) {
          const uint32_t a0 = q4_pair_bf16x2(wv[u][0].x, s);  // row g,     k-slots 2q, 2q+1
          const uint32_t a1 = q4_pair_bf16x2(wv[u][1].x, s);  // row g + 8, k-slots 2q, 2q+1
          const uint32_t a2 = q4_pair_bf16x2(wv[u][0].y, s);  // row g,     k-slots 2q+8, 2q+9
          const uint32_t a3 = q4_pair_bf16x2(wv[u][1].y, s);  // row g + 8, k-slots 2q+8, 2q+9
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint32_t b0 = s == s2 ? bq[t].x : bq[t].z, b1 = s == s2 ? bq[t].y : bq[t].w;
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
          acc[t][0] = fmaf(sv[u][0], c[t][0], acc[t][0]);
          acc[t][1] = fmaf(sv[u][0], c[t][1], acc[t][1]);
          acc[t][2] = fmaf(sv[u][1], c[t][2], acc[t][2]);
          acc[t][3] = fmaf(sv[u][1], c[t][3], acc[t][3]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][i] += c[t][i];
        }
      }
    }
  };
  uint2 wa[U][2], wb[U][2];
  float sa[U][2], sb[U][2];
  load_batch(wa, sa, g_first);
  for (int g0 = g_first; g0 < n_groups; g0 += 2 * U) {
    load_batch(wb, sb, g0 + U);
    compute_batch(wa, sa, g0);
    load_batch(wa, sa, g0 + 2 * U);
    compute_batch(wb, sb, g0 + U);
  }

  // Epilogue: the slices' accumulators (rows g, g+8; columns 2q, 2q+1 of each n-tile) go through shared memory;
  // then each (row, token) adds its matrices' slices in order (Q4_ROW: times the row scale), sums its S parts
  // in order and is stored.
  constexpr int kCols = NT * 8 + 1;
  __shared__ float stage[kTcWarps][16][kCols];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    stage[warp][g][t * 8 + 2 * q] = acc[t][0];
    stage[warp][g][t * 8 + 2 * q + 1] = acc[t][1];
    stage[warp][g + 8][t * 8 + 2 * q] = acc[t][2];
    stage[warp][g + 8][t * 8 + 2 * q + 1] = acc[t][3];
  }
  __syncthreads();
  // Column c of row i of matrix m, over the whole K.
  auto total = [&](int m, int i, int c) {
    float v = stage[m * KS][i][c];
#pragma unroll
    for (int w = 1; w < KS; ++w) v += stage[m * KS + w][i][c];
    if (!kGrouped) v *= __ldg((m == 0 ? it.w0.scales : it.w1.scales) + imin(m0 + i, rows_out - 1));
    return v;
  };
  const int n_tok = it.n_tok;
  for (int idx = static_cast<int>(threadIdx.x); idx < 16 * n_tok; idx += kTcWarps * 32) {
    const int i = idx & 15, r = idx >> 4;
    const int o = m0 + i;
    if (o >= rows_out) continue;
    float v0 = total(0, i, r * S);
#pragma unroll
    for (int p = 1; p < S; ++p) v0 += total(0, i, r * S + p);
    if constexpr (GATE_UP) {
      float v1 = total(1, i, r * S);
#pragma unroll
      for (int p = 1; p < S; ++p) v1 += total(1, i, r * S + p);
      store_h(it, r, o, silu(v0) * v1);
    } else {
      it.y[static_cast<int64_t>(r) * it.y_ld + o] = v0;
    }
  }
}

// Launches the instance for (splits, nt); cudaErrorInvalidValue for a combination that is not instantiated.
template <int FMT, bool GATE_UP>
cudaError_t launch_tc_q4(int splits, int nt, const WorkItem* items, int n_items, int grid_x, cudaStream_t stream) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items));
  const dim3 block(kTcWarps * 32);
  auto run = [&](auto kernel) { return launch_kernel(kernel, grid, block, stream, true, items); };
  if (splits == 3 && nt == 1) return run(&tc_q4_kernel<FMT, 3, 1, GATE_UP>);
  if (splits == 3 && nt == 2) return run(&tc_q4_kernel<FMT, 3, 2, GATE_UP>);
  if (splits == 3 && nt == 3) return run(&tc_q4_kernel<FMT, 3, 3, GATE_UP>);
  if (splits == 1 && nt == 1) return run(&tc_q4_kernel<FMT, 1, 1, GATE_UP>);
  if (splits == 1 && nt == 2) return run(&tc_q4_kernel<FMT, 1, 2, GATE_UP>);
  if (splits == 1 && nt == 4) return run(&tc_q4_kernel<FMT, 1, 4, GATE_UP>);
  return cudaErrorInvalidValue;
}

}  // namespace strata_cuda
