// AVX-512 VNNI kernels of cpu_vnni: activation rows quantized to int8 per 64 columns, and int4 weight rows
// times those rows with vpdpbusd (64 byte products per instruction against 16 f32 products per FMA).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "q8.hpp"

namespace strata_cpu {

void quantize_q8(const float* x, int64_t n, Q8Chunk* out) {
  const int64_t chunks = q8_chunks(n);
  std::memset(static_cast<void*>(out), 0, static_cast<size_t>(chunks) * sizeof(Q8Chunk));
  for (int64_t c = 0; c < chunks; ++c) {
    Q8Chunk& ch = out[c];
    for (int half = 0; half < 2; ++half) {
      const int64_t c0 = c * kQ8Cols + half * 64, c1 = std::min(c0 + 64, n);
      if (c0 >= n) break;
      float amax = 0.0f;
      for (int64_t i = c0; i < c1; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int l = 0; l < 8; ++l) ch.d[half * 8 + l] = amax / 127.0f;
      for (int64_t i = c0; i < c1; ++i) {
        const int k = static_cast<int>(i - c * kQ8Cols);  // column within the chunk
        const auto q = static_cast<int8_t>(std::nearbyint(x[i] * inv));
        (k % 2 == 0 ? ch.even : ch.odd)[k / 2] = q;
        ch.corr[k / 8] -= 8 * q;
      }
    }
  }
}

namespace {

// The sum of the 16 lanes in a fixed order (halves, then quarters, ...). Lanes 0-7 by a shuffle rather than
// _mm512_reduce_add_ps, whose undefined upper halves g++ 12 reports as used uninitialized (GCC bug 105593).
inline float hsum(__m512 v) {
  const __m256 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 a = _mm256_add_ps(lo, _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

// R weight rows × S activation rows per step: R · S f32 accumulators, 2R decoded nibble vectors.
template <bool Grouped, int R, int S>
void kernel(const uint8_t* const* rows, const float* const* scales, int64_t n, const Q8Chunk* const* x,
            float* y, int64_t y_stride, int64_t row_bytes) {
  const int64_t chunks = q8_chunks(n), groups = (n + 63) / 64;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[R][S];
  __m512 ws[R];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
    ws[r] = _mm512_set1_ps(scales[r][0]);  // Q4_ROW: one scale for the whole row
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t left = row_bytes - 64 * c;
    __m512i lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      // The next step's rows follow these in memory: fetch them a line at a time, one step ahead (the rows
      // are short streams the hardware prefetcher barely ramps up on; see cpu_avx512).
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + R * row_bytes + 64 * c), _MM_HINT_T0);
      const __m512i w = left >= 64 ? _mm512_loadu_si512(rows[r] + 64 * c)
                                   : _mm512_maskz_loadu_epi8((__mmask64{1} << left) - 1, rows[r] + 64 * c);
      lo[r] = _mm512_and_si512(w, low4);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
      if constexpr (Grouped) {
        const float s0 = scales[r][2 * c], s1 = 2 * c + 1 < groups ? scales[r][2 * c + 1] : s0;
        ws[r] = _mm512_mask_broadcastss_ps(_mm512_set1_ps(s0), 0xff00, _mm_set_ss(s1));
      }
    }
    for (int s = 0; s < S; ++s) {
      const Q8Chunk& q = x[s][c];
      const __m512i xe = _mm512_load_si512(q.even), xo = _mm512_load_si512(q.odd);
      const __m512i corr = _mm512_load_si512(q.corr);
      const __m512 d = _mm512_load_ps(q.d);
      for (int r = 0; r < R; ++r) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[r], xe), hi[r], xo);
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
  constexpr int kRows = 4, kXs = 4;
  for (int64_t o = o0; o < o1; o += kRows) {
    const int rr = static_cast<int>(std::min<int64_t>(kRows, o1 - o));
    const uint8_t* rows[kRows];
    const float* sc[kRows];
    for (int r = 0; r < rr; ++r) {
      rows[r] = base + (o + r) * row_bytes;
      sc[r] = w.scales + (o + r) * scales_per_row;
    }
    for (int64_t s0 = 0; s0 < n_x; s0 += kXs) {
      const int ss = static_cast<int>(std::min<int64_t>(kXs, n_x - s0));
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
