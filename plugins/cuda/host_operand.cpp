// The exact tensor-core operand's token table, encoded on the host (host_operand.hpp): the arithmetic of the
// device's encode_i8_unit (kernels/encode_i8.cuh) in exactly rounded IEEE steps, so the bytes are the same.
#include "host_operand.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#if defined(__x86_64__)
#include <immintrin.h>
#else
#include <cfenv>
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

// Round half to even to an integer, for |s| < 2^30 (the device's __float2int_rn): the double sum is rounded
// to an integer by the addition itself (1.5 * 2^52 puts the units digit at the last mantissa bit).
int32_t round_half_even(float s) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double t = static_cast<double>(s) + kMagic;  // (IEEE arithmetic: no -ffast-math here)
  return static_cast<int32_t>(t - kMagic);
}

// The stored digits of m: the 4 bytes of (m + 0x808080) ^ 0x808080 are d0 .. d3 (balanced base 256: with
// M = m + 128 (1 + 256 + 65536), bytes 0-2 of M are d_p + 128 and M >> 24 is d3).
inline uint32_t digit_bytes(int32_t m) {
  return (static_cast<uint32_t>(m) + 0x808080u) ^ 0x808080u;
}

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

// A group's scaling by 2^(30 - e) as two products, each exact or rounded once as ldexpf rounds (|x 2^(30 - e)|
// < 2^30): 30 - e <= 127, one product by that power of two (rounded once where the result is subnormal); above
// (the group's largest value below 2^-97), by 2^127 and then by the rest, both exact (the magnitude grows and a
// nonzero x >= 2^-149 ends normal).
struct GroupScale {
  float fa, fb;
  explicit GroupScale(int e) {
    const int k = 30 - e;
    fa = pow2f(k > 127 ? 127 : k);
    fb = k > 127 ? pow2f(k - 127) : 1.0f;
  }
};

// A group's multiplier: 2^(e - 34), or NaN for a group with a non-finite value.
void put_mult(float* at, bool bad, int e) {
  const uint32_t nan = 0x7fc00000u;
  if (bad) {
    std::memcpy(at, &nan, 4);
  } else {
    *at = pow2f(e - 34);
  }
}

// One row, a value at a time (the portable form; the AVX2 one must give its bytes).
void encode_row_scalar(const float* row, int64_t cols, int64_t kp, uint8_t* planes, float* mult) {
  float v[kColPad];
  for (int64_t grp = 0; grp < kp / kColPad; ++grp) {
    const int64_t c0 = grp * kColPad;
    bool bad = false;
    float amax = 0.0f;
    for (int i = 0; i < kColPad; ++i) {
      v[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
      const float a = std::fabs(v[i]);
      bad = bad || !(a <= std::numeric_limits<float>::max());  // (inf, NaN)
      amax = a > amax ? a : amax;
    }
    const int e = !bad && amax > 0.0f ? frexp_exponent(amax) : 0;
    const GroupScale sc(e);
    for (int ch = 0; ch < kColPad; ch += 16) {  // a 16-column chunk's positions are contiguous
      uint8_t* at = planes + i8_pos_host(c0 + ch, kp);
      for (int s = 0; s < 16; ++s) {  // position s holds column 8 (s >> 3) + 2 (s & 3) + ((s >> 2) & 1)
        const int i = ch + 8 * (s >> 3) + 2 * (s & 3) + ((s >> 2) & 1);
        const uint32_t d = digit_bytes(bad ? 0 : round_half_even(v[i] * sc.fa * sc.fb));
        for (int p = 0; p < kI8Planes; ++p) at[p * kp + s] = static_cast<uint8_t>(d >> (8 * p));
      }
    }
    put_mult(mult + grp, bad, e);
  }
}

#if defined(__x86_64__)
// 32 values at a time with AVX2: a 16-column chunk's values as digit words (cvtps2dq rounds half to even under
// the default MXCSR, which encode_token_table_as sets), then a byte transpose of the words into the 4 planes in
// i8_pos' order within a chunk (columns 0 2 4 6 1 3 5 7 8 10 12 14 9 11 13 15); two chunks at a time, chunk 2j
// in the low 128-bit lanes and 2j + 1 in the high ones, so the per-lane unpacks transpose both at once.
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
    put_mult(mult + grp, bad, e);
    if (bad) {
      for (auto& r : v) r = _mm256_setzero_ps();  // (digits zero)
    }
    const GroupScale sc(e);
    const __m256 fa = _mm256_set1_ps(sc.fa), fb = _mm256_set1_ps(sc.fb);
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

// (GCC 12's AVX-512 headers leave an "undefined" vector to the reductions and shuffles, which -Wall reports as
// (maybe) uninitialized; a false positive.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// 64 values (a group) at a time with AVX-512 (F, BW): the group's 4 chunks transposed by 128-bit lanes so that
// register k holds columns 4k .. 4k + 3 of every chunk (chunk j in lane j), then the AVX2 form's per-lane digit
// words and byte transpose, giving each plane's 16 bytes of chunk j in lane j. A whole unit (two groups) is
// stored as 128 contiguous bytes per plane (its chunks interleaved: group 0's chunk k at 32 k, group 1's at
// 32 k + 16); a last unit of one group as its chunks in order. group_avx512: one group's planes (plane[p], chunk
// j in lane j) and its multiplier.
__attribute__((target("avx512f,avx512bw"))) void group_avx512(const float* src, float* mu,
                                                             __m512i (&plane)[kI8Planes]) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), bias = _mm512_set1_epi32(0x808080);
  __m512 v[4];
  __m512 mx = _mm512_setzero_ps();
  __mmask16 nonfinite = 0;
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm512_loadu_ps(src + 16 * k);
    mx = _mm512_max_ps(mx, _mm512_abs_ps(v[k]));
    nonfinite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v[k]), exp_mask), exp_mask);
  }
  const bool bad = nonfinite != 0;
  const float amax = _mm512_reduce_max_ps(mx);
  const int e = !bad && amax > 0.0f ? frexp_exponent(amax) : 0;
  put_mult(mu, bad, e);
  if (bad) {
    for (auto& r : v) r = _mm512_setzero_ps();  // (digits zero)
  }
  const GroupScale sc(e);
  const __m512 fa = _mm512_set1_ps(sc.fa), fb = _mm512_set1_ps(sc.fb);
  const __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  const __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  const __m512 q[4] = {_mm512_shuffle_f32x4(t0, t2, 0x88), _mm512_shuffle_f32x4(t0, t2, 0xDD),
                       _mm512_shuffle_f32x4(t1, t3, 0x88), _mm512_shuffle_f32x4(t1, t3, 0xDD)};
  __m512i x[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i m = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(q[k], fa), fb));
    x[k] = _mm512_xor_si512(_mm512_add_epi32(m, bias), bias);
  }
  const __m512i ua = _mm512_unpacklo_epi8(x[0], x[1]), ub = _mm512_unpackhi_epi8(x[0], x[1]);
  const __m512i uc = _mm512_unpacklo_epi8(x[2], x[3]), ud = _mm512_unpackhi_epi8(x[2], x[3]);
  const __m512i ev0 = _mm512_unpacklo_epi8(ua, ub), od0 = _mm512_unpackhi_epi8(ua, ub);
  const __m512i ev1 = _mm512_unpacklo_epi8(uc, ud), od1 = _mm512_unpackhi_epi8(uc, ud);
  const __m512i i0 = _mm512_unpacklo_epi32(ev0, od0), i1 = _mm512_unpackhi_epi32(ev0, od0);
  const __m512i j0 = _mm512_unpacklo_epi32(ev1, od1), j1 = _mm512_unpackhi_epi32(ev1, od1);
  plane[0] = _mm512_unpacklo_epi64(i0, j0);
  plane[1] = _mm512_unpackhi_epi64(i0, j0);
  plane[2] = _mm512_unpacklo_epi64(i1, j1);
  plane[3] = _mm512_unpackhi_epi64(i1, j1);
}

__attribute__((target("avx512f,avx512bw"))) void encode_row_avx512(const float* row, int64_t cols, int64_t kp,
                                                                  uint8_t* planes, float* mult) {
  alignas(64) float pad[2 * kColPad];
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t c0 = 0; c0 < kp; c0 += 2 * kColPad) {  // units of 128 columns
    const bool whole = c0 + 2 * kColPad <= kp;
    const int64_t n = whole ? 2 * kColPad : kColPad;
    const float* src = row + c0;
    if (c0 + n > cols) {  // (a partial last unit: zeros past the row)
      for (int64_t i = 0; i < n; ++i) pad[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
      src = pad;
    }
    __m512i p0[kI8Planes], p1[kI8Planes];
    group_avx512(src, mult + c0 / kColPad, p0);
    if (!whole) {
      for (int p = 0; p < kI8Planes; ++p) _mm512_storeu_si512(planes + p * kp + c0, p0[p]);
      continue;
    }
    group_avx512(src + kColPad, mult + c0 / kColPad + 1, p1);
    for (int p = 0; p < kI8Planes; ++p) {
      _mm512_storeu_si512(planes + p * kp + c0, _mm512_permutex2var_epi64(p0[p], lo, p1[p]));
      _mm512_storeu_si512(planes + p * kp + c0 + 64, _mm512_permutex2var_epi64(p0[p], hi, p1[p]));
    }
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

uint64_t token_table_bytes(int64_t n_rows, int64_t kp) {
  const auto rows = static_cast<uint64_t>(n_rows);
  return rows * kI8Planes * static_cast<uint64_t>(kp) + (rows + 1) * static_cast<uint64_t>(kp / kColPad) * 4;
}

void encode_token_table(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                        int64_t n_rows, uint8_t* dst) {
#if defined(__x86_64__)
  static const TableCode best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                                    ? TableCode::kAvx512
                                : __builtin_cpu_supports("avx2") ? TableCode::kAvx2
                                                                 : TableCode::kScalar;
  encode_token_table_as(x, ld_x, cols, kp, src, n_rows, dst, best);
#else
  encode_token_table_as(x, ld_x, cols, kp, src, n_rows, dst, TableCode::kScalar);
#endif
}

void encode_token_table_as(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                           int64_t n_rows, uint8_t* dst, TableCode code) {
#if defined(__x86_64__)
  if (code == TableCode::kAvx2 && !__builtin_cpu_supports("avx2")) code = TableCode::kScalar;
  if (code == TableCode::kAvx512 && !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))) {
    code = TableCode::kScalar;
  }
#endif
  const int64_t n_groups = kp / kColPad;
  float* mult = reinterpret_cast<float*>(dst + static_cast<uint64_t>(n_rows) * kI8Planes * kp);
  // The zero token's multipliers (its digits are never read: the kernel's B columns past the tokens load a
  // live one).
  std::memset(mult + n_rows * n_groups, 0, static_cast<size_t>(n_groups) * 4);
  // IEEE defaults for the products and conversions (no flush to zero, round to nearest even), whatever the
  // calling thread set; restored after.
#if defined(__x86_64__)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(0x1f80);
#else
  std::fenv_t env;
  std::fegetenv(&env);
  std::fesetenv(FE_DFL_ENV);
#endif
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* row = x + (src != nullptr ? src[t] : t) * ld_x;
    uint8_t* planes = dst + static_cast<uint64_t>(t) * kI8Planes * kp;
    float* row_mult = mult + t * n_groups;
#if defined(__x86_64__)
    if (code == TableCode::kAvx512) {
      encode_row_avx512(row, cols, kp, planes, row_mult);
      continue;
    }
    if (code == TableCode::kAvx2) {
      encode_row_avx2(row, cols, kp, planes, row_mult);
      continue;
    }
#endif
    encode_row_scalar(row, cols, kp, planes, row_mult);
  }
#if defined(__x86_64__)
  _mm_setcsr(csr);
#else
  std::fesetenv(&env);
#endif
}

}  // namespace strata_cuda
