// Memory-bound "gemv" kernels for int4 weights (Q4_G64, Q4_ROW) and 1..8 tokens per item, in f32 on the SIMT
// cores: y = W · x, or the fused expert gate/up h = silu(gate · x) ⊙ (up · x). The exact-mode int4 path (see
// plugins/cuda/README.md): every token's value is an f32 dot product in a fixed order, whatever the item's
// token count, so prefill equals decode bit for bit.
//
// Work split: a warp owns R output rows of each of its NM matrices (gate_up: 2 gate + 2 up rows; linear: 4 rows),
// i.e. NS = 4 weight streams. A row is read in 16-byte chunks (32 columns, half a Q4_G64 group); chunk c goes
// to lane c % 32, so a warp reads 512 contiguous bytes of each stream per step, 2 KB in all (ld.global.nc,
// L1::no_allocate: the weights are read once and must not evict the activations from L1). The next step's
// chunks are loaded before the current ones are used (up to 4 KB in flight per warp). 4 warps per block; grid
// x = row blocks, y = work items (every expert of a pass and token count in one launch).
//
// Activations: the item's input operand is f32 [T][gemv_ld(kp)] *pre-scaled*: column k holds x_k · 16^-(k % 4)
// (exact: a power of two), stored at gemv_slot(k) so that each float4 load of a warp is 512 contiguous bytes. A 32-bit word of weights holds columns 8j .. 8j + 7 as nibbles 0..7; nibble n sits, in w (n < 4)
// or in w >> 16 (n >= 4), at position i = n % 4 = k % 4, and
//     f = float((w & (15 << 4i)) | 0x4B000000) - (2^23 + 8 · 16^i) = (q - 8) · 16^i     (exact: lop3 + fadd)
// so the fma f · x'_k is exactly (q - 8) · x_k: per weight one lop3, one fadd, one fma per token (plus one shift
// per 8 weights), no int-to-float conversion (about 3.6 SASS instructions per weight with one token). The
// activations are read through L1 (__ldg float4), each load shared by the NS streams; tokens go in groups
// of up to 4 (registers), the weights decoded again for tokens 5..8.
//
// Order of the sums, per (row, token), the same for every T and every launch:
//   Q4_G64: per chunk p = fma chain over its 32 columns in order (from 0), then acc = fma(scale, p, acc);
//   Q4_ROW: acc = one fma chain over the lane's columns in order; times the row scale after the reduction;
//   each lane takes its chunks in increasing order; then a fixed xor-shuffle tree over the 32 lanes.
// Rows past the matrix read a clamped (valid) row and are never stored; columns are padded to 64 with zero
// activations (device copies pad with zero weights), so padding adds nothing.
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

// The 32-bit word j (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// (nibble at position I of w) - 8, times 16^I, exactly: bits 4I .. 4I + 3 (I <= 3) lie below the exponent of
// 2^23, so OR-ing them into `magic` (0x4B000000, 2^23, passed as a register: the AND-OR is then one lop3 instead
// of two) makes the float 2^23 + q · 16^I, and the subtraction is exact.
template <int I>
__device__ __forceinline__ float q4_scaled(uint32_t w, uint32_t magic) {
#if defined(STRATA_CUDA_EMULATE)
  const uint32_t b = (w & (0xFu << (4 * I))) | magic;
#else
  uint32_t b;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(b) : "r"(w), "n"(0xFu << (4 * I)), "r"(magic));
#endif
  return __uint_as_float(b) - (8388608.0f + 8.0f * static_cast<float>(1u << (4 * I)));
}

// Blocks (of 4 warps) per SM asked of the register allocator (sm_90, no spills): many warps for few tokens,
// where the kernel must keep the memory busy (1 token: 80 registers, 24 warps per SM, up to 4 KB of loads in
// flight each); fewer as the per-token accumulators grow and the fma become the limit (2 tokens: 96 registers,
// 20 warps; 3: 128, 16; 4-8: 168, 12).
constexpr int gemv_min_blocks(int t) { return t <= 1 ? 6 : t <= 2 ? 5 : t <= 3 ? 4 : 3; }

template <int FMT, int T, bool GATE_UP>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_min_blocks(T))
    gemv_q4_kernel(const WorkItem* __restrict__ items) {
  static_assert(FMT == kQ4G64 || FMT == kQ4Row, "int4 formats only");
  static_assert(T >= 1 && T <= kGemvMaxTok, "1..8 tokens");
  constexpr int NM = GATE_UP ? 2 : 1;
  constexpr int R = GATE_UP ? kGemvRowsGateUp : kGemvRowsLinear;
  constexpr int NS = NM * R;  // weight streams of a warp: stream s = m * R + i is row o0 + i of matrix m
  constexpr bool kGrouped = FMT == kQ4G64;
  static_assert(R * T <= 32, "one store per lane");

  grid_dep_launch();
  const WorkItem& it = items[blockIdx.y];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int rows_out = it.w0.rows;
  const int o0 = (static_cast<int>(blockIdx.x) * kGemvWarps + warp) * R;
  if (o0 >= rows_out) return;  // whole warp; no block-wide barrier follows
  const int kp = it.w0.kp;
  const int n_chunks = kp / 32;  // 16-byte chunks per row (even: kp is a multiple of 64)

  // Stream s reads row o0 + i of matrix m (clamped to the last row): a base pointer per matrix and 32-bit
  // offsets (at most 3 rows apart, or in the next 16-row tile: well within 2^31 bytes for any real matrix)
  // keep the registers for accumulators. Chunk c of a row is at c * 16 (rows in order) or, in tiles, at
  // 1024 (c / 4) + 16 (c % 4) from the row's first byte (see DevMatrix); gate and up may differ (one resident,
  // one staged), so offsets and layout are per matrix.
  // Scales likewise: a base per matrix; row o0 + d at d sstep[m] from it (the warp's R rows are in one 16-row
  // block: o0 is a multiple of R <= 16), a Q4_G64 group at its offset in the matrix's scale layout.
  const uint8_t* wb[NM];
  const float* sb[NM];
  int32_t woff[NM][R], sstep[NM];
  bool tiles[NM];
  static_assert(16 % R == 0, "a warp's rows in one 16-row block");
  const int last = rows_out - 1 - o0;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const DevMatrix& mat = m == 0 ? it.w0 : it.w1;
    wb[m] = static_cast<const uint8_t*>(mat.data) + q4_row_byte(mat, o0, 0);
    sb[m] = mat.scales + (kGrouped ? q4_scale_row(mat, o0) : o0);
    tiles[m] = mat.layout == kTiles;
    sstep[m] = kGrouped ? static_cast<int32_t>(q4_scale_row(mat, 1) - q4_scale_row(mat, 0)) : 1;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int d = imin(i, last);
      woff[m][i] = static_cast<int32_t>(q4_row_byte(mat, o0 + d, 0) - q4_row_byte(mat, o0, 0));
    }
  }
  auto soff = [&](int m, int i) { return imin(i, last) * sstep[m]; };
  const float* x = static_cast<const float*>(it.in);
  const int ld = gemv_ld(kp);  // the operand's row length (slot order, see gemv_slot)
  const uint32_t hide0 = static_cast<uint32_t>(it.n_tok - T);  // 0: every item of the launch has T tokens
  const uint32_t magic = 0x4B000000u | hide0;                     // kept in a register (see q4_scaled)

  float acc[NS][T];
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[s][t] = 0.0f;

  // Chunk c of every stream (weights, and the Q4_G64 scale of its group).
  auto load = [&](int c, uint4 (&w)[NS], float (&sc)[NS]) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const uint8_t* row = wb[s / R] + woff[s / R][s % R];
      if (tiles[s / R]) {
        // Chunk c's two 8-byte pieces (bytes 16 (c % 4) .. of unit c / 4, q4_tile_byte). (Through L1 they were
        // slower still: n = 32 of the projection shape +11 % against +2 % for these, run119-120.)
        const int j = c & 3;
        const uint8_t* unit = row + static_cast<int64_t>(c >> 2) * 1024 + (j >> 1) * 8;
        const uint2 lo = ld_stream_u2(unit + ((2 * j) & 3) * 16), hi = ld_stream_u2(unit + ((2 * j + 1) & 3) * 16);
        w[s] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      } else {
        w[s] = ld_stream_u4(row + static_cast<int64_t>(c) * 16);
      }
      sc[s] = kGrouped ? __ldg(sb[s / R] + soff(s / R, s % R) + q4_scale_grp(tiles[s / R], c >> 1)) : 0.0f;
    }
  };
  // The next step's chunks are loaded before this step's are used (nw/ns), so each warp keeps up to two steps
  // (4 KB) of loads in flight.
  uint4 nw[NS];
  float ns[NS];
  if (lane < n_chunks) load(lane, nw, ns);
  grid_dep_wait();  // the weights above may load during the previous kernel's tail; the activations not
  for (int c = lane; c < n_chunks; c += 32) {
    uint4 cw[NS];
    float cs[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      cw[s] = nw[s];
      cs[s] = ns[s];
    }
    if (c + 32 < n_chunks) load(c + 32, nw, ns);
    const float* xc = x + static_cast<int64_t>(c - lane) * 32 + 4 * lane;  // quarter q of chunk c: xc + 128 q
    // Tokens in groups of up to 4 (more would not fit the registers; the weights are then decoded once per
    // group, which changes nothing in the sums).
#pragma unroll
    for (int t0 = 0; t0 < T; t0 += 4) {
      // The second group decodes the words again, xor a zero the compiler cannot see (n_tok - T): otherwise
      // it keeps all 128 decoded weights of the first group alive for the second (and spills).
      uint4 gw[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        gw[s] = cw[s];
        if (t0 > 0) {
          gw[s].x ^= hide0;
          gw[s].y ^= hide0;
          gw[s].z ^= hide0;
          gw[s].w ^= hide0;
        }
      }
      float p[NS][4];  // Q4_G64: this chunk's sums (the group's scale applies to them); Q4_ROW: unused
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int t = 0; t < 4; ++t) p[s][t] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // columns 8j + 4h .. 8j + 4h + 3: positions 0..3 of w (h = 0) or w >> 16
          float4 xv[4];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            xv[t] = t0 + t < T ? __ldg(reinterpret_cast<const float4*>(xc + static_cast<int64_t>(t0 + t) * ld +
                                                                        128 * (2 * j + h)))
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
#pragma unroll
          for (int s = 0; s < NS; ++s) {
            const uint32_t w = h == 0 ? word_of(gw[s], j) : word_of(gw[s], j) >> 16;
            const float f0 = q4_scaled<0>(w, magic), f1 = q4_scaled<1>(w, magic);
            const float f2 = q4_scaled<2>(w, magic), f3 = q4_scaled<3>(w, magic);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              if (t0 + t < T) {
                float& a = kGrouped ? p[s][t] : acc[s][t0 + t];
                a = fmaf(f0, xv[t].x, a);
                a = fmaf(f1, xv[t].y, a);
                a = fmaf(f2, xv[t].z, a);
                a = fmaf(f3, xv[t].w, a);
              }
            }
          }
        }
      }
      if (kGrouped) {
#pragma unroll
        for (int s = 0; s < NS; ++s)
#pragma unroll
          for (int t = 0; t < 4; ++t)
            if (t0 + t < T) acc[s][t0 + t] = fmaf(cs[s], p[s][t], acc[s][t0 + t]);
      }
    }
  }

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
      const float scale = __ldg(sb[s / R] + soff(s / R, s % R));
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
cudaError_t launch_gemv_q4(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  if (n_items <= 0 || grid_x <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(n_items));
  const dim3 block(kGemvWarps * 32);
  auto run = [&](auto kernel) { return launch_kernel(kernel, grid, block, on, true, items); };
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
