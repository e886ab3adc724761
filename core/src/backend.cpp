// Backend: the one place where the core touches the plugin C structs.
#include "strata/backend.hpp"

#include <vector>

#include "strata/error.hpp"
#include "strata/plugin_abi.h"

namespace strata {

static_assert(static_cast<int>(WeightFormat::F32) == STRATA_DTYPE_F32);
static_assert(static_cast<int>(WeightFormat::BF16) == STRATA_DTYPE_BF16);
static_assert(static_cast<int>(WeightFormat::F16) == STRATA_DTYPE_F16);
static_assert(static_cast<int>(WeightFormat::Q4_ROW) == STRATA_DTYPE_Q4_ROW);
static_assert(static_cast<int>(WeightFormat::Q4_G64) == STRATA_DTYPE_Q4_G64);

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::F16: return "F16";
    case WeightFormat::Q4_ROW: return "Q4_ROW";
    case WeightFormat::Q4_G64: return "Q4_G64";
  }
  return "?";
}

size_t Matrix::bytes() const {
  switch (format) {
    case WeightFormat::F32: return static_cast<size_t>(rows * cols * 4);
    case WeightFormat::BF16:
    case WeightFormat::F16: return static_cast<size_t>(rows * cols * 2);
    case WeightFormat::Q4_ROW: return static_cast<size_t>(rows * ((cols + 1) / 2) + rows * 4);
    case WeightFormat::Q4_G64: return static_cast<size_t>(rows * ((cols + 1) / 2) + rows * ((cols + 63) / 64) * 4);
  }
  return 0;
}

namespace {
strata_matrix to_c(const Matrix& m) {
  strata_matrix c{};
  c.dtype = static_cast<int32_t>(m.format);
  c.rows = m.rows;
  c.cols = m.cols;
  c.data = m.data;
  c.scales = m.scales;
  return c;
}
}  // namespace

Backend::Backend(std::shared_ptr<void> library, const strata_plugin_vtable* vtable, int n_threads, int device)
    : library_(std::move(library)), vt_(vtable) {
  strata_backend_options opt{};
  opt.struct_size = sizeof opt;
  opt.n_threads = n_threads;
  opt.device = device;
  const strata_status s = vt_->create(&opt, &handle_);
  if (s != STRATA_OK) raise(s, "create");
}

Backend::~Backend() {
  if (handle_ != nullptr) vt_->destroy(handle_);
}

std::string_view Backend::name() const { return vt_->name; }

bool Backend::supports_matmul(WeightFormat f) const {
  return vt_->supports_matmul != nullptr && vt_->supports_matmul(handle_, static_cast<int32_t>(f)) != 0;
}

bool Backend::supports_expert_group(WeightFormat f) const {
  return vt_->supports_expert_group != nullptr && vt_->supports_expert_group(handle_, static_cast<int32_t>(f)) != 0;
}

void Backend::raise(int status, std::string_view op) const {
  const char* msg = vt_->last_error != nullptr ? vt_->last_error() : "";
  fail("backend", "{}: {} failed (status {}): {}", vt_->name, op, status, msg != nullptr ? msg : "");
}

void Backend::matmul(const Matrix& w, const float* x, int64_t n_x_rows, float* y) const {
  if (vt_->matmul == nullptr) fail("backend", "{}: matmul is not offered by this plugin", vt_->name);
  const strata_matrix cw = to_c(w);
  const strata_status s = vt_->matmul(handle_, &cw, x, n_x_rows, y);
  if (s != STRATA_OK) raise(s, "matmul");
}

void Backend::expert_group(const float* x, int64_t n_x_rows, int64_t hidden, std::span<const ExpertTask> tasks) const {
  if (vt_->expert_group == nullptr) fail("backend", "{}: expert_group is not offered by this plugin", vt_->name);
  // The C experts live in one vector so the task pointers stay valid for the call.
  std::vector<strata_expert> experts(tasks.size());
  std::vector<strata_expert_task> ctasks(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    experts[i] = strata_expert{to_c(tasks[i].expert->gate), to_c(tasks[i].expert->up), to_c(tasks[i].expert->down)};
    ctasks[i].expert = &experts[i];
    ctasks[i].n_rows = static_cast<int32_t>(tasks[i].rows.size());
    ctasks[i].rows = tasks[i].rows.data();
    ctasks[i].out = tasks[i].out;
  }
  const strata_status s =
      vt_->expert_group(handle_, x, n_x_rows, hidden, static_cast<int32_t>(ctasks.size()), ctasks.data());
  if (s != STRATA_OK) raise(s, "expert_group");
}

}  // namespace strata
