// Canonical f32 dot products and weight-row decoding shared by the exact-mode CPU kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// The canonical reduction order of every exact-mode CPU kernel (DESIGN §6). Any backend that claims exact
// mode must reproduce it bit for bit:
//   - columns go in blocks of 32; column offset c within a block feeds accumulator E[c / 2] when c is even
//   and
//     O[c / 2] when c is odd (32 accumulators, 16 "even" lanes and 16 "odd" lanes);
//   - each accumulator takes its products in increasing column order as fused multiply-adds, acc = fma(w, x,
//   acc)
//     (one rounding each; std::fma in portable code, vfmadd in SIMD code); a last partial block continues the
//     same rule;
//   - then t[l] = E[l] + O[l] for l < 16, and t is folded pairwise: t[l] += t[l + 8] for l < 8, then + 4, +
//   2,
//     + 1; t[0] is the result.
// Why this shape: int4 weights store columns 2j and 2j+1 in the low and high nibble of byte j, and BF16 pairs
// share a 32-bit word, so with even and odd columns in separate accumulators an AVX-512 kernel decodes 32
// weights with no cross-lane shuffle (one zero-extend and two table permutes for int4, a shift and a mask for
// BF16), and the fused multiply-add keeps the arithmetic to one instruction per 16 weights and x row: with
// separate multiply and add, int4 decode on a 2-core AVX-512 host was compute-bound at ~45 % of its memory
// bandwidth. The portable kernels below are written in the same order, so both builds agree bit for bit.
constexpr int kLanes = 16;
constexpr int kBlock = 2 * kLanes;

inline float fold_lanes(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  }
  return acc[0];
}

// Activations go to the kernels in "blocked" layout: per block of 32 columns, the 16 even columns then the 16
// odd ones, zero-padded to a whole block, so the even and odd accumulators each read contiguous x. Drivers
// convert once per call (x, h); the cost is O(rows × cols) against O(outputs × cols) for the weights.
inline int64_t blocked_cols(int64_t n) {
  return (n + kBlock - 1) / kBlock * kBlock;
}
inline int64_t blocked_index(int64_t i) {
  return (i & ~int64_t{kBlock - 1}) + (i & 1) * kLanes + ((i & (kBlock - 1)) >> 1);
}

inline void to_blocked(const float* x, int64_t n, float* out) {
  const int64_t padded = blocked_cols(n);
  for (int64_t i = n; i < padded; ++i) out[blocked_index(i)] = 0.0f;
  for (int64_t i = 0; i < n; ++i) out[blocked_index(i)] = x[i];
}

// One canonical dot of a natural-layout f32 weight row with a blocked-layout x.
inline float dot_f32_blocked(const float* __restrict w, const float* __restrict xb, int64_t n) {
  float even[kLanes] = {}, odd[kLanes] = {};
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int l = 0; l < kLanes; ++l) {
      even[l] = std::fma(w[i + 2 * l], xb[i + l], even[l]);
      odd[l] = std::fma(w[i + 2 * l + 1], xb[i + kLanes + l], odd[l]);
    }
  }
  for (int c = 0; i + c < n; ++c) {
    float& a = (c % 2 == 0) ? even[c / 2] : odd[c / 2];
    a = std::fma(w[i + c], xb[i + (c % 2) * kLanes + c / 2], a);
  }
  for (int l = 0; l < kLanes; ++l) even[l] = even[l] + odd[l];
  return fold_lanes(even);
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE binary16 → binary32, exact for every input (subnormals, infinities, NaN payloads).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: normalise the mantissa.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row o of a matrix as f32. Returns a pointer into the weights when the format is already F32, otherwise
// decodes into scratch (which must hold cols floats) and returns scratch. int4 weights decode as (nibble − 8)
// · scale, one f32 multiply: the exact-mode int4 kernels are the float kernels applied to these values.
inline const float* row_f32(const strata_matrix& w, int64_t o, float* scratch) {
  const int64_t n = w.cols;
  switch (w.dtype) {
    case STRATA_DTYPE_F32:
      return static_cast<const float*>(w.data) + o * n;
    case STRATA_DTYPE_BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + o * n;
      for (int64_t i = 0; i < n; ++i) scratch[i] = bf16_to_f32(src[i]);
      return scratch;
    }
    case STRATA_DTYPE_F16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + o * n;
      for (int64_t i = 0; i < n; ++i) scratch[i] = f16_to_f32(src[i]);
      return scratch;
    }
    case STRATA_DTYPE_Q4_ROW:
    case STRATA_DTYPE_Q4_G64: {
      const auto* src = static_cast<const uint8_t*>(w.data) + o * ((n + 1) / 2);
      const bool grouped = w.dtype == STRATA_DTYPE_Q4_G64;
      const float* sc = w.scales + (grouped ? o * ((n + 63) / 64) : o);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t b = src[i / 2];
        const int nib = (i % 2 == 0) ? (b & 0x0f) : (b >> 4);
        scratch[i] = static_cast<float>(nib - 8) * sc[grouped ? i / 64 : 0];
      }
      return scratch;
    }
    default:
      return nullptr;
  }
}

// A prefetch (into all cache levels) of the byte at base + offset, which may lie past the end of the matrix:
// the kernels fetch the next step's rows, which after the last step are not there. The address is formed on
// integers, so no out-of-range pointer arithmetic; a prefetch of an unmapped address does not fault.
inline void prefetch_ahead(const void* base, int64_t offset) {
  __builtin_prefetch(
      reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset)), 0,
      3);
}

inline bool is_float_format(int32_t dtype) {
  return dtype == STRATA_DTYPE_F32 || dtype == STRATA_DTYPE_BF16 || dtype == STRATA_DTYPE_F16;
}

inline bool is_q4_format(int32_t dtype) {
  return dtype == STRATA_DTYPE_Q4_ROW || dtype == STRATA_DTYPE_Q4_G64;
}

// y[s * y_stride + j] = W[o0 + j] · x_s for j in [0, o1 - o0), s in [0, n_x): one canonical dot per output.
// Each x_s is in blocked layout at xb + s * xb_stride (xb_stride >= blocked_cols(W.cols)). Implemented
// portable, with AVX-512 and with AVX2; all must agree bit for bit.
using DotBlockFn = void (*)(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                            int64_t x_stride, float* y, int64_t y_stride);

}  // namespace strata_cpu
