/* strata plugin ABI: the only header a backend plugin compiles against (C, no C++ types cross it). */
#ifndef STRATA_PLUGIN_ABI_H
#define STRATA_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of the structs or functions below. The registry rejects a plugin whose
 * vtable carries another abi_version, or whose struct_size is smaller than STRATA_PLUGIN_VTABLE_MIN_SIZE.
 * Slots appended after that size later are optional and read through STRATA_PLUGIN_HAS_SLOT, so plugins built
 * against this header stay loadable. */
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
  STRATA_DTYPE_F32 = 0,  /* row-major [O, I] */
  STRATA_DTYPE_BF16 = 1, /* row-major [O, I] */
  STRATA_DTYPE_F16 = 2,  /* row-major [O, I] */
  STRATA_DTYPE_Q4_ROW =
      3, /* [O, ceil(I/2)] nibbles (low = even column, nibble = q + 8), one F32 scale per row */
  STRATA_DTYPE_Q4_G64 = 4, /* same nibbles, one F32 scale per 64 inputs: s[o * ceil(I/64) + g] */
} strata_dtype;

/* A copy of a weight matrix in a backend's device memory, made by upload_matrix() (opaque, owned by the
 * plugin). */
typedef struct strata_resident strata_resident;

/* A weight matrix W[O, I] (O = rows = outputs, I = cols = inputs). Host memory, owned by the core; valid for
 * the duration of the call that receives it. When `resident` is set and was made by the backend that receives
 * the matrix, that backend computes from its device copy and may ignore data/scales (which may then be NULL);
 * every other backend (CPU plugins, another device) ignores `resident` and reads data/scales. */
typedef struct strata_matrix {
  int32_t dtype; /* strata_dtype */
  int32_t reserved0;
  int64_t rows; /* O */
  int64_t cols; /* I */
  const void* data;
  const float* scales;             /* Q4 formats only, else NULL */
  const strata_resident* resident; /* NULL, or a handle from upload_matrix() */
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

/* Device memory of a backend (memory_info). */
typedef struct strata_memory_info {
  uint64_t total_bytes;    /* memory of the backend's device */
  uint64_t free_bytes;     /* free on that device now, whoever holds the rest */
  uint64_t used_bytes;     /* held by this backend instance: resident matrices plus its staging and scratch */
  uint64_t resident_bytes; /* of which resident matrices (upload_matrix), as laid out on the device */
} strata_memory_info;

/* An expert group in flight (expert_group_issue), opaque, owned by the plugin until take or discard. */
typedef struct strata_group strata_group;

/* The vtable a plugin returns from strata_plugin_init(). Every function is noexcept in spirit: it never
 * throws or longjmps across this boundary; failures return a status and leave a message in last_error().
 * Slots marked (optional) may be NULL. */
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

  /* ---- Device backends: optional slots (NULL in CPU plugins), read through STRATA_PLUGIN_HAS_SLOT. ---- */

  /* (optional) Copies w into the backend's device memory (in whatever layout its kernels want) and returns a
   * handle to put in strata_matrix.resident; w's host memory need not outlive the call. Out of device memory
   * is STRATA_ERR_OUT_OF_MEMORY. */
  strata_status (*upload_matrix)(strata_backend* backend, const strata_matrix* w, strata_resident** out);
  /* (optional) Frees a handle from upload_matrix of this backend (NULL: nothing). No issued group may still
   * use it. */
  strata_status (*free_matrix)(strata_backend* backend, strata_resident* resident);
  /* (optional) Total and free memory of the backend's device and what this backend holds there. */
  strata_status (*memory_info)(strata_backend* backend, strata_memory_info* out);
  /* (optional) expert_group, asynchronous: starts the work and returns at once with a handle. Everything the
   * call reads (x, tasks, their rows, host weights) is consumed before it returns; each task's out must stay
   * valid until take. Groups may be in flight on several backends (devices) and several on one backend. */
  strata_status (*expert_group_issue)(strata_backend* backend, const float* x, int64_t n_x_rows,
                                      int64_t hidden, int32_t n_tasks, const strata_expert_task* tasks,
                                      strata_group** out);
  /* (optional) Waits for an issued group and writes every task's out. Consumes the handle, also on failure
   * (STRATA_ERR_DEVICE etc.: the outputs are then unspecified and the core may recompute them elsewhere). */
  strata_status (*expert_group_take)(strata_backend* backend, strata_group* group);
  /* (optional) Waits for an issued group and releases it without writing any output (error paths; outputs in
   * memory registered with host_register may have been written). */
  void (*expert_group_discard)(strata_backend* backend, strata_group* group);

  /* (optional, appended) Host memory the device writes group outputs into directly: the rows of a task whose
   * out lies inside a registered range are written there by the device, by its kernels or a copy, at any time
   * between issue and take (no staging copy at take). ptr and bytes as registered stay registered until
   * host_unregister(ptr), which the core calls before freeing the memory and never while a group writing
   * there is in flight. STRATA_ERR_UNSUPPORTED: not offered here. */
  strata_status (*host_register)(strata_backend* backend, void* ptr, uint64_t bytes);
  strata_status (*host_unregister)(strata_backend* backend, void* ptr);

  /* (optional, appended) NULL for a plugin that keeps the exact-mode contract (DESIGN §6: f32 activations, the
   * canonical order where it claims it). Otherwise a one-line text naming what it approximates and how far its
   * results may move, e.g. "int8 activations (one scale per 64 columns); outputs within ~1 % of exact mode".
   * The core never chooses such a plugin by `auto`, and says the text when a config names it. */
  const char* approximation;
} strata_plugin_vtable;

/* The vtable size every plugin must have: through expert_group_discard (the revision of ABI 1 that also added
 * strata_matrix.resident, so plugins built before it are refused). Slots appended later fall past this size
 * and count as NULL in plugins that end before them. */
#define STRATA_PLUGIN_VTABLE_MIN_SIZE                     \
  (offsetof(strata_plugin_vtable, expert_group_discard) + \
   sizeof(((strata_plugin_vtable*)0)->expert_group_discard))
/* Nonzero when the vtable has the (optional) slot and sets it. */
#define STRATA_PLUGIN_HAS_SLOT(vt, slot) \
  ((vt)->struct_size >= offsetof(strata_plugin_vtable, slot) + sizeof((vt)->slot) && (vt)->slot != NULL)

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
