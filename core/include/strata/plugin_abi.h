/* strata plugin ABI: the only header a backend plugin compiles against (C, no C++ types cross it). */
#ifndef STRATA_PLUGIN_ABI_H
#define STRATA_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of the structs or functions below. The registry rejects a plugin whose
 * vtable carries another abi_version, or whose struct_size is smaller than the one this header defines. */
#define STRATA_PLUGIN_ABI_VERSION 1u

#if defined(_WIN32)
#define STRATA_PLUGIN_EXPORT __declspec(dllexport)
#else
#define STRATA_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_ERR_UNSUPPORTED = 1,      /* this backend does not implement the op for these formats */
  STRATA_ERR_INVALID_ARGUMENT = 2, /* shapes, pointers or options make no sense */
  STRATA_ERR_OUT_OF_MEMORY = 3,
  STRATA_ERR_DEVICE = 4,   /* the device (driver, GPU) failed; the core may recompute elsewhere */
  STRATA_ERR_INTERNAL = 5, /* anything else; last_error() says what */
} strata_status;

/* Weight formats (DESIGN §4, byte-exact). */
typedef enum strata_dtype {
  STRATA_DTYPE_F32 = 0,    /* row-major [O, I] */
  STRATA_DTYPE_BF16 = 1,   /* row-major [O, I] */
  STRATA_DTYPE_F16 = 2,    /* row-major [O, I] */
  STRATA_DTYPE_Q4_ROW = 3, /* [O, ceil(I/2)] nibbles (low = even column, nibble = q + 8), one F32 scale per row */
  STRATA_DTYPE_Q4_G64 = 4, /* same nibbles, one F32 scale per 64 inputs: s[o * ceil(I/64) + g] */
} strata_dtype;

/* A weight matrix W[O, I] (O = rows = outputs, I = cols = inputs). Host memory, owned by the core; valid for
 * the duration of the call that receives it. */
typedef struct strata_matrix {
  int32_t dtype; /* strata_dtype */
  int32_t reserved0;
  int64_t rows; /* O */
  int64_t cols; /* I */
  const void* data;
  const float* scales; /* Q4 formats only, else NULL */
} strata_matrix;

/* One routed expert: gate and up are [F, H], down is [H, F]. */
typedef struct strata_expert {
  strata_matrix gate;
  strata_matrix up;
  strata_matrix down;
} strata_expert;

/* The rows routed to one expert. For r in [0, n_rows):
 *   out[r * H .. r * H + H) = down · (silu(gate · x[rows[r]]) ⊙ (up · x[rows[r]]))
 * Outputs are per (row, expert); the core weights and combines them in routing-slot order. */
typedef struct strata_expert_task {
  const strata_expert* expert;
  int32_t n_rows; /* may be 0 */
  int32_t reserved0;
  const int32_t* rows; /* indices into x, each in [0, n_x_rows) */
  float* out;          /* [n_rows, H], written by the backend */
} strata_expert_task;

typedef struct strata_backend_options {
  uint32_t struct_size; /* sizeof(strata_backend_options) as the core knows it */
  int32_t n_threads;    /* host threads the backend may use; 0 = all hardware threads */
  int32_t device;       /* device ordinal for device backends; ignored by CPU backends */
} strata_backend_options;

typedef struct strata_backend strata_backend; /* opaque, created by the plugin */

/* The vtable a plugin returns from strata_plugin_init(). Every function is noexcept in spirit: it never throws
 * or longjmps across this boundary; failures return a status and leave a message in last_error(). Slots
 * marked (optional) may be NULL. */
typedef struct strata_plugin_vtable {
  uint32_t abi_version; /* STRATA_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size; /* sizeof(strata_plugin_vtable) as the plugin knows it */
  const char* name;     /* short unique name used in YAML configs, e.g. "cpu_generic" */
  const char* version;  /* the plugin's own version string */
  const char* description;

  /* Thread-local text of the last failure on the calling thread ("" if none). Valid until the next call. */
  const char* (*last_error)(void);

  /* Create / destroy a backend instance. The instance may be used from several threads at once for
   * independent calls (the core never calls it concurrently with destroy). */
  strata_status (*create)(const strata_backend_options* options, strata_backend** out);
  void (*destroy)(strata_backend* backend);

  /* Nonzero when matmul accepts weights of this dtype. */
  int32_t (*supports_matmul)(strata_backend* backend, int32_t dtype);
  /* y[S, O] = x[S, I] · W[O, I]^T, f32 activations and outputs. Bitwise independent of thread count. */
  strata_status (*matmul)(strata_backend* backend, const strata_matrix* w, const float* x, int64_t n_x_rows,
                          float* y);

  /* Nonzero when expert_group accepts experts whose three matrices are of this dtype. */
  int32_t (*supports_expert_group)(strata_backend* backend, int32_t dtype);
  /* Runs every task: x is [n_x_rows, hidden] f32. Bitwise independent of thread count. */
  strata_status (*expert_group)(strata_backend* backend, const float* x, int64_t n_x_rows, int64_t hidden,
                                int32_t n_tasks, const strata_expert_task* tasks);
} strata_plugin_vtable;

/* Exported by every plugin. Must be safe to call on any machine (compiled without ISA-specific flags). */
typedef const strata_plugin_vtable* (*strata_plugin_init_fn)(void);
/* 0 = cannot run on this machine (the reason is in last_error()); higher = preferred. */
typedef uint32_t (*strata_plugin_score_fn)(void);

#define STRATA_PLUGIN_INIT_SYMBOL "strata_plugin_init"
#define STRATA_PLUGIN_SCORE_SYMBOL "strata_plugin_score"

#ifdef __cplusplus
}
#endif

#endif /* STRATA_PLUGIN_ABI_H */
