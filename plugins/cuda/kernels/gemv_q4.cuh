// Memory-bound "gemv" kernels for int4 weights (Q4_G64, Q4_ROW) and 1..8 tokens per item, on the SIMT cores'
// integer dot-product unit (dp4a): y = W · x, or the fused expert gate/up h = silu(gate · x) ⊙ (up · x). The
// exact-mode int4 path (see plugins/cuda/README.md): every token's value is computed in a fixed order from that
// token's activations alone, whatever the item's token count, so prefill equals decode bit for bit.
//
// Activations as integers: the block turns its item's f32 activations, per token and 64-column group, into
// m_k = rint(x_k · 2^(29 - E)) with 2^E <= max |x| of the group < 2^(E + 1), so |m_k| <= 2^30 (30 bits below
// the group's largest value: finer than an f32 product's rounding), kept as four byte planes
// m = b3 · 2^24 + b2 · 2^16 + b1 · 2^8 + b0 (b3 signed, the others unsigned). A weight byte holds one nibble q
// (0..15); dp4a gives exact int32 sums of 4 products, so per 32 columns (a lane's 16-byte chunk of a row) and
// plane, A_i = Σ q · b_i - 8 Σ b_i = Σ (q - 8) b_i exactly (the chain starts from -8 Σ b_i), and
//     S = Σ (q - 8) m = (A_3 · 2^8 + A_2) · 2^16 + (A_1 · 2^8 + A_0)
// with both brackets exact in f32 (below 2^24): one rounding gives S as a float, and
// acc += (group scale · 2^(E - 29)) · S. Per weight and token: one dp4a and about 0.4 other instructions,
// against 3.6 for the f32 form (lop3 + fadd + fma per weight), which made these kernels issue-bound.
//
// Work split: a block is kGemvWarps warps; a warp owns R output rows of each of its NM matrices (gate_up: 2
// gate + 2 up rows; linear: 4 rows), i.e. NS = 4 weight streams. A row is read in 16-byte chunks (32 columns,
// half a Q4_G64 group); chunk c goes to lane c % 32, so a warp reads 512 contiguous bytes of each stream per
// step (ld.global.nc, L1::no_allocate), the next step's chunks loaded before the current ones are used. The
// block converts the activations a tile of kGemvTileCols(T) columns at a time into shared memory (all its
// warps, between two barriers), then its warps take the tile's chunks. Grid x = row blocks, y = work items.
//
// Input operand (unchanged from the f32 kernels, and what the gate/up pass writes): f32 [T][gemv_ld(kp)],
// column k holding x_k · 16^-(k % 4) at gemv_slot(k) (device_util.cuh); the scaling is undone exactly here.
//
// Order of the sums, per (row, token), the same for every T and every launch: each lane takes its chunks in
// increasing order (Q4_G64: acc = fma(scale · 2^(E - 29), S, acc); Q4_ROW: acc = fma(2^(E - 29), S, acc), times
// the row scale after the reduction), then a fixed xor-shuffle tree over the 32 lanes. Rows past the matrix
// read a clamped (valid) row and are never stored; columns are padded to 64 with zero activations (device
// copies pad with zero weights), so padding adds nothing.
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

// The 32-bit word j (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Columns per activation tile (a whole number of warp steps; 18-37 KB of shared memory a block).
__host__ __device__ constexpr int gemv_tile_cols(int t) { return (t <= 1 ? 6 : t <= 2 ? 3 : t <= 3 ? 2 : 1) * kGemvStepCols; }

// Blocks (of 8 warps) per SM asked of the register allocator: 2 (16 warps, 128 registers). With 3 (85
// registers) the one-token kernel spills: the per-stream plane sums, two steps of weights and the activation
// words are live together.
constexpr int gemv_min_blocks(int) { return 2; }

template <int FMT, int T, bool GATE_UP>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_min_blocks(T))
    gemv_q4_kernel(const WorkItem* __restrict__ items) {
  static_assert(FMT == kQ4G64 || FMT == kQ4Row, "int4 formats only");
  static_assert(T >= 1 && T <= kGemvMaxTok, "1..8 tokens");
  constexpr int NM = GATE_UP ? 2 : 1;
  constexpr int R = GATE_UP ? kGemvRowsGateUp : kGemvRowsLinear;
  constexpr int NS = NM * R;  // weight streams of a warp: stream s = m * R + i is row o0 + i of matrix m
  constexpr bool kGrouped = FMT == kQ4G64;
  constexpr int KT = gemv_tile_cols(T);
  constexpr int CT = KT / 32;  // chunks per tile
  static_assert(R * T <= 32, "one store per lane");

  // The tile's activations: byte planes [token][plane b3, b2, b1, b0][half][chunk] (16 bytes: the even and odd
  // columns of two weight words, in the order the nibbles are unpacked), per group 2^(E - 29), per chunk and
  // plane -8 Σ b_i (where the dp4a chains start).
  __shared__ uint4 qx[T][4][2][CT];
  __shared__ float qscale[T][CT / 2];
  __shared__ int4 qbias[T][CT];

  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int rows_out = it.w0.rows;
  const int o0 = (static_cast<int>(blockIdx.x) * kGemvWarps + warp) * R;
  const bool active = o0 < rows_out;  // a warp past the rows still converts activations (barriers)
  const int kp = it.w0.kp;
  const int n_chunks = kp / 32;  // 16-byte chunks per row (even: kp is a multiple of 64)
  const int n_groups = kp / kColPad;

  // Stream s reads row o0 + i of matrix m (clamped to the last row): a base pointer per matrix and 32-bit
  // offsets (at most 3 rows apart, and a row has at most 2^29 + 32 bytes) keep the registers for accumulators.
  const int ob = active ? o0 : 0;
  const uint8_t* wb[NM];
  const float* sb[NM];
  int32_t woff[R], soff[R];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const DevMatrix& mat = m == 0 ? it.w0 : it.w1;
    wb[m] = static_cast<const uint8_t*>(mat.data) + static_cast<int64_t>(ob) * mat.stride;
    sb[m] = mat.scales + (kGrouped ? static_cast<int64_t>(ob) * n_groups : ob);
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int d = imin(i, rows_out - 1 - ob);
    woff[i] = d * static_cast<int32_t>(it.w0.stride);
    soff[i] = kGrouped ? d * n_groups : d;
  }
  const float* x = static_cast<const float*>(it.in);
  const int ld = gemv_ld(kp);  // the operand's row length (slot order, see gemv_slot)

  float acc[NS][T];
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[s][t] = 0.0f;

  // Chunk c of every stream (weights, and the Q4_G64 scale of its group).
  auto load = [&](int c, uint4 (&w)[NS], float (&sc)[NS]) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      w[s] = ld_stream_u4(wb[s / R] + woff[s % R] + static_cast<int64_t>(c) * 16);
      sc[s] = kGrouped ? __ldg(sb[s / R] + soff[s % R] + (c >> 1)) : 0.0f;
    }
  };

  // Converts chunk (tile-relative) cl of token t, columns k0 + 32 cl ..: two neighbouring lanes hold the two
  // chunks of a group and share its maximum. `live` false: a filler lane (takes part in the shuffle only).
  auto convert = [&](int t, int cl, int k0, bool live) {
    const float* xr = x + static_cast<int64_t>(t) * ld;
    const int c = k0 / 32 + cl;
    // Quarter qq: columns 32 c + 4 qq .. + 3 (scaled by 16^-0..3); read twice (L1), for the maximum and then
    // for the integers, which keeps the registers low.
    auto quarter = [&](int qq) {
      return live ? __ldg(reinterpret_cast<const float4*>(xr + gemv_slot(32 * c + 4 * qq)))
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    float mx[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // max |x'| per column class k % 4
    float nonfinite = 0.0f;                   // NaN when a value is Inf or NaN (fmaxf would drop a NaN)
#pragma unroll
    for (int qq = 0; qq < 8; ++qq) {
      const float4 v = quarter(qq);
      mx[0] = fmaxf(mx[0], fabsf(v.x));
      mx[1] = fmaxf(mx[1], fabsf(v.y));
      mx[2] = fmaxf(mx[2], fabsf(v.z));
      mx[3] = fmaxf(mx[3], fabsf(v.w));
      nonfinite += (v.x * 0.0f + v.y * 0.0f) + (v.z * 0.0f + v.w * 0.0f);
    }
    float big = fmaxf(fmaxf(mx[0], mx[1] * 16.0f), fmaxf(mx[2] * 256.0f, mx[3] * 4096.0f));  // exact
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 1));  // the group's two chunks
    nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, 1);
    // E_field of the maximum, at least 41 (groups below 2^-86 keep fewer bits: far below any tolerance), so
    // that the multipliers below and 2^(E - 29) are normal floats. A group holding an Inf or a NaN gives NaN
    // (as the f32 reference would give NaN or Inf): its integers are zero and its factor NaN.
    const bool bad = nonfinite != nonfinite;
    const int ef0 = static_cast<int>((f32_bits(big) >> 23) & 0xFFu);
    const int ef = bad ? 41 : ef0 < 41 ? 41 : ef0;
    if (!live) return;
    int bsum[4] = {0, 0, 0, 0};  // Σ b_i over the chunk
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t planes[4][4];  // [b3, b2, b1, b0][word 2 half even, odd, word 2 half + 1 even, odd]
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {  // weight word j = 2 half + jj: columns 8 j .. 8 j + 7
        const int j = 2 * half + jj;
        int m[8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float4 q = bad ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : quarter(2 * j + h);
          // column class i: x_k = x'_k 16^i, times 2^(156 - E_field) = 2^(29 - E)
          m[4 * h + 0] = f2i_rn(q.x * __uint_as_float(static_cast<uint32_t>(283 - ef) << 23));
          m[4 * h + 1] = f2i_rn(q.y * __uint_as_float(static_cast<uint32_t>(287 - ef) << 23));
          m[4 * h + 2] = f2i_rn(q.z * __uint_as_float(static_cast<uint32_t>(291 - ef) << 23));
          m[4 * h + 3] = f2i_rn(q.w * __uint_as_float(static_cast<uint32_t>(295 - ef) << 23));
        }
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const int sh = 24 - 8 * p;
          auto byte = [&](int i) { return (static_cast<uint32_t>(m[i]) >> sh) & 0xFFu; };
          planes[p][2 * jj] = byte(0) | byte(2) << 8 | byte(4) << 16 | byte(6) << 24;      // even columns
          planes[p][2 * jj + 1] = byte(1) | byte(3) << 8 | byte(5) << 16 | byte(7) << 24;  // odd columns
#pragma unroll
          for (int i = 0; i < 8; ++i) bsum[p] += p == 0 ? static_cast<int>(m[i] >> 24) : static_cast<int>(byte(i));
        }
      }
#pragma unroll
      for (int p = 0; p < 4; ++p) qx[t][p][half][cl] = make_uint4(planes[p][0], planes[p][1], planes[p][2], planes[p][3]);
    }
    qbias[t][cl] = make_int4(-8 * bsum[0], -8 * bsum[1], -8 * bsum[2], -8 * bsum[3]);
    if ((cl & 1) == 0) qscale[t][cl >> 1] = bad ? __uint_as_float(0x7FC00000u) : __uint_as_float(static_cast<uint32_t>(ef - 29) << 23);
  };

  uint4 nw[NS];
  float ns[NS];
  if (active && lane < n_chunks) load(lane, nw, ns);
  for (int k0 = 0; k0 < kp; k0 += KT) {  // block-uniform
    const int tc = imin(CT, (kp - k0) / 32);  // chunks in this tile (even)
    __syncthreads();                          // the previous tile is consumed
    const int work = T * tc;                  // (token, chunk) pairs, in whole warps
    for (int idx = static_cast<int>(threadIdx.x); idx < (work + 31) / 32 * 32; idx += kGemvWarps * 32) {
      const bool live = idx < work;
      const int t = live ? idx / tc : 0, cl = live ? idx % tc : 0;
      convert(t, cl, k0, live);
    }
    __syncthreads();
    if (!active) continue;
    const int c_end = imin(n_chunks, (k0 + KT) / 32);
    for (int c = k0 / 32 + lane; c < c_end; c += 32) {
      uint4 cw[NS];
      float cs[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        cw[s] = nw[s];
        cs[s] = ns[s];
      }
      if (c + 32 < n_chunks) load(c + 32, nw, ns);
      const int cl = c - k0 / 32;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int4 bias = qbias[t][cl];
        int a3[NS];
        uint32_t a2[NS], a1[NS], a0[NS];
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          a3[s] = bias.x;
          a2[s] = static_cast<uint32_t>(bias.y);
          a1[s] = static_cast<uint32_t>(bias.z);
          a0[s] = static_cast<uint32_t>(bias.w);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // weight words 2 half, 2 half + 1
          const uint4 p3 = qx[t][0][half][cl], p2 = qx[t][1][half][cl];
          const uint4 p1 = qx[t][2][half][cl], p0 = qx[t][3][half][cl];
#pragma unroll
          for (int s = 0; s < NS; ++s) {
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              const uint32_t w = word_of(cw[s], 2 * half + jj);
              const uint32_t we = w & 0x0F0F0F0Fu, wo = (w >> 4) & 0x0F0F0F0Fu;  // even, odd columns
              a3[s] = dp4a_su(jj ? p3.z : p3.x, we, a3[s]);
              a3[s] = dp4a_su(jj ? p3.w : p3.y, wo, a3[s]);
              a2[s] = dp4a_uu(jj ? p2.z : p2.x, we, a2[s]);
              a2[s] = dp4a_uu(jj ? p2.w : p2.y, wo, a2[s]);
              a1[s] = dp4a_uu(jj ? p1.z : p1.x, we, a1[s]);
              a1[s] = dp4a_uu(jj ? p1.w : p1.y, wo, a1[s]);
              a0[s] = dp4a_uu(jj ? p0.z : p0.x, we, a0[s]);
              a0[s] = dp4a_uu(jj ? p0.w : p0.y, wo, a0[s]);
            }
          }
        }
        const float sx = qscale[t][cl >> 1];
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          // A_i = Σ (q - 8) b_i (|A_3| <= 2^14, |A_0..2| < 2^16): both brackets are exact in f32.
          const int hi = a3[s] * 256 + static_cast<int>(a2[s]);
          const int lo = static_cast<int>(a1[s]) * 256 + static_cast<int>(a0[s]);
          const float f = fmaf(static_cast<float>(hi), 65536.0f, static_cast<float>(lo));
          acc[s][t] = fmaf(kGrouped ? cs[s] * sx : sx, f, acc[s][t]);
        }
      }
    }
  }
  if (!active) return;  // no barrier follows

  // Butterfly sums: every lane ends with the same bits (a + b == b + a).
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) acc[s][t] += __shfl_xor_sync(0xffffffffu, acc[s][t], off);
  if (!kGrouped) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const float scale = __ldg(sb[s / R] + soff[s % R]);
#pragma unroll
      for (int t = 0; t < T; ++t) acc[s][t] *= scale;
    }
  }
  // Lane i * T + t stores (row o0 + i, token t).
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (lane == i * T + t && o0 + i < rows_out) {
        if constexpr (GATE_UP) {
          store_h(it, t, o0 + i, silu(acc[i][t]) * acc[R + i][t]);
        } else {
          it.y[static_cast<int64_t>(t) * it.y_ld + o0 + i] = acc[i][t];
        }
      }
    }
  }
}

// Launches the instance for t tokens (every item of the launch has n_tok == t); cudaErrorInvalidValue outside
// 1..8.
template <int FMT, bool GATE_UP>
cudaError_t launch_gemv_q4(int t, const WorkItem* items, int n_items, int grid_x, cudaStream_t stream) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items));
  const dim3 block(kGemvWarps * 32);
  auto run = [&](auto kernel) { return launch_kernel(kernel, grid, block, stream, true, items); };
  switch (t) {
    case 1: return run(&gemv_q4_kernel<FMT, 1, GATE_UP>);
    case 2: return run(&gemv_q4_kernel<FMT, 2, GATE_UP>);
    case 3: return run(&gemv_q4_kernel<FMT, 3, GATE_UP>);
    case 4: return run(&gemv_q4_kernel<FMT, 4, GATE_UP>);
    case 5: return run(&gemv_q4_kernel<FMT, 5, GATE_UP>);
    case 6: return run(&gemv_q4_kernel<FMT, 6, GATE_UP>);
    case 7: return run(&gemv_q4_kernel<FMT, 7, GATE_UP>);
    case 8: return run(&gemv_q4_kernel<FMT, 8, GATE_UP>);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace strata_cuda
