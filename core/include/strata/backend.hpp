// The core's C++ face over plugin backends: weight views, RAII backend handles, status → strata::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

struct strata_plugin_vtable;
struct strata_backend;
struct strata_resident;
struct strata_group;

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
  // A device copy (Backend::upload); the backend that made it computes from it, every other one from data.
  const strata_resident* resident = nullptr;
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

class Backend;

// Device memory of a backend (Backend::memory_info), in bytes.
struct MemoryInfo {
  uint64_t total = 0;     // the device's memory
  uint64_t free = 0;      // free on the device now
  uint64_t used = 0;      // held by this backend: resident matrices, staging and scratch
  uint64_t resident = 0;  // of which resident matrices
};

// A matrix copied to a backend's device (Backend::upload). Move-only; frees the device copy when it dies, so
// it must not outlive its backend, nor be freed while an issued group uses it.
class ResidentMatrix {
 public:
  ResidentMatrix() = default;
  ResidentMatrix(ResidentMatrix&& o) noexcept { *this = std::move(o); }
  ResidentMatrix& operator=(ResidentMatrix&& o) noexcept;
  ResidentMatrix(const ResidentMatrix&) = delete;
  ResidentMatrix& operator=(const ResidentMatrix&) = delete;
  ~ResidentMatrix() { reset(); }
  void reset() noexcept;  // frees the device copy now (errors are ignored; Backend::free reports them)
  explicit operator bool() const { return handle_ != nullptr; }
  // The host view with the device copy attached.
  const Matrix& matrix() const { return matrix_; }

 private:
  friend class Backend;
  const Backend* owner_ = nullptr;
  strata_resident* handle_ = nullptr;
  Matrix matrix_;
};

// An expert group in flight (Backend::issue). Move-only. take() waits and writes the outputs (throws
// strata::Error when the backend failed); a group dropped without take is waited for and discarded, its
// outputs left unwritten.
class PendingGroup {
 public:
  PendingGroup() = default;
  PendingGroup(PendingGroup&& o) noexcept { *this = std::move(o); }
  PendingGroup& operator=(PendingGroup&& o) noexcept;
  PendingGroup(const PendingGroup&) = delete;
  PendingGroup& operator=(const PendingGroup&) = delete;
  ~PendingGroup() { discard(); }
  void take();
  void discard() noexcept;
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  friend class Backend;
  const Backend* owner_ = nullptr;
  strata_group* handle_ = nullptr;
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
  void expert_group(const float* x, int64_t n_x_rows, int64_t hidden,
                    std::span<const ExpertTask> tasks) const;

  // Device memory (optional ABI slots: upload_matrix, free_matrix, memory_info).
  bool has_device_memory() const;
  ResidentMatrix upload(const Matrix& w) const;
  void free(ResidentMatrix& m) const;  // frees now and reports errors (the destructor ignores them)
  MemoryInfo memory_info() const;

  // Asynchronous expert group (optional ABI slots: expert_group_issue / take / discard). x, the tasks and
  // their rows are consumed by issue; each task's out must stay valid until the group is taken.
  bool has_async() const;
  PendingGroup issue(const float* x, int64_t n_x_rows, int64_t hidden,
                     std::span<const ExpertTask> tasks) const;

  // Host memory the device writes group outputs into directly (optional ABI slots host_register /
  // host_unregister). false: not offered, or the backend refused (the outputs then go through its staging
  // buffers, as for any other memory). Unregister before freeing, never with a group writing there in flight.
  bool register_host(void* p, size_t bytes) const;
  void unregister_host(void* p) const;

 private:
  friend class ResidentMatrix;
  friend class PendingGroup;
  [[noreturn]] void raise(int status, std::string_view op) const;
  std::shared_ptr<void> library_;
  const strata_plugin_vtable* vt_;
  strata_backend* handle_ = nullptr;
};

}  // namespace strata
