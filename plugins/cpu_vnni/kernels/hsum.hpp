// The sum of an AVX-512 vector's 16 lanes in one fixed order (halves, then quarters, ...), for cpu_vnni's
// kernels; include only from files compiled with AVX-512 flags.
#pragma once

#include <immintrin.h>

namespace strata_cpu {

// Lanes 0-7 by a shuffle rather than _mm512_reduce_add_ps, whose undefined upper halves g++ 12 reports as
// used uninitialized (GCC bug 105593).
inline float hsum(__m512 v) {
  const __m256 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 a = _mm256_add_ps(lo, _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

}  // namespace strata_cpu
