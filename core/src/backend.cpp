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
    case WeightFormat::F32:
      return "F32";
    case WeightFormat::BF16:
      return "BF16";
    case WeightFormat::F16:
      return "F16";
    case WeightFormat::Q4_ROW:
      return "Q4_ROW";
    case WeightFormat::Q4_G64:
      return "Q4_G64";
  }
  return "?";
}

size_t Matrix::bytes() const {
  switch (format) {
    case WeightFormat::F32:
      return static_cast<size_t>(rows * cols * 4);
    case WeightFormat::BF16:
    case WeightFormat::F16:
      return static_cast<size_t>(rows * cols * 2);
    case WeightFormat::Q4_ROW:
      return static_cast<size_t>(rows * ((cols + 1) / 2) + rows * 4);
    case WeightFormat::Q4_G64:
      return static_cast<size_t>(rows * ((cols + 1) / 2) + rows * ((cols + 63) / 64) * 4);
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
  c.resident = m.resident;
  return c;
}

// The C tasks of an expert group; the C experts live in one vector so the task pointers stay valid.
struct CTasks {
  std::vector<strata_expert> experts;
  std::vector<strata_expert_task> tasks;
  explicit CTasks(std::span<const ExpertTask> in) : experts(in.size()), tasks(in.size()) {
    for (size_t i = 0; i < in.size(); ++i) {
      experts[i] = strata_expert{to_c(in[i].expert->gate), to_c(in[i].expert->up), to_c(in[i].expert->down)};
      tasks[i].expert = &experts[i];
      tasks[i].n_rows = static_cast<int32_t>(in[i].rows.size());
      tasks[i].rows = in[i].rows.data();
      tasks[i].out = in[i].out;
    }
  }
};
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

std::string_view Backend::name() const {
  return vt_->name;
}

bool Backend::supports_matmul(WeightFormat f) const {
  return vt_->supports_matmul != nullptr && vt_->supports_matmul(handle_, static_cast<int32_t>(f)) != 0;
}

bool Backend::supports_expert_group(WeightFormat f) const {
  return vt_->supports_expert_group != nullptr &&
         vt_->supports_expert_group(handle_, static_cast<int32_t>(f)) != 0;
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

void Backend::expert_group(const float* x, int64_t n_x_rows, int64_t hidden,
                           std::span<const ExpertTask> tasks) const {
  if (vt_->expert_group == nullptr)
    fail("backend", "{}: expert_group is not offered by this plugin", vt_->name);
  CTasks c(tasks);
  const strata_status s =
      vt_->expert_group(handle_, x, n_x_rows, hidden, static_cast<int32_t>(c.tasks.size()), c.tasks.data());
  if (s != STRATA_OK) raise(s, "expert_group");
}

bool Backend::has_device_memory() const {
  return STRATA_PLUGIN_HAS_SLOT(vt_, upload_matrix) && STRATA_PLUGIN_HAS_SLOT(vt_, free_matrix) &&
         STRATA_PLUGIN_HAS_SLOT(vt_, memory_info);
}

ResidentMatrix Backend::upload(const Matrix& w) const {
  if (!has_device_memory()) fail("backend", "{}: device memory is not offered by this plugin", vt_->name);
  Matrix host = w;
  host.resident = nullptr;
  const strata_matrix cw = to_c(host);
  strata_resident* h = nullptr;
  const strata_status s = vt_->upload_matrix(handle_, &cw, &h);
  if (s != STRATA_OK) raise(s, "upload_matrix");
  ResidentMatrix r;
  r.owner_ = this;
  r.handle_ = h;
  r.matrix_ = host;
  r.matrix_.resident = h;
  return r;
}

void Backend::free(ResidentMatrix& m) const {
  if (m.handle_ == nullptr) return;
  if (m.owner_ != this) fail("backend", "{}: free of a matrix resident on another backend", vt_->name);
  strata_resident* h = m.handle_;
  m.handle_ = nullptr;
  m.owner_ = nullptr;
  m.matrix_.resident = nullptr;
  const strata_status s = vt_->free_matrix(handle_, h);
  if (s != STRATA_OK) raise(s, "free_matrix");
}

MemoryInfo Backend::memory_info() const {
  if (!has_device_memory()) fail("backend", "{}: device memory is not offered by this plugin", vt_->name);
  strata_memory_info c{};
  const strata_status s = vt_->memory_info(handle_, &c);
  if (s != STRATA_OK) raise(s, "memory_info");
  return MemoryInfo{c.total_bytes, c.free_bytes, c.used_bytes, c.resident_bytes};
}

bool Backend::has_async() const {
  return STRATA_PLUGIN_HAS_SLOT(vt_, expert_group_issue) && STRATA_PLUGIN_HAS_SLOT(vt_, expert_group_take) &&
         STRATA_PLUGIN_HAS_SLOT(vt_, expert_group_discard);
}

PendingGroup Backend::issue(const float* x, int64_t n_x_rows, int64_t hidden,
                            std::span<const ExpertTask> tasks) const {
  if (!has_async())
    fail("backend", "{}: asynchronous expert groups are not offered by this plugin", vt_->name);
  CTasks c(tasks);
  strata_group* h = nullptr;
  const strata_status s = vt_->expert_group_issue(handle_, x, n_x_rows, hidden,
                                                  static_cast<int32_t>(c.tasks.size()), c.tasks.data(), &h);
  if (s != STRATA_OK) raise(s, "expert_group_issue");
  PendingGroup g;
  g.owner_ = this;
  g.handle_ = h;
  return g;
}

bool Backend::register_host(void* p, size_t bytes) const {
  if (!STRATA_PLUGIN_HAS_SLOT(vt_, host_register) || !STRATA_PLUGIN_HAS_SLOT(vt_, host_unregister)) return false;
  return vt_->host_register(handle_, p, bytes) == STRATA_OK;
}

void Backend::unregister_host(void* p) const {
  if (STRATA_PLUGIN_HAS_SLOT(vt_, host_unregister)) (void)vt_->host_unregister(handle_, p);
}

ResidentMatrix& ResidentMatrix::operator=(ResidentMatrix&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    handle_ = o.handle_;
    matrix_ = o.matrix_;
    o.owner_ = nullptr;
    o.handle_ = nullptr;
    o.matrix_.resident = nullptr;
  }
  return *this;
}

void ResidentMatrix::reset() noexcept {
  if (handle_ != nullptr && owner_ != nullptr) (void)owner_->vt_->free_matrix(owner_->handle_, handle_);
  handle_ = nullptr;
  owner_ = nullptr;
  matrix_.resident = nullptr;
}

PendingGroup& PendingGroup::operator=(PendingGroup&& o) noexcept {
  if (this != &o) {
    discard();
    owner_ = o.owner_;
    handle_ = o.handle_;
    o.owner_ = nullptr;
    o.handle_ = nullptr;
  }
  return *this;
}

void PendingGroup::take() {
  if (handle_ == nullptr) fail("backend", "take of an expert group that is not in flight");
  const Backend* b = owner_;
  strata_group* h = handle_;
  owner_ = nullptr;
  handle_ = nullptr;  // take consumes the handle, also when it fails
  const strata_status s = b->vt_->expert_group_take(b->handle_, h);
  if (s != STRATA_OK) b->raise(s, "expert_group_take");
}

void PendingGroup::discard() noexcept {
  if (handle_ != nullptr && owner_ != nullptr) owner_->vt_->expert_group_discard(owner_->handle_, handle_);
  handle_ = nullptr;
  owner_ = nullptr;
}

}  // namespace strata
