// Parallel drivers (oneTBB) for matmul and the fused expert MLP; the arithmetic lives in the DotBlockFn.
#include "drivers.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata_cpu {
namespace {

// Output rows per work item: 16 rows of a 6144-wide BF16 matrix are 192 KiB, which stay in L2 (2 MiB per core
// on Sapphire Rapids / Zen 4) while the routed x rows stream past them; small enough that one expert of width
// 2048 still splits into 128 items for the cores.
constexpr int64_t kRowBlock = 16;

inline float silu(float g) {
  return g / (1.0f + std::exp(-g));
}

}  // namespace

void matmul_driver(DotBlockFn dot, const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  const int64_t out_dim = w.rows, in_dim = w.cols, stride = blocked_cols(in_dim);
  std::vector<float> xb(static_cast<size_t>(n_x_rows * stride));
  for (int64_t s = 0; s < n_x_rows; ++s) to_blocked(x + s * in_dim, in_dim, xb.data() + s * stride);
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, out_dim, kRowBlock), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
          dot(w, b, std::min(b + kRowBlock, r.end()), xb.data(), n_x_rows, stride, y + b, out_dim);
        }
      });
}

void expert_group_driver(DotBlockFn dot, const float* x, int64_t hidden, int32_t n_tasks,
                         const strata_expert_task* tasks) {
  tbb::parallel_for(0, n_tasks, [&](int32_t t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows <= 0) return;
    const strata_expert& e = *task.expert;
    const int64_t ffn = e.gate.rows;
    const int64_t n = task.n_rows;
    const int64_t xs = blocked_cols(hidden), hs = blocked_cols(ffn);
    // Gather the routed rows once, in blocked layout, so both passes read contiguous memory.
    std::vector<float> xr(static_cast<size_t>(n * xs));
    for (int64_t r = 0; r < n; ++r)
      to_blocked(x + static_cast<int64_t>(task.rows[r]) * hidden, hidden, xr.data() + r * xs);
    std::vector<float> h(static_cast<size_t>(n * hs), 0.0f);  // blocked layout; the padding stays zero
    // Pass 1: a block of gate rows and the same block of up rows, for every routed row.
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, ffn, kRowBlock),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        std::vector<float> g(static_cast<size_t>(n * kRowBlock)), u(g.size());
                        for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
                          const int64_t end = std::min(b + kRowBlock, r.end()), nb = end - b;
                          dot(e.gate, b, end, xr.data(), n, xs, g.data(), nb);
                          dot(e.up, b, end, xr.data(), n, xs, u.data(), nb);
                          for (int64_t s = 0; s < n; ++s) {
                            for (int64_t j = 0; j < nb; ++j)
                              h[s * hs + blocked_index(b + j)] = silu(g[s * nb + j]) * u[s * nb + j];
                          }
                        }
                      });
    // Pass 2: out = down · h.
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, hidden, kRowBlock), [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
            dot(e.down, b, std::min(b + kRowBlock, r.end()), h.data(), n, hs, task.out + b, hidden);
          }
        });
  });
}

// Portable, but cloned for x86-64-v3 (AVX2 + FMA) and picked at load time (ifunc): std::fma is exact either
// way, so both clones give the same bits; the v3 clone just avoids a libm call per weight.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("default", "arch=x86-64-v3")))
#endif
void dot_block_generic(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x, int64_t x_stride,
                       float* y, int64_t y_stride) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(w.cols)) scratch.resize(static_cast<size_t>(w.cols));
  for (int64_t o = o0; o < o1; ++o) {
    const float* row = row_f32(w, o, scratch.data());
    for (int64_t s = 0; s < n_x; ++s)
      y[s * y_stride + (o - o0)] = dot_f32_blocked(row, x + s * x_stride, w.cols);
  }
}

}  // namespace strata_cpu
