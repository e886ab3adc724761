// AVX-512 exact-mode dot kernel for F32/BF16/F16/Q4_ROW/Q4_G64 weights, bitwise identical to the portable
// kernel: the canonical order (plugins/cpu_generic/kernels/dot.hpp) keeps even and odd columns in separate
// accumulators, so 32 weights decode with no cross-lane shuffle against x in blocked layout (evens, then
// odds, per 32 columns, prepared once per call by the drivers), and up to 4 weight rows × 2 x rows (or 2 × 4)
// accumulate at once to hide the add latency.
#include "dot_block_avx512.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/dot.hpp"

namespace strata_cpu {
namespace {

enum class Fmt { F32, BF16, F16, Q4Row, Q4G64 };

struct Decoded {
  __m512 even, odd;
};

// Weights of one row for the 32 columns starting at i (a multiple of 32). rem < 32 marks the last partial
// block: nothing past column i + rem is read, and lanes beyond it hold values the caller masks out.
template <Fmt F>
inline Decoded decode(const void* row, __m512 table, int64_t i, int rem) {
  if constexpr (F == Fmt::F32) {
    const float* p = static_cast<const float*>(row) + i;
    const __mmask16 ma = rem >= 16 ? 0xffff : static_cast<__mmask16>((1u << rem) - 1);
    const __mmask16 mb = rem >= 32 ? 0xffff : (rem > 16 ? static_cast<__mmask16>((1u << (rem - 16)) - 1) : 0);
    const __m512 a = _mm512_maskz_loadu_ps(ma, p);
    const __m512 b = _mm512_maskz_loadu_ps(mb, p + 16);
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return {_mm512_permutex2var_ps(a, ie, b), _mm512_permutex2var_ps(a, io, b)};
  } else if constexpr (F == Fmt::BF16 || F == Fmt::F16) {
    const auto* p = static_cast<const uint16_t*>(row) + i;
    const __mmask32 m = rem >= 32 ? 0xffffffffu : static_cast<__mmask32>((1ull << rem) - 1);
    const __m512i v = _mm512_maskz_loadu_epi16(m, p);  // dword j = col 2j+1 << 16 | col 2j
    if constexpr (F == Fmt::BF16) {
      return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
              _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
    } else {
      return {_mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)),
              _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)))};
    }
  } else {
    const auto* p = static_cast<const uint8_t*>(row) + i / 2;
    __m128i b;
    if (rem >= 32) {
      b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) uint8_t tmp[16];
      std::memset(tmp, 0x88, sizeof tmp);
      std::memcpy(tmp, p, static_cast<size_t>((rem + 1) / 2));
      b = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
    }
    // Byte j holds column 2j (low nibble) and 2j+1 (high nibble); the permutes read only the low 4 bits of
    // each index, so the table lookup of (nibble - 8) * scale needs no masking.
    const __m512i v = _mm512_cvtepu8_epi32(b);
    return {_mm512_permutexvar_ps(v, table), _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table)};
  }
}

// (t - 8) · s for t = 0..15: the 16 values an int4 weight with scale s can take, each one f32 multiply,
// exactly as the portable decode computes them.
inline __m512 q4_table(float s) {
  const __m512 q = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  return _mm512_mul_ps(q, _mm512_set1_ps(s));
}

// The canonical fold of the 32 accumulators: t = even + odd, then lanes l += l+8, +4, +2, +1.
inline float fold(__m512 even, __m512 odd) {
  const __m512 v = _mm512_add_ps(even, odd);
  // Lanes 0-7 by a shuffle rather than _mm512_castps512_ps256, whose undefined upper half g++ 12 reports as
  // used uninitialized (GCC bug 105593); the same register.
  const __m256 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 a = _mm256_add_ps(lo, _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

// Bytes of weights per 32 columns.
template <Fmt F>
constexpr int64_t kBlockBytes = F == Fmt::F32                       ? 128
                                : (F == Fmt::BF16 || F == Fmt::F16) ? 64
                                                                    : 16;

template <Fmt F, int R, int S>
void kernel(const void* const* rows, const float* const* scales, int64_t n, const float* xd,
            int64_t xd_stride, float* y, int64_t y_stride, int64_t row_bytes) {
  __m512 ae[R][S], ao[R][S];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) ae[r][s] = ao[r][s] = _mm512_setzero_ps();
  }
  __m512 table[R];
  for (int r = 0; r < R; ++r) table[r] = _mm512_setzero_ps();
  if constexpr (F == Fmt::Q4Row) {
    for (int r = 0; r < R; ++r) table[r] = q4_table(scales[r][0]);
  }
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // Expert rows are short (1-3 KB of int4), so each row is a new stream for the hardware prefetcher; fetch
    // the next R rows (the next step of this block, contiguous after these) one cache line per row ahead of
    // use. Measured on the 2-core AVX-512 dev VM, one GLM-5.2 expert layer in Q4_G64, 1 row: 46 % -> 72 % of
    // the read bandwidth (1 thread), cold 128-expert projection shape 42 % -> 78 %.
    if ((i * kBlockBytes<F> / 32) % 64 == 0) {
      for (int r = 0; r < R; ++r) {
        prefetch_ahead(rows[r], R * row_bytes + i * kBlockBytes<F> / 32);
      }
    }
    if constexpr (F == Fmt::Q4G64) {
      if (i % 64 == 0) {
        for (int r = 0; r < R; ++r) table[r] = q4_table(scales[r][i / 64]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const Decoded w = decode<F>(rows[r], table[r], i, 32);
      for (int s = 0; s < S; ++s) {
        const float* xs = xd + s * xd_stride + i;
        ae[r][s] = _mm512_fmadd_ps(w.even, _mm512_loadu_ps(xs), ae[r][s]);
        ao[r][s] = _mm512_fmadd_ps(w.odd, _mm512_loadu_ps(xs + 16), ao[r][s]);
      }
    }
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const auto me = static_cast<__mmask16>((1u << ((rem + 1) / 2)) - 1);
    const auto mo = static_cast<__mmask16>((1u << (rem / 2)) - 1);
    if constexpr (F == Fmt::Q4G64) {
      if (i % 64 == 0) {
        for (int r = 0; r < R; ++r) table[r] = q4_table(scales[r][i / 64]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const Decoded w = decode<F>(rows[r], table[r], i, rem);
      for (int s = 0; s < S; ++s) {
        const float* xs = xd + s * xd_stride + i;
        ae[r][s] = _mm512_mask3_fmadd_ps(w.even, _mm512_loadu_ps(xs), ae[r][s], me);
        ao[r][s] = _mm512_mask3_fmadd_ps(w.odd, _mm512_loadu_ps(xs + 16), ao[r][s], mo);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) y[s * y_stride + r] = fold(ae[r][s], ao[r][s]);
  }
}

template <Fmt F, int R>
void kernel_s(int s_count, const void* const* rows, const float* const* scales, int64_t n, const float* xd,
              int64_t xd_stride, float* y, int64_t y_stride, int64_t row_bytes) {
  switch (s_count) {
    case 4:
      return kernel<F, R, 4>(rows, scales, n, xd, xd_stride, y, y_stride, row_bytes);
    case 3:
      return kernel<F, R, 3>(rows, scales, n, xd, xd_stride, y, y_stride, row_bytes);
    case 2:
      return kernel<F, R, 2>(rows, scales, n, xd, xd_stride, y, y_stride, row_bytes);
    default:
      return kernel<F, R, 1>(rows, scales, n, xd, xd_stride, y, y_stride, row_bytes);
  }
}

template <Fmt F>
void dot_block_t(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                 int64_t x_stride, float* y, int64_t y_stride) {
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
  const float* xd = x;  // already in blocked layout (dot.hpp)
  const int64_t xd_stride = x_stride;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto rb = static_cast<int64_t>(row_bytes);
  // 32 registers: 4 weight rows × 2 x rows (16 accumulators) for decode-sized batches, 2 × 4 beyond.
  const int rows_per_step = n_x <= 2 ? 4 : 2;
  const int xs_per_step = n_x <= 2 ? 2 : 4;
  for (int64_t o = o0; o < o1; o += rows_per_step) {
    const int rr = static_cast<int>(std::min<int64_t>(rows_per_step, o1 - o));
    const void* rows[4];
    const float* sc[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int r = 0; r < rr; ++r) {
      rows[r] = base + static_cast<size_t>(o + r) * row_bytes;
      if (scales_per_row > 0) sc[r] = w.scales + (o + r) * scales_per_row;
    }
    for (int64_t s0 = 0; s0 < n_x; s0 += xs_per_step) {
      const int ss = static_cast<int>(std::min<int64_t>(xs_per_step, n_x - s0));
      const float* xs = xd + s0 * xd_stride;
      float* ys = y + s0 * y_stride + (o - o0);
      switch (rr) {
        case 4:
          kernel_s<F, 4>(ss, rows, sc, n, xs, xd_stride, ys, y_stride, rb);
          break;
        case 3:
          kernel_s<F, 3>(ss, rows, sc, n, xs, xd_stride, ys, y_stride, rb);
          break;
        case 2:
          kernel_s<F, 2>(ss, rows, sc, n, xs, xd_stride, ys, y_stride, rb);
          break;
        default:
          kernel_s<F, 1>(ss, rows, sc, n, xs, xd_stride, ys, y_stride, rb);
          break;
      }
    }
  }
}

}  // namespace

void dot_block_avx512(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                      int64_t x_stride, float* y, int64_t y_stride) {
  switch (w.dtype) {
    case STRATA_DTYPE_F32:
      return dot_block_t<Fmt::F32>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_BF16:
      return dot_block_t<Fmt::BF16>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_F16:
      return dot_block_t<Fmt::F16>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_Q4_ROW:
      return dot_block_t<Fmt::Q4Row>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    case STRATA_DTYPE_Q4_G64:
      return dot_block_t<Fmt::Q4G64>(w, o0, o1, x, n_x, x_stride, y, y_stride);
    default:
      std::abort();  // the vtable checks formats before calling
  }
}

}  // namespace strata_cpu
