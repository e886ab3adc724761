// Exact-mode CPU kernels for float-format weights: compiled once portable (cpu_generic) and once with AVX-512
// flags (cpu_avx512); the canonical order in dot.hpp makes both builds bitwise identical.
#include "float_kernels.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dot.hpp"

namespace strata_cpu {
namespace {

// Rows of W decoded to f32 per work item. 16 rows of a 6144-wide matrix are 384 KiB of f32: they stay in L2
// while every x row streams past them (sized for a 2 MiB L2 per core, Sapphire Rapids / Zen 4).
constexpr int64_t kRowBlock = 16;

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace

void matmul_float(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  const int64_t out_dim = w.rows, in_dim = w.cols;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, out_dim, kRowBlock), [&](const tbb::blocked_range<int64_t>& r) {
    std::vector<float>& buf = scratch(static_cast<size_t>(kRowBlock * in_dim));
    const float* rows[kRowBlock];
    for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
      const int64_t nb = std::min(kRowBlock, r.end() - b);
      for (int64_t j = 0; j < nb; ++j) rows[j] = row_f32(w, b + j, buf.data() + j * in_dim);
      for (int64_t s = 0; s < n_x_rows; ++s) {
        const float* xs = x + s * in_dim;
        float* ys = y + s * out_dim + b;
        for (int64_t j = 0; j < nb; ++j) ys[j] = dot_f32(rows[j], xs, in_dim);
      }
    }
  });
}

void expert_group_float(const float* x, int64_t hidden, int32_t n_tasks, const strata_expert_task* tasks) {
  tbb::parallel_for(0, n_tasks, [&](int32_t t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows <= 0) return;
    const strata_expert& e = *task.expert;
    const int64_t ffn = e.gate.rows;
    const int64_t n = task.n_rows;
    // Gather the routed rows once so both passes read contiguous memory.
    std::vector<float> xr(static_cast<size_t>(n * hidden));
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(x + static_cast<int64_t>(task.rows[r]) * hidden, hidden, xr.data() + r * hidden);
    }
    std::vector<float> h(static_cast<size_t>(n * ffn));
    // Pass 1: gate and up rows f read together, x rows read once per block of f.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, ffn, kRowBlock), [&](const tbb::blocked_range<int64_t>& r) {
      std::vector<float>& buf = scratch(static_cast<size_t>(2 * hidden));
      for (int64_t f = r.begin(); f < r.end(); ++f) {
        const float* g_row = row_f32(e.gate, f, buf.data());
        const float* u_row = row_f32(e.up, f, buf.data() + hidden);
        for (int64_t s = 0; s < n; ++s) {
          const float* xs = xr.data() + s * hidden;
          const float g = dot_f32(g_row, xs, hidden);
          const float u = dot_f32(u_row, xs, hidden);
          h[s * ffn + f] = silu(g) * u;
        }
      }
    });
    // Pass 2: out = down · h.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, hidden, kRowBlock), [&](const tbb::blocked_range<int64_t>& r) {
      std::vector<float>& buf = scratch(static_cast<size_t>(ffn));
      for (int64_t o = r.begin(); o < r.end(); ++o) {
        const float* d_row = row_f32(e.down, o, buf.data());
        for (int64_t s = 0; s < n; ++s) task.out[s * hidden + o] = dot_f32(d_row, h.data() + s * ffn, ffn);
      }
    });
  });
}

}  // namespace strata_cpu
