// AVX-512 VNNI kernels of cpu_vnni: activation rows quantized to int8 per 64 columns, and int4 weight rows
// times those rows with vpdpbusd (64 byte products per instruction against 16 f32 products per FMA).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "hsum.hpp"
#include "kernels/dot.hpp"
#include "q8.hpp"

namespace strata_cpu {

void quantize_q8(const float* x, int64_t n, Q8Chunk* out) {
  const int64_t chunks = q8_chunks(n);
  std::memset(static_cast<void*>(out), 0, static_cast<size_t>(chunks) * sizeof(Q8Chunk));
  // q and d of every column, natural order, for one chunk at a time.
  int8_t qn[kQ8Cols];
  float dn[4];
  for (int64_t c = 0; c < chunks; ++c) {
    Q8Chunk& ch = out[c];
    std::memset(qn, 0, sizeof qn);
    for (int g = 0; g < 4; ++g) {
      const int64_t c0 = c * kQ8Cols + 64 * g, c1 = std::min(c0 + 64, n);
      dn[g] = 0.0f;
      if (c0 >= n) continue;
      float amax = 0.0f;
      bool finite = true;
      for (int64_t i = c0; i < c1; ++i) {
        finite = finite && std::isfinite(x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
      if (!finite) {  // an Inf or NaN: the group's q stay 0 and its scale is NaN, so every output it feeds is
        dn[g] = std::numeric_limits<float>::quiet_NaN();  // NaN, as exact mode's would be (no UB cast)
        continue;
      }
      dn[g] = amax / 127.0f;
      if (amax == 0.0f) continue;
      // In double: 127 / amax overflows float for subnormal amax, and x · 127 for x near FLT_MAX.
      const double inv = 127.0 / amax;
      for (int64_t i = c0; i < c1; ++i)
        qn[i - c * kQ8Cols] = static_cast<int8_t>(std::nearbyint(static_cast<double>(x[i]) * inv));
    }
    for (int t = 0; t < 4; ++t) {
      for (int i = 0; i < 64; ++i) {
        const int8_t q = qn[q8_column(t, i)];
        ch.q[t][i] = q;
        ch.corr[i / 4] -= 8 * q;
      }
    }
    for (int l = 0; l < 16; ++l) ch.d[l] = dn[l / 4];
  }
}

namespace {

// R weight rows × S activation rows per step, R · S f32 accumulators; a row's four nibble vectors live for
// its S products.
template <bool Grouped, int R, int S>
void kernel(const uint8_t* const* rows, const float* const* scales, int64_t n, const Q8Chunk* const* x,
            float* y, int64_t y_stride, int64_t row_bytes) {
  const int64_t chunks = q8_chunks(n), groups = (n + 63) / 64;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i lane_group = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[R][S];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t left = row_bytes - 128 * c;  // bytes of this chunk in the row (the last may be short)
    const int g_left = static_cast<int>(std::min<int64_t>(4, groups - 4 * c));
    // The R rows' nibbles and scales first, then each activation row's operands once for all R rows: loads,
    // not arithmetic, limit this loop (a 512-bit load per cycle on Zen 4), so every operand is read once per
    // step. The loops are unrolled so that acc, w and ws stay in registers.
    __m512i w[R][4];
    __m512 ws[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = rows[r] + 128 * c;
      // The next step's rows follow these in memory: fetch them two lines a chunk, one step ahead (the rows
      // are short streams the hardware prefetcher barely ramps up on; see cpu_avx512).
      prefetch_ahead(p, R * row_bytes);
      prefetch_ahead(p, R * row_bytes + 64);
      __m512i a, b;
      if (left >= 128) {
        a = _mm512_loadu_si512(p);
        b = _mm512_loadu_si512(p + 64);
      } else {
        const int64_t la = std::min<int64_t>(left, 64), lb = left - la;
        a = _mm512_maskz_loadu_epi8(la >= 64 ? ~__mmask64{0} : (__mmask64{1} << la) - 1, p);
        b = _mm512_maskz_loadu_epi8(lb <= 0 ? 0 : (__mmask64{1} << lb) - 1, p + 64);
      }
      const __m512i s1 = _mm512_shuffle_i64x2(a, b, 0x88), s2 = _mm512_shuffle_i64x2(a, b, 0xdd);
      w[r][0] = _mm512_and_si512(s1, low4);
      w[r][1] = _mm512_and_si512(_mm512_srli_epi16(s1, 4), low4);
      w[r][2] = _mm512_and_si512(s2, low4);
      w[r][3] = _mm512_and_si512(_mm512_srli_epi16(s2, 4), low4);
      if constexpr (Grouped) {
        const __m128 four = _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << g_left) - 1), scales[r] + 4 * c);
        ws[r] = _mm512_permutexvar_ps(lane_group, _mm512_zextps128_ps512(four));
      } else {
        ws[r] = _mm512_set1_ps(scales[r][0]);  // Q4_ROW: one scale for the whole row
      }
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      const Q8Chunk& q = x[s][c];
      const __m512i corr = _mm512_load_si512(q.corr);
      const __m512i q0 = _mm512_load_si512(q.q[0]), q1 = _mm512_load_si512(q.q[1]);
      const __m512i q2 = _mm512_load_si512(q.q[2]), q3 = _mm512_load_si512(q.q[3]);
      const __m512 d = _mm512_load_ps(q.d);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512i dot = _mm512_dpbusd_epi32(corr, w[r][0], q0);
        dot = _mm512_dpbusd_epi32(dot, w[r][1], q1);
        dot = _mm512_dpbusd_epi32(dot, w[r][2], q2);
        dot = _mm512_dpbusd_epi32(dot, w[r][3], q3);
        acc[r][s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws[r], d), acc[r][s]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) y[s * y_stride + r] = hsum(acc[r][s]);
  }
}

template <bool Grouped, int R>
void kernel_s(int s_count, const uint8_t* const* rows, const float* const* scales, int64_t n,
              const Q8Chunk* const* x, float* y, int64_t y_stride, int64_t row_bytes) {
  switch (s_count) {
    case 6:
      return kernel<Grouped, R, 6>(rows, scales, n, x, y, y_stride, row_bytes);
    case 5:
      return kernel<Grouped, R, 5>(rows, scales, n, x, y, y_stride, row_bytes);
    case 4:
      return kernel<Grouped, R, 4>(rows, scales, n, x, y, y_stride, row_bytes);
    case 3:
      return kernel<Grouped, R, 3>(rows, scales, n, x, y, y_stride, row_bytes);
    case 2:
      return kernel<Grouped, R, 2>(rows, scales, n, x, y, y_stride, row_bytes);
    default:
      return kernel<Grouped, R, 1>(rows, scales, n, x, y, y_stride, row_bytes);
  }
}

template <bool Grouped>
void dot_t(const strata_matrix& w, int64_t o0, int64_t o1, const Q8Chunk* const* x, int64_t n_x, float* y,
           int64_t y_stride) {
  const int64_t n = w.cols, row_bytes = (n + 1) / 2, scales_per_row = Grouped ? (n + 63) / 64 : 1;
  const auto* base = static_cast<const uint8_t*>(w.data);
  // 32 registers: 4 weight rows × up to 2 activation rows for decode-sized batches, 2 × 4 for 3-5 rows, 2 × 6
  // from 6 (R · S accumulators, 4R nibble vectors, R scale vectors and 6 activation operands live). 2 × 6
  // against 2 × 4 at n = 512, one thread on the dev VM: 199-200 ms against 215-226.
  constexpr int kRows = 4;
  const int rows_per_step = n_x <= 2 ? 4 : 2, xs_per_step = n_x <= 2 ? 2 : (n_x < 6 ? 4 : 6);
  for (int64_t o = o0; o < o1; o += rows_per_step) {
    const int rr = static_cast<int>(std::min<int64_t>(rows_per_step, o1 - o));
    const uint8_t* rows[kRows];
    const float* sc[kRows];
    for (int r = 0; r < rr; ++r) {
      rows[r] = base + (o + r) * row_bytes;
      sc[r] = w.scales + (o + r) * scales_per_row;
    }
    for (int64_t s0 = 0; s0 < n_x; s0 += xs_per_step) {
      const int ss = static_cast<int>(std::min<int64_t>(xs_per_step, n_x - s0));
      float* ys = y + s0 * y_stride + (o - o0);
      switch (rr) {
        case 4:
          kernel_s<Grouped, 4>(ss, rows, sc, n, x + s0, ys, y_stride, row_bytes);
          break;
        case 3:
          kernel_s<Grouped, 3>(ss, rows, sc, n, x + s0, ys, y_stride, row_bytes);
          break;
        case 2:
          kernel_s<Grouped, 2>(ss, rows, sc, n, x + s0, ys, y_stride, row_bytes);
          break;
        default:
          kernel_s<Grouped, 1>(ss, rows, sc, n, x + s0, ys, y_stride, row_bytes);
          break;
      }
    }
  }
}

}  // namespace

void dot_q4_q8(const strata_matrix& w, int64_t o0, int64_t o1, const Q8Chunk* const* x, int64_t n_x, float* y,
               int64_t y_stride) {
  if (w.dtype == STRATA_DTYPE_Q4_G64) return dot_t<true>(w, o0, o1, x, n_x, y, y_stride);
  if (w.dtype == STRATA_DTYPE_Q4_ROW) return dot_t<false>(w, o0, o1, x, n_x, y, y_stride);
  std::abort();  // the drivers send only int4 matrices here
}

}  // namespace strata_cpu
