// SIMT f32 kernels for every weight format: y = W · x for up to 8 tokens, and the fused expert gate/up. The
// simple path: F32/BF16/F16 weights (memory-bound at a few rows: 1-2 arithmetic ops per weight and token), and
// int4 when the tensor-core kernels are switched off (STRATA_CUDA_KERNELS=simt).
//
// A warp owns 4 output rows (linear) or 2 gate+up row pairs; lane l takes the 8-column chunks l, l + 32, ... of
// the (64-padded) row, keeps the chunk's activations of all tokens in registers and reuses them for its rows.
// Each (row, token) is one f32 sum: per lane, fma over its chunks in column order, then a fixed xor-shuffle
// tree. So the value of a token never depends on the other tokens or on how they were chunked.
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

// Columns 8c .. 8c + 7 of row `row` as f32 (int4: (nibble - 8) * scale, as the CPU reference decodes).
template <int FMT>
__device__ __forceinline__ void decode_chunk8(const DevMatrix& m, int row, int c, float (&w)[8]) {
  const char* base = static_cast<const char*>(m.data) + static_cast<int64_t>(row) * m.stride;
  if constexpr (FMT == kF32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(base) + 2 * c);
    const float4 b = __ldg(reinterpret_cast<const float4*>(base) + 2 * c + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
  } else if constexpr (FMT == kBF16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(base) + c);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = __uint_as_float(u[j] << 16);
      w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
    }
  } else if constexpr (FMT == kF16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(base) + c);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] & 0xffffu)));
      w[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] >> 16)));
    }
  } else {
    // (either layout: the 4 bytes are within one 16-byte chunk of the row)
    const uint32_t v =
        __ldg(reinterpret_cast<const uint32_t*>(static_cast<const char*>(m.data) + q4_row_byte(m, row, 4 * c)));
    const float s = FMT == kQ4G64 ? __ldg(m.scales + q4_scale_at(m, row, c >> 3)) : __ldg(m.scales + row);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t b = (v >> (8 * j)) & 0xffu;
      w[2 * j] = static_cast<float>(static_cast<int>(b & 15u) - 8) * s;
      w[2 * j + 1] = static_cast<float>(static_cast<int>(b >> 4) - 8) * s;
    }
  }
}

template <int FMT, bool GATE_UP>
__global__ void __launch_bounds__(kSimtWarps * 32, 1) simt_kernel(const WorkItem* __restrict__ items) {
  constexpr int NM = GATE_UP ? 2 : 1;
  constexpr int ROWS = GATE_UP ? kSimtRowsGateUp : kSimtRowsLinear;
  constexpr int T = kSimtMaxTok;
  grid_dep_launch();
  grid_dep_wait();
  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int rows_out = it.w0.rows;
  const int o0 = (static_cast<int>(blockIdx.x) * kSimtWarps + warp) * ROWS;
  if (o0 >= rows_out) return;
  const int kp = it.w0.kp;
  const int n_tok = it.n_tok;
  const float* x = static_cast<const float*>(it.in);

  float acc[NM][ROWS][T];
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int r = 0; r < T; ++r) acc[m][i][r] = 0.0f;

  for (int c = lane; c < kp / 8; c += 32) {
    float xv[T][8];
#pragma unroll
    for (int r = 0; r < T; ++r) {
      if (r < n_tok) {
        const float4* p = reinterpret_cast<const float4*>(x + static_cast<int64_t>(r) * kp) + 2 * c;
        const float4 a = __ldg(p), b = __ldg(p + 1);
        xv[r][0] = a.x; xv[r][1] = a.y; xv[r][2] = a.z; xv[r][3] = a.w;
        xv[r][4] = b.x; xv[r][5] = b.y; xv[r][6] = b.z; xv[r][7] = b.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) xv[r][k] = 0.0f;
      }
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const DevMatrix& mat = m == 0 ? it.w0 : it.w1;
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        if (o0 + i < rows_out) {  // warp-uniform
          float w[8];
          decode_chunk8<FMT>(mat, o0 + i, c, w);
#pragma unroll
          for (int r = 0; r < T; ++r) {
            if (r < n_tok) {
#pragma unroll
              for (int k = 0; k < 8; ++k) acc[m][i][r] = fmaf(w[k], xv[r][k], acc[m][i][r]);
            }
          }
        }
      }
    }
  }
  // Butterfly sums: every lane ends with the same bits (a + b == b + a).
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
      for (int r = 0; r < T; ++r) {
        if (r < n_tok) {
#pragma unroll
          for (int off = 16; off >= 1; off >>= 1) acc[m][i][r] += __shfl_xor_sync(0xffffffffu, acc[m][i][r], off);
        }
      }
  // Lane i * T + r stores (row o0 + i, token r).
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
#pragma unroll
    for (int r = 0; r < T; ++r) {
      if (lane == ((i * T + r) & 31) && r < n_tok && o0 + i < rows_out) {
        if constexpr (GATE_UP) {
          store_h(it, r, o0 + i, silu(acc[0][i][r]) * acc[NM - 1][i][r]);
        } else {
          it.y[static_cast<int64_t>(r) * it.y_ld + o0 + i] = acc[0][i][r];
        }
      }
    }
  }
}

template <bool GATE_UP>
cudaError_t launch_simt(int dtype, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items));
  const dim3 block(kSimtWarps * 32);
  auto run = [&](auto kernel) { return launch_kernel(kernel, grid, block, on, true, items); };
  switch (dtype) {
    case kF32: return run(&simt_kernel<kF32, GATE_UP>);
    case kBF16: return run(&simt_kernel<kBF16, GATE_UP>);
    case kF16: return run(&simt_kernel<kF16, GATE_UP>);
    case kQ4Row: return run(&simt_kernel<kQ4Row, GATE_UP>);
    case kQ4G64: return run(&simt_kernel<kQ4G64, GATE_UP>);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace strata_cuda
