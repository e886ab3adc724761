// Random host matrices in every weight format for the plugin tests (conformance, CUDA).
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "strata/backend.hpp"
#include "strata/dtype.hpp"
#include "strata/quant.hpp"

namespace strata::test {

// A weight matrix that owns its bytes (and int4 scales).
struct HostMatrix {
  WeightFormat format;
  int64_t rows, cols;
  std::vector<std::byte> bytes;
  std::vector<float> scales;
  Matrix view() const {
    return Matrix{format, rows, cols, bytes.data(), scales.empty() ? nullptr : scales.data()};
  }
};

inline bool is_q4(WeightFormat f) {
  return f == WeightFormat::Q4_ROW || f == WeightFormat::Q4_G64;
}

inline uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

inline HostMatrix random_matrix(std::mt19937& rng, WeightFormat fmt, int64_t rows, int64_t cols,
                                float sd = 0.5f) {
  std::normal_distribution<float> d(0.0f, sd);
  HostMatrix m{fmt, rows, cols, {}, {}};
  const size_t n = static_cast<size_t>(rows * cols);
  if (is_q4(fmt)) {
    std::vector<float> f(n);
    for (auto& v : f) v = d(rng);
    const QuantizedMatrix q = quantize_q4(f, rows, cols, fmt);
    m.bytes.resize(q.packed.size());
    std::memcpy(m.bytes.data(), q.packed.data(), q.packed.size());
    m.scales = q.scales;
  } else if (fmt == WeightFormat::F32) {
    m.bytes.resize(n * 4);
    for (size_t i = 0; i < n; ++i) {
      const float v = d(rng);
      std::memcpy(m.bytes.data() + 4 * i, &v, 4);
    }
  } else {
    m.bytes.resize(n * 2);
    for (size_t i = 0; i < n; ++i) {
      const float v = d(rng);
      const uint16_t h = fmt == WeightFormat::BF16 ? to_bf16(v) : strata::f32_to_f16_bits(v);
      std::memcpy(m.bytes.data() + 2 * i, &h, 2);
    }
  }
  return m;
}

inline std::vector<float> random_vec(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace strata::test
