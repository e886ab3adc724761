// The core's C++ face over plugin backends: weight views, RAII backend handles, status → strata::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

struct strata_plugin_vtable;
struct strata_backend;

namespace strata {

enum class WeightFormat : int32_t { F32 = 0, BF16 = 1, F16 = 2, Q4_ROW = 3, Q4_G64 = 4 };
std::string_view weight_format_name(WeightFormat f);

// A weight matrix W[rows = O, cols = I] in host memory (usually inside a mapped checkpoint). Non-owning.
struct Matrix {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const float* scales = nullptr;  // Q4 formats only
  size_t bytes() const;
};

struct ExpertMatrices {
  Matrix gate, up, down;  // [F, H], [F, H], [H, F]
};

struct ExpertTask {
  const ExpertMatrices* expert = nullptr;
  std::span<const int32_t> rows;  // indices into the x passed to expert_group
  float* out = nullptr;           // [rows.size(), H]
};

// One instance of a plugin's backend. Keeps its plugin library loaded for as long as it lives. Thread-safe
// for concurrent independent calls, as the ABI promises.
class Backend {
 public:
  Backend(std::shared_ptr<void> library, const strata_plugin_vtable* vtable, int n_threads, int device = 0);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  std::string_view name() const;
  bool supports_matmul(WeightFormat f) const;
  bool supports_expert_group(WeightFormat f) const;
  // y[S, O] = x[S, I] · W^T.
  void matmul(const Matrix& w, const float* x, int64_t n_x_rows, float* y) const;
  // Runs all tasks; x is [n_x_rows, hidden].
  void expert_group(const float* x, int64_t n_x_rows, int64_t hidden, std::span<const ExpertTask> tasks) const;

 private:
  [[noreturn]] void raise(int status, std::string_view op) const;
  std::shared_ptr<void> library_;
  const strata_plugin_vtable* vt_;
  strata_backend* handle_ = nullptr;
};

}  // namespace strata
