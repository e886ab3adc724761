// The CUDA backend behind the C vtable (plugin.cpp) and bench_cuda: device memory, staging slots, the plan of
// a call (work items, launches), issue/take. Failures throw strata_cuda::Failure (status + text); plugin.cpp
// turns them into the ABI's status and last_error.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/work.hpp"
#include "strata/plugin_abi.h"

namespace strata_cuda {

class Failure : public std::runtime_error {
 public:
  Failure(strata_status s, const std::string& what) : std::runtime_error(what), status(s) {}
  strata_status status;
};

// Why this process cannot use CUDA ("" when at least one device of compute capability >= 9.0 is there).
std::string cuda_unavailable_reason();

struct Slot;
struct Plan;
struct PlanScratch;
class CudaBackend;

}  // namespace strata_cuda

// The opaque ABI handles.
struct strata_resident {
  uint64_t magic;
  strata_cuda::CudaBackend* owner;
  strata_cuda::DevMatrix m;
  void* alloc;
  uint64_t bytes;
};

struct strata_group {
  uint64_t magic;
  strata_cuda::CudaBackend* owner;
  strata_cuda::Slot* slot;
  struct OutCopy {  // (the slot's plan has the group's list: Plan::outs)
    float* dst;
    uint64_t offset;  // in the slot's pinned output buffer (the same offset as in the device's y region)
    uint64_t bytes;
    bool direct;   // dst is in registered host memory: the device puts the rows there itself (host_register)
    bool written;  // direct, and written there by the down kernels (else copied there after the group)
  };
  int trace_kind = 0;  // STRATA_CUDA_TRACE's bucket: 0 one token, 1 more
};

namespace strata_cuda {

// The layer kernel's default 16-row tiles per warp (Settings::layer_mt_gu and layer_mt_dn, with two gate/up K
// slices) on a device of `sms` SMs whose memory reads peak at `bytes_per_s` (0: unknown): 2 where that is at least
// 30 GB/s per SM, else 1. Measured: on an H200 (4.9 TB/s, 132 SMs: 37 GB/s per SM) two row tiles per warp, a
// block per tile, ran the GLM-5.2 decode layer at 51.3-51.5 us queued against 51.7-51.9 at 1 row and 56.3-57.6
// against 59.7-60.2 at 3-4 rows (run160); on an H100 (3.35 TB/s, 132 SMs: 25 GB/s per SM) it was slower at every
// row count (runs 143, 158: 1 row 104.7-105.5 us against 102.6 with 13 experts). The bits are the same either way.
inline int default_layer_warp_tiles(double bytes_per_s, int sms) {
  return sms > 0 && bytes_per_s / sms >= 30e9 ? 2 : 1;
}

// The most copies of a shared gate/up operand (Settings::share_operands).
inline constexpr int kShareCopiesMax = 8;

// Settings read once when a backend is created (environment), adjustable by the bench.
struct Settings {
  // Experts with at least this many rows run their int4 matrices on the W4A16 path (bf16 activations); 0 =
  // never (the default: every path is then f32-accurate and prefill equals decode bit for bit).
  // STRATA_CUDA_W4A16_MIN_ROWS=N.
  int w4a16_min_rows = 0;
  // int4 matrices (exact mode) run on the memory-bound gemv kernels in calls (experts) with at most this many
  // rows, on the exact tensor-core kernels above; -1 = every row count (STRATA_CUDA_GEMV_MAX_ROWS=all); 0 =
  // never (the default: on the H200 the tensor cores on tiled weights are faster from 1 row: run13). Only 0
  // and -1 keep a token's result independent of the row count (prefill == decode bit for bit).
  // STRATA_CUDA_GEMV_MAX_ROWS=N.
  int gemv_max_rows = 0;
  // Exact mode: experts (matmul calls) with at least this many rows run in 16-token chunks on the wide kernels
  // (tc_wide.cuh: 8 warps share each batch's operand through shared memory; the same bits as the narrow ones),
  // a rest of at most 8 tokens on the narrow ones; 0 = never. STRATA_CUDA_WIDE_MIN_ROWS=N (default 9).
  int wide_min_rows = 9;
  // STRATA_CUDA_KERNELS=simt: int4 weights on the SIMT f32 kernels instead of the gemv / tensor-core kernels.
  bool force_simt = false;
  // A group's kernels are queued as programmatic dependent launches: each may start while the one before is
  // still in its last wave, loading its first weights there (device_util.cuh). STRATA_CUDA_PDL=0: off (A/B).
  bool pdl = true;
  // Resident int4 matrices are stored in 16-row tiles in load order (work.hpp, kTiles; their Q4_G64 scales in
  // 16 x 4 blocks in load order), read 1.6x faster by the tensor-core kernels than rows in order; read when a
  // matrix is uploaded. STRATA_CUDA_LAYOUT=rows: rows in order (the gemv kernels read those better).
  bool tiles = true;
  // A group's launch sequence is captured once per shape (launch classes, item counts, grids) and slot, and
  // replayed as a CUDA graph: one host call instead of one per kernel (the host is busy with the CPU rows
  // beside it). STRATA_CUDA_GRAPHS=0: every kernel launched on its own.
  bool graphs = true;
  // A decode group whose experts all run on the exact tensor cores (one format, up to 4 rows per expert: 2
  // n-tiles) is one launch after the operand preparation: the layer kernel (kernels/tc_layer.cuh) runs the
  // gate/up tiles and then the down tiles, each expert's down tiles as soon as its h is complete, instead of
  // a gate/up launch, a preparation launch and a down launch. Same results bit for bit. STRATA_CUDA_LAYER=0:
  // the three launches (A/B).
  bool layer_kernel = true;
  // The layer kernel as a persistent launch: as many blocks as the device holds at once, each taking tiles
  // until none is left (so a block's slot never waits on a block launch, a ticket, a work item or its first
  // loads): the next tile's ticket taken as the current tile's last two load batches begin and its first
  // weights loaded before the current tile's epilogue. Same results bit for bit. -1 (auto, the default): on at
  // 2 n-tiles, and at 1 for a launch of at least two tiles per block the device holds at once (4 per SM); off
  // with one gate/up K slice (gate_up_slices, below) and with two row tiles per warp (layer_mt_gu/dn). H100,
  // run127-129, with a gate/up tile's count by one fence per block: a GLM-5.2 layer (1792 tiles, 3.4 per block)
  // at 1 row 64.1-64.4 us queued against 65.0-65.5 a block per tile, 3-4 rows 69.5-70.1 against 70.4-71.1; the
  // projection shape at n = 1 (640 tiles, 1.2 per block) 18.6-19.1 us event-timed against 17.7-18.5. (With a
  // fence in every thread the persistent kernel was ~1 us slower than a block per tile at 1-2 rows: run52/54 on
  // the H200, run127.) STRATA_CUDA_LAYER_PERSISTENT=0 or 1 (at every n-tile count and size), auto. (A streaming
  // form, the next ticket taken as a tile starts, measured ~11 us slower at every row count, run52, and is gone.)
  int layer_persistent = -1;
  // The layer kernel with one block more per SM: each unit's B values loaded just before its k-steps instead
  // of one unit ahead (1-2 rows per expert: 5 blocks in 96 registers instead of 4 in 128; 3-4 rows: 4 in 128
  // instead of 3 in 168). Same results bit for bit. -1 (auto, the default): lean at 2 n-tiles only, where it
  // measured faster (H200, run52: 3-4 rows 74.2-75.7 us queued against 74.9-75.8 for 8 experts, 266 against
  // 280 for 32), and not at 1 (1 row 64.6-65.0 against 56.1-56.7). STRATA_CUDA_LAYER_LEAN=0: never, 1:
  // always.
  int layer_lean = -1;
  // 16-row tiles per warp of the layer kernel's gate/up and down tiles: 2 has each warp compute two row tiles
  // with every B value it loads (half the B loads and L1 fills per weight byte; gate/up tiles of 32 rows, down
  // tiles of 128). Same results bit for bit. STRATA_CUDA_LAYER_WARP_ROWS=16 (1, 1), 32 (2, 2) or 32/16 (2, 1);
  // with one gate/up K slice (gate_up_slices) 16 or 16/32 (1, 2: down tiles of 128 rows); others are refused.
  // Without the setting, with two gate/up slices: (2, 2) on a device that reads memory at 30 GB/s per SM or more,
  // (1, 1) below (default_layer_warp_tiles).
  int layer_mt_gu = 1, layer_mt_dn = 1;
  // K slices per gate/up matrix of the tensor-core kernels (narrow, wide and the layer kernel's gate/up tiles;
  // kernels/tc_q4.cuh): 2 (the default) a block is one 16-row tile of h, each matrix in 2 warps of half K; 1 a
  // block is two 16-row tiles, each matrix's tile in one warp over the whole K (wide blocks of 64 rows instead
  // of 32). The two give different bits (the order of the sums); prefill == decode within either. With 1 the
  // layer kernel's gate/up warps take one 16-row tile (STRATA_CUDA_LAYER_WARP_ROWS 16 or 16/32) and it runs a
  // block per tile (layer_persistent_for). H100 (runs 153-154) against 2: the exact wide kernels at 16-256 rows per expert
  // 11-12 % faster, W4A16 at 1-4 rows 3-5 % faster; the GLM-5.2 decode layer (queued) at 1 row 1.7 us slower
  // on the full card and 1.8 us faster on the H200 stand-in (--reserve-sms 52), at 3-4 rows 0.3-0.6 slower and
  // 5.5 faster; at 8 rows (separate launches) 13 and 10 us slower; the projection shape 1.9-2.6 us slower. With
  // 8 experts the layer's 512 gate/up tiles are one wave on 132 SMs (528 blocks), so the down tiles start
  // together and end in a partial second round; with 16 experts the full card is as fast at 1 row and 4.7 us
  // faster at 3-4 rows. With the H200's waves and bandwidth per SM (run155: the stand-in with 5 experts) it is as
  // fast as 2 at 1-2 rows and 5 % faster at 3-4 rows. The real H200 not measured. STRATA_CUDA_GATE_UP_SLICES=1|2.
  int gate_up_slices = 2;
  // The SMs the persistent layer kernel sizes its grid for (as many blocks as they hold at once); 0: all the
  // device's. bench_cuda --reserve-sms sets it to the SMs it leaves free. STRATA_CUDA_LAYER_SMS=N.
  int layer_sms = 0;
  // Experts of a group with the same rows of x (every expert of a one-token decode group) share one gate/up
  // input operand: encoded once by the preparation pass, and read by all of their gate/up tiles, so the L1 and
  // L2 hold one copy for all of them (plan_group). Same results bit for bit. N >= 1: N copies (the k-th chunk
  // with an operand reads copy k % N: each copy is read by fewer SMs at once); 0: an operand per expert; -1
  // (auto, the default): one copy, none for a one-n-tile tensor-core operand (1-2 rows of the exact kernels).
  // On an H100 (runs 164-166) one copy was 0.8-1.7 us faster at 3-4 rows with the H200's 32-row gate/up tiles
  // and 2-3.8 us at 8 rows, but 0.5-0.9 us slower at 1 row: every SM then reads the one 49 KB operand at once
  // and the first tiles' inputs came 0.5 us later (--timeline). STRATA_CUDA_SHARE_OPERANDS=auto|0..8.
  int share_operands = -1;
  // host_register is offered: outputs in registered host memory are put there by the device (direct_writes).
  // STRATA_CUDA_REGISTER=0: refused (STRATA_ERR_UNSUPPORTED), every output through the staging buffers (A/B).
  bool host_register = true;
  // A take (or matmul) polls its done event for up to this long before it sleeps until the device's
  // interrupt (dispatch.cpp, wait_done). STRATA_CUDA_SPIN_US=N.
  int spin_us = 2000;
  // Outputs in registered host memory are written there by the down kernels themselves (through the range's
  // device address: stores over the bus as the rows are done), instead of a copy after the group.
  // STRATA_CUDA_DIRECT_WRITES=0: copied after the group (A/B).
  bool direct_writes = true;
};

class CudaBackend {
 public:
  // Throws Failure: STRATA_ERR_INVALID_ARGUMENT for a bad ordinal, STRATA_ERR_UNSUPPORTED for a device older
  // than sm_90, STRATA_ERR_DEVICE when the driver refuses.
  explicit CudaBackend(int device);
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  int device() const { return device_; }
  Settings& settings() { return settings_; }
  // Whether the layer kernel runs its lean instance at nt n-tiles (Settings::layer_lean).
  bool layer_lean_for(int nt) const {
    return settings_.layer_lean > 0 || (settings_.layer_lean < 0 && nt == 2);
  }
  // The layer kernel's persistent mode for a launch of `tiles` tiles at nt n-tiles (Settings::layer_persistent).
  int layer_persistent_for(int nt, int64_t tiles) const {
    if (settings_.layer_persistent >= 0) return settings_.layer_persistent;
    // Tiles larger than 16 rows of h (gate/up) or 64 rows (down) run a block per tile: measured faster for each
    // such shape at every row count. One gate/up K slice (32-row gate/up tiles), run154: H100 1 row 67.2-67.3 us
    // queued against 69.7-70.0 persistent, 3-4 rows 70.3-70.9 against 73.0-73.3. Two row tiles per warp, run159
    // on the H200: WARP_ROWS=32 1 row 51.3-51.6 against 52.7-52.9, 3-4 rows 56.6-57.1 against 57.4-58.3; 32/16
    // 51.8-52.0 against 53.1-53.4; run158 on an H100 likewise.
    if (tc_gate_up_rows(settings_.gate_up_slices) * settings_.layer_mt_gu > kTcRowsPerBlock ||
        settings_.layer_mt_dn > 1)
      return 0;
    const int sms = settings_.layer_sms > 0 && settings_.layer_sms < sm_count_ ? settings_.layer_sms : sm_count_;
    // (4: the 1-n-tile instance's blocks per SM, tc_min_blocks in kernels/tc_q4.cuh)
    return nt == 2 || tiles >= 2 * 4 * static_cast<int64_t>(sms) ? 1 : 0;
  }
  static bool supports(int32_t dtype) { return dtype >= kF32 && dtype <= kQ4G64; }

  void matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y);
  void expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                    const strata_expert_task* tasks);
  strata_group* issue(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                      const strata_expert_task* tasks);
  void take(strata_group* group);  // consumes the handle, also when it throws
  void discard(strata_group* group) noexcept;

  strata_resident* upload(const strata_matrix& w);
  void free(strata_resident* r);
  strata_memory_info memory_info();

  // Host memory the device writes group outputs into directly (cudaHostRegister, mapped); see plugin_abi.h.
  void host_register(void* p, uint64_t bytes);
  void host_unregister(void* p);

  // Bench: runs the kernels of one expert group `iters` times (inputs staged once) and returns the time of
  // each run in ms, measured with events on the device; the outputs of the last run are written to the tasks.
  // hold_us > 0: each run's launches are queued behind a kernel spinning that long, so the time is the
  // device's alone (without it, the first kernels may wait for the host to submit them).
  // timeline (a layer-kernel group only): the runs are launched directly, not as a graph, the layer kernel
  // writes each ticket's record (kernels/work.hpp kTimeline*, kTimelineWords per ticket), the first
  // preparation launch its start and end after them (kPrepStamp*), and the last run's are returned there;
  // left empty for a group without the layer kernel. Not with other groups in flight.
  std::vector<float> time_expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                                       const strata_expert_task* tasks, int iters, int hold_us = 0,
                                       std::vector<uint64_t>* timeline = nullptr);

  // STRATA_CUDA_FAIL_NEXT=oom|device, read when the backend is created: the next issue fails with that
  // status.
  void inject_failure(strata_status s) { fail_next_.store(static_cast<int>(s)); }

 private:
  Slot* acquire_slot();
  void release_slot(Slot* s) noexcept;
  void ensure_capacity(Slot& s, const Plan& p);
  void stage(Slot& s, const Plan& p);      // inputs to the device (pinned head copy, host weights)
  void copy_head(Slot& s, const Plan& p);  // the pinned head to the device (in stage)
  void launch_signature(std::string& k, const Plan& p) const;  // the graph cache's key (launch_graph)
  void launch(Slot& s, const Plan& p);  // the kernels: replayed as a CUDA graph when possible
  void launch_direct(Slot& s, const Plan& p);
  bool launch_graph(Slot& s, const Plan& p);
  void finish(Slot& s, const Plan& p);  // outputs to pinned memory, done event
  void sync_quietly(Slot& s) noexcept;
  // Plans into the slot's plan (p, sc: Slot::plan, Slot::scratch; their memory is reused).
  void plan_group(Plan& p, PlanScratch& sc, const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                  const strata_expert_task* tasks);
  void plan_matmul(Plan& p, const strata_matrix& w, const float* x, int64_t n_x_rows);

  int device_;
  int sm_major_ = 9;  // the device's compute capability major (8: no programmatic dependent launches)
  int sm_count_ = 0;  // its SMs
  Settings settings_;
  std::atomic<int> fail_next_{0};
  std::atomic<bool> graphs_failed_{false};  // a capture or instantiation failed once: launch directly
  // time_expert_group's timeline, while it runs: the device buffer for the layer kernel and its tickets.
  uint64_t* timeline_dev_ = nullptr;
  int32_t timeline_n_ = 0;
  // STRATA_CUDA_TRACE: host time per phase of an issue and a take, and the groups' device spans, kept apart
  // for one-token groups (decode) and the rest (prefill); printed when the backend goes.
  struct IssueTrace {
    uint64_t calls = 0, takes = 0;
    double plan = 0, slot = 0, stage = 0, launch = 0, finish = 0;
    double take_wait = 0, take_copy = 0;  // take: waiting for the device; copying the outputs out
    double device = 0;                    // the groups' spans on their streams (staging copy to done event)
  };
  bool trace_on_ = false;
  IssueTrace trace_[2];  // [0]: groups of one token, [1]: more
  std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_slots_;
  std::unordered_set<const strata_resident*> residents_;
  std::unordered_set<const strata_group*> groups_;
  struct Registered {
    uint64_t bytes;
    char* dev;  // the device's address of the range's start (cudaHostGetDevicePointer)
  };
  std::map<uintptr_t, Registered> registered_;  // host_register: start -> range (under mu_)
  std::mutex register_mu_;                      // one host_register / host_unregister at a time
  uint64_t resident_bytes_ = 0;
  std::atomic<uint64_t> workspace_bytes_{0};
};

}  // namespace strata_cuda
