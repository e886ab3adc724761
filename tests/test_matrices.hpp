// Random host matrices in every weight format for the plugin tests (conformance, CUDA).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
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

// A group of random experts (gate and up [ffn, hidden], down [hidden, ffn], formats (gate/up, down) per
// expert), a random x of n_x rows, and row_counts[e] random routed rows for expert e: the expert_group inputs
// of the plugin tests. The experts' views point into store, so a copy shares the original's weights.
struct RandomExpertGroup {
  int64_t hidden = 0, ffn = 0, n_x = 0;
  std::vector<float> x;
  std::vector<HostMatrix> store;  // gate, up, down per expert
  std::vector<ExpertMatrices> experts;
  std::vector<std::vector<int32_t>> rows;

  RandomExpertGroup(std::mt19937& rng, int64_t h, int64_t f, int64_t nx, const std::vector<int>& row_counts,
                    const std::vector<std::pair<WeightFormat, WeightFormat>>& formats)
      : hidden(h), ffn(f), n_x(nx) {
    x = random_vec(rng, static_cast<size_t>(nx * h));
    const size_t n = row_counts.size();
    store.reserve(3 * n);
    for (size_t e = 0; e < n; ++e) {
      store.push_back(random_matrix(rng, formats[e].first, f, h));
      store.push_back(random_matrix(rng, formats[e].first, f, h));
      store.push_back(random_matrix(rng, formats[e].second, h, f));
    }
    for (size_t e = 0; e < n; ++e)
      experts.push_back({store[3 * e].view(), store[3 * e + 1].view(), store[3 * e + 2].view()});
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(nx - 1));
    rows.resize(n);
    for (size_t e = 0; e < n; ++e) {
      for (int r = 0; r < row_counts[e]; ++r) rows[e].push_back(pick(rng));
    }
  }

  // One task per expert on rs[e] (default: rows), writing into out[e] (resized, NaN-filled).
  std::vector<ExpertTask> tasks(std::vector<std::vector<float>>& out,
                                const std::vector<std::vector<int32_t>>* rs = nullptr) const {
    const auto& use = rs != nullptr ? *rs : rows;
    out.assign(experts.size(), {});
    std::vector<ExpertTask> t;
    for (size_t e = 0; e < experts.size(); ++e) {
      out[e].assign(use[e].size() * static_cast<size_t>(hidden), NAN);
      t.push_back({&experts[e], use[e], out[e].data()});
    }
    return t;
  }

  // Runs every expert on its rows (rs[e]; default: rows) on b; one [rows, hidden] output per expert.
  std::vector<std::vector<float>> run(const Backend& b,
                                      const std::vector<std::vector<int32_t>>* rs = nullptr) const {
    std::vector<std::vector<float>> out;
    const auto t = tasks(out, rs);
    b.expert_group(x.data(), n_x, hidden, t);
    return out;
  }
};

inline std::vector<std::pair<WeightFormat, WeightFormat>> same_format(WeightFormat f, size_t n) {
  return std::vector<std::pair<WeightFormat, WeightFormat>>(n, {f, f});
}

}  // namespace strata::test
