// AVX512_BF16 kernel of cpu_vnni: BF16 weight rows times activations rounded to bf16, with vdpbf16ps (32
// multiply-adds per instruction where the exact kernel decodes and does two f32 FMAs of 16).
#include <immintrin.h>

#include <algorithm>

#include "bf16.hpp"
#include "hsum.hpp"
#include "kernels/dot.hpp"

namespace strata_cpu {
namespace {

template <int R, int S>
void kernel(const uint16_t* const* rows, int64_t n, const uint16_t* const* x, float* y, int64_t y_stride,
            int64_t row_elems) {
  __m512 acc[R][S];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < n; c += 32) {
    const int64_t left = n - c;
    __m512i w[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // The next step's rows follow these: fetch them a line at a time, one step ahead (as cpu_avx512 does).
      prefetch_ahead(rows[r], 2 * (R * row_elems + c));
      w[r] = left >= 32 ? _mm512_loadu_si512(rows[r] + c)
                        : _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << left) - 1), rows[r] + c);
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      const __m512i xv = _mm512_load_si512(x[s] + c);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], (__m512bh)xv, (__m512bh)w[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) y[s * y_stride + r] = hsum(acc[r][s]);
  }
}

template <int R>
void kernel_s(int s_count, const uint16_t* const* rows, int64_t n, const uint16_t* const* x, float* y,
              int64_t y_stride, int64_t row_elems) {
  switch (s_count) {
    case 4:
      return kernel<R, 4>(rows, n, x, y, y_stride, row_elems);
    case 3:
      return kernel<R, 3>(rows, n, x, y, y_stride, row_elems);
    case 2:
      return kernel<R, 2>(rows, n, x, y, y_stride, row_elems);
    default:
      return kernel<R, 1>(rows, n, x, y, y_stride, row_elems);
  }
}

}  // namespace

void to_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < bf16_cols(n); i += 32) {
    const int64_t la = std::clamp<int64_t>(n - i, 0, 16), lb = std::clamp<int64_t>(n - i - 16, 0, 16);
    const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << la) - 1), x + i);
    const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lb) - 1), x + i + 16);
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

void dot_bf16(const strata_matrix& w, int64_t o0, int64_t o1, const uint16_t* const* x, int64_t n_x, float* y,
              int64_t y_stride) {
  const int64_t n = w.cols;
  const auto* base = static_cast<const uint16_t*>(w.data);
  constexpr int kRows = 4, kXs = 4;  // 16 accumulators, 4 weight vectors, one activation vector live
  for (int64_t o = o0; o < o1; o += kRows) {
    const int rr = static_cast<int>(std::min<int64_t>(kRows, o1 - o));
    const uint16_t* rows[kRows];
    for (int r = 0; r < rr; ++r) rows[r] = base + (o + r) * n;
    for (int64_t s0 = 0; s0 < n_x; s0 += kXs) {
      const int ss = static_cast<int>(std::min<int64_t>(kXs, n_x - s0));
      float* ys = y + s0 * y_stride + (o - o0);
      switch (rr) {
        case 4:
          kernel_s<4>(ss, rows, n, x + s0, ys, y_stride, n);
          break;
        case 3:
          kernel_s<3>(ss, rows, n, x + s0, ys, y_stride, n);
          break;
        case 2:
          kernel_s<2>(ss, rows, n, x + s0, ys, y_stride, n);
          break;
        default:
          kernel_s<1>(ss, rows, n, x + s0, ys, y_stride, n);
          break;
      }
    }
  }
}

}  // namespace strata_cpu
