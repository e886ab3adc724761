// cpu_vnni's parallel drivers (oneTBB): activations quantized once per call, then int4 weights × int8 rows in
// blocks of output rows; float weights, and experts not wholly int4, go to the exact AVX-512 drivers.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/dot_block_avx512.hpp"
#include "kernels/drivers.hpp"
#include "q8.hpp"

namespace strata_cpu {
namespace {

// Output rows per work item, as in the exact drivers: 16 rows of a 6144-wide int4 matrix are 48 KiB.
constexpr int64_t kRowBlock = 16;

bool is_q4(const strata_matrix& m) {
  return m.dtype == STRATA_DTYPE_Q4_ROW || m.dtype == STRATA_DTYPE_Q4_G64;
}

inline float silu(float g) {
  return g / (1.0f + std::exp(-g));
}

// Rows of int8 activations, each q8_chunks(cols) chunks.
struct Q8Rows {
  Q8Rows(int64_t rows, int64_t cols)
      : chunks(q8_chunks(cols)), data(std::make_unique<Q8Chunk[]>(static_cast<size_t>(rows * chunks))) {}
  const Q8Chunk* row(int64_t r) const { return data.get() + r * chunks; }
  Q8Chunk* row(int64_t r) { return data.get() + r * chunks; }
  int64_t chunks;
  std::unique_ptr<Q8Chunk[]> data;
};

// Quantizes rows [0, n) of x (row r at x + r * stride), in parallel when there are many.
void quantize_rows(const float* x, int64_t n, int64_t cols, int64_t stride, Q8Rows& out) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 8), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) quantize_q8(x + i * stride, cols, out.row(i));
  });
}

// y[S, O] = q8 rows · W^T over blocks of output rows.
void matmul_rows(const strata_matrix& w, const Q8Chunk* const* xs, int64_t n_x, float* y, int64_t y_stride) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, w.rows, kRowBlock),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t b = r.begin(); b < r.end(); b += kRowBlock)
                        dot_q4_q8(w, b, std::min(b + kRowBlock, r.end()), xs, n_x, y + b, y_stride);
                    });
}

}  // namespace

void VnniKernels::matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  if (!is_q4(w)) return matmul_driver(&dot_block_avx512, w, x, n_x_rows, y);
  Q8Rows q(n_x_rows, w.cols);
  quantize_rows(x, n_x_rows, w.cols, w.cols, q);
  std::vector<const Q8Chunk*> xs(static_cast<size_t>(n_x_rows));
  for (int64_t s = 0; s < n_x_rows; ++s) xs[s] = q.row(s);
  matmul_rows(w, xs.data(), n_x_rows, y, w.rows);
}

void VnniKernels::expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                               const strata_expert_task* tasks) {
  // Every x row some int4 expert reads is quantized once, whatever the number of experts it is routed to.
  std::vector<int64_t> slot(static_cast<size_t>(n_x_rows), -1);
  std::vector<int64_t> used;
  for (int32_t t = 0; t < n_tasks; ++t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows <= 0 || !is_q4(task.expert->gate) || !is_q4(task.expert->up) || !is_q4(task.expert->down))
      continue;
    for (int32_t r = 0; r < task.n_rows; ++r) {
      int64_t& s = slot[static_cast<size_t>(task.rows[r])];
      if (s < 0) {
        s = static_cast<int64_t>(used.size());
        used.push_back(task.rows[r]);
      }
    }
  }
  Q8Rows xq(static_cast<int64_t>(used.size()), hidden);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, used.size(), 8), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i < r.end(); ++i)
      quantize_q8(x + used[i] * hidden, hidden, xq.row(static_cast<int64_t>(i)));
  });
  tbb::parallel_for(0, n_tasks, [&](int32_t t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows <= 0) return;
    const strata_expert& e = *task.expert;
    if (!is_q4(e.gate) || !is_q4(e.up) || !is_q4(e.down)) {
      return expert_group_driver(&dot_block_avx512, x, hidden, 1, &task);
    }
    const int64_t ffn = e.gate.rows, n = task.n_rows;
    std::vector<const Q8Chunk*> xs(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) xs[r] = xq.row(slot[static_cast<size_t>(task.rows[r])]);
    // Pass 1: a block of gate rows and the same block of up rows, for every routed row; h = silu(g) · u.
    std::vector<float> h(static_cast<size_t>(n * ffn));
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, ffn, kRowBlock),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        std::vector<float> g(static_cast<size_t>(n * kRowBlock)), u(g.size());
                        for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
                          const int64_t end = std::min(b + kRowBlock, r.end()), nb = end - b;
                          dot_q4_q8(e.gate, b, end, xs.data(), n, g.data(), nb);
                          dot_q4_q8(e.up, b, end, xs.data(), n, u.data(), nb);
                          for (int64_t s = 0; s < n; ++s) {
                            for (int64_t j = 0; j < nb; ++j)
                              h[s * ffn + b + j] = silu(g[s * nb + j]) * u[s * nb + j];
                          }
                        }
                      });
    // Pass 2: out = down · h, with h quantized like x.
    Q8Rows hq(n, ffn);
    quantize_rows(h.data(), n, ffn, ffn, hq);
    std::vector<const Q8Chunk*> hs(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) hs[r] = hq.row(r);
    matmul_rows(e.down, hs.data(), n, task.out, hidden);
  });
}

}  // namespace strata_cpu
