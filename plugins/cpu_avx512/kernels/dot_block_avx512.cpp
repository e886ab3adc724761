// AVX-512 exact-mode dot kernel for F32/BF16/F16/Q4_ROW/Q4_G64 weights: register-blocked 4 rows × 4 x rows,
// bitwise identical to the portable kernel (canonical order in plugins/cpu_generic/kernels/dot.hpp).
#include "dot_block_avx512.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace strata_cpu {
namespace {

enum class Fmt { F32, BF16, F16, Q4Row, Q4G64 };

// 16 weights of row `row` starting at column i0 (i0 a multiple of 16), as f32. `rem` < 16 means a tail: only
// `rem` columns exist and nothing past them is read; the other lanes are zero or garbage (masked by the caller).
template <Fmt F>
inline __m512 load_w(const void* row, const float* scales, int64_t i0, int rem) {
  const __mmask16 m = rem >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << rem) - 1);
  if constexpr (F == Fmt::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + i0);
  } else if constexpr (F == Fmt::BF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i0);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (F == Fmt::F16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i0);
    return _mm512_cvtph_ps(h);
  } else {
    const auto* bytes = static_cast<const uint8_t*>(row) + i0 / 2;
    __m128i b;
    if (rem >= 16) {
      b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
    } else {
      uint64_t tmp = 0x8888888888888888ull;
      std::memcpy(&tmp, bytes, static_cast<size_t>((rem + 1) / 2));
      b = _mm_cvtsi64_si128(static_cast<long long>(tmp));
    }
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    const __m128i nib = _mm_unpacklo_epi8(lo, hi);  // column order: lo0 hi0 lo1 hi1 ...
    const __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(nib), _mm512_set1_epi32(8));
    const float s = F == Fmt::Q4G64 ? scales[i0 / 64] : scales[0];
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s));
  }
}

// The canonical fold: lanes l += l+8, then +4, +2, +1.
inline float fold(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

template <Fmt F, int R, int S>
void kernel(const void* const* rows, const float* const* scales, int64_t n, const float* x, int64_t x_stride, float* y,
            int64_t y_stride) {
  __m512 acc[R][S];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = load_w<F>(rows[r], scales[r], i, 16);
    for (int s = 0; s < S; ++s) {
      const __m512 xv = _mm512_loadu_ps(x + s * x_stride + i);
      for (int r = 0; r < R; ++r) acc[r][s] = _mm512_add_ps(acc[r][s], _mm512_mul_ps(w[r], xv));
    }
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const auto m = static_cast<__mmask16>((1u << rem) - 1);
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = load_w<F>(rows[r], scales[r], i, rem);
    for (int s = 0; s < S; ++s) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + s * x_stride + i);
      for (int r = 0; r < R; ++r) acc[r][s] = _mm512_mask_add_ps(acc[r][s], m, acc[r][s], _mm512_mul_ps(w[r], xv));
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) y[s * y_stride + r] = fold(acc[r][s]);
  }
}

template <Fmt F, int R>
void kernel_rows(int s_count, const void* const* rows, const float* const* scales, int64_t n, const float* x,
                 int64_t x_stride, float* y, int64_t y_stride) {
  switch (s_count) {
    case 4: return kernel<F, R, 4>(rows, scales, n, x, x_stride, y, y_stride);
    case 3: return kernel<F, R, 3>(rows, scales, n, x, x_stride, y, y_stride);
    case 2: return kernel<F, R, 2>(rows, scales, n, x, x_stride, y, y_stride);
    default: return kernel<F, R, 1>(rows, scales, n, x, x_stride, y, y_stride);
  }
}

template <Fmt F>
void dot_block_t(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x, int64_t x_stride,
                 float* y, int64_t y_stride) {
  const int64_t n = w.cols;
  size_t row_bytes = 0;
  int64_t scales_per_row = 0;
  if constexpr (F == Fmt::F32) {
    row_bytes = static_cast<size_t>(n) * 4;
  } else if constexpr (F == Fmt::BF16 || F == Fmt::F16) {
    row_bytes = static_cast<size_t>(n) * 2;
  } else {
    row_bytes = static_cast<size_t>((n + 1) / 2);
    scales_per_row = F == Fmt::Q4G64 ? (n + 63) / 64 : 1;
  }
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = o0; o < o1; o += 4) {
    const int rr = static_cast<int>(std::min<int64_t>(4, o1 - o));
    const void* rows[4];
    const float* sc[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int r = 0; r < rr; ++r) {
      rows[r] = base + static_cast<size_t>(o + r) * row_bytes;
      if (scales_per_row > 0) sc[r] = w.scales + (o + r) * scales_per_row;
    }
    for (int64_t s0 = 0; s0 < n_x; s0 += 4) {
      const int ss = static_cast<int>(std::min<int64_t>(4, n_x - s0));
      const float* xs = x + s0 * x_stride;
      float* ys = y + s0 * y_stride + (o - o0);
      switch (rr) {
        case 4: kernel_rows<F, 4>(ss, rows, sc, n, xs, x_stride, ys, y_stride); break;
        case 3: kernel_rows<F, 3>(ss, rows, sc, n, xs, x_stride, ys, y_stride); break;
        case 2: kernel_rows<F, 2>(ss, rows, sc, n, xs, x_stride, ys, y_stride); break;
        default: kernel_rows<F, 1>(ss, rows, sc, n, xs, x_stride, ys, y_stride); break;
      }
    }
  }
}

}  // namespace

void dot_block_avx512(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x, int64_t x_stride,
                      float* y, int64_t y_stride) {
  switch (w.dtype) {
    case STRATA_DTYPE_F32: return dot_block_t<Fmt::F32>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_BF16: return dot_block_t<Fmt::BF16>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_F16: return dot_block_t<Fmt::F16>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_Q4_ROW: return dot_block_t<Fmt::Q4Row>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_Q4_G64: return dot_block_t<Fmt::Q4G64>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    default: std::abort();  // the vtable checks formats before calling
  }
}

}  // namespace strata_cpu
