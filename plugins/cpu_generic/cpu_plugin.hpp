// The vtable of a CPU backend (shared by cpu_generic, cpu_avx512, cpu_avx2 and cpu_vnni): error capture at
// the ABI boundary, a oneTBB arena sized from the options, argument checks, dispatch to the plugin's kernels
// (the exact-mode drivers with its own row-block dot kernel, or cpu_vnni's int8-activation drivers).
#pragma once

#include <tbb/task_arena.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "kernels/dot.hpp"
#include "kernels/drivers.hpp"
#include "strata/plugin_abi.h"

namespace strata_cpu {

inline std::string& last_error_text() {
  thread_local std::string text;
  return text;
}

inline const char* last_error() {
  return last_error_text().c_str();
}

// The score of an ISA-specific plugin (cpu_avx512, cpu_avx2): 0, with the reason as the last error, when
// <probe_env>=off forces "no" (tests) or missing() names what this CPU lacks; else `score`. missing() runs in
// the plugin's probe translation unit, compiled without ISA flags (__builtin_cpu_supports), so it cannot
// raise SIGILL; nullptr: all there.
template <class Missing>
uint32_t isa_score(const char* isa, const char* probe_env, Missing&& missing, uint32_t score) {
  const char* force = std::getenv(probe_env);
  const char* lacks = nullptr;
  std::string why;
  if (force != nullptr && std::strcmp(force, "off") == 0) {
    why = std::string(isa) + " probe forced off by " + probe_env + "=off";
  } else if ((lacks = missing()) != nullptr) {
    why = lacks;
  } else {
    return score;
  }
  last_error_text() = why;
  return 0;
}

// True when this CPU runs AVX-512 F/BW/VL/DQ code (cpu_avx512's kernels, and cpu_vnni's with VNNI besides).
// For the probes: compiled without ISA flags.
inline bool cpu_has_avx512_fbwvldq() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

inline strata_status fail(strata_status status, std::string message) {
  last_error_text() = std::move(message);
  return status;
}

// Runs f, turning every exception into a status; nothing is thrown across the C boundary.
template <class F>
strata_status guarded(F&& f) noexcept {
  try {
    last_error_text().clear();
    return f();
  } catch (const std::bad_alloc&) {
    return fail(STRATA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(STRATA_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(STRATA_ERR_INTERNAL, "unknown exception");
  }
}

struct CpuBackend {
  explicit CpuBackend(int threads) : arena(threads > 0 ? threads : tbb::task_arena::automatic) {}
  tbb::task_arena arena;  // all parallel work of this backend runs here, so n_threads is honoured
};

inline CpuBackend* as_cpu(strata_backend* b) {
  return reinterpret_cast<CpuBackend*>(b);
}

inline strata_status cpu_create(const strata_backend_options* options, strata_backend** out) {
  return guarded([&] {
    if (out == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "create: out is NULL");
    int threads = 0;
    if (options != nullptr && options->struct_size >= sizeof(strata_backend_options))
      threads = options->n_threads;
    if (threads < 0) return fail(STRATA_ERR_INVALID_ARGUMENT, "create: n_threads must be >= 0");
    *out = reinterpret_cast<strata_backend*>(new CpuBackend(threads));
    return STRATA_OK;
  });
}

inline void cpu_destroy(strata_backend* b) {
  delete as_cpu(b);
}

inline int32_t cpu_supports(strata_backend*, int32_t dtype) {
  return is_float_format(dtype) || is_q4_format(dtype) ? 1 : 0;
}

inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case STRATA_DTYPE_F32:
      return "F32";
    case STRATA_DTYPE_BF16:
      return "BF16";
    case STRATA_DTYPE_F16:
      return "F16";
    case STRATA_DTYPE_Q4_ROW:
      return "Q4_ROW";
    case STRATA_DTYPE_Q4_G64:
      return "Q4_G64";
    default:
      return "unknown";
  }
}

inline bool check_matrix(const strata_matrix* m, const char* what, strata_status* status) {
  if (m == nullptr || m->data == nullptr || m->rows <= 0 || m->cols <= 0) {
    *status = fail(STRATA_ERR_INVALID_ARGUMENT, std::string(what) + ": empty or NULL matrix");
    return false;
  }
  if (!is_float_format(m->dtype) && !is_q4_format(m->dtype)) {
    *status = fail(STRATA_ERR_UNSUPPORTED,
                   std::string(what) + ": weight format " + dtype_name(m->dtype) +
                       " is not supported by this backend (F32/BF16/F16/Q4_ROW/Q4_G64 are)");
    return false;
  }
  if (is_q4_format(m->dtype) && m->scales == nullptr) {
    *status = fail(STRATA_ERR_INVALID_ARGUMENT, std::string(what) + ": int4 matrix without scales");
    return false;
  }
  return true;
}

// The kernels of an exact-mode plugin: the shared drivers over its row-block dot kernel. A plugin with other
// drivers passes a struct of its own with the same two static functions.
template <DotBlockFn Dot>
struct ExactKernels {
  static void matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
    matmul_driver(Dot, w, x, n_x_rows, y);
  }
  static void expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                           const strata_expert_task* tasks) {
    (void)n_x_rows;
    expert_group_driver(Dot, x, hidden, n_tasks, tasks);
  }
};

template <class Kernels>
strata_status cpu_matmul(strata_backend* b, const strata_matrix* w, const float* x, int64_t n_x_rows,
                         float* y) {
  return guarded([&] {
    strata_status status = STRATA_OK;
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "matmul: backend is NULL");
    if (!check_matrix(w, "matmul", &status)) return status;
    if (n_x_rows < 0 || (n_x_rows > 0 && (x == nullptr || y == nullptr))) {
      return fail(STRATA_ERR_INVALID_ARGUMENT, "matmul: bad activations");
    }
    if (n_x_rows == 0) return STRATA_OK;
    as_cpu(b)->arena.execute([&] { Kernels::matmul(*w, x, n_x_rows, y); });
    return STRATA_OK;
  });
}

template <class Kernels>
strata_status cpu_expert_group(strata_backend* b, const float* x, int64_t n_x_rows, int64_t hidden,
                               int32_t n_tasks, const strata_expert_task* tasks) {
  return guarded([&] {
    strata_status status = STRATA_OK;
    if (b == nullptr) return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: backend is NULL");
    if (n_tasks < 0 || (n_tasks > 0 && tasks == nullptr)) {
      return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: bad task list");
    }
    for (int32_t t = 0; t < n_tasks; ++t) {
      const strata_expert_task& task = tasks[t];
      if (task.n_rows == 0) continue;
      if (task.n_rows < 0 || task.expert == nullptr || task.rows == nullptr || task.out == nullptr ||
          x == nullptr) {
        return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: task " + std::to_string(t) + " is malformed");
      }
      const strata_expert& e = *task.expert;
      if (!check_matrix(&e.gate, "expert_group gate", &status) ||
          !check_matrix(&e.up, "expert_group up", &status) ||
          !check_matrix(&e.down, "expert_group down", &status)) {
        return status;
      }
      if (e.gate.cols != hidden || e.up.cols != hidden || e.up.rows != e.gate.rows || e.down.rows != hidden ||
          e.down.cols != e.gate.rows) {
        return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: task " + std::to_string(t) +
                                                     " has inconsistent gate/up/down shapes for hidden " +
                                                     std::to_string(hidden));
      }
      for (int32_t r = 0; r < task.n_rows; ++r) {
        if (task.rows[r] < 0 || task.rows[r] >= n_x_rows) {
          return fail(STRATA_ERR_INVALID_ARGUMENT, "expert_group: task " + std::to_string(t) + " row index " +
                                                       std::to_string(task.rows[r]) + " outside [0, " +
                                                       std::to_string(n_x_rows) + ")");
        }
      }
    }
    as_cpu(b)->arena.execute([&] { Kernels::expert_group(x, n_x_rows, hidden, n_tasks, tasks); });
    return STRATA_OK;
  });
}

template <class Kernels>
strata_plugin_vtable make_cpu_vtable(const char* name, const char* version, const char* description) {
  strata_plugin_vtable v{};
  v.abi_version = STRATA_PLUGIN_ABI_VERSION;
  v.struct_size = sizeof(strata_plugin_vtable);
  v.name = name;
  v.version = version;
  v.description = description;
  v.last_error = &last_error;
  v.create = &cpu_create;
  v.destroy = &cpu_destroy;
  v.supports_matmul = &cpu_supports;
  v.matmul = &cpu_matmul<Kernels>;
  v.supports_expert_group = &cpu_supports;
  v.expert_group = &cpu_expert_group<Kernels>;
  return v;
}

}  // namespace strata_cpu
