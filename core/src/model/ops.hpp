// Core f32 math used by the forward pass (norms, rope, softmax, dot). The core's own dot (router logits,
// attention scores) has its fixed order below; the plugins' exact-mode order is in
// plugins/cpu_generic/kernels/dot.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/model_spec.hpp"

namespace strata::ops {

constexpr int kLanes = 16;

// 16 lanes, lane l sums i ≡ l (mod 16) in increasing i with separate multiply and add, then a pairwise fold
// (8, 4, 2, 1). Deterministic whatever the thread count (one thread computes each dot).
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float p = a[i + l] * b[i + l];
      acc[l] = acc[l] + p;
    }
  }
  for (int l = 0; i + l < n; ++l) {
    const float p = a[i + l] * b[i + l];
    acc[l] = acc[l] + p;
  }
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
  }
  return acc[0];
}

// RMSNorm as transformers computes it: x * rsqrt(mean(x²) + eps), then weight * that.
inline void rms_norm(const float* x, const float* w, int64_t n, double eps, float* out) {
  const float ms = dot(x, x, n) / static_cast<float>(n);
  const float r = 1.0f / std::sqrt(ms + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

// LayerNorm with weight and bias (biased variance), as torch.nn.LayerNorm.
inline void layer_norm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<float>(n);
  const float r = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * r * w[i] + b[i];
}

inline float silu(float g) {
  return g / (1.0f + std::exp(-g));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// Rotary frequencies of a RopeSpec (default or yarn), computed in f32 as transformers does.
class Rope {
 public:
  explicit Rope(const RopeSpec& spec);
  int64_t dim() const { return dim_; }
  // cos/sin of each frequency pair (dim/2 values each) at position pos.
  void angles(int64_t pos, float* cos_out, float* sin_out) const;

 private:
  int64_t dim_ = 0;
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
};

// Rotate-half (NeoX) rope on the first `dim` elements of x.
inline void rope_half(float* x, int64_t dim, const float* c, const float* s) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i] + a * s[i];
  }
}

// Interleaved rope (pairs 2i, 2i+1) on the first `dim` elements of x; the result is written de-interleaved
// (evens first, then odds) exactly as transformers' apply_rotary_pos_emb_interleave does.
inline void rope_interleave(float* x, int64_t dim, const float* c, const float* s, float* scratch) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    scratch[i] = a * c[i] - b * s[i];
    scratch[half + i] = b * c[i] + a * s[i];
  }
  for (int64_t i = 0; i < dim; ++i) x[i] = scratch[i];
}

// In-place softmax over n scores (max-subtracted, sequential sum).
inline void softmax(float* v, int64_t n) {
  float m = v[0];
  for (int64_t i = 1; i < n; ++i) m = v[i] > m ? v[i] : m;
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - m);
    sum += v[i];
  }
  for (int64_t i = 0; i < n; ++i) v[i] /= sum;
}

}  // namespace strata::ops
