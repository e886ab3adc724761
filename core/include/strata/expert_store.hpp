// ExpertStore: where every routed expert lives (VRAM, RAM, an LRU cache of RAM slots, or disk), the plan made
// at load from the memory budgets and the routing statistics, and the per-layer run that computes GPU groups,
// CPU rows and disk reads at the same time (a oneTBB flow graph).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/backend.hpp"
#include "strata/expert_io.hpp"
#include "strata/routing_stats.hpp"

namespace strata {

class Model;
class SafetensorsSet;
struct RuntimeConfig;

struct StoreOptions {
  std::optional<double> ram_gb;   // routed-expert RAM budget; nullopt = auto (MemAvailable − dense − reserve)
  std::optional<double> vram_gb;  // per device; nullopt = auto (free − reserve); used when a GPU backend is chosen
  double reserve_gb = 1.0;
  std::string pin = "auto";  // auto (statistics beside the model) | none | a statistics file
  ReaderOptions reader;      // disk reads (queue depth, O_DIRECT, engine)
  // pin none also freezes the placement: no statistics are read or saved and end_turn moves nothing, so the
  // same prompt gives the same bits whatever ran before.
  bool overlap = true;       // false: the same work one part after the other (A/B)
  bool prefetch = false;     // router look-ahead: read the next layer's likely experts during this one
  static StoreOptions from(const RuntimeConfig& config);
};

enum class Tier : uint8_t {
  kVram,   // resident on a GPU backend, computed there
  kRam,    // in host memory for good: mapped from the checkpoint (everything fits) or a pinned copy
  kCache,  // streamed: currently in a slot of the LRU cache
  kDisk,   // streamed: read from the checkpoint when routed to
};
std::string_view tier_name(Tier t);

// Cumulative counters; telemetry() returns a copy. Times in seconds, summed over layers.
struct StoreTelemetry {
  uint64_t layers = 0;
  uint64_t vram_hits = 0, ram_hits = 0, cache_hits = 0, disk_reads = 0;  // (layer, expert) uses by tier
  uint64_t disk_bytes = 0;
  uint64_t gpu_fallbacks = 0;  // GPU groups recomputed on the CPU after a device error
  uint64_t prefetch_reads = 0;  // experts read ahead by the router look-ahead
  uint64_t prefetch_hits = 0;   // routed experts found in the cache because they were read ahead
  // Recall of the look-ahead: routed experts that were read ahead / those that had to come from disk.
  double prefetch_recall() const {
    const double need = static_cast<double>(prefetch_hits + disk_reads);
    return need > 0 ? static_cast<double>(prefetch_hits) / need : 0.0;
  }
  double gpu_issue_s = 0, cpu_rows_s = 0, disk_wait_s = 0, take_s = 0, layer_s = 0;
  // From the start of a layer to the start of its first CPU job (summed over layers with CPU rows): the
  // bookkeeping before the rows plus, with overlap, the wait for a thread to take the job.
  double cpu_start_s = 0;
  // From the start of a layer to the end of its last CPU job (summed over layers with CPU rows), and to the
  // moment its GPU group was taken (summed over layers with a GPU group): what of a layer's time comes after.
  double cpu_end_s = 0, gpu_done_s = 0;
  // From the start of a layer to the end of its GPU issue (summed over layers with a GPU group): when the
  // group was queued on the device (late when the issue thread waited for a core).
  double gpu_issued_s = 0;
  StoreTelemetry operator-(const StoreTelemetry& o) const;
  StoreTelemetry operator+(const StoreTelemetry& o) const;
};

// The plan, as numbers (plan_text() says it in words).
struct StorePlan {
  int64_t experts = 0;  // routed experts of the model
  int64_t vram = 0, ram = 0, streamed = 0;
  int64_t shared_vram = 0;  // layers whose shared expert is in VRAM
  int64_t cache_slots = 0;
  uint64_t expert_bytes = 0;  // host bytes of one expert (largest)
  uint64_t slot_bytes = 0;    // bytes of one cache slot
  uint64_t ram_budget = 0, vram_budget = 0, dense_bytes = 0, mem_available = 0;
  bool mapped = false;  // every non-VRAM expert is used straight from the mapped checkpoint
  std::string gpu;      // the GPU backend's name ("" = none)
  std::string stats_path;
  std::vector<std::string> warnings;
};

class ExpertStore {
 public:
  // Plans the tiers for `model` (whose experts are bound and point into `tensors`' mappings or into memory
  // made at load) and loads what the plan keeps resident: pinned copies, VRAM uploads. Throws strata::Error
  // when the plan cannot fit or the statistics file belongs to another model.
  ExpertStore(const Model& model, const SafetensorsSet& tensors, const StoreOptions& options);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  struct Work {
    int32_t expert = 0;
    std::span<const int32_t> rows;  // rows of x
    float* out = nullptr;           // [rows.size(), hidden]
  };
  // Computes the routed experts of one MoE layer for the rows x [T, hidden], each where its tier says, and
  // runs `alongside` (e.g. the shared expert) at the same time. Every output row is bitwise what the same
  // backend computes for it whatever the overlap, cache state or thread count. One layer at a time (a mutex
  // serializes callers).
  // shared_out: when shared_on_gpu(layer), the layer's shared expert for all T rows goes into the GPU group
  // and its output to shared_out [T, hidden] (then `alongside` should not compute it again).
  void run_layer(int64_t layer, const float* x, int64_t T, std::span<const Work> work,
                 const std::function<void()>& alongside, float* shared_out = nullptr);
  bool shared_on_gpu(int64_t layer) const;
  // Output memory (run_layer's Work::out, shared_out) the GPU tier's device writes into directly instead of
  // through staging buffers (the take's copy, ~15 µs per layer, leaves the layer's critical path). false:
  // no GPU tier, or its backend does not offer it. Unregister before freeing the memory, between layers.
  bool register_output(void* p, size_t bytes);
  void unregister_output(void* p);

  // Ends a turn (a request, a chat answer): re-places experts between tiers by frequency (recency breaks
  // ties) with hysteresis, and saves the routing statistics atomically (unless pin is none).
  void end_turn();

  const StorePlan& plan() const { return plan_; }
  std::string plan_text() const;
  StoreTelemetry telemetry() const;
  // Switches scheduler.overlap between layers (an A/B of the same placement in one process; results do not
  // change, only the schedule).
  void set_overlap(bool overlap);
  Tier tier_of(int64_t layer, int64_t expert) const;
  int64_t pinned_slots() const;  // cache slots in use (0 between layers; tests check it)
  const RoutingStats& stats() const { return stats_; }

 private:
  void issue_prefetch(int64_t layer, const float* x, int64_t T);
  struct Entry;
  struct Slot;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  StorePlan plan_;
  RoutingStats stats_;
};

}  // namespace strata
