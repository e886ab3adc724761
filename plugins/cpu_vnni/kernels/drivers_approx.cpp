// cpu_vnni's parallel drivers (oneTBB): activations rounded once per call (int8 for int4 weights, bf16 for
// BF16 weights where the CPU has AVX512_BF16), then the weights times those rows in blocks of output rows;
// other formats, and experts whose three matrices differ in kind, go to the exact AVX-512 drivers. No ISA
// flags here.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <new>
#include <vector>

#include "bf16.hpp"
#include "kernels/dot_block_avx512.hpp"
#include "kernels/drivers.hpp"
#include "q8.hpp"

namespace strata_cpu {

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

namespace {

// Output rows per work item, as in the exact drivers: 16 rows of a 6144-wide int4 matrix are 48 KiB.
constexpr int64_t kRowBlock = 16;

inline float silu(float g) {
  return g / (1.0f + std::exp(-g));
}

// The two kinds of rounded activations: how a row is stored, prepared and multiplied.
struct Int8Act {  // for Q4_ROW / Q4_G64 weights
  using Elem = Q8Chunk;
  static bool takes(const strata_matrix& m) {
    return m.dtype == STRATA_DTYPE_Q4_ROW || m.dtype == STRATA_DTYPE_Q4_G64;
  }
  static int64_t elems(int64_t cols) { return q8_chunks(cols); }
  static void prepare(const float* x, int64_t cols, Elem* out) { quantize_q8(x, cols, out); }
  static void dot(const strata_matrix& w, int64_t o0, int64_t o1, const Elem* const* x, int64_t n, float* y,
                  int64_t ys) {
    dot_q4_q8(w, o0, o1, x, n, y, ys);
  }
};

struct Bf16Act {  // for BF16 weights
  using Elem = uint16_t;
  static bool takes(const strata_matrix& m) {
    static const bool have = cpu_has_avx512_bf16();
    return m.dtype == STRATA_DTYPE_BF16 && have;
  }
  static int64_t elems(int64_t cols) { return bf16_cols(cols); }
  static void prepare(const float* x, int64_t cols, Elem* out) { to_bf16(x, cols, out); }
  static void dot(const strata_matrix& w, int64_t o0, int64_t o1, const Elem* const* x, int64_t n, float* y,
                  int64_t ys) {
    dot_bf16(w, o0, o1, x, n, y, ys);
  }
};

template <class A>
bool takes_expert(const strata_expert& e) {
  return A::takes(e.gate) && A::takes(e.up) && A::takes(e.down);
}

// Rows of rounded activations, each A::elems(cols) elements, every row 64-byte aligned.
template <class A>
struct ActRows {
  using Elem = typename A::Elem;
  ActRows(int64_t rows, int64_t cols)
      : stride(A::elems(cols)),
        data(static_cast<Elem*>(::operator new[](
            static_cast<size_t>(std::max<int64_t>(rows* stride, 1)) * sizeof(Elem), std::align_val_t{64}))) {}
  Elem* row(int64_t r) const { return data.get() + r * stride; }
  struct Free {
    void operator()(Elem* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  int64_t stride;
  std::unique_ptr<Elem[], Free> data;
};

// Rounds rows [0, n) of x (row i at x + i · stride) into out, in parallel when there are many.
template <class A>
void prepare_rows(const float* x, int64_t n, int64_t cols, int64_t stride, const ActRows<A>& out) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 8), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) A::prepare(x + i * stride, cols, out.row(i));
  });
}

// y[S, O] = rounded rows · W^T over blocks of output rows.
template <class A>
void matmul_rows(const strata_matrix& w, const typename A::Elem* const* xs, int64_t n_x, float* y,
                 int64_t y_stride) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, w.rows, kRowBlock),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t b = r.begin(); b < r.end(); b += kRowBlock)
                        A::dot(w, b, std::min(b + kRowBlock, r.end()), xs, n_x, y + b, y_stride);
                    });
}

template <class A>
void matmul_t(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  ActRows<A> q(n_x_rows, w.cols);
  prepare_rows<A>(x, n_x_rows, w.cols, w.cols, q);
  std::vector<const typename A::Elem*> xs(static_cast<size_t>(n_x_rows));
  for (int64_t s = 0; s < n_x_rows; ++s) xs[s] = q.row(s);
  matmul_rows<A>(w, xs.data(), n_x_rows, y, w.rows);
}

// The x rows the tasks of kind A read, each rounded once whatever the number of experts it is routed to.
template <class A>
struct SharedRows {
  SharedRows(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
             const strata_expert_task* tasks)
      : slot(static_cast<size_t>(n_x_rows), -1) {
    std::vector<int64_t> used;
    for (int32_t t = 0; t < n_tasks; ++t) {
      const strata_expert_task& task = tasks[t];
      if (task.n_rows <= 0 || !takes_expert<A>(*task.expert)) continue;
      for (int32_t r = 0; r < task.n_rows; ++r) {
        int64_t& s = slot[static_cast<size_t>(task.rows[r])];
        if (s < 0) {
          s = static_cast<int64_t>(used.size());
          used.push_back(task.rows[r]);
        }
      }
    }
    rows = std::make_unique<ActRows<A>>(static_cast<int64_t>(used.size()), hidden);
    tbb::parallel_for(tbb::blocked_range<size_t>(0, used.size(), 8),
                      [&](const tbb::blocked_range<size_t>& r) {
                        for (size_t i = r.begin(); i < r.end(); ++i)
                          A::prepare(x + used[i] * hidden, hidden, rows->row(static_cast<int64_t>(i)));
                      });
  }
  const typename A::Elem* of(int32_t x_row) const { return rows->row(slot[static_cast<size_t>(x_row)]); }
  std::vector<int64_t> slot;
  std::unique_ptr<ActRows<A>> rows;
};

// One expert: gate and up over blocks of rows together, h = silu(gate) · up rounded like x, then down.
template <class A>
void run_task(const strata_expert_task& task, int64_t hidden, const SharedRows<A>& xr) {
  const strata_expert& e = *task.expert;
  const int64_t ffn = e.gate.rows, n = task.n_rows;
  std::vector<const typename A::Elem*> xs(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) xs[r] = xr.of(task.rows[r]);
  std::vector<float> h(static_cast<size_t>(n * ffn));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, ffn, kRowBlock),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      std::vector<float> g(static_cast<size_t>(n * kRowBlock)), u(g.size());
                      for (int64_t b = r.begin(); b < r.end(); b += kRowBlock) {
                        const int64_t end = std::min(b + kRowBlock, r.end()), nb = end - b;
                        A::dot(e.gate, b, end, xs.data(), n, g.data(), nb);
                        A::dot(e.up, b, end, xs.data(), n, u.data(), nb);
                        for (int64_t s = 0; s < n; ++s) {
                          for (int64_t j = 0; j < nb; ++j)
                            h[s * ffn + b + j] = silu(g[s * nb + j]) * u[s * nb + j];
                        }
                      }
                    });
  ActRows<A> hq(n, ffn);
  prepare_rows<A>(h.data(), n, ffn, ffn, hq);
  std::vector<const typename A::Elem*> hs(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) hs[r] = hq.row(r);
  matmul_rows<A>(e.down, hs.data(), n, task.out, hidden);
}

}  // namespace

void VnniKernels::matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  if (Int8Act::takes(w)) return matmul_t<Int8Act>(w, x, n_x_rows, y);
  if (Bf16Act::takes(w)) return matmul_t<Bf16Act>(w, x, n_x_rows, y);
  matmul_driver(&dot_block_avx512, w, x, n_x_rows, y);
}

void VnniKernels::expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                               const strata_expert_task* tasks) {
  const SharedRows<Int8Act> x8(x, n_x_rows, hidden, n_tasks, tasks);
  const SharedRows<Bf16Act> x16(x, n_x_rows, hidden, n_tasks, tasks);
  tbb::parallel_for(0, n_tasks, [&](int32_t t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows <= 0) return;
    if (takes_expert<Int8Act>(*task.expert)) return run_task(task, hidden, x8);
    if (takes_expert<Bf16Act>(*task.expert)) return run_task(task, hidden, x16);
    expert_group_driver(&dot_block_avx512, x, hidden, 1, &task);
  });
}

}  // namespace strata_cpu
