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
// 16-column chunk of an operand row 4x4-transposed, and a thread loads its 4 values of a k-step as 8 bytes.
// There is no shape constraint: rows past the matrix are computed from a clamped row and never stored; columns
// are padded to 64 with zero activations.
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

template <int FMT, int S, int NT, bool GATE_UP>
__global__ void __launch_bounds__(kTcWarps * 32) tc_q4_kernel(const WorkItem* __restrict__ items) {
  static_assert(FMT == kQ4G64 || FMT == kQ4Row, "int4 formats only");
  constexpr int NM = GATE_UP ? 2 : 1;  // weight matrices read per item
  constexpr int U = 4;                 // 64-column groups per load batch (registers: 2 * U * NM * 6)
  constexpr bool kGrouped = FMT == kQ4G64;

  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rows_out = it.w0.rows;
  const int m0 = (static_cast<int>(blockIdx.x) * kTcWarps + warp) * 16;
  if (m0 >= rows_out) return;  // whole warp; no block-wide barrier follows
  const int kp = it.w0.kp;
  const int n_groups = kp / kColPad;
  // Rows past the matrix read the last row (valid memory); their results are never stored.
  const int rows[2] = {imin(m0 + g, rows_out - 1), imin(m0 + g + 8, rows_out - 1)};

  const uint8_t* wp[NM][2];
  const float* sp[NM][2];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const DevMatrix& mat = m == 0 ? it.w0 : it.w1;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      wp[m][rr] = static_cast<const uint8_t*>(mat.data) + static_cast<int64_t>(rows[rr]) * mat.stride + q * 8;
      sp[m][rr] = mat.scales + (kGrouped ? static_cast<int64_t>(rows[rr]) * n_groups : rows[rr]);
    }
  }
  // This thread's B column is g of each n-tile; its 16 slots of a group start at q * 16.
  const uint16_t* bp = static_cast<const uint16_t*>(it.in) + static_cast<int64_t>(g) * kp + q * 16;
  const int64_t ntile_stride = static_cast<int64_t>(8) * kp;

  float acc[NM][NT][4];
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][t][i] = 0.0f;

  // Weights of U groups are loaded ahead (two register buffers, software-pipelined): while one batch is turned
  // into mma, the next one's loads are in flight.
  auto load_batch = [&](uint2 (&wv)[U][NM][2], float (&sv)[U][NM][2], int g0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int gi = g0 + u;
#pragma unroll
      for (int m = 0; m < NM; ++m) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          if (gi < n_groups) {
            wv[u][m][rr] = ld_stream_u2(wp[m][rr] + static_cast<int64_t>(gi) * 32);
            sv[u][m][rr] = kGrouped ? __ldg(sp[m][rr] + gi) : 1.0f;
          } else {
            wv[u][m][rr] = make_uint2(0u, 0u);
            sv[u][m][rr] = 0.0f;
          }
        }
      }
    }
  };
  auto compute_batch = [&](const uint2 (&wv)[U][NM][2], const float (&sv)[U][NM][2], int g0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int gi = g0 + u;
      if (gi >= n_groups) return;  // warp-uniform
      float c[NM][NT][4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t b[NT][2];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const uint2 bb = ld_cached_u2(bp + t * ntile_stride + static_cast<int64_t>(gi) * kColPad + s * 4);
          b[t][0] = bb.x;
          b[t][1] = bb.y;
        }
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          const uint32_t a0 = q4_pair_bf16x2(wv[u][m][0].x, s);  // row g,     k-slots 2q, 2q+1
          const uint32_t a1 = q4_pair_bf16x2(wv[u][m][1].x, s);  // row g + 8, k-slots 2q, 2q+1
          const uint32_t a2 = q4_pair_bf16x2(wv[u][m][0].y, s);  // row g,     k-slots 2q+8, 2q+9
          const uint32_t a3 = q4_pair_bf16x2(wv[u][m][1].y, s);  // row g + 8, k-slots 2q+8, 2q+9
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (s == 0) {
              mma_bf16_16816(c[m][t], a0, a1, a2, a3, b[t][0], b[t][1], 0.0f, 0.0f, 0.0f, 0.0f);
            } else {
              mma_bf16_16816(c[m][t], a0, a1, a2, a3, b[t][0], b[t][1], c[m][t][0], c[m][t][1], c[m][t][2],
                             c[m][t][3]);
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < NM; ++m) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (kGrouped) {
            acc[m][t][0] = fmaf(sv[u][m][0], c[m][t][0], acc[m][t][0]);
            acc[m][t][1] = fmaf(sv[u][m][0], c[m][t][1], acc[m][t][1]);
            acc[m][t][2] = fmaf(sv[u][m][1], c[m][t][2], acc[m][t][2]);
            acc[m][t][3] = fmaf(sv[u][m][1], c[m][t][3], acc[m][t][3]);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][t][i] += c[m][t][i];
          }
        }
      }
    }
  };
  uint2 wa[U][NM][2], wb[U][NM][2];
  float sa[U][NM][2], sb[U][NM][2];
  load_batch(wa, sa, 0);
  for (int g0 = 0; g0 < n_groups; g0 += 2 * U) {
    load_batch(wb, sb, g0 + U);
    compute_batch(wa, sa, g0);
    load_batch(wa, sa, g0 + 2 * U);
    compute_batch(wb, sb, g0 + U);
  }
  if (!kGrouped) {
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const float s_lo = __ldg(sp[m][0]), s_hi = __ldg(sp[m][1]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        acc[m][t][0] *= s_lo;
        acc[m][t][1] *= s_lo;
        acc[m][t][2] *= s_hi;
        acc[m][t][3] *= s_hi;
      }
    }
  }

  // Epilogue: the accumulators (rows g, g+8; columns 2q, 2q+1 of each n-tile) go through this warp's shared
  // memory, then each (row, token) sums its S parts in order and is stored.
  constexpr int kCols = NT * 8 + 1;
  __shared__ float stage[kTcWarps][NM][16][kCols];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      stage[warp][m][g][t * 8 + 2 * q] = acc[m][t][0];
      stage[warp][m][g][t * 8 + 2 * q + 1] = acc[m][t][1];
      stage[warp][m][g + 8][t * 8 + 2 * q] = acc[m][t][2];
      stage[warp][m][g + 8][t * 8 + 2 * q + 1] = acc[m][t][3];
    }
  }
  __syncwarp();
  const int n_tok = it.n_tok;
  for (int idx = lane; idx < 16 * n_tok; idx += 32) {
    const int i = idx & 15, r = idx >> 4;
    const int o = m0 + i;
    if (o >= rows_out) continue;
    float v0 = stage[warp][0][i][r * S];
#pragma unroll
    for (int p = 1; p < S; ++p) v0 += stage[warp][0][i][r * S + p];
    if constexpr (GATE_UP) {
      float v1 = stage[warp][NM - 1][i][r * S];
#pragma unroll
      for (int p = 1; p < S; ++p) v1 += stage[warp][NM - 1][i][r * S + p];
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
