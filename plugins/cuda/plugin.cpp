// cuda: the CUDA backend plugin. This file is the C ABI: the vtable, the score (a host without a driver or a
// device gets 0 and the reason, never a crash: the CUDA runtime is linked statically and loads the driver
// library only when asked), and the shims that turn exceptions into a status and last_error.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cuda_backend.hpp"
#include "strata/plugin_abi.h"

// "cuda"; the CPU emulation build (tests) is "cuda_emu".
#ifndef STRATA_CUDA_PLUGIN_NAME
#define STRATA_CUDA_PLUGIN_NAME "cuda"
#endif

namespace {

using strata_cuda::CudaBackend;
using strata_cuda::Failure;

std::string& last_error_text() {
  thread_local std::string text;
  return text;
}

const char* last_error() {
  return last_error_text().c_str();
}

strata_status fail(strata_status status, std::string message) {
  last_error_text() = std::move(message);
  return status;
}

template <class F>
strata_status guarded(F&& f) noexcept {
  try {
    last_error_text().clear();
    return f();
  } catch (const Failure& e) {
    return fail(e.status, e.what());
  } catch (const std::bad_alloc&) {
    return fail(STRATA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(STRATA_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(STRATA_ERR_INTERNAL, "unknown exception");
  }
}

CudaBackend* as_cuda(strata_backend* b) {
  return reinterpret_cast<CudaBackend*>(b);
}

strata_status cuda_create(const strata_backend_options* options, strata_backend** out) {
  return guarded([&] {
    if (out == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "create: out is NULL");
    *out = nullptr;
    int device = 0;
    if (options != nullptr &&
        options->struct_size >= offsetof(strata_backend_options, device) + sizeof(int32_t)) {
      device = options->device;
    }
    *out = reinterpret_cast<strata_backend*>(new CudaBackend(device));
    return STRATA_OK;
  });
}

void cuda_destroy(strata_backend* b) {
  delete as_cuda(b);
}

int32_t cuda_supports(strata_backend*, int32_t dtype) {
  return CudaBackend::supports(dtype) ? 1 : 0;
}

strata_status cuda_matmul(strata_backend* b, const strata_matrix* w, const float* x, int64_t n_x_rows,
                          float* y) {
  return guarded([&] {
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "matmul: backend is NULL");
    if (w == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "matmul: empty or NULL matrix");
    as_cuda(b)->matmul(*w, x, n_x_rows, y);
    return STRATA_OK;
  });
}

strata_status cuda_expert_group(strata_backend* b, const float* x, int64_t n_x_rows, int64_t hidden,
                                int32_t n_tasks, const strata_expert_task* tasks) {
  return guarded([&] {
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: backend is NULL");
    as_cuda(b)->expert_group(x, n_x_rows, hidden, n_tasks, tasks);
    return STRATA_OK;
  });
}

strata_status cuda_upload(strata_backend* b, const strata_matrix* w, strata_resident** out) {
  return guarded([&] {
    if (b == nullptr || w == nullptr || out == nullptr) {
      return fail(STRATA_ERR_INVALID_ARGUMENT, "upload_matrix: NULL backend, matrix or out");
    }
    *out = nullptr;
    *out = as_cuda(b)->upload(*w);
    return STRATA_OK;
  });
}

strata_status cuda_free(strata_backend* b, strata_resident* r) {
  return guarded([&] {
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "free_matrix: backend is NULL");
    as_cuda(b)->free(r);
    return STRATA_OK;
  });
}

strata_status cuda_memory_info(strata_backend* b, strata_memory_info* out) {
  return guarded([&] {
    if (b == nullptr || out == nullptr)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "memory_info: NULL backend or out");
    *out = as_cuda(b)->memory_info();
    return STRATA_OK;
  });
}

strata_status cuda_issue(strata_backend* b, const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                         const strata_expert_task* tasks, strata_group** out) {
  return guarded([&] {
    if (b == nullptr || out == nullptr)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group_issue: NULL backend or out");
    *out = nullptr;
    *out = as_cuda(b)->issue(x, n_x_rows, hidden, n_tasks, tasks);
    return STRATA_OK;
  });
}

strata_status cuda_take(strata_backend* b, strata_group* g) {
  return guarded([&] {
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group_take: backend is NULL");
    as_cuda(b)->take(g);
    return STRATA_OK;
  });
}

void cuda_discard(strata_backend* b, strata_group* g) {
  if (b != nullptr) as_cuda(b)->discard(g);
}

strata_status cuda_host_register(strata_backend* b, void* p, uint64_t bytes) {
  return guarded([&] {
    if (b == nullptr || p == nullptr || bytes == 0)
      return fail(STRATA_ERR_INVALID_ARGUMENT, "host_register: NULL backend or memory, or 0 bytes");
    as_cuda(b)->host_register(p, bytes);
    return STRATA_OK;
  });
}

strata_status cuda_host_unregister(strata_backend* b, void* p) {
  return guarded([&] {
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "host_unregister: backend is NULL");
    as_cuda(b)->host_unregister(p);
    return STRATA_OK;
  });
}

}  // namespace

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable = [] {
    strata_plugin_vtable v{};
    v.abi_version = STRATA_PLUGIN_ABI_VERSION;
    v.struct_size = sizeof(strata_plugin_vtable);
    v.name = STRATA_CUDA_PLUGIN_NAME;
    v.version = STRATA_VERSION;
    v.description =
        "NVIDIA GPUs, sm_80+: int4 expert groups on tensor cores (f32-exact and W4A16), f32 SIMT for "
        "float weights, device-resident weights, asynchronous groups";
    v.last_error = &last_error;
    v.create = &cuda_create;
    v.destroy = &cuda_destroy;
    v.supports_matmul = &cuda_supports;
    v.matmul = &cuda_matmul;
    v.supports_expert_group = &cuda_supports;
    v.expert_group = &cuda_expert_group;
    v.upload_matrix = &cuda_upload;
    v.free_matrix = &cuda_free;
    v.memory_info = &cuda_memory_info;
    v.expert_group_issue = &cuda_issue;
    v.expert_group_take = &cuda_take;
    v.expert_group_discard = &cuda_discard;
    v.host_register = &cuda_host_register;
    v.host_unregister = &cuda_host_unregister;
    return v;
  }();
  return &vtable;
}

// 0 with the reason when no driver, no device or none of sm_80+ (STRATA_CUDA_PROBE=off forces that answer,
// for tests). Otherwise 50: above cpu_generic, below cpu_avx512 and cpu_avx2. The score ranks plugins for
// `auto`: the dense backend is the highest-scoring one, and the core uploads no dense weights, so every dense
// matmul through this plugin would copy its host weights over PCIe, slower than an AVX-512 CPU reading them
// from RAM. Expert backends under `auto` are every exact-mode plugin that runs, in score order, and the core's
// expert store makes the first one with device memory its VRAM tier whatever its rank; so with no config a
// GPU host still computes the experts it places in VRAM here (docs/tiers.md).
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  const char* force = std::getenv("STRATA_CUDA_PROBE");
  if (force != nullptr && std::strcmp(force, "off") == 0) {
    last_error_text() = "CUDA probe forced off by STRATA_CUDA_PROBE=off";
    return 0;
  }
  try {
    const std::string why = strata_cuda::cuda_unavailable_reason();
    if (!why.empty()) {
      last_error_text() = why;
      return 0;
    }
  } catch (...) {
    last_error_text() = "CUDA probe failed";
    return 0;
  }
  return 50;
}

}  // extern "C"
