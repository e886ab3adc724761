// AVX2 + FMA exact-mode dot kernel for F32/BF16/F16/Q4_ROW/Q4_G64 weights, bitwise identical to the portable
// kernel: the canonical order (plugins/cpu_generic/kernels/dot.hpp) has 16 even and 16 odd accumulators per
// 32 columns; here each is two 8-lane registers (lanes 0-7 and 8-15), fed from x in blocked layout (evens,
// then odds, per 32 columns). int4 weights decode as (nibble - 8) converted to f32 times the scale, one
// rounding, exactly the portable decode (and the AVX-512 kernel's table).
#include "dot_block_avx2.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/dot.hpp"

namespace strata_cpu {
namespace {

enum class Fmt { F32, BF16, F16, Q4Row, Q4G64 };

// The 32 weights of one block: even columns 0, 2, .., 14 (e0) and 16, .., 30 (e1); odd columns 1, .., 15 (o0)
// and 17, .., 31 (o1). Accumulator lane l of e0 is the canonical E[l], of e1 E[l + 8]; likewise O.
struct Decoded {
  __m256 e0, e1, o0, o1;
};

inline __m256 q4_values(__m256i nibbles, __m256 scale) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(nibbles, _mm256_set1_epi32(8))), scale);
}

// Weights of one row for the 32 columns starting at i (a multiple of 32). rem < 32 marks the last partial
// block: nothing past column i + rem is read, and lanes beyond it hold values the caller blends out.
template <Fmt F>
inline Decoded decode(const void* row, __m256 scale, int64_t i, int rem) {
  if constexpr (F == Fmt::F32) {
    const float* p = static_cast<const float*>(row) + i;
    __m256 a[4];
    if (rem >= 32) {
      for (int k = 0; k < 4; ++k) a[k] = _mm256_loadu_ps(p + 8 * k);
    } else {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (int k = 0; k < 4; ++k) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8 * k), lane);
        a[k] = _mm256_maskload_ps(p + 8 * k, m);
      }
    }
    // shuffle 0x88 / 0xDD: columns [0 2 8 10 | 4 6 12 14] / [1 3 9 11 | 5 7 13 15]; the 64-bit permute
    // (0, 2, 1, 3) puts them in order.
    auto evens = [](__m256 x, __m256 y) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0x88)), 0xD8));
    };
    auto odds = [](__m256 x, __m256 y) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0xDD)), 0xD8));
    };
    return {evens(a[0], a[1]), evens(a[2], a[3]), odds(a[0], a[1]), odds(a[2], a[3])};
  } else if constexpr (F == Fmt::BF16 || F == Fmt::F16) {
    const auto* p = static_cast<const uint16_t*>(row) + i;
    __m256i a, b;  // columns 0-15 and 16-31; dword j = column 2j+1 << 16 | column 2j
    if (rem >= 32) {
      a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    } else {
      alignas(32) uint16_t tmp[32] = {};
      std::memcpy(tmp, p, static_cast<size_t>(rem) * 2);
      a = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
      b = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp + 16));
    }
    if constexpr (F == Fmt::BF16) {
      const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
      return {_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)),
              _mm256_castsi256_ps(_mm256_and_si256(a, hi)), _mm256_castsi256_ps(_mm256_and_si256(b, hi))};
    } else {
      // Per 128-bit lane: the even halves to its low 8 bytes, the odd ones to its high 8; then the 64-bit
      // permute (0, 2, 1, 3) gives 8 even halves in the low 128 bits and 8 odd ones in the high 128.
      const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5,
                                             8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
      const __m256i ea = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a, split), 0xD8);
      const __m256i eb = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, split), 0xD8);
      return {_mm256_cvtph_ps(_mm256_castsi256_si128(ea)), _mm256_cvtph_ps(_mm256_castsi256_si128(eb)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(ea, 1)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(eb, 1))};
    }
  } else {
    const auto* p = static_cast<const uint8_t*>(row) + i / 2;
    alignas(16) uint8_t tmp[16];
    if (rem < 32) {
      std::memset(tmp, 0x88, sizeof tmp);
      std::memcpy(tmp, p, static_cast<size_t>((rem + 1) / 2));
      p = tmp;
    }
    // Byte j holds column 2j (low nibble) and 2j+1 (high nibble): bytes 0-7 are columns 0-15, 8-15 the rest
    // (each half zero-extended straight from memory: no shuffle to split a 16-byte load).
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i low = _mm256_set1_epi32(0x0f);
    return {q4_values(_mm256_and_si256(v0, low), scale), q4_values(_mm256_and_si256(v1, low), scale),
            q4_values(_mm256_srli_epi32(v0, 4), scale), q4_values(_mm256_srli_epi32(v1, 4), scale)};
  }
}

// The canonical fold of the 32 accumulators: t = even + odd, then lanes l += l+8, +4, +2, +1.
inline float fold(const __m256 (&a)[4]) {
  const __m256 t = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}

// Bytes of weights per 32 columns.
template <Fmt F>
constexpr int64_t kBlockBytes = F == Fmt::F32                       ? 128
                                : (F == Fmt::BF16 || F == Fmt::F16) ? 64
                                                                    : 16;

// R weight rows x S x rows at once (16 registers: 4 R S accumulators, R scales, the decode's temporaries).
template <Fmt F, int R, int S>
void kernel(const void* const* rows, const float* const* scales, int64_t n, const float* xd,
            int64_t xd_stride, float* y, int64_t y_stride, int64_t row_bytes) {
  __m256 acc[R][S][4];
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < 4; ++k) acc[r][s][k] = _mm256_setzero_ps();
    }
  }
  __m256 scale[R];
  for (int r = 0; r < R; ++r) scale[r] = _mm256_setzero_ps();
  if constexpr (F == Fmt::Q4Row) {
    for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_ps(scales[r][0]);
  }
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // Expert rows are short (1-3 KB of int4), so each row is a new stream for the hardware prefetcher; fetch
    // the next R rows (contiguous after these) one cache line per row ahead of use, as the AVX-512 kernel
    // does.
    if ((i * kBlockBytes<F> / 32) % 64 == 0) {
      for (int r = 0; r < R; ++r) {
        prefetch_ahead(rows[r], R * row_bytes + i * kBlockBytes<F> / 32);
      }
    }
    if constexpr (F == Fmt::Q4G64) {
      if (i % 64 == 0) {
        for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_ps(scales[r][i / 64]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const Decoded w = decode<F>(rows[r], scale[r], i, 32);
      for (int s = 0; s < S; ++s) {
        const float* xs = xd + s * xd_stride + i;
        acc[r][s][0] = _mm256_fmadd_ps(w.e0, _mm256_loadu_ps(xs), acc[r][s][0]);
        acc[r][s][1] = _mm256_fmadd_ps(w.e1, _mm256_loadu_ps(xs + 8), acc[r][s][1]);
        acc[r][s][2] = _mm256_fmadd_ps(w.o0, _mm256_loadu_ps(xs + 16), acc[r][s][2]);
        acc[r][s][3] = _mm256_fmadd_ps(w.o1, _mm256_loadu_ps(xs + 24), acc[r][s][3]);
      }
    }
  }
  if (i < n) {
    // The last partial block: accumulator lane l of the evens takes column 2l (< rem), of the odds 2l + 1;
    // the other lanes keep their value (a blend: whatever the decode put in those lanes).
    const int rem = static_cast<int>(n - i);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i ne = _mm256_set1_epi32((rem + 1) / 2), no = _mm256_set1_epi32(rem / 2);
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256 mask[4] = {_mm256_castsi256_ps(_mm256_cmpgt_epi32(ne, lane)),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(ne, _mm256_add_epi32(lane, eight))),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(no, lane)),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(no, _mm256_add_epi32(lane, eight)))};
    if constexpr (F == Fmt::Q4G64) {
      if (i % 64 == 0) {
        for (int r = 0; r < R; ++r) scale[r] = _mm256_set1_ps(scales[r][i / 64]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const Decoded d = decode<F>(rows[r], scale[r], i, rem);
      const __m256 w[4] = {d.e0, d.e1, d.o0, d.o1};
      for (int s = 0; s < S; ++s) {
        const float* xs = xd + s * xd_stride + i;
        for (int k = 0; k < 4; ++k) {
          const __m256 f = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xs + 8 * k), acc[r][s][k]);
          acc[r][s][k] = _mm256_blendv_ps(acc[r][s][k], f, mask[k]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) y[s * y_stride + r] = fold(acc[r][s]);
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
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto rb = static_cast<int64_t>(row_bytes);
  // 8 accumulators: 2 weight rows x 1 x row at decode (one token per expert), 1 x 2 beyond (each weight
  // decoded once for two x rows).
  const int rows_per_step = n_x == 1 ? 2 : 1;
  const int xs_per_step = n_x == 1 ? 1 : 2;
  for (int64_t o = o0; o < o1; o += rows_per_step) {
    const int rr = static_cast<int>(std::min<int64_t>(rows_per_step, o1 - o));
    const void* rows[2];
    const float* sc[2] = {nullptr, nullptr};
    for (int r = 0; r < rr; ++r) {
      rows[r] = base + static_cast<size_t>(o + r) * row_bytes;
      if (scales_per_row > 0) sc[r] = w.scales + (o + r) * scales_per_row;
    }
    for (int64_t s0 = 0; s0 < n_x; s0 += xs_per_step) {
      const int ss = static_cast<int>(std::min<int64_t>(xs_per_step, n_x - s0));
      const float* xs = x + s0 * x_stride;
      float* ys = y + s0 * y_stride + (o - o0);
      if (rr == 2) {
        kernel<F, 2, 1>(rows, sc, n, xs, x_stride, ys, y_stride, rb);
      } else if (ss == 2) {
        kernel<F, 1, 2>(rows, sc, n, xs, x_stride, ys, y_stride, rb);
      } else {
        kernel<F, 1, 1>(rows, sc, n, xs, x_stride, ys, y_stride, rb);
      }
    }
  }
}

}  // namespace

void dot_block_avx2(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
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
