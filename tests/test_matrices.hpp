// Random host matrices in every weight format for the plugin tests (conformance, CUDA).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <span>
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

// A group of random experts in one format (gate and up [ffn, hidden], down [hidden, ffn]), a random x of n_x
// rows, and row_counts[e] random routed rows for expert e: the expert_group inputs of the plugin tests.
struct RandomExpertGroup {
  int64_t hidden = 0, ffn = 0, n_x = 0;
  std::vector<float> x;
  std::vector<HostMatrix> store;  // gate, up, down of each expert (the views in experts point into it)
  std::vector<ExpertMatrices> experts;
  std::vector<std::vector<int32_t>> rows;

  // Runs every expert on its rows (rs[e]; default: rows) on b; one [rows, hidden] output per expert.
  std::vector<std::vector<float>> run(const Backend& b) const { return run(b, rows); }
  std::vector<std::vector<float>> run(const Backend& b, const std::vector<std::vector<int32_t>>& rs) const {
    std::vector<std::vector<float>> out(experts.size());
    std::vector<ExpertTask> tasks;
    for (size_t e = 0; e < experts.size(); ++e) {
      out[e].assign(rs[e].size() * static_cast<size_t>(hidden), NAN);
      tasks.push_back({&experts[e], rs[e], out[e].data()});
    }
    b.expert_group(x.data(), n_x, hidden, tasks);
    return out;
  }
};

inline RandomExpertGroup random_expert_group(std::mt19937& rng, WeightFormat f, int64_t hidden, int64_t ffn,
                                             int64_t n_x, std::span<const int> row_counts) {
  RandomExpertGroup g;
  g.hidden = hidden;
  g.ffn = ffn;
  g.n_x = n_x;
  g.x = random_vec(rng, static_cast<size_t>(n_x * hidden));
  const size_t n = row_counts.size();
  for (size_t e = 0; e < n; ++e) {
    g.store.push_back(random_matrix(rng, f, ffn, hidden));
    g.store.push_back(random_matrix(rng, f, ffn, hidden));
    g.store.push_back(random_matrix(rng, f, hidden, ffn));
  }
  for (size_t e = 0; e < n; ++e)
    g.experts.push_back({g.store[3 * e].view(), g.store[3 * e + 1].view(), g.store[3 * e + 2].view()});
  g.rows.resize(n);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_x - 1));
  for (size_t e = 0; e < n; ++e) {
    for (int r = 0; r < row_counts[e]; ++r) g.rows[e].push_back(pick(rng));
  }
  return g;
}

}  // namespace strata::test
