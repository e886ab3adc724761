// The CUDA backend's host side: validation, device copies of matrices, the plan of a call (work items in
// chunks of tokens, kernel choice per format and row count), staging slots (a stream, pinned buffers, one
// device buffer each), issue/take. Every CUDA call is checked; failures become Failure(status, text).
#include <cuda_runtime.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "cuda_backend.hpp"

namespace strata_cuda {

namespace {

constexpr size_t kMaxGraphs = 64;  // per slot; beyond that the least recently used one goes

// Waits for a slot's done event: polls (sched_yield between queries offers the core to any runnable thread)
// for up to spin_us, then sleeps in cudaEventSynchronize (a BlockingSync event: woken by the device's
// interrupt). The engine takes a group on the layer's thread after its CPU rows, when nothing else is left to
// run, so polling costs no work, while the interrupt's wake-up cost 20-40 µs per take on the H200 (run30/32:
// a GLM-5.2 layer's issue -> take 96.8 µs polling, 118.7 with a 50 µs poll; serial GPU issue + take per token
// 0.44 vs 0.58 ms); the sleep only bounds a long wait (a prefill group). Settings::spin_us.
cudaError_t wait_done(cudaEvent_t done, int spin_us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  cudaError_t e;
  while ((e = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() >= until) {
      e = cudaEventSynchronize(done);
      break;
    }
    sched_yield();
  }
  if (e == cudaSuccess) (void)cudaGetLastError();  // no "not ready" left behind for this thread's next launch
  return e;
}

constexpr uint64_t kResidentMagic = 0x3144495345525453ull;  // "STRESID1"
constexpr uint64_t kGroupMagic = 0x3150524750525453ull;     // "STRPGRP1"
constexpr uint64_t kAlign = 256;
constexpr int64_t kMaxDim = int64_t{1} << 30;  // rows and cols (kernels index with int32)
constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

bool is_q4(int32_t dtype) {
  return dtype == kQ4Row || dtype == kQ4G64;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case kF32:
      return "F32";
    case kBF16:
      return "BF16";
    case kF16:
      return "F16";
    case kQ4Row:
      return "Q4_ROW";
    case kQ4G64:
      return "Q4_G64";
    default:
      return "unknown";
  }
}

int64_t padded_cols(int64_t cols) {
  return (cols + kColPad - 1) / kColPad * kColPad;
}

// Row length of an f32 operand for a matrix of kp padded columns: gemv operands are whole warp steps
// (gemv_slot in device_util.cuh), the SIMT ones kp.
int64_t f32_operand_ld(int splits, int64_t kp) {
  return splits == kGemvSplits ? (kp + kGemvStepCols - 1) / kGemvStepCols * kGemvStepCols : kp;
}

// Bytes of one row: as the host stores it, and padded on the device.
int64_t host_row_bytes(int32_t dtype, int64_t cols) {
  switch (dtype) {
    case kF32:
      return cols * 4;
    case kBF16:
    case kF16:
      return cols * 2;
    default:
      return (cols + 1) / 2;
  }
}
int64_t device_row_bytes(int32_t dtype, int64_t cols) {
  return host_row_bytes(dtype, padded_cols(cols));
}

int64_t scale_count(int32_t dtype, int64_t rows, int64_t cols) {
  if (dtype == kQ4G64) return rows * ((cols + kColPad - 1) / kColPad);
  if (dtype == kQ4Row) return rows;
  return 0;
}

// Data bytes of a matrix copy with rows in order (the int4 scales follow at the next aligned offset).
uint64_t device_data_bytes(int32_t dtype, int64_t rows, int64_t cols) {
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(device_row_bytes(dtype, cols));
}
// The kTiles layout of a resident int4 matrix (work.hpp): rows of a multiple of 64 bytes, 16-row tiles.
int64_t tiles_row_bytes(int64_t cols) {
  return (device_row_bytes(kQ4G64, cols) + 63) / 64 * 64;
}
uint64_t tiles_data_bytes(int64_t rows, int64_t cols) {
  return static_cast<uint64_t>((rows + 15) / 16 * 16) * static_cast<uint64_t>(tiles_row_bytes(cols));
}

// Q4_G64 scales of a kTiles matrix, in 16 x 4 blocks (work.hpp): how many floats, and the host's row-major
// scales (rows x n groups) in that order; padding zero.
int64_t tile_scale_count(int64_t rows, int64_t cols) {
  return tile_scale_row(static_cast<int32_t>((rows + 15) / 16 * 16),
                        static_cast<int32_t>((cols + kColPad - 1) / kColPad));
}
std::vector<float> to_tile_scales(const float* src, int64_t rows, int64_t cols) {
  const int32_t n = static_cast<int32_t>((cols + kColPad - 1) / kColPad);  // (rows and cols below 2^30)
  std::vector<float> out(static_cast<size_t>(tile_scale_count(rows, cols)), 0.0f);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t g = 0; g < n; ++g) {
      out[static_cast<size_t>(tile_scale_row(r, n) + tile_scale_grp(g))] =
          src[static_cast<int64_t>(r) * n + g];
    }
  }
  return out;
}

// Host int4 rows (raw bytes per row) in the kTiles order (work.hpp, q4_tile_byte): 8-byte piece i of row r
// goes to (r / 16) 16 rb + 512 ((r / 8) % 2) + 64 (r % 8) + 1024 (i / 8) + 16 (i % 4) + 8 ((i / 4) % 2);
// padding stays zero.
std::vector<uint8_t> to_tiles(const uint8_t* src, int64_t rows, int64_t raw, int64_t rb) {
  std::vector<uint8_t> out(static_cast<size_t>((rows + 15) / 16 * 16 * rb), 0);
  std::vector<uint8_t> row(static_cast<size_t>(rb), 0);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(row.data(), src + r * raw, static_cast<size_t>(raw));  // the tail of `row` stays zero
    uint8_t* tile_row = out.data() + (r >> 4) * 16 * rb + ((r >> 3) & 1) * 512 + (r & 7) * 64;
    for (int64_t i = 0; i < rb / 8; ++i)
      std::memcpy(tile_row + (i >> 3) * 1024 + (i & 3) * 16 + ((i >> 2) & 1) * 8, &row[i * 8], 8);
  }
  return out;
}

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

[[noreturn]] void throw_cuda(cudaError_t e, const std::string& what, int device) {
  (void)cudaGetLastError();  // clears the error when it is not sticky
  const strata_status s = e == cudaErrorMemoryAllocation ? STRATA_ERR_OUT_OF_MEMORY : STRATA_ERR_DEVICE;
  throw Failure(s, "cuda device " + std::to_string(device) + ": " + what + ": " + cuda_text(e));
}

#define STRATA_CK(expr, what)                                               \
  do {                                                                      \
    const cudaError_t strata_ck_e = (expr);                                 \
    if (strata_ck_e != cudaSuccess) throw_cuda(strata_ck_e, what, device_); \
  } while (0)

[[noreturn]] void invalid(const std::string& what) {
  throw Failure(STRATA_ERR_INVALID_ARGUMENT, what);
}

// Tokens per work item for an operand of kind `splits` (kI8Splits: exact tensor-core, 1: W4A16, 0: SIMT f32,
// kGemvSplits: gemv f32).
int chunk_capacity(int splits) {
  return splits == kI8Splits ? 8 : splits == 1 ? 32 : splits == kGemvSplits ? kGemvMaxTok : kSimtMaxTok;
}

// n-tiles needed for n tokens, rounded to an instantiated count.
int nt_for(int splits, int n) {
  if (splits == kI8Splits) return (kI8Planes * n + 7) / 8;  // 1..4 for n <= 8
  const int need = (n + 7) / 8;                             // W4A16: 1, 2, 4
  return need <= 1 ? 1 : need <= 2 ? 2 : 4;
}

// Bytes of a tensor-core operand of nt n-tiles and row length kp (work.hpp): int8 digit planes and the group
// multipliers, or bf16.
uint64_t tc_operand_bytes(int splits, int nt, int64_t kp) {
  const auto cols = static_cast<uint64_t>(8 * nt), len = static_cast<uint64_t>(kp);
  if (splits == kI8Splits) return cols * len + static_cast<uint64_t>(2 * nt) * (len / kColPad) * 4;
  return cols * len * 2;
}

// Threads a preparation job keeps busy: a warp per (token, group) for the int8 planes, else one per element.
int64_t prep_threads(int splits, int64_t ncols, int64_t kp) {
  return splits == kI8Splits ? ncols / kI8Planes * (kp / kColPad) * 32 : ncols * kp;
}

// Where a matrix's device copy is: a resident (pointers known) or a host matrix staged in the slot buffer.
struct MatRef {
  DevMatrix dm{};
  int64_t upload = -1;  // index into Plan::uploads when staged
};

struct Upload {
  const strata_matrix* src;
  uint64_t data_off, scale_off;
};

// A kernel launch over a contiguous range of the plan's items. Not tc: SIMT (splits 0) or gemv (splits
// kGemvSplits, nt = the items' token count).
struct LaunchSpec {
  bool tc;
  int32_t dtype;
  bool gate_up;
  int splits, nt;
  uint64_t first_item;
  int n_items;
  int grid_x;
  // tc: every matrix of its items resident in kTiles (the exact instances with constant strides)
  bool tiles = false;
};

struct ItemSpec {
  MatRef w0, w1;
  uint64_t in_off;
  int in_splits, n_tok;
  uint64_t y_off = kNone;
  float* y_ptr = nullptr;  // instead of y_off: rows in registered host memory (their device address)
  int64_t y_ld = 0;
  uint64_t h_off = kNone;
  int h_splits = 0, h_kp = 0;
};

struct JobSpec {
  uint64_t src_off = kNone;   // device offset of the f32 source rows, or kNone (the call's x)
  uint64_t rows_off = kNone;  // device offset of the n_tok row indices, or kNone (consecutive rows from row0)
  int64_t x_ld;
  int row0, n_tok, cols, kp, splits, ncols;
  uint64_t dst_off;
  uint64_t zero_off = kNone;
  int64_t zero_bytes = 0;
};

// Groups items into launches: one per (kernel, format, splits, gemv token count) class, items of a class
// contiguous. `nts` gets the n-tile count of each tensor-core class (the operand buffers are sized by it).
struct ClassKey {
  bool tc;
  int32_t dtype;
  int splits;
  int gemv_tok = 0;  // gemv classes: the token count of their items (one kernel instance per count)
  bool wide = false;  // exact tensor cores: the wide kernels (kWideNt n-tiles, whole 16-token chunks)
  bool operator<(const ClassKey& o) const {
    return std::tie(tc, dtype, splits, gemv_tok, wide) < std::tie(o.tc, o.dtype, o.splits, o.gemv_tok, o.wide);
  }
  bool operator==(const ClassKey& o) const {
    return tc == o.tc && dtype == o.dtype && splits == o.splits && gemv_tok == o.gemv_tok && wide == o.wide;
  }
};

// A group's launch classes (one or two at decode) and their n-tile counts, in key order: a sorted vector.
struct ClassCounts {
  std::vector<std::pair<ClassKey, int>> v;
  size_t last = 0;  // the entry found last (chunks of one class mostly follow each other)
  int& operator[](const ClassKey& k) {
    if (last < v.size() && v[last].first == k) return v[last].second;
    auto it = std::lower_bound(v.begin(), v.end(), k,
                               [](const auto& e, const ClassKey& key) { return e.first < key; });
    if (it == v.end() || !(it->first == k)) it = v.insert(it, {k, 0});
    last = static_cast<size_t>(it - v.begin());
    return it->second;
  }
  auto begin() { return v.begin(); }
  auto end() { return v.end(); }
  auto begin() const { return v.begin(); }
  auto end() const { return v.end(); }
};

// A piece of an expert task's routed rows: at most its launch classes' chunk capacity (plan_group).
struct Chunk {
  int task, start, n;
  MatRef gate, up, down;
  ClassKey gu, dn;
  // Their classes' n-tile counts (gemv: token counts), once the classes are known.
  int gu_nt = 0, dn_nt = 0;
  // In the layout: the gate_up input operand, the region gate_up writes h to (h_bytes, cleared by the first
  // preparation pass), and for an exact-mode down the operand encoded from that f32 h (else kNone).
  uint64_t in_off = 0, h_off = 0, h_bytes = 0, dn_op_off = kNone;
  // in_off is chunk share_from's operand (an earlier chunk's, equal to this one's: plan_group); -1: its own.
  int share_from = -1;
};

}  // namespace

// Everything one call does, with buffer offsets; pointers are made once the slot's buffers are known.
struct Plan {
  const float* x = nullptr;
  uint64_t x_bytes = 0, x_off = 0;
  std::vector<int32_t> rows;
  uint64_t rows_off = 0;
  std::vector<ItemSpec> items;
  uint64_t items_off = 0;
  // Preparation jobs: [0, n_jobs_first) before the first launch; the rest (the exact-mode down operands,
  // encoded from gate_up's f32 output) before launch first_down_launch.
  std::vector<JobSpec> jobs;
  uint64_t jobs_off = 0;
  size_t n_jobs_first = 0, first_down_launch = 0;
  uint64_t head_bytes = 0;  // [0, head_bytes) of the device buffer mirrors the pinned input buffer
  uint64_t y_off = 0, y_bytes = 0;
  uint64_t dev_bytes = 0;
  std::vector<Upload> uploads;
  std::vector<LaunchSpec> launches;
  std::vector<strata_group::OutCopy> outs;  // offsets relative to y_off
  int prep_blocks = 1;
  // The layer kernel instead of launches[0] (gate_up), the down operands' preparation and launches[1] (down):
  // LayerWork's counters at sync_off (sync_bytes in the head, at an offset that does not depend on the token
  // count; zero in the pinned head, so that the head's copy clears them before each launch).
  bool layer = false;
  uint64_t sync_off = 0, sync_bytes = 0;
};

// A layer-kernel plan's tiles: its gate/up items' tiles and their down tiles, at mg and md 16-row tiles per warp.
static int64_t layer_tiles(const Plan& p, int mg = 1, int md = 1) {
  return static_cast<int64_t>(p.launches[0].n_items) *
         ((p.launches[0].grid_x + mg - 1) / mg + (p.launches[1].grid_x + md - 1) / md);
}

// plan_group's working lists (a slot keeps them: Slot::scratch).
struct PlanScratch {
  std::vector<Chunk> chunks;
  std::vector<uint64_t> task_rows_at, y_task;
  std::vector<float*> y_dev;  // direct writes: the device address of a task's rows in registered host memory
  ClassCounts gu_nt, dn_nt;   // launch classes and their n-tile counts (gemv: the token count)
  // The chunks whose gate/up operands may be shared, as (hash of the operand, chunk) sorted (plan_group).
  std::vector<std::pair<uint64_t, uint32_t>> operand_keys;
};

// A staging slot: what one call in flight owns. Reused by later calls once taken; grown when a call needs
// more.
struct Slot {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;  // bench timing, made on first use
  char* dev = nullptr;                     // device: inputs, operands, outputs, host weights staged
  uint64_t dev_bytes = 0;
  char* in = nullptr;  // pinned: the head (x, row table, items, jobs)
  uint64_t in_bytes = 0;
  char* out = nullptr;  // pinned: outputs
  uint64_t out_bytes = 0;
  // Launch sequences captured as CUDA graphs, by their signature (launch_signature), with the call count at
  // their last use; their kernel arguments point into `dev`, so they are dropped when it moves.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };
  std::map<std::string, Graph> graphs;
  uint64_t graph_uses = 0;
  std::string key;  // the signature of the call being launched
  // The call's plan, and plan_group's working lists: kept with the slot, so that their memory serves its next
  // calls (a decode call's plan then allocates nothing). The plan lives until the call is taken (its
  // outputs).
  Plan plan;
  PlanScratch scratch;
};

namespace {

// A fresh plan, its lists' memory kept (their contents cleared).
void reset(Plan& p) {
  Plan fresh;
  auto keep = [](auto& from, auto& to) {
    from.clear();
    to.swap(from);
  };
  keep(p.rows, fresh.rows);
  keep(p.items, fresh.items);
  keep(p.jobs, fresh.jobs);
  keep(p.uploads, fresh.uploads);
  keep(p.launches, fresh.launches);
  keep(p.outs, fresh.outs);
  p = std::move(fresh);
}

void drop_graphs(Slot& s) {
  for (auto& [key, g] : s.graphs) (void)cudaGraphExecDestroy(g.exec);
  s.graphs.clear();
}

// Lays out a plan's device buffer: head (x, rows, items, jobs), then `extra` bytes of operands and outputs
// the caller placed from `operands_base`, then the staged host weights.
struct Layout {
  uint64_t cursor = 0;
  uint64_t take(uint64_t bytes) {
    const uint64_t at = cursor;
    cursor += align_up(bytes);
    return at;
  }
};

DevMatrix patch(const MatRef& r, const std::vector<Upload>& uploads, char* base) {
  DevMatrix d = r.dm;
  if (r.upload >= 0) {
    const Upload& u = uploads[static_cast<size_t>(r.upload)];
    d.data = base + u.data_off;
    d.scales = is_q4(d.dtype) ? reinterpret_cast<const float*>(base + u.scale_off) : nullptr;
  }
  return d;
}

}  // namespace

// ---- device discovery ------------------------------------------------------------------------------------

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    int driver = 0;
    (void)cudaDriverGetVersion(&driver);
    if (driver == 0) return "no CUDA driver (libcuda.so.1 not found)";
    return "CUDA driver too old: it supports CUDA " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) + ", this plugin needs " +
           std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  }
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
    (void)cudaGetLastError();
    return "no CUDA device";
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return "no CUDA device (cudaGetDeviceCount: " + cuda_text(e) + ")";
  }
  std::string found;
  for (int d = 0; d < count; ++d) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (major >= 8) return "";
    found += (found.empty() ? "" : ", ") + std::string("sm_") + std::to_string(major) + std::to_string(minor);
  }
  return "no CUDA device of compute capability 8.0 or newer (found " +
         (found.empty() ? "none usable" : found) + ")";
}

// ---- backend ---------------------------------------------------------------------------------------------

namespace {
// An integer setting from the environment: the number `name` is set to when it is a whole number in
// [lo, hi], `bad` when it is set to anything else, `unset` when it is not set.
int env_int(const char* name, long lo, long hi, int bad, int unset) {
  const char* v = std::getenv(name);
  if (v == nullptr) return unset;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && n >= lo && n <= hi ? static_cast<int>(n) : bad;
}
}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  if (const char* t = std::getenv("STRATA_CUDA_TRACE"); t != nullptr && *t != '\0' && std::string(t) != "0") {
    trace_on_ = true;
  }
  int count = 0;
  STRATA_CK(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count) {
    invalid("create: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
            " CUDA devices)");
  }
  int major = 0, minor = 0;
  STRATA_CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
            "cudaDeviceGetAttribute");
  STRATA_CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
            "cudaDeviceGetAttribute");
  if (major < 8) {
    throw Failure(STRATA_ERR_UNSUPPORTED, "cuda device " + std::to_string(device) + " is sm_" +
                                              std::to_string(major) + std::to_string(minor) +
                                              "; this plugin needs sm_80 or newer");
  }
  sm_major_ = major;
  STRATA_CK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  STRATA_CK(cudaSetDevice(device), "cudaSetDevice");
  STRATA_CK(cudaFree(nullptr), "context creation");
  constexpr long kRowsMax = (1L << 30) - 1;
  settings_.w4a16_min_rows = env_int("STRATA_CUDA_W4A16_MIN_ROWS", 1, kRowsMax, 0, settings_.w4a16_min_rows);
  settings_.gemv_max_rows = env_int("STRATA_CUDA_GEMV_MAX_ROWS", 0, kRowsMax, -1, settings_.gemv_max_rows);
  settings_.wide_min_rows = env_int("STRATA_CUDA_WIDE_MIN_ROWS", 0, kRowsMax, 9, settings_.wide_min_rows);
  // The wide kernels ask for more than the default 48 KB of shared memory per block (69 KiB): a device that
  // allows less keeps every chunk on the narrow kernels (the same bits). (Every sm_80+ card allows 99 KB.)
  int smem_optin = 0;
  if (cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    smem_optin = 0;
  }
  if (static_cast<unsigned>(smem_optin) < wide_smem_bytes()) settings_.wide_min_rows = 0;
  if (const char* v = std::getenv("STRATA_CUDA_KERNELS")) settings_.force_simt = std::strcmp(v, "simt") == 0;
  if (const char* v = std::getenv("STRATA_CUDA_PDL")) settings_.pdl = std::strcmp(v, "0") != 0;
  // Programmatic dependent launches need the device (sm_90+) and kernels that wait for them (griddepcontrol,
  // compiled for compute_90+: not so when an sm_90 device runs a build's compute_80 PTX).
  if (sm_major_ < 9 || kernels_ptx_version() < 90) settings_.pdl = false;
  if (const char* v = std::getenv("STRATA_CUDA_GRAPHS")) settings_.graphs = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("STRATA_CUDA_LAYER")) settings_.layer_kernel = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("STRATA_CUDA_LAYER_PERSISTENT")) {
    settings_.layer_persistent = std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "auto") == 0 ? -1 : 1;
  }
  if (const char* v = std::getenv("STRATA_CUDA_LAYER_LEAN")) {
    settings_.layer_lean = std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "auto") == 0 ? -1 : 1;
  }
  settings_.layer_sms = env_int("STRATA_CUDA_LAYER_SMS", 0, 1 << 20, 0, settings_.layer_sms);
  if (std::getenv("STRATA_CUDA_GATE_UP_SLICES") != nullptr) {
    const int ksg = env_int("STRATA_CUDA_GATE_UP_SLICES", 1, 2, 0, settings_.gate_up_slices);
    if (ksg == 0) {
      invalid(std::string("create: STRATA_CUDA_GATE_UP_SLICES is '") + std::getenv("STRATA_CUDA_GATE_UP_SLICES") +
              "'; expected 1 or 2 (K slices per gate/up matrix of the tensor-core kernels)");
    }
    settings_.gate_up_slices = ksg;
  }
  // The layer kernel's tile shape by default (with two gate/up slices): the device's peak memory read rate per
  // SM decides (default_layer_warp_tiles; memory clock x 2 (double data rate) x bus width); WARP_ROWS overrides.
  if (settings_.gate_up_slices == 2) {
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
      (void)cudaGetLastError();
      mem_khz = bus_bits = 0;
    }
    const double bytes_per_s = 2.0 * mem_khz * 1e3 * bus_bits / 8;
    settings_.layer_mt_gu = settings_.layer_mt_dn = default_layer_warp_tiles(bytes_per_s, sm_count_);
  }
  if (const char* v = std::getenv("STRATA_CUDA_LAYER_WARP_ROWS")) {
    // (gate/up / down 16-row tiles per warp; the layer kernel's instances: with 2 gate/up K slices 16, 32/16,
    // 32; with 1 slice 16 and 16/32)
    const std::string w = v;
    const bool one = settings_.gate_up_slices == 1;
    if (w == "16" || (!one && (w == "32/16" || w == "32")) || (one && w == "16/32")) {
      settings_.layer_mt_gu = w == "32" || w == "32/16" ? 2 : 1;
      settings_.layer_mt_dn = w == "32" || w == "16/32" ? 2 : 1;
    } else {
      invalid("create: STRATA_CUDA_LAYER_WARP_ROWS is '" + w + "'; expected " +
              (one ? "16 or 16/32 (with STRATA_CUDA_GATE_UP_SLICES=1)" : "16, 32/16 or 32 (16/32 only with "
                                                                          "STRATA_CUDA_GATE_UP_SLICES=1)"));
    }
  }
  if (const char* v = std::getenv("STRATA_CUDA_SHARE_OPERANDS")) {
    const int n = std::strcmp(v, "auto") == 0 ? -1 : env_int("STRATA_CUDA_SHARE_OPERANDS", 0, kShareCopiesMax, -2, -1);
    if (n == -2) {
      invalid(std::string("create: STRATA_CUDA_SHARE_OPERANDS is '") + v + "'; expected auto or the copies of a shared "
              "operand, 0 (none: an operand per expert) to " + std::to_string(kShareCopiesMax));
    }
    settings_.share_operands = n;
  }
  if (const char* v = std::getenv("STRATA_CUDA_REGISTER")) settings_.host_register = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("STRATA_CUDA_DIRECT_WRITES"))
    settings_.direct_writes = std::strcmp(v, "0") != 0;
  settings_.spin_us = env_int("STRATA_CUDA_SPIN_US", 0, 10'000'000, settings_.spin_us, settings_.spin_us);
  if (const char* v = std::getenv("STRATA_CUDA_LAYOUT")) settings_.tiles = std::strcmp(v, "rows") != 0;
  if (const char* v = std::getenv("STRATA_CUDA_FAIL_NEXT")) {
    if (std::strcmp(v, "oom") == 0) fail_next_ = STRATA_ERR_OUT_OF_MEMORY;
    if (std::strcmp(v, "device") == 0) fail_next_ = STRATA_ERR_DEVICE;
  }
}

CudaBackend::~CudaBackend() {
  for (int k = 0; k < 2 && trace_on_; ++k) {
    const IssueTrace& t = trace_[k];
    const char* kind = k == 0 ? "one-token" : "longer";
    if (t.calls > 0) {
      const double n = static_cast<double>(t.calls) / 1e6;
      std::fprintf(
          stderr,
          "strata cuda device %d: %llu %s expert groups issued; host time per issue: plan %.1f us, slot "
          "%.1f us, staging %.1f us, launches %.1f us, output copy + event %.1f us\n",
          device_, static_cast<unsigned long long>(t.calls), kind, t.plan / n, t.slot / n, t.stage / n,
          t.launch / n, t.finish / n);
    }
    if (t.takes > 0) {
      const double n = static_cast<double>(t.takes) / 1e6;
      std::fprintf(
          stderr,
          "strata cuda device %d: %llu %s takes; host time per take: waiting %.1f us, outputs %.1f us; "
          "span on the stream per group (staging copy to done) %.1f us\n",
          device_, static_cast<unsigned long long>(t.takes), kind, t.take_wait / n, t.take_copy / n,
          t.device / n);
    }
  }
  (void)cudaSetDevice(device_);
  for (auto& s : slots_) {
    if (s->stream != nullptr) (void)cudaStreamSynchronize(s->stream);
    drop_graphs(*s);
    if (s->done != nullptr) (void)cudaEventDestroy(s->done);
    if (s->t0 != nullptr) (void)cudaEventDestroy(s->t0);
    if (s->t1 != nullptr) (void)cudaEventDestroy(s->t1);
    if (s->stream != nullptr) (void)cudaStreamDestroy(s->stream);
    if (s->dev != nullptr) (void)cudaFree(s->dev);
    if (s->in != nullptr) (void)cudaFreeHost(s->in);
    if (s->out != nullptr) (void)cudaFreeHost(s->out);
  }
  for (const strata_resident* r : residents_) {
    (void)cudaFree(r->alloc);
    delete r;
  }
  for (const strata_group* g : groups_) delete g;
  (void)cudaGetLastError();
}

Slot* CudaBackend::acquire_slot() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_slots_.empty()) {
      Slot* s = free_slots_.back();
      free_slots_.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<Slot>();
  cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  // BlockingSync: a waiter that outlasts wait_done's polling sleeps until the device's interrupt.
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming | cudaEventBlockingSync);
  if (e != cudaSuccess) {
    if (s->stream != nullptr) (void)cudaStreamDestroy(s->stream);
    throw_cuda(e, "stream creation", device_);
  }
  Slot* raw = s.get();
  std::lock_guard<std::mutex> lock(mu_);
  slots_.push_back(std::move(s));
  return raw;
}

void CudaBackend::release_slot(Slot* s) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  free_slots_.push_back(s);
}

void CudaBackend::sync_quietly(Slot& s) noexcept {
  (void)cudaStreamSynchronize(s.stream);
  (void)cudaGetLastError();
}

void CudaBackend::ensure_capacity(Slot& s, const Plan& p) {
  auto grow = [](uint64_t have, uint64_t need) { return std::max(need, have + have / 2); };
  if (s.dev_bytes < p.dev_bytes) {
    const uint64_t n = grow(s.dev_bytes, p.dev_bytes);
    if (s.dev != nullptr) {
      drop_graphs(s);
      (void)cudaFree(s.dev);
      workspace_bytes_ -= s.dev_bytes;
      s.dev = nullptr;
      s.dev_bytes = 0;
    }
    void* d = nullptr;
    cudaError_t e = cudaMalloc(&d, n);
    if (e != cudaSuccess && n > p.dev_bytes) {  // the growth margin may be what does not fit
      (void)cudaGetLastError();
      e = cudaMalloc(&d, p.dev_bytes);
      if (e == cudaSuccess) {
        s.dev = static_cast<char*>(d);
        s.dev_bytes = p.dev_bytes;
        workspace_bytes_ += s.dev_bytes;
      }
    } else if (e == cudaSuccess) {
      s.dev = static_cast<char*>(d);
      s.dev_bytes = n;
      workspace_bytes_ += s.dev_bytes;
    }
    if (e != cudaSuccess)
      throw_cuda(e, "cudaMalloc of " + std::to_string(p.dev_bytes) + " bytes of scratch", device_);
  }
  auto pinned = [&](char*& ptr, uint64_t& have, uint64_t need, const char* what) {
    if (have >= need) return;
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
    ptr = nullptr;
    const uint64_t n = grow(have, need);
    have = 0;
    void* h = nullptr;
    const cudaError_t e = cudaHostAlloc(&h, n, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw Failure(STRATA_ERR_OUT_OF_MEMORY,
                    "cuda device " + std::to_string(device_) + ": cudaHostAlloc of " + std::to_string(n) +
                        " bytes of pinned " + what + " staging failed: " + cuda_text(e));
    }
    ptr = static_cast<char*>(h);
    have = n;
  };
  const char* in_was = s.in;
  pinned(s.in, s.in_bytes, p.head_bytes, "input");
  // (No graph reads the pinned input buffer: the head's copy is its own call before the launch. The graphs
  // of the old buffer are dropped all the same, so none could keep a stale address.)
  if (s.in != in_was) drop_graphs(s);
  pinned(s.out, s.out_bytes, p.y_bytes, "output");
}

// ---- planning
// ----------------------------------------------------------------------------------------------

namespace {

// Checks a matrix of a call and finds its device copy (resident) or schedules a staged copy of the host data.
// The caller holds the backend's lock over `residents` while it resolves.
class MatrixResolver {
 public:
  MatrixResolver(std::vector<Upload>* uploads, const std::unordered_set<const strata_resident*>* residents)
      : uploads_(uploads), residents_(residents) {}

  MatRef resolve(const strata_matrix* m, const char* what_text) {
    auto what = [what_text] { return std::string(what_text); };  // made only for an error
    if (m == nullptr || m->rows <= 0 || m->cols <= 0) invalid(what() + ": empty or NULL matrix");
    if (!CudaBackend::supports(m->dtype)) {
      throw Failure(STRATA_ERR_UNSUPPORTED,
                    what() + ": weight format " + dtype_name(m->dtype) +
                        " is not supported by this backend (F32/BF16/F16/Q4_ROW/Q4_G64 are)");
    }
    if (m->rows > kMaxDim || m->cols > kMaxDim) {
      throw Failure(STRATA_ERR_UNSUPPORTED, what() + ": " + std::to_string(m->rows) + " x " +
                                                std::to_string(m->cols) +
                                                " is larger than this backend handles (2^30 per side)");
    }
    MatRef r;
    if (m->resident != nullptr && residents_->count(m->resident) != 0) {
      const strata_resident* res = m->resident;
      if (res->m.dtype != m->dtype || res->m.rows != m->rows || res->m.cols != m->cols) {
        invalid(what() + ": the resident copy is a " + dtype_name(res->m.dtype) + " " +
                std::to_string(res->m.rows) + " x " + std::to_string(res->m.cols) +
                " matrix, the matrix says " + dtype_name(m->dtype) + " " + std::to_string(m->rows) + " x " +
                std::to_string(m->cols));
      }
      r.dm = res->m;
      return r;
    }
    if (m->data == nullptr) {
      invalid(what() + (m->resident != nullptr ? ": resident on another backend and no host data"
                                               : ": empty or NULL matrix"));
    }
    if (is_q4(m->dtype) && m->scales == nullptr) invalid(what() + ": int4 matrix without scales");
    r.dm.rows = static_cast<int32_t>(m->rows);
    r.dm.cols = static_cast<int32_t>(m->cols);
    r.dm.kp = static_cast<int32_t>(padded_cols(m->cols));
    r.dm.dtype = m->dtype;
    r.dm.stride = device_row_bytes(m->dtype, m->cols);
    const auto key = std::make_tuple(m->data, m->scales, m->dtype, m->rows, m->cols);
    auto it = staged_.find(key);
    if (it == staged_.end()) {
      it = staged_.emplace(key, static_cast<int64_t>(uploads_->size())).first;
      uploads_->push_back(Upload{m, 0, 0});
    }
    r.upload = it->second;
    return r;
  }

 private:
  std::vector<Upload>* uploads_;
  const std::unordered_set<const strata_resident*>* residents_;
  std::map<std::tuple<const void*, const float*, int32_t, int64_t, int64_t>, int64_t> staged_;
};

// Places the staged host matrices at the end of the layout.
void place_uploads(Plan& p, Layout& lay) {
  for (Upload& u : p.uploads) {
    const strata_matrix& m = *u.src;
    u.data_off = lay.take(device_data_bytes(m.dtype, m.rows, m.cols));
    u.scale_off =
        is_q4(m.dtype) ? lay.take(static_cast<uint64_t>(scale_count(m.dtype, m.rows, m.cols)) * 4) : 0;
  }
}

// A tensor-core launch of the wide kernels: exact mode with kWideNt n-tiles (narrow ones have at most 4).
bool wide_launch(bool tc, int splits, int nt) {
  return tc && splits == kI8Splits && nt == kWideNt;
}

// Of a call (expert or matmul) with n rows in exact mode, how many run in 2 kWideNt-token chunks on the wide
// kernels: none below s.wide_min_rows; else all of them when more than a narrow chunk's 8 are left over (the
// last wide chunk partly filled), or else the whole chunks, the rest (at most 8) on the narrow kernels.
int wide_rows(const Settings& s, int n) {
  constexpr int kWideTok = 2 * kWideNt;
  if (s.wide_min_rows <= 0 || n < s.wide_min_rows) return 0;
  return n % kWideTok > chunk_capacity(kI8Splits) ? n : n / kWideTok * kWideTok;
}

// ksg: the tensor-core gate/up kernels' K slices (Settings::gate_up_slices).
int grid_for(bool tc, int splits, bool gate_up, int rows, int nt = 0, int ksg = 2) {
  const bool wide = wide_launch(tc, splits, nt);
  const int per_block = wide                    ? (gate_up ? wide_gate_up_rows(ksg) : kWideRowsLinear)
                        : tc                    ? (gate_up ? tc_gate_up_rows(ksg) : kTcRowsPerBlock * kTcLinearTiles)
                        : splits == kGemvSplits ? kGemvWarps * (gate_up ? kGemvRowsGateUp : kGemvRowsLinear)
                                                : kSimtWarps * (gate_up ? kSimtRowsGateUp : kSimtRowsLinear);
  return (rows + per_block - 1) / per_block;
}

// Marks the tensor-core launches whose items' matrices are all resident in kTiles (LaunchSpec::tiles).
void mark_tile_launches(Plan& p) {
  for (LaunchSpec& l : p.launches) {
    l.tiles = l.tc;
    for (uint64_t i = l.first_item; l.tiles && i < l.first_item + static_cast<uint64_t>(l.n_items); ++i) {
      const ItemSpec& it = p.items[static_cast<size_t>(i)];
      l.tiles =
          it.w0.upload < 0 && it.w1.upload < 0 && it.w0.dm.layout == kTiles && it.w1.dm.layout == kTiles;
    }
  }
}

// The kernel family of an int4 matrix in a call with n_rows rows (force_simt and W4A16 aside): gemv or the
// exact tensor-core kernels.
bool use_gemv(const Settings& s, int64_t n_rows) {
  return s.gemv_max_rows < 0 || n_rows <= s.gemv_max_rows;
}

}  // namespace

void CudaBackend::plan_group(Plan& p, PlanScratch& sc, const float* x, int64_t n_x_rows, int64_t hidden,
                             int32_t n_tasks, const strata_expert_task* tasks) {
  if (n_tasks < 0 || (n_tasks > 0 && tasks == nullptr)) invalid("expert_group: bad task list");
  if (n_x_rows < 0) invalid("expert_group: n_x_rows < 0");
  reset(p);
  MatrixResolver res(&p.uploads, &residents_);
  std::unique_lock<std::mutex> resolving(mu_);  // residents_, while the tasks' matrices are resolved

  // Validate every task (as the CPU backends do) and cut the routed rows into chunks.
  std::vector<Chunk>& chunks = sc.chunks;
  chunks.clear();
  chunks.reserve(static_cast<size_t>(n_tasks));  // (one chunk per task but for long tasks)
  std::vector<uint64_t>& task_rows_at = sc.task_rows_at;
  task_rows_at.assign(static_cast<size_t>(n_tasks), 0);
  int64_t all_rows = 0;
  for (int32_t t = 0; t < n_tasks; ++t) all_rows += std::max<int32_t>(tasks[t].n_rows, 0);
  // (a malformed count is refused below; the cap keeps it from allocating first)
  p.rows.reserve(static_cast<size_t>(std::min<int64_t>(all_rows, 1 << 20)));
  bool any_rows = false;
  for (int32_t t = 0; t < n_tasks; ++t) {
    const strata_expert_task& task = tasks[t];
    if (task.n_rows == 0) continue;
    auto tn = [t] { return "expert_group: task " + std::to_string(t); };  // made only for an error
    if (task.n_rows < 0 || task.expert == nullptr || task.rows == nullptr || task.out == nullptr ||
        x == nullptr) {
      invalid(tn() + " is malformed");
    }
    const strata_expert& e = *task.expert;
    const MatRef gate = res.resolve(&e.gate, "expert_group gate");
    const MatRef up = res.resolve(&e.up, "expert_group up");
    const MatRef down = res.resolve(&e.down, "expert_group down");
    if (e.gate.cols != hidden || e.up.cols != hidden || e.up.rows != e.gate.rows || e.down.rows != hidden ||
        e.down.cols != e.gate.rows) {
      invalid(tn() + " has inconsistent gate/up/down shapes for hidden " + std::to_string(hidden));
    }
    if (e.gate.dtype != e.up.dtype) {
      throw Failure(STRATA_ERR_UNSUPPORTED, tn() + ": gate (" + dtype_name(e.gate.dtype) + ") and up (" +
                                                dtype_name(e.up.dtype) + ") of different formats");
    }
    for (int32_t r = 0; r < task.n_rows; ++r) {
      if (task.rows[r] < 0 || task.rows[r] >= n_x_rows) {
        invalid(tn() + " row index " + std::to_string(task.rows[r]) + " outside [0, " +
                std::to_string(n_x_rows) + ")");
      }
    }
    any_rows = true;
    // Kernel per matrix: int4 on W4A16 tensor cores (experts with >= w4a16_min_rows rows), else on gemv or
    // the exact tensor cores (gemv_max_rows), or everything on SIMT (force_simt); float formats on SIMT.
    const bool w4a16 = settings_.w4a16_min_rows > 0 && task.n_rows >= settings_.w4a16_min_rows;
    const bool gemv = !w4a16 && use_gemv(settings_, task.n_rows);
    const bool gu_q4 = is_q4(e.gate.dtype) && !settings_.force_simt;
    const bool dn_q4 = is_q4(e.down.dtype) && !settings_.force_simt;
    const bool gu_tc = gu_q4 && !gemv, dn_tc = dn_q4 && !gemv;
    const int s_in = gu_q4 ? (gemv ? kGemvSplits : w4a16 ? 1 : kI8Splits) : 0;
    const int s_h = dn_q4 ? (gemv ? kGemvSplits : w4a16 ? 1 : kI8Splits) : 0;
    const int cap = std::min(chunk_capacity(s_in), chunk_capacity(s_h));
    task_rows_at[static_cast<size_t>(t)] = p.rows.size();
    p.rows.insert(p.rows.end(), task.rows, task.rows + task.n_rows);
    // Exact mode throughout: wide_rows' chunks on the wide kernels (the same bits as the narrow ones).
    const bool exact = gu_tc && dn_tc && s_in == kI8Splits && s_h == kI8Splits;
    const int n_wide = exact ? wide_rows(settings_, task.n_rows) : 0;
    constexpr int kWideTok = 2 * kWideNt;
    for (int start = 0; start < n_wide; start += kWideTok) {
      chunks.push_back(Chunk{t, start, std::min(kWideTok, n_wide - start), gate, up, down,
                             ClassKey{true, e.gate.dtype, kI8Splits, 0, true},
                             ClassKey{true, e.down.dtype, kI8Splits, 0, true}});
    }
    for (int start = n_wide; start < task.n_rows; start += cap) {
      const int n = std::min(cap, task.n_rows - start);
      chunks.push_back(Chunk{t, start, n, gate, up, down,
                             ClassKey{gu_tc, e.gate.dtype, s_in, s_in == kGemvSplits ? n : 0},
                             ClassKey{dn_tc, e.down.dtype, s_h, s_h == kGemvSplits ? n : 0}});
    }
  }
  resolving.unlock();
  if (!any_rows) return;  // nothing to compute; the group completes at once

  // Launch classes and their n-tile counts (gemv: the token count).
  ClassCounts &gu_nt = sc.gu_nt, &dn_nt = sc.dn_nt;
  gu_nt.v.clear();
  dn_nt.v.clear();
  for (const Chunk& c : chunks) {
    int& g = gu_nt[c.gu];
    g = c.gu.wide ? kWideNt : c.gu.tc ? std::max(g, nt_for(c.gu.splits, c.n)) : c.gu.gemv_tok;
    int& d = dn_nt[c.dn];
    d = c.dn.wide ? kWideNt : c.dn.tc ? std::max(d, nt_for(c.dn.splits, c.n)) : c.dn.gemv_tok;
  }
  for (auto* m : {&gu_nt, &dn_nt}) {
    for (auto& [k, nt] : *m) {
      if (k.tc && k.splits == 1 && nt == 3) nt = 4;
    }
  }
  for (Chunk& c : chunks) {
    c.gu_nt = gu_nt[c.gu];
    c.dn_nt = dn_nt[c.dn];
  }

  // Layout: head, then per chunk its gate_up input operand and h operand, then outputs (task order), then
  // staged host weights.
  Layout lay;
  p.x = x;
  p.x_bytes = static_cast<uint64_t>(n_x_rows) * static_cast<uint64_t>(hidden) * 4;
  // Items and jobs first: the kernels' arguments point at them, and at offsets that do not depend on the
  // token count a captured graph serves every call with the same launches (launch_signature).
  p.items_off = lay.take(2 * chunks.size() * sizeof(WorkItem));
  p.jobs_off = lay.take(2 * chunks.size() * sizeof(PrepJob));
  int64_t widest = 0;  // gate rows: the layer kernel counts gate/up tiles per 64-row group of h
  for (const Chunk& c : chunks) widest = std::max<int64_t>(widest, c.gate.dm.rows);
  p.sync_bytes = (1 + chunks.size() * static_cast<uint64_t>(1 + (widest + 63) / 64)) * sizeof(int32_t);
  p.sync_off = lay.take(p.sync_bytes);
  p.x_off = lay.take(p.x_bytes);
  p.rows_off = lay.take(p.rows.size() * sizeof(int32_t));
  p.head_bytes = lay.cursor;

  // Per chunk: its operands and h (Chunk::in_off ..). Chunks whose gate/up input operands are equal -- the
  // same launch class and width, the same rows of x in the same order, as every expert of a one-token decode
  // group has -- share one (Settings::share_operands; by default not at one tensor-core n-tile): encoded once
  // (the other chunks' preparation jobs only clear their h), and the experts' gate/up tiles read the same
  // lines, which the L1 and the L2 then hold for all of them. Same values, so the same bits.
  const int64_t hp = padded_cols(hidden);
  int64_t max_prep = 0;
  auto chunk_rows = [&](const Chunk& c) {
    return p.rows.data() + task_rows_at[static_cast<size_t>(c.task)] + c.start;
  };
  // Which chunks share: those with equal operands sorted together (by hash, then chunk), the k-th chunk with an
  // operand reads copy k % copies, the first `copies` of them encoding one each. (A sort in the slot's kept
  // vector: no allocation per plan.)
  auto copies_for = [&](const Chunk& c) {
    return settings_.share_operands >= 0 ? settings_.share_operands : c.gu.tc && c.gu_nt == 1 ? 0 : 1;
  };
  sc.operand_keys.clear();
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    Chunk& c = chunks[ci];
    c.share_from = -1;
    if (copies_for(c) == 0) continue;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the operand's class, width and rows
    auto mix = [&](uint64_t v) { hash = (hash ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(c.gu.tc) | static_cast<uint64_t>(c.gu.wide) << 1 |
        static_cast<uint64_t>(static_cast<uint32_t>(c.gu.splits)) << 2);
    mix(static_cast<uint64_t>(c.gu.dtype) << 32 | static_cast<uint32_t>(c.gu.gemv_tok));
    mix(static_cast<uint64_t>(c.gu_nt) << 32 | static_cast<uint32_t>(c.n));
    const int32_t* r = chunk_rows(c);
    for (int i = 0; i < c.n; ++i) mix(static_cast<uint32_t>(r[i]));
    sc.operand_keys.emplace_back(hash, static_cast<uint32_t>(ci));
  }
  std::sort(sc.operand_keys.begin(), sc.operand_keys.end());
  for (size_t a = 0; a < sc.operand_keys.size();) {
    size_t b = a + 1;
    while (b < sc.operand_keys.size() && sc.operand_keys[b].first == sc.operand_keys[a].first) ++b;
    // [a, b): one hash, chunks in order; those equal to the first (a collision is not) are the operand's k-th
    // chunks: the first `copies` hold a copy each, the others read copy k % copies.
    const uint32_t first = sc.operand_keys[a].second;
    const Chunk& o = chunks[first];
    const int copies = copies_for(o);
    std::array<uint32_t, kShareCopiesMax> holder{};
    holder[0] = first;
    int k = 1;
    for (size_t e = a + 1; e < b; ++e) {
      Chunk& c = chunks[sc.operand_keys[e].second];
      const int32_t* r = chunk_rows(c);
      if (!(o.gu == c.gu && o.gu_nt == c.gu_nt && o.n == c.n && std::equal(r, r + c.n, chunk_rows(o)))) continue;
      if (k < copies) {
        holder[static_cast<size_t>(k)] = sc.operand_keys[e].second;
      } else {
        c.share_from = static_cast<int>(holder[static_cast<size_t>(k % copies)]);
      }
      ++k;
    }
    a = b;
  }
  for (Chunk& c : chunks) {
    const int64_t fp = padded_cols(c.gate.dm.rows);
    const int64_t in_cols = c.gu.tc ? 8 * c.gu_nt : c.n;
    const int64_t in_ld = c.gu.tc ? hp : f32_operand_ld(c.gu.splits, hp);
    const uint64_t in_bytes =
        c.gu.tc ? tc_operand_bytes(c.gu.splits, c.gu_nt, hp) : static_cast<uint64_t>(in_cols * in_ld) * 4;
    const bool dn_i8 = c.dn.tc && c.dn.splits == kI8Splits;
    const int64_t h_ld = c.dn.tc && !dn_i8 ? fp : f32_operand_ld(c.dn.splits, fp);
    c.h_bytes = c.dn.tc && !dn_i8 ? tc_operand_bytes(c.dn.splits, c.dn_nt, fp)
                                  : static_cast<uint64_t>(c.n * h_ld) * 4;
    c.in_off = c.share_from >= 0 ? chunks[static_cast<size_t>(c.share_from)].in_off : lay.take(in_bytes);
    c.h_off = lay.take(c.h_bytes);
    if (dn_i8) {
      c.dn_op_off = lay.take(tc_operand_bytes(kI8Splits, c.dn_nt, fp));
      max_prep = std::max(max_prep, prep_threads(kI8Splits, 8 * c.dn_nt, fp));
    }
    max_prep =
        std::max({max_prep, prep_threads(c.gu.splits, in_cols, in_ld), static_cast<int64_t>(c.h_bytes / 16)});
  }
  p.y_off = lay.cursor;
  std::vector<uint64_t>& y_task = sc.y_task;
  y_task.assign(static_cast<size_t>(n_tasks), 0);
  std::vector<float*>& y_dev = sc.y_dev;  // direct writes
  y_dev.assign(static_cast<size_t>(n_tasks), nullptr);
  uint64_t y_cursor = 0;
  p.outs.reserve(static_cast<size_t>(n_tasks));
  {
    std::lock_guard<std::mutex> lock(mu_);  // registered_
    for (int32_t t = 0; t < n_tasks; ++t) {
      if (tasks[t].n_rows <= 0) continue;
      const uint64_t bytes = static_cast<uint64_t>(tasks[t].n_rows) * static_cast<uint64_t>(hidden) * 4;
      y_task[static_cast<size_t>(t)] = y_cursor;
      // In registered host memory: the down kernels write the rows there (direct_writes), or the device
      // copies them there after the group (finish).
      const auto at = reinterpret_cast<uintptr_t>(tasks[t].out);
      auto r = registered_.upper_bound(at);
      const bool direct = r != registered_.begin() && (--r, at + bytes <= r->first + r->second.bytes);
      if (direct && settings_.direct_writes) {
        y_dev[static_cast<size_t>(t)] = reinterpret_cast<float*>(r->second.dev + (at - r->first));
      }
      const bool written = y_dev[static_cast<size_t>(t)] != nullptr;
      p.outs.push_back(strata_group::OutCopy{tasks[t].out, y_cursor, bytes, direct, written});
      y_cursor += bytes;
    }
  }
  p.y_bytes = y_cursor;
  lay.take(p.y_bytes);
  place_uploads(p, lay);
  p.dev_bytes = lay.cursor;
  p.prep_blocks = static_cast<int>(std::clamp<int64_t>((max_prep + 255) / 256, 1, 2048));

  // Items: gate_up items class by class, then down items class by class; one prep job per chunk.
  p.items.reserve(2 * chunks.size());
  p.jobs.reserve(2 * chunks.size());
  p.launches.reserve(gu_nt.v.size() + dn_nt.v.size());
  auto emit = [&](bool gate_up) {
    const auto& nts = gate_up ? gu_nt : dn_nt;
    for (const auto& [key, nt] : nts) {
      LaunchSpec l{key.tc, key.dtype, gate_up, key.splits, nt, p.items.size(), 0, 0};
      int max_rows = 0;
      for (const Chunk& c : chunks) {
        if (!((gate_up ? c.gu : c.dn) == key)) continue;
        ItemSpec it;
        it.n_tok = c.n;
        if (gate_up) {
          it.w0 = c.gate;
          it.w1 = c.up;
          it.in_off = c.in_off;
          it.in_splits = c.gu.splits;
          it.h_off = c.h_off;
          // The down operand's form (W4A16 bf16, SIMT f32 or gemv f32), or f32 to encode from (exact mode).
          it.h_splits = c.dn.splits == kI8Splits ? 0 : c.dn.splits;
          it.h_kp = static_cast<int>(padded_cols(c.gate.dm.rows));
          max_rows = std::max(max_rows, c.gate.dm.rows);
        } else {
          it.w0 = c.down;
          it.w1 = c.down;
          it.in_off = c.dn_op_off != kNone ? c.dn_op_off : c.h_off;
          it.in_splits = c.dn.splits;
          it.y_off = p.y_off + y_task[static_cast<size_t>(c.task)] +
                     static_cast<uint64_t>(c.start) * static_cast<uint64_t>(hidden) * 4;
          if (float* d = y_dev[static_cast<size_t>(c.task)])
            it.y_ptr = d + static_cast<int64_t>(c.start) * hidden;
          it.y_ld = hidden;
          max_rows = std::max(max_rows, c.down.dm.rows);
        }
        p.items.push_back(it);
      }
      l.n_items = static_cast<int>(p.items.size() - l.first_item);
      l.grid_x = grid_for(key.tc, key.splits, gate_up, max_rows, nt, settings_.gate_up_slices);
      p.launches.push_back(l);
    }
  };
  emit(true);
  p.first_down_launch = p.launches.size();
  emit(false);
  for (const Chunk& c : chunks) {
    JobSpec j;
    j.rows_off =
        p.rows_off + (task_rows_at[static_cast<size_t>(c.task)] + static_cast<uint64_t>(c.start)) * 4;
    j.x_ld = hidden;
    j.row0 = 0;
    j.n_tok = c.n;
    j.cols = static_cast<int>(hidden);
    j.kp = static_cast<int>(c.gu.tc ? hp : f32_operand_ld(c.gu.splits, hp));
    j.splits = c.gu.splits;
    j.ncols = c.share_from >= 0 ? 0 : c.gu.tc ? 8 * c.gu_nt : c.n;  // (0: nothing to encode, h to clear)
    j.dst_off = c.in_off;
    j.zero_off = c.h_off;
    j.zero_bytes = static_cast<int64_t>(c.h_bytes);
    p.jobs.push_back(j);
  }
  p.n_jobs_first = p.jobs.size();
  for (const Chunk& c : chunks) {  // the exact-mode down operands, from gate_up's f32 h
    if (c.dn_op_off == kNone) continue;
    const int64_t fp = padded_cols(c.gate.dm.rows);
    JobSpec j;
    j.src_off = c.h_off;
    j.x_ld = fp;
    j.row0 = 0;
    j.n_tok = c.n;
    j.cols = c.gate.dm.rows;  // (h's padding columns encode as zeros without being read)
    j.kp = static_cast<int>(fp);
    j.splits = kI8Splits;
    j.ncols = 8 * c.dn_nt;
    j.dst_off = c.dn_op_off;
    p.jobs.push_back(j);
  }
  // One gate_up and one down launch, both exact tensor cores of one format with 1-2 n-tiles, over resident
  // matrices in tiles only (its addresses are compile-time strides; a group with staged host weights waits on
  // their copies far longer than the layer kernel saves): the layer kernel (its items: the gate_up items,
  // then the down items, both in chunk order; a down job per chunk).
  mark_tile_launches(p);
  if (settings_.layer_kernel && p.launches.size() == 2 && p.first_down_launch == 1) {
    const LaunchSpec &gu = p.launches[0], &dn = p.launches[1];
    p.layer = gu.tc && dn.tc && gu.splits == kI8Splits && dn.splits == kI8Splits && gu.dtype == dn.dtype &&
              gu.nt == dn.nt && gu.nt <= 2 && gu.n_items == dn.n_items &&
              p.jobs.size() - p.n_jobs_first == static_cast<size_t>(gu.n_items) && gu.tiles && dn.tiles;
  }
}

void CudaBackend::plan_matmul(Plan& p, const strata_matrix& w, const float* x, int64_t n_x_rows) {
  reset(p);
  MatrixResolver res(&p.uploads, &residents_);
  std::unique_lock<std::mutex> resolving(mu_);
  const MatRef m = res.resolve(&w, "matmul");
  resolving.unlock();
  if (n_x_rows < 0 || (n_x_rows > 0 && x == nullptr)) invalid("matmul: bad activations");
  if (n_x_rows == 0) {
    p.uploads.clear();
    return;
  }
  if (n_x_rows > kMaxDim) throw Failure(STRATA_ERR_UNSUPPORTED, "matmul: too many rows");
  const bool q4 = is_q4(w.dtype) && !settings_.force_simt;
  const bool gemv = q4 && use_gemv(settings_, n_x_rows);
  const bool tc = q4 && !gemv;
  const int splits = tc ? kI8Splits : gemv ? kGemvSplits : 0;
  const int n = static_cast<int>(n_x_rows);
  // The chunks (first row, rows, n-tiles: the operand's width). Exact mode, as in plan_group: wide_rows' chunks
  // on the wide kernels, the rest on the narrow ones.
  struct MChunk {
    int start, len, nt;
  };
  std::vector<MChunk> mc;
  const int n_wide = tc ? wide_rows(settings_, n) : 0;
  constexpr int kWideTok = 2 * kWideNt;
  for (int st = 0; st < n_wide; st += kWideTok) mc.push_back(MChunk{st, std::min(kWideTok, n_wide - st), kWideNt});
  const size_t n_wide_chunks = mc.size();
  const int cap = chunk_capacity(splits);
  int nt = 0;  // the narrow chunks' (one launch)
  for (int st = n_wide; st < n; st += cap) {
    const int len = std::min(cap, n - st);
    if (tc) nt = std::max(nt, nt_for(splits, len));
    mc.push_back(MChunk{st, len, 0});
  }
  for (size_t c = n_wide_chunks; c < mc.size(); ++c) mc[c].nt = nt;
  const int n_chunks = static_cast<int>(mc.size());
  const int64_t kp = padded_cols(w.cols);
  const int64_t ld = tc ? kp : f32_operand_ld(splits, kp);  // the operand's row length
  Layout lay;
  p.x = x;
  p.x_bytes = static_cast<uint64_t>(n_x_rows) * static_cast<uint64_t>(w.cols) * 4;
  p.items_off = lay.take(static_cast<uint64_t>(n_chunks) * sizeof(WorkItem));  // first, as in plan_group
  p.jobs_off = lay.take(static_cast<uint64_t>(n_chunks) * sizeof(PrepJob));
  p.x_off = lay.take(p.x_bytes);
  p.rows_off = lay.take(0);
  p.head_bytes = lay.cursor;
  std::vector<uint64_t> in_off(static_cast<size_t>(n_chunks));
  int64_t max_prep = 0;
  for (int c = 0; c < n_chunks; ++c) {
    const MChunk& k = mc[static_cast<size_t>(c)];
    const int64_t cols = tc ? 8 * k.nt : k.len;
    in_off[static_cast<size_t>(c)] =
        lay.take(tc ? tc_operand_bytes(splits, k.nt, ld) : static_cast<uint64_t>(cols * ld) * 4);
    max_prep = std::max(max_prep, prep_threads(splits, cols, ld));
  }
  p.y_bytes = static_cast<uint64_t>(n_x_rows) * static_cast<uint64_t>(w.rows) * 4;
  p.y_off = lay.take(p.y_bytes);
  place_uploads(p, lay);
  p.dev_bytes = lay.cursor;
  p.prep_blocks = static_cast<int>(std::clamp<int64_t>((max_prep + 255) / 256, 1, 2048));
  if (gemv) {
    // One gemv instance per token count: the full chunks, then the shorter last one.
    const int full = n / cap, rest = n % cap;
    const int grid = grid_for(false, splits, false, m.dm.rows);
    if (full > 0) p.launches.push_back(LaunchSpec{false, w.dtype, false, splits, cap, 0, full, grid});
    if (rest > 0)
      p.launches.push_back(
          LaunchSpec{false, w.dtype, false, splits, rest, static_cast<uint64_t>(full), 1, grid});
  } else {
    const int n_narrow = n_chunks - static_cast<int>(n_wide_chunks);
    if (n_wide_chunks > 0) {
      p.launches.push_back(LaunchSpec{tc, w.dtype, false, splits, kWideNt, 0, static_cast<int>(n_wide_chunks),
                                      grid_for(tc, splits, false, m.dm.rows, kWideNt)});
    }
    if (n_narrow > 0) {
      p.launches.push_back(LaunchSpec{tc, w.dtype, false, splits, nt, n_wide_chunks, n_narrow,
                                      grid_for(tc, splits, false, m.dm.rows, nt)});
    }
  }
  for (int c = 0; c < n_chunks; ++c) {
    const MChunk& k = mc[static_cast<size_t>(c)];
    ItemSpec it;
    it.w0 = m;
    it.w1 = m;
    it.n_tok = k.len;
    it.in_off = in_off[static_cast<size_t>(c)];
    it.in_splits = splits;
    it.y_off = p.y_off + static_cast<uint64_t>(k.start) * static_cast<uint64_t>(w.rows) * 4;
    it.y_ld = w.rows;
    p.items.push_back(it);
    JobSpec j;
    j.x_ld = w.cols;
    j.row0 = k.start;
    j.n_tok = k.len;
    j.cols = static_cast<int>(w.cols);
    j.kp = static_cast<int>(ld);
    j.splits = splits;
    j.ncols = tc ? 8 * k.nt : k.len;
    j.dst_off = in_off[static_cast<size_t>(c)];
    p.jobs.push_back(j);
  }
  p.n_jobs_first = p.jobs.size();
  p.first_down_launch = p.launches.size();
  mark_tile_launches(p);
}

// ---- execution
// ---------------------------------------------------------------------------------------------

void CudaBackend::copy_head(Slot& s, const Plan& p) {
  if (p.head_bytes > 0) {
    STRATA_CK(cudaMemcpyAsync(s.dev, s.in, p.head_bytes, cudaMemcpyHostToDevice, s.stream),
              "copy of the inputs");
  }
}

void CudaBackend::stage(Slot& s, const Plan& p) {
  char* base = s.dev;
  // The head, in pinned memory: x, the row table, the items and jobs with device pointers.
  if (p.x_bytes > 0) std::memcpy(s.in + p.x_off, p.x, p.x_bytes);
  if (!p.rows.empty()) std::memcpy(s.in + p.rows_off, p.rows.data(), p.rows.size() * sizeof(int32_t));
  WorkItem* items = reinterpret_cast<WorkItem*>(s.in + p.items_off);
  for (size_t i = 0; i < p.items.size(); ++i) {
    const ItemSpec& is = p.items[i];
    WorkItem w{};
    w.w0 = patch(is.w0, p.uploads, base);
    w.w1 = patch(is.w1, p.uploads, base);
    w.in = base + is.in_off;
    w.y = is.y_ptr != nullptr ? is.y_ptr
          : is.y_off != kNone ? reinterpret_cast<float*>(base + is.y_off)
                              : nullptr;
    w.y_ld = is.y_ld;
    w.h = is.h_off != kNone ? base + is.h_off : nullptr;
    w.h_splits = is.h_splits;
    w.h_kp = is.h_kp;
    w.n_tok = is.n_tok;
    w.in_splits = is.in_splits;
    std::memcpy(&items[i], &w, sizeof w);
  }
  PrepJob* jobs = reinterpret_cast<PrepJob*>(s.in + p.jobs_off);
  for (size_t i = 0; i < p.jobs.size(); ++i) {
    const JobSpec& js = p.jobs[i];
    PrepJob j{};
    j.x = reinterpret_cast<const float*>(base + (js.src_off != kNone ? js.src_off : p.x_off));
    j.x_ld = js.x_ld;
    j.rows = js.rows_off != kNone ? reinterpret_cast<const int32_t*>(base + js.rows_off) : nullptr;
    j.dst = base + js.dst_off;
    j.zero = js.zero_off != kNone ? base + js.zero_off : nullptr;
    j.zero_bytes = js.zero_bytes;
    j.row0 = js.row0;
    j.n_tok = js.n_tok;
    j.cols = js.cols;
    j.kp = js.kp;
    j.splits = js.splits;
    j.ncols = js.ncols;
    std::memcpy(&jobs[i], &j, sizeof j);
  }
  // The layer kernel's counters are in the head: its copy clears them (no memset node before the launch).
  if (p.layer) std::memset(s.in + p.sync_off, 0, p.sync_bytes);
  copy_head(s, p);
  // Host weights: padded rows (the padding zeroed), then the scales. From pageable memory these copies return
  // once the data is staged by the driver, so the caller's weights need not outlive the call.
  for (const Upload& u : p.uploads) {
    const strata_matrix& m = *u.src;
    const int64_t raw = host_row_bytes(m.dtype, m.cols), padded = device_row_bytes(m.dtype, m.cols);
    if (raw == padded) {
      STRATA_CK(cudaMemcpyAsync(base + u.data_off, m.data, static_cast<size_t>(raw * m.rows),
                                cudaMemcpyHostToDevice, s.stream),
                "copy of host weights");
    } else {
      STRATA_CK(cudaMemsetAsync(base + u.data_off, 0, static_cast<size_t>(padded * m.rows), s.stream),
                "clearing staged weights");
      STRATA_CK(cudaMemcpy2DAsync(base + u.data_off, static_cast<size_t>(padded), m.data,
                                  static_cast<size_t>(raw), static_cast<size_t>(raw),
                                  static_cast<size_t>(m.rows), cudaMemcpyHostToDevice, s.stream),
                "copy of host weights");
    }
    if (is_q4(m.dtype)) {
      STRATA_CK(cudaMemcpyAsync(base + u.scale_off, m.scales,
                                static_cast<size_t>(scale_count(m.dtype, m.rows, m.cols)) * 4,
                                cudaMemcpyHostToDevice, s.stream),
                "copy of host scales");
    }
  }
}

// What a plan's launches depend on besides the contents of the slot's buffers: with the same signature on the
// same slot (same `dev`), the same kernels run with the same arguments. Written into k (the slot's, so that
// its memory is reused).
void CudaBackend::launch_signature(std::string& k, const Plan& p) const {
  k.clear();
  auto put = [&](uint64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(settings_.pdl);
  put(p.items_off);
  put(p.jobs_off);
  put(static_cast<uint64_t>(p.prep_blocks));
  put(p.n_jobs_first);
  put(p.first_down_launch);
  put(p.layer);
  put(static_cast<uint64_t>(p.layer ? layer_persistent_for(p.launches[0].nt, layer_tiles(p)) : 0));  // (grid, mode)
  put(static_cast<uint64_t>(p.layer ? settings_.layer_mt_gu * 4 + settings_.layer_mt_dn : 0));  // (instance, tiles)
  put(static_cast<uint64_t>(settings_.gate_up_slices));  // (the gate/up instances)
  put(p.layer && layer_lean_for(p.launches[0].nt));  // (its instances: lean or B one unit ahead)
  put(static_cast<uint64_t>(p.layer ? settings_.layer_sms : 0));  // (the persistent grid)
  put(p.sync_off);
  put(p.sync_bytes);
  for (const JobSpec& j : p.jobs) put(static_cast<uint64_t>(static_cast<int64_t>(j.splits)));
  put(p.jobs.size());
  for (const LaunchSpec& l : p.launches) {
    put(l.tc);
    put(static_cast<uint64_t>(l.dtype));
    put(l.gate_up);
    put(static_cast<uint64_t>(static_cast<int64_t>(l.splits)));
    put(static_cast<uint64_t>(l.nt));
    put(l.first_item);
    put(static_cast<uint64_t>(l.n_items));
    put(static_cast<uint64_t>(l.grid_x));
    put(l.tiles);  // (its instances)
  }
}

void CudaBackend::launch(Slot& s, const Plan& p) {
  if (p.items.empty()) return;
  if (settings_.graphs && !graphs_failed_.load() && launch_graph(s, p)) return;
  launch_direct(s, p);
}

// Replays the plan's launches from the slot's graph cache, capturing them first if their signature is new.
// false: graphs are not available here (a capture the driver refused; then never again). The emulation
// captures and replays too (emu.cpp), so the cache and its signatures are checked without a GPU.
bool CudaBackend::launch_graph(Slot& s, const Plan& p) {
  std::string& key = s.key;
  launch_signature(key, p);
  auto it = s.graphs.find(key);
  if (it == s.graphs.end()) {
    if (s.graphs.size() >= kMaxGraphs) {
      auto lru = s.graphs.begin();
      for (auto g = s.graphs.begin(); g != s.graphs.end(); ++g) {
        if (g->second.last_use < lru->second.last_use) lru = g;
      }
      (void)cudaGraphExecDestroy(lru->second.exec);
      s.graphs.erase(lru);
    }
    if (cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      graphs_failed_ = true;
      return false;
    }
    cudaGraph_t g = nullptr;
    try {
      launch_direct(s, p);
    } catch (...) {
      // A launch the capture refused: no graphs from now on; the caller launches directly (and reports a
      // launch that fails there too).
      (void)cudaStreamEndCapture(s.stream, &g);
      if (g != nullptr) (void)cudaGraphDestroy(g);
      (void)cudaGetLastError();
      graphs_failed_ = true;
      return false;
    }
    cudaError_t e = cudaStreamEndCapture(s.stream, &g);
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
    if (g != nullptr) (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      graphs_failed_ = true;
      return false;
    }
    it = s.graphs.emplace(key, Slot::Graph{exec, 0}).first;
  }
  it->second.last_use = ++s.graph_uses;
  STRATA_CK(cudaGraphLaunch(it->second.exec, s.stream), "cudaGraphLaunch");
  return true;
}

void CudaBackend::launch_direct(Slot& s, const Plan& p) {
  constexpr int kMaxGridY = 65535;
  const Queue on{s.stream, settings_.pdl};
  const int ksg = settings_.gate_up_slices;  // (the tensor-core gate/up instances')
  // (time_expert_group's timeline: the first preparation launch notes its start and end after the records)
  uint64_t* const prep_stamps =
      timeline_dev_ != nullptr ? timeline_dev_ + static_cast<int64_t>(timeline_n_) * kTimelineWords : nullptr;
  auto prep = [&](size_t from, size_t to) {
    bool i8 = false;
    for (size_t i = from; i < to; ++i) i8 = i8 || p.jobs[i].splits == kI8Splits;
    for (size_t first = from; first < to; first += kMaxGridY) {
      const int n = static_cast<int>(std::min<size_t>(kMaxGridY, to - first));
      STRATA_CK(
          launch_prep(reinterpret_cast<const PrepJob*>(s.dev + p.jobs_off) + first, n, p.prep_blocks, i8,
                      from == 0 && first == 0 ? prep_stamps : nullptr, on),
          "launch of prep_operands");
    }
  };
  prep(0, p.n_jobs_first);
  if (p.layer) {
    const LaunchSpec &gu = p.launches[0], &dn = p.launches[1];
    LayerWork lw{};
    lw.items = reinterpret_cast<const WorkItem*>(s.dev + p.items_off);
    lw.dn_jobs = reinterpret_cast<const PrepJob*>(s.dev + p.jobs_off) + p.n_jobs_first;
    lw.sync = reinterpret_cast<int32_t*>(s.dev + p.sync_off);
    lw.n_items = gu.n_items;
    const int mg = settings_.layer_mt_gu, md = settings_.layer_mt_dn;
    lw.gu_tiles = (gu.grid_x + mg - 1) / mg;
    lw.dn_tiles = (dn.grid_x + md - 1) / md;
    lw.persistent = layer_persistent_for(gu.nt, layer_tiles(p));  // (the work: in tiles of 16 rows per warp)
    lw.max_sms = settings_.layer_sms;
    lw.timeline = timeline_dev_;
    lw.timeline_n = timeline_n_;
    const bool lean = layer_lean_for(gu.nt);
    const cudaError_t e = gu.dtype == kQ4G64 ? launch_layer_q4g64_tc(gu.nt, lean, mg, md, ksg, lw, on)
                                             : launch_layer_q4row_tc(gu.nt, lean, mg, md, ksg, lw, on);
    STRATA_CK(e, "launch of the layer kernel (n-tiles " + std::to_string(gu.nt) + ", " +
                     std::to_string(gu.n_items) + " experts)");
    return;
  }
  for (size_t li = 0; li < p.launches.size(); ++li) {
    if (li == p.first_down_launch) prep(p.n_jobs_first, p.jobs.size());
    const LaunchSpec& l = p.launches[li];
    for (int first = 0; first < l.n_items; first += kMaxGridY) {
      const int n = std::min(kMaxGridY, l.n_items - first);
      const WorkItem* items = reinterpret_cast<const WorkItem*>(s.dev + p.items_off) + l.first_item +
                              static_cast<uint64_t>(first);
      cudaError_t e;
      std::string name;
      if (wide_launch(l.tc, l.splits, l.nt)) {
        const bool g64 = l.dtype == kQ4G64;
        name = std::string(l.gate_up ? "gate_up" : "linear") + (g64 ? "_q4g64_wide" : "_q4row_wide");
            e = g64 ? launch_wide_q4g64_tc(l.gate_up, l.tiles, ksg, items, n, l.grid_x, on)
                : launch_wide_q4row_tc(l.gate_up, l.tiles, ksg, items, n, l.grid_x, on);
      } else if (l.tc) {
        const bool g64 = l.dtype == kQ4G64;
        name = std::string(l.gate_up ? "gate_up" : "linear") + (g64 ? "_q4g64_tc" : "_q4row_tc");
        if (l.gate_up) {
                e = g64 ? launch_gate_up_q4g64_tc(l.splits, l.nt, l.tiles, ksg, items, n, l.grid_x, on)
                  : launch_gate_up_q4row_tc(l.splits, l.nt, l.tiles, ksg, items, n, l.grid_x, on);
        } else {
          e = g64 ? launch_linear_q4g64_tc(l.splits, l.nt, l.tiles, items, n, l.grid_x, on)
                  : launch_linear_q4row_tc(l.splits, l.nt, l.tiles, items, n, l.grid_x, on);
        }
      } else if (l.splits == kGemvSplits) {
        const bool g64 = l.dtype == kQ4G64;
        name = std::string(l.gate_up ? "gate_up" : "linear") + (g64 ? "_q4g64_gemv" : "_q4row_gemv");
        if (l.gate_up) {
          e = g64 ? launch_gate_up_q4g64_gemv(l.nt, items, n, l.grid_x, on)
                  : launch_gate_up_q4row_gemv(l.nt, items, n, l.grid_x, on);
        } else {
          e = g64 ? launch_linear_q4g64_gemv(l.nt, items, n, l.grid_x, on)
                  : launch_linear_q4row_gemv(l.nt, items, n, l.grid_x, on);
        }
      } else {
        name = std::string(l.gate_up ? "gate_up_simt_" : "linear_simt_") + dtype_name(l.dtype);
        e = l.gate_up ? launch_gate_up_simt(l.dtype, items, n, l.grid_x, on)
                      : launch_linear_simt(l.dtype, items, n, l.grid_x, on);
      }
      STRATA_CK(e, "launch of " + name + " (splits " + std::to_string(l.splits) + ", n-tiles " +
                       std::to_string(l.nt) + ", " + std::to_string(n) + " items)");
    }
  }
}

void CudaBackend::finish(Slot& s, const Plan& p) {
  // Outputs in registered host memory straight there (one copy per run of outputs adjacent on both sides);
  // the rest (matmul: everything) through the slot's pinned buffer, copied out at take.
  // Outputs the down kernels wrote there themselves need nothing.
  bool staged = p.outs.empty();
  for (size_t i = 0; i < p.outs.size();) {
    const auto& o = p.outs[i];
    if (!o.direct || o.written) {
      staged = staged || !o.direct;
      ++i;
      continue;
    }
    uint64_t bytes = o.bytes;
    size_t j = i + 1;
    for (; j < p.outs.size() && p.outs[j].direct && !p.outs[j].written &&
           p.outs[j].offset == o.offset + bytes &&
           reinterpret_cast<const char*>(p.outs[j].dst) == reinterpret_cast<const char*>(o.dst) + bytes;
         ++j) {
      bytes += p.outs[j].bytes;
    }
    STRATA_CK(cudaMemcpyAsync(o.dst, s.dev + p.y_off + o.offset, bytes, cudaMemcpyDeviceToHost, s.stream),
              "copy of the outputs into registered memory");
    i = j;
  }
  if (staged && p.y_bytes > 0) {
    STRATA_CK(cudaMemcpyAsync(s.out, s.dev + p.y_off, p.y_bytes, cudaMemcpyDeviceToHost, s.stream),
              "copy of the outputs");
  }
  STRATA_CK(cudaEventRecord(s.done, s.stream), "cudaEventRecord");
}

strata_group* CudaBackend::issue(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                                 const strata_expert_task* tasks) {
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  if (hidden <= 0 || hidden > kMaxDim) invalid("expert_group: hidden must be in [1, 2^30]");
  using TraceClock = std::chrono::steady_clock;
  TraceClock::time_point t0;
  IssueTrace tr;  // this call's laps, added to trace_ under mu_ at the end (several threads may issue)
  const bool trace = trace_on_;
  auto lap = [&](double& into) {
    if (!trace) return;
    const auto now = TraceClock::now();
    into += std::chrono::duration<double>(now - t0).count();
    t0 = now;
  };
  if (trace) t0 = TraceClock::now();
  Slot* s = acquire_slot();
  lap(tr.slot);
  Plan& p = s->plan;  // (until the take: its outputs)
  std::unique_ptr<strata_group> g;
  try {
    plan_group(p, s->scratch, x, n_x_rows, hidden, n_tasks, tasks);
    g = std::make_unique<strata_group>();
    g->magic = kGroupMagic;
    g->owner = this;
    g->slot = s;
    g->trace_kind = n_x_rows > 1 ? 1 : 0;
    lap(tr.plan);
    ensure_capacity(*s, p);
    // Trace: the group's span on its stream, from the staging copy (the host's staging and launches included
    // when the stream was idle) to its done event.
    if (trace) {
      if (s->t0 == nullptr) STRATA_CK(cudaEventCreate(&s->t0), "cudaEventCreate");
      if (s->t1 == nullptr) STRATA_CK(cudaEventCreate(&s->t1), "cudaEventCreate");
      STRATA_CK(cudaEventRecord(s->t0, s->stream), "cudaEventRecord");
    }
    lap(tr.slot);
    stage(*s, p);
    lap(tr.stage);
    const int injected = fail_next_.exchange(0);
    if (injected == STRATA_ERR_OUT_OF_MEMORY) {
      throw Failure(STRATA_ERR_OUT_OF_MEMORY,
                    "cuda device " + std::to_string(device_) +
                        ": out of device memory (injected by STRATA_CUDA_FAIL_NEXT=oom)");
    }
    if (injected != 0) {
      throw Failure(STRATA_ERR_DEVICE, "cuda device " + std::to_string(device_) +
                                           ": device error (injected by STRATA_CUDA_FAIL_NEXT=device)");
    }
    launch(*s, p);
    lap(tr.launch);
    finish(*s, p);
    if (trace) STRATA_CK(cudaEventRecord(s->t1, s->stream), "cudaEventRecord");
    lap(tr.finish);
  } catch (...) {
    sync_quietly(*s);
    release_slot(s);
    throw;
  }
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (trace) {
      IssueTrace& t = trace_[g->trace_kind];
      ++t.calls;
      t.plan += tr.plan;
      t.slot += tr.slot;
      t.stage += tr.stage;
      t.launch += tr.launch;
      t.finish += tr.finish;
    }
    groups_.insert(g.get());
  } catch (...) {  // (bad_alloc: the group is not handed out, so its slot must come back here)
    sync_quietly(*s);
    release_slot(s);
    throw;
  }
  return g.release();
}

void CudaBackend::take(strata_group* group) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (group == nullptr || groups_.erase(group) == 0) {
      invalid("expert_group_take: not an expert group in flight on this backend (already taken, or NULL)");
    }
  }
  std::unique_ptr<strata_group> g(group);
  Slot* s = g->slot;
  const cudaError_t sd = cudaSetDevice(device_);
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t e = sd;
  if (e == cudaSuccess) e = wait_done(s->done, settings_.spin_us);
  const auto t1 = std::chrono::steady_clock::now();
  if (e != cudaSuccess) {
    sync_quietly(*s);
    release_slot(s);
    throw_cuda(e, "expert group", device_);
  }
  float device_ms = 0;
  if (trace_on_ && s->t1 != nullptr) {
    (void)cudaEventSynchronize(s->t1);
    if (cudaEventElapsedTime(&device_ms, s->t0, s->t1) != cudaSuccess) device_ms = 0;
    (void)cudaGetLastError();
  }
  for (const auto& o : s->plan.outs) {
    if (!o.direct) std::memcpy(o.dst, s->out + o.offset, o.bytes);
  }
  release_slot(s);
  if (trace_on_) {
    const auto t2 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    IssueTrace& t = trace_[g->trace_kind];
    ++t.takes;
    t.device += device_ms * 1e-3;
    t.take_wait += std::chrono::duration<double>(t1 - t0).count();
    t.take_copy += std::chrono::duration<double>(t2 - t1).count();
  }
}

void CudaBackend::discard(strata_group* group) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (group == nullptr || groups_.erase(group) == 0) return;
  }
  std::unique_ptr<strata_group> g(group);
  (void)cudaSetDevice(device_);
  sync_quietly(*g->slot);
  release_slot(g->slot);
}

void CudaBackend::expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                               const strata_expert_task* tasks) {
  take(issue(x, n_x_rows, hidden, n_tasks, tasks));
}

void CudaBackend::matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y) {
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  if (n_x_rows > 0 && y == nullptr) invalid("matmul: bad activations");
  if (n_x_rows == 0) {  // checked as any call, no slot taken
    Plan empty;
    plan_matmul(empty, w, x, n_x_rows);
    return;
  }
  Slot* s = acquire_slot();
  const Plan& p = s->plan;
  try {
    plan_matmul(s->plan, w, x, n_x_rows);
    ensure_capacity(*s, p);
    stage(*s, p);
    launch(*s, p);
    finish(*s, p);
    STRATA_CK(wait_done(s->done, settings_.spin_us), "matmul");
  } catch (...) {
    sync_quietly(*s);
    release_slot(s);
    throw;
  }
  std::memcpy(y, s->out, p.y_bytes);
  release_slot(s);
}

std::vector<float> CudaBackend::time_expert_group(const float* x, int64_t n_x_rows, int64_t hidden,
                                                  int32_t n_tasks, const strata_expert_task* tasks, int iters,
                                                  int hold_us, std::vector<uint64_t>* timeline) {
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  Slot* s = acquire_slot();
  const Plan& p = s->plan;
  std::vector<float> ms;
  // The timeline's buffer (freed, and the kernel's pointer cleared, however this ends).
  struct TimelineBuffer {
    CudaBackend& b;
    ~TimelineBuffer() {
      if (b.timeline_dev_ != nullptr) (void)cudaFree(b.timeline_dev_);
      b.timeline_dev_ = nullptr;
      b.timeline_n_ = 0;
    }
  } timeline_buffer{*this};
  try {
    plan_group(s->plan, s->scratch, x, n_x_rows, hidden, n_tasks, tasks);
    if (s->t0 == nullptr) STRATA_CK(cudaEventCreate(&s->t0), "cudaEventCreate");
    if (s->t1 == nullptr) STRATA_CK(cudaEventCreate(&s->t1), "cudaEventCreate");
    ensure_capacity(*s, p);
    if (timeline != nullptr) timeline->clear();
    if (timeline != nullptr && p.layer) {
      const int64_t n = layer_tiles(p, settings_.layer_mt_gu, settings_.layer_mt_dn);
      const size_t words = static_cast<size_t>(n) * kTimelineWords + kPrepStampWords;
      const size_t bytes = words * sizeof(uint64_t);
      STRATA_CK(cudaMalloc(&timeline_dev_, bytes), "cudaMalloc of the layer timeline");
      STRATA_CK(cudaMemset(timeline_dev_, 0, bytes), "clearing the layer timeline");
      timeline_n_ = static_cast<int32_t>(n);
      timeline->resize(words);
    }
    stage(*s, p);
    for (int i = 0; i < iters; ++i) {
      // A relaunch without staging: the layer kernel's counters cleared again, before the timed span (and
      // the preparation's stamps).
      if (p.layer && i > 0) {
        STRATA_CK(cudaMemsetAsync(s->dev + p.sync_off, 0, p.sync_bytes, s->stream),
                  "clearing the layer counters");
        if (timeline_dev_ != nullptr) {
          STRATA_CK(cudaMemsetAsync(timeline_dev_ + static_cast<int64_t>(timeline_n_) * kTimelineWords, 0,
                                    kPrepStampWords * sizeof(uint64_t), s->stream),
                    "clearing the preparation's stamps");
        }
      }
      STRATA_CK(launch_hold(hold_us, s->stream), "launch of the hold kernel");
      STRATA_CK(cudaEventRecord(s->t0, s->stream), "cudaEventRecord");
      if (timeline_dev_ != nullptr)
        launch_direct(*s, p);  // (a captured graph would keep the kernel's arguments of its capture)
      else
        launch(*s, p);
      STRATA_CK(cudaEventRecord(s->t1, s->stream), "cudaEventRecord");
      STRATA_CK(cudaEventSynchronize(s->t1), "expert group");
      float t = 0;
      STRATA_CK(cudaEventElapsedTime(&t, s->t0, s->t1), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    finish(*s, p);
    STRATA_CK(cudaEventSynchronize(s->done), "expert group");
    if (timeline_dev_ != nullptr) {
      STRATA_CK(cudaMemcpy(timeline->data(), timeline_dev_, timeline->size() * sizeof(uint64_t),
                           cudaMemcpyDeviceToHost),
                "copy of the layer timeline");
    }
  } catch (...) {
    sync_quietly(*s);
    release_slot(s);
    throw;
  }
  for (const auto& o : p.outs) {
    if (!o.direct) std::memcpy(o.dst, s->out + o.offset, o.bytes);  // (direct: the device wrote them there)
  }
  release_slot(s);
  return ms;
}

// ---- device memory
// -----------------------------------------------------------------------------------------

strata_resident* CudaBackend::upload(const strata_matrix& w) {
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  if (w.rows <= 0 || w.cols <= 0 || w.data == nullptr) invalid("upload_matrix: empty or NULL matrix");
  if (!supports(w.dtype)) {
    throw Failure(STRATA_ERR_UNSUPPORTED,
                  std::string("upload_matrix: weight format ") + dtype_name(w.dtype) +
                      " is not supported by this backend (F32/BF16/F16/Q4_ROW/Q4_G64 are)");
  }
  if (w.rows > kMaxDim || w.cols > kMaxDim) {
    throw Failure(STRATA_ERR_UNSUPPORTED, "upload_matrix: larger than this backend handles (2^30 per side)");
  }
  if (is_q4(w.dtype) && w.scales == nullptr) invalid("upload_matrix: int4 matrix without scales");
  const bool tiles = is_q4(w.dtype) && settings_.tiles;
  const bool scale_tiles = tiles && w.dtype == kQ4G64;
  const uint64_t data_bytes =
      tiles ? tiles_data_bytes(w.rows, w.cols) : device_data_bytes(w.dtype, w.rows, w.cols);
  const int64_t n_scales =
      scale_tiles ? tile_scale_count(w.rows, w.cols) : scale_count(w.dtype, w.rows, w.cols);
  const uint64_t bytes =
      is_q4(w.dtype) ? align_up(data_bytes) + static_cast<uint64_t>(n_scales) * 4 : data_bytes;
  void* d = nullptr;
  const cudaError_t e = cudaMalloc(&d, bytes);
  if (e != cudaSuccess)
    throw_cuda(e, "cudaMalloc of " + std::to_string(bytes) + " bytes for a resident matrix", device_);
  char* base = static_cast<char*>(d);
  const int64_t raw = host_row_bytes(w.dtype, w.cols), padded = device_row_bytes(w.dtype, w.cols);
  try {
    // On the legacy stream, then waited for: the copy is complete (not only staged) when upload returns.
    if (tiles) {
      const std::vector<uint8_t> t =
          to_tiles(static_cast<const uint8_t*>(w.data), w.rows, raw, tiles_row_bytes(w.cols));
      STRATA_CK(cudaMemcpy(base, t.data(), t.size(), cudaMemcpyHostToDevice), "copy of a resident matrix");
    } else if (raw == padded) {
      STRATA_CK(cudaMemcpyAsync(base, w.data, data_bytes, cudaMemcpyHostToDevice, cudaStreamLegacy),
                "copy of a resident matrix");
    } else {
      STRATA_CK(cudaMemsetAsync(base, 0, data_bytes, cudaStreamLegacy), "clearing a resident matrix");
      STRATA_CK(cudaMemcpy2DAsync(base, static_cast<size_t>(padded), w.data, static_cast<size_t>(raw),
                                  static_cast<size_t>(raw), static_cast<size_t>(w.rows),
                                  cudaMemcpyHostToDevice, cudaStreamLegacy),
                "copy of a resident matrix");
    }
    if (scale_tiles) {
      const std::vector<float> t = to_tile_scales(w.scales, w.rows, w.cols);
      STRATA_CK(cudaMemcpy(base + align_up(data_bytes), t.data(), t.size() * 4, cudaMemcpyHostToDevice),
                "copy of resident scales");
    } else if (is_q4(w.dtype)) {
      STRATA_CK(cudaMemcpyAsync(base + align_up(data_bytes), w.scales, static_cast<size_t>(n_scales) * 4,
                                cudaMemcpyHostToDevice, cudaStreamLegacy),
                "copy of resident scales");
    }
    STRATA_CK(cudaStreamSynchronize(cudaStreamLegacy), "upload_matrix");
  } catch (...) {
    (void)cudaFree(d);
    throw;
  }
  auto r = std::make_unique<strata_resident>();
  r->magic = kResidentMagic;
  r->owner = this;
  r->alloc = d;
  r->bytes = bytes;
  r->m.data = base;
  r->m.scales = is_q4(w.dtype) ? reinterpret_cast<const float*>(base + align_up(data_bytes)) : nullptr;
  r->m.stride = tiles ? tiles_row_bytes(w.cols) : padded;
  r->m.layout = tiles ? kTiles : kRowMajor;
  r->m.rows = static_cast<int32_t>(w.rows);
  r->m.cols = static_cast<int32_t>(w.cols);
  r->m.kp = static_cast<int32_t>(padded_cols(w.cols));
  r->m.dtype = w.dtype;
  std::lock_guard<std::mutex> lock(mu_);
  residents_.insert(r.get());
  resident_bytes_ += bytes;
  return r.release();
}

void CudaBackend::free(strata_resident* r) {
  if (r == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (residents_.erase(r) == 0) invalid("free_matrix: not a resident matrix of this backend");
    resident_bytes_ -= r->bytes;
  }
  std::unique_ptr<strata_resident> own(r);
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  STRATA_CK(cudaFree(r->alloc), "cudaFree of a resident matrix");
}

void CudaBackend::host_register(void* p, uint64_t bytes) {
  if (!settings_.host_register) {
    throw Failure(STRATA_ERR_UNSUPPORTED, "host_register: off (STRATA_CUDA_REGISTER=0)");
  }
  std::lock_guard<std::mutex> reg(register_mu_);  // the check, the registration and the map change as one
  const auto at = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = registered_.lower_bound(at);
    const bool overlaps =
        (next != registered_.end() && next->first < at + bytes) ||
        (next != registered_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > at);
    if (overlaps) invalid("host_register: the range overlaps one already registered");
  }
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  STRATA_CK(cudaHostRegister(p, bytes, cudaHostRegisterMapped), "cudaHostRegister");
  void* dev = nullptr;
  if (const cudaError_t e = cudaHostGetDevicePointer(&dev, p, 0); e != cudaSuccess) {
    (void)cudaHostUnregister(p);
    throw_cuda(e, "cudaHostGetDevicePointer of registered memory", device_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  registered_[at] = Registered{bytes, static_cast<char*>(dev)};
}

void CudaBackend::host_unregister(void* p) {
  std::lock_guard<std::mutex> reg(register_mu_);
  const auto at = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (registered_.count(at) == 0) invalid("host_unregister: not the start of a registered range");
  }
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  STRATA_CK(cudaHostUnregister(p), "cudaHostUnregister");
  std::lock_guard<std::mutex> lock(mu_);  // only once unpinned: a failure leaves it registered (and said)
  registered_.erase(at);
}

strata_memory_info CudaBackend::memory_info() {
  STRATA_CK(cudaSetDevice(device_), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  STRATA_CK(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  strata_memory_info m{};
  m.total_bytes = total_b;
  m.free_bytes = free_b;
  std::lock_guard<std::mutex> lock(mu_);
  m.resident_bytes = resident_bytes_;
  m.used_bytes = resident_bytes_ + workspace_bytes_.load();
  return m;
}

}  // namespace strata_cuda
