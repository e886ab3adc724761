// Canonical f32 dot products and weight-row decoding shared by the exact-mode CPU kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// The canonical reduction order of every exact-mode CPU kernel (DESIGN §6). Any backend that claims exact mode
// must reproduce it bit for bit:
//   - 16 lanes; lane l accumulates the products w[i] * x[i] for i ≡ l (mod 16), in increasing i, each as a
//     rounded multiply followed by a rounded add (never a fused multiply-add);
//   - the tail (n not a multiple of 16) continues the same rule, so it is a masked 16-lane step;
//   - the 16 lane sums are folded pairwise: s[l] += s[l + 8] for l < 8, then + 4, + 2, + 1; s[0] is the result.
// 16 lanes is one AVX-512 register of f32, so the AVX-512 plugin does exactly this with vector instructions;
// the portable version is written so that compilers vectorize it without changing a single rounding.
constexpr int kLanes = 16;

inline float fold_lanes(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  }
  return acc[0];
}

inline float dot_f32(const float* __restrict w, const float* __restrict x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float p = w[i + l] * x[i + l];
      acc[l] = acc[l] + p;
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const float p = w[i + l] * x[i + l];
    acc[l] = acc[l] + p;
  }
  return fold_lanes(acc);
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

// Row o of a matrix as f32. Returns a pointer into the weights when the format is already F32, otherwise decodes
// into scratch (which must hold cols floats) and returns scratch. int4 weights decode as (nibble − 8) · scale,
// one f32 multiply: the exact-mode int4 kernels are the float kernels applied to these values.
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

inline bool is_float_format(int32_t dtype) {
  return dtype == STRATA_DTYPE_F32 || dtype == STRATA_DTYPE_BF16 || dtype == STRATA_DTYPE_F16;
}

inline bool is_q4_format(int32_t dtype) { return dtype == STRATA_DTYPE_Q4_ROW || dtype == STRATA_DTYPE_Q4_G64; }

// y[s * y_stride + j] = W[o0 + j] · x[s * x_stride ..] for j in [0, o1 - o0), s in [0, n_x): one canonical dot
// per output. Implemented once portable and once with AVX-512; both must agree bit for bit.
using DotBlockFn = void (*)(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                            int64_t x_stride, float* y, int64_t y_stride);

}  // namespace strata_cpu
