// The exact tensor-core operand's token table, encoded on the host (host_operand.hpp): the arithmetic of the
// device's encode_i8_unit (kernels/encode_i8.cuh) in exactly rounded IEEE steps, so the bytes are the same.
#include "host_operand.hpp"

#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/work.hpp"

namespace strata_cuda {
namespace {

// The column stored at position c of a plane row of kp bytes (device_util.cuh's i8_pos, the same formula).
int64_t i8_pos_host(int64_t c, int64_t kp) {
  const int64_t in16 = (c & 8) | ((c & 1) << 2) | ((c >> 1) & 3);
  const int64_t unit = c & ~int64_t{127};
  if (unit + 128 > kp) return (c & ~int64_t{15}) | in16;
  return unit | (((c >> 4) & 3) << 5) | (((c >> 6) & 1) << 4) | in16;
}

// v 2^k rounded once to f32, as ldexpf does (|v 2^k| < 2^30 here, k <= 178). k <= 127: one product by the
// power of two, rounded once where the result is subnormal. k > 127 (the group's largest value below 2^-97):
// a product by 2^127, then by the rest, both exact (the magnitude grows, and a nonzero v >= 2^-149 ends
// normal).
float scale_pow2(float v, int k) {
  if (k > 127) return v * std::ldexp(1.0f, 127) * std::ldexp(1.0f, k - 127);
  return v * std::ldexp(1.0f, k);
}

// Round half to even to an integer, for |s| < 2^30 (the device's __float2int_rn): the double sum is rounded
// to an integer by the addition itself (1.5 * 2^52 puts the units digit at the last mantissa bit).
int32_t round_half_even(float s) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double t = static_cast<double>(s) + kMagic;  // (IEEE arithmetic: no -ffast-math here)
  return static_cast<int32_t>(t - kMagic);
}

}  // namespace

uint64_t token_table_bytes(int64_t n_rows, int64_t kp) {
  const auto rows = static_cast<uint64_t>(n_rows);
  return rows * kI8Planes * static_cast<uint64_t>(kp) + (rows + 1) * static_cast<uint64_t>(kp / kColPad) * 4;
}

namespace {

// The multiplier of a group with exponent e, or NaN for a group with a non-finite value.
float group_mult(bool bad, int e) {
  float mu = std::ldexp(1.0f, e - 34);
  if (bad) {
    const uint32_t nan = 0x7fc00000u;
    std::memcpy(&mu, &nan, 4);
  }
  return mu;
}

// The stored digits of m: the 4 bytes of (m + 0x808080) ^ 0x808080 are d0 .. d3 (balanced base 256: with
// M = m + 128 (1 + 256 + 65536), bytes 0-2 of M are d_p + 128 and M >> 24 is d3).
inline uint32_t digit_bytes(int32_t m) {
  return (static_cast<uint32_t>(m) + 0x808080u) ^ 0x808080u;
}

// One row, a value at a time (the reference; the SSE2 form below must give its bytes).
void encode_row_scalar(const float* row, int64_t cols, int64_t kp, uint8_t* planes, float* mult) {
  float v[kColPad];
  for (int64_t grp = 0; grp < kp / kColPad; ++grp) {
    const int64_t c0 = grp * kColPad;
    bool bad = false;
    float amax = 0.0f;
    for (int i = 0; i < kColPad; ++i) {
      v[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
      bad = bad || !std::isfinite(v[i]);
      amax = std::fmax(amax, std::fabs(v[i]));
    }
    int e = 0;
    if (!bad && amax > 0.0f) (void)std::frexp(amax, &e);  // amax = f 2^e, f in [0.5, 1)
    for (int i = 0; i < kColPad; ++i) {
      const uint32_t d = digit_bytes(bad ? 0 : round_half_even(scale_pow2(v[i], 30 - e)));
      const int64_t at = i8_pos_host(c0 + i, kp);
      for (int p = 0; p < kI8Planes; ++p) planes[p * kp + at] = static_cast<uint8_t>(d >> (8 * p));
    }
    mult[grp] = group_mult(bad, e);
  }
}

#if defined(__SSE2__)
// 2^k as an f32 (ldexpf(1, k)): normal, subnormal or zero, from its bits.
float pow2f(int k) {
  uint32_t bits = 0;
  if (k >= -126) {
    bits = static_cast<uint32_t>(k + 127) << 23;  // (k <= 127 here)
  } else if (k >= -149) {
    bits = 1u << (k + 149);
  }  // (below 2^-149: 0, as ldexpf rounds it)
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// frexpf's exponent of a positive finite a: a = f 2^e with f in [0.5, 1), from its bits.
int frexp_exponent(float a) {
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  const int biased = static_cast<int>(bits >> 23);
  if (biased > 0) return biased - 126;
  return (32 - __builtin_clz(bits)) - 149;  // subnormal: its mantissa's bit length
}

// 16 values at a time: a 16-column chunk scaled by 2^(30 - e) in two products (as scale_pow2), converted with
// round-half-even (cvtps2dq under the default MXCSR, which encode_token_table sets), and its digit bytes
// transposed into the 4 planes in i8_pos' order within a chunk (columns 0 2 4 6 1 3 5 7 8 10 12 14 9 11 13 15).
void encode_row_sse2(const float* row, int64_t cols, int64_t kp, uint8_t* planes, float* mult) {
  alignas(16) float pad[kColPad];
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128i exp_mask = _mm_set1_epi32(0x7f800000), bias = _mm_set1_epi32(0x808080);
  for (int64_t grp = 0; grp < kp / kColPad; ++grp) {
    const int64_t c0 = grp * kColPad;
    const float* src = row + c0;
    if (c0 + kColPad > cols) {  // (a partial last group: zeros past the row)
      for (int i = 0; i < kColPad; ++i) pad[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
      src = pad;
    }
    __m128 v[16];
    __m128 mx = _mm_setzero_ps();
    __m128i nonfinite = _mm_setzero_si128();
    for (int k = 0; k < 16; ++k) {
      v[k] = _mm_loadu_ps(src + 4 * k);
      mx = _mm_max_ps(mx, _mm_and_ps(v[k], abs_mask));
      nonfinite = _mm_or_si128(nonfinite,
                               _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(v[k]), exp_mask), exp_mask));
    }
    const bool bad = _mm_movemask_epi8(nonfinite) != 0;
    alignas(16) float m4[4];
    _mm_store_ps(m4, mx);
    const float amax = std::fmax(std::fmax(m4[0], m4[1]), std::fmax(m4[2], m4[3]));
    const int e = !bad && amax > 0.0f ? frexp_exponent(amax) : 0;
    if (bad) {
      const uint32_t nan = 0x7fc00000u;
      std::memcpy(mult + grp, &nan, 4);
    } else {
      mult[grp] = pow2f(e - 34);
    }
    if (bad) {  // (digits zero)
      for (int p = 0; p < kI8Planes; ++p) {
        for (int ch = 0; ch < 4; ++ch) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + p * kp + i8_pos_host(c0 + 16 * ch, kp)),
                           _mm_setzero_si128());
        }
      }
      continue;
    }
    const int k30 = 30 - e;
    const __m128 fa = _mm_set1_ps(pow2f(k30 > 127 ? 127 : k30));
    const __m128 fb = _mm_set1_ps(k30 > 127 ? pow2f(k30 - 127) : 1.0f);
    for (int ch = 0; ch < 4; ++ch) {  // 16-column chunks
      __m128i x[4];  // columns 4k .. 4k + 3 of the chunk: their digit bytes
      for (int k = 0; k < 4; ++k) {
        const __m128i m = _mm_cvtps_epi32(_mm_mul_ps(_mm_mul_ps(v[4 * ch + k], fa), fb));
        x[k] = _mm_xor_si128(_mm_add_epi32(m, bias), bias);
      }
      // A byte transpose: the planes' bytes of columns (0 2 4 6), (1 3 5 7) of x0, x1, then (8 .. 14),
      // (9 .. 15) of x2, x3, as a dword per plane; then those dwords gathered per plane.
      const __m128i a = _mm_unpacklo_epi8(x[0], x[1]), b = _mm_unpackhi_epi8(x[0], x[1]);
      const __m128i c = _mm_unpacklo_epi8(x[2], x[3]), d = _mm_unpackhi_epi8(x[2], x[3]);
      const __m128i ev0 = _mm_unpacklo_epi8(a, b), od0 = _mm_unpackhi_epi8(a, b);
      const __m128i ev1 = _mm_unpacklo_epi8(c, d), od1 = _mm_unpackhi_epi8(c, d);
      const __m128i i0 = _mm_unpacklo_epi32(ev0, od0), i1 = _mm_unpackhi_epi32(ev0, od0);
      const __m128i j0 = _mm_unpacklo_epi32(ev1, od1), j1 = _mm_unpackhi_epi32(ev1, od1);
      const __m128i plane[4] = {_mm_unpacklo_epi64(i0, j0), _mm_unpackhi_epi64(i0, j0), _mm_unpacklo_epi64(i1, j1),
                                _mm_unpackhi_epi64(i1, j1)};
      const int64_t at = i8_pos_host(c0 + 16 * ch, kp);  // (a chunk's 16 positions are contiguous)
      for (int p = 0; p < kI8Planes; ++p) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + p * kp + at), plane[p]);
      }
    }
  }
}
#endif

#if defined(__x86_64__)
// The same with AVX2, two chunks at a time (chunk 2j in the low 128-bit lanes, 2j + 1 in the high ones, so the
// per-lane unpacks transpose both at once): ~35 % less time than SSE2 here (bench_cuda --host-operand).
__attribute__((target("avx2"))) void encode_row_avx2(const float* row, int64_t cols, int64_t kp, uint8_t* planes,
                                                     float* mult) {
  alignas(32) float pad[kColPad];
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000), bias = _mm256_set1_epi32(0x808080);
  for (int64_t grp = 0; grp < kp / kColPad; ++grp) {
    const int64_t c0 = grp * kColPad;
    const float* src = row + c0;
    if (c0 + kColPad > cols) {  // (a partial last group: zeros past the row)
      for (int i = 0; i < kColPad; ++i) pad[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
      src = pad;
    }
    __m256 v[8];
    __m256 mx = _mm256_setzero_ps();
    __m256i nonfinite = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      v[k] = _mm256_loadu_ps(src + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[k], abs_mask));
      nonfinite = _mm256_or_si256(
          nonfinite, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v[k]), exp_mask), exp_mask));
    }
    const bool bad = _mm256_movemask_epi8(nonfinite) != 0;
    alignas(32) float m8[8];
    _mm256_store_ps(m8, mx);
    float amax = 0.0f;
    for (float f : m8) amax = std::fmax(amax, f);
    const int e = !bad && amax > 0.0f ? frexp_exponent(amax) : 0;
    if (bad) {
      const uint32_t nan = 0x7fc00000u;
      std::memcpy(mult + grp, &nan, 4);
      for (int p = 0; p < kI8Planes; ++p) {  // (digits zero)
        for (int ch = 0; ch < 4; ++ch) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + p * kp + i8_pos_host(c0 + 16 * ch, kp)),
                           _mm_setzero_si128());
        }
      }
      continue;
    }
    mult[grp] = pow2f(e - 34);
    const int k30 = 30 - e;
    const __m256 fa = _mm256_set1_ps(pow2f(k30 > 127 ? 127 : k30));
    const __m256 fb = _mm256_set1_ps(k30 > 127 ? pow2f(k30 - 127) : 1.0f);
    for (int pair = 0; pair < 2; ++pair) {  // chunks 2 pair, 2 pair + 1
      const __m256 a = v[4 * pair], b = v[4 * pair + 1], c = v[4 * pair + 2], d = v[4 * pair + 3];
      const __m256 q[4] = {_mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31),
                           _mm256_permute2f128_ps(b, d, 0x20), _mm256_permute2f128_ps(b, d, 0x31)};
      __m256i x[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i m = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(q[k], fa), fb));
        x[k] = _mm256_xor_si256(_mm256_add_epi32(m, bias), bias);
      }
      const __m256i ua = _mm256_unpacklo_epi8(x[0], x[1]), ub = _mm256_unpackhi_epi8(x[0], x[1]);
      const __m256i uc = _mm256_unpacklo_epi8(x[2], x[3]), ud = _mm256_unpackhi_epi8(x[2], x[3]);
      const __m256i ev0 = _mm256_unpacklo_epi8(ua, ub), od0 = _mm256_unpackhi_epi8(ua, ub);
      const __m256i ev1 = _mm256_unpacklo_epi8(uc, ud), od1 = _mm256_unpackhi_epi8(uc, ud);
      const __m256i i0 = _mm256_unpacklo_epi32(ev0, od0), i1 = _mm256_unpackhi_epi32(ev0, od0);
      const __m256i j0 = _mm256_unpacklo_epi32(ev1, od1), j1 = _mm256_unpackhi_epi32(ev1, od1);
      const __m256i plane[4] = {_mm256_unpacklo_epi64(i0, j0), _mm256_unpackhi_epi64(i0, j0),
                                _mm256_unpacklo_epi64(i1, j1), _mm256_unpackhi_epi64(i1, j1)};
      const int64_t at0 = i8_pos_host(c0 + 32 * pair, kp), at1 = i8_pos_host(c0 + 32 * pair + 16, kp);
      for (int p = 0; p < kI8Planes; ++p) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + p * kp + at0), _mm256_castsi256_si128(plane[p]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + p * kp + at1), _mm256_extracti128_si256(plane[p], 1));
      }
    }
  }
}
#endif

}  // namespace

void encode_token_table(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                        int64_t n_rows, uint8_t* dst) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  encode_token_table_as(x, ld_x, cols, kp, src, n_rows, dst, avx2 ? TableCode::kAvx2 : TableCode::kSse2);
#elif defined(__SSE2__)
  encode_token_table_as(x, ld_x, cols, kp, src, n_rows, dst, TableCode::kSse2);
#else
  encode_token_table_as(x, ld_x, cols, kp, src, n_rows, dst, TableCode::kScalar);
#endif
}

void encode_token_table_as(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                           int64_t n_rows, uint8_t* dst, TableCode code) {
#if defined(__x86_64__)
  if (code == TableCode::kAvx2 && !__builtin_cpu_supports("avx2")) code = TableCode::kScalar;
#endif
  const int64_t n_groups = kp / kColPad;
  float* mult = reinterpret_cast<float*>(dst + static_cast<uint64_t>(n_rows) * kI8Planes * kp);
  // The zero token's multipliers (its digits are never read: the kernel's B columns past the tokens load a
  // live one).
  std::memset(mult + n_rows * n_groups, 0, static_cast<size_t>(n_groups) * 4);
#if defined(__SSE2__)
  // IEEE defaults for the products and conversions (no flush to zero, round to nearest even), whatever the
  // calling thread set; restored after.
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(0x1f80);
#endif
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* row = x + (src != nullptr ? src[t] : t) * ld_x;
    uint8_t* planes = dst + static_cast<uint64_t>(t) * kI8Planes * kp;
    float* row_mult = mult + t * n_groups;
#if defined(__x86_64__)
    if (code == TableCode::kAvx2) {
      encode_row_avx2(row, cols, kp, planes, row_mult);
      continue;
    }
#endif
#if defined(__SSE2__)
    if (code == TableCode::kSse2) {
      encode_row_sse2(row, cols, kp, planes, row_mult);
      continue;
    }
#endif
    encode_row_scalar(row, cols, kp, planes, row_mult);
  }
#if defined(__SSE2__)
  _mm_setcsr(csr);
#endif
}

}  // namespace strata_cuda
