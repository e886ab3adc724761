// Routing statistics per (layer, expert): how often the router chose each expert and when last, ranked for
// pinning, saved atomically and tied to one model by a fingerprint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace strata {

class SafetensorsSet;

// Counts are indexed [layer * experts + expert]. Turns are numbered from 1 by the caller; last_turn 0 means
// the expert was never chosen. Not thread-safe: one thread records (the scheduler, between forwards).
struct RoutingStats {
  int64_t layers = 0, experts = 0;
  std::vector<uint64_t> count;      // [layers * experts]: tokens routed to the expert
  std::vector<uint64_t> last_turn;  // [layers * experts]: the latest turn that routed to it (0 = never)
  uint64_t turns = 0;               // the highest turn recorded
  std::string fingerprint;          // model_fingerprint() of the model these were recorded for

  RoutingStats() = default;
  // Zeroed statistics for a model with `layers` × `experts` routed experts (both >= 1).
  RoutingStats(int64_t layers, int64_t experts, std::string fingerprint);

  // Adds `n` tokens routed to (layer, expert) during `turn`. Throws strata::Error for an index out of range.
  void record(int64_t layer, int64_t expert, uint64_t n, uint64_t turn);
  uint64_t count_of(int64_t layer, int64_t expert) const;

  // Every (layer, expert), most used first: count descending, then last_turn descending (recent first), then
  // (layer, expert) ascending. Deterministic: equal statistics always rank the same.
  std::vector<std::pair<int64_t, int64_t>> ranked() const;
};

// A stable hash (FNV-1a 64, 16 hex digits) of what makes a model's routing what it is: the bytes of
// <model_dir>/config.json and the sorted names, dtypes and shapes of its tensors (which include the routed
// experts of every layer). Independent of sharding and file order. The second form reuses an open set.
std::string model_fingerprint(const std::filesystem::path& model_dir);
std::string model_fingerprint(const std::filesystem::path& model_dir, const SafetensorsSet& tensors);

// Writes the statistics to `path` (a small little-endian binary file: magic, version, fingerprint, layers,
// experts, turns, counts, last turns, checksum) atomically: a temporary file in the same folder, fsync,
// rename. A failed write leaves any previous file at `path` as it was. Throws strata::Error naming the path.
void save_routing_stats(const RoutingStats& stats, const std::filesystem::path& path);

// Reads statistics saved by save_routing_stats. Throws strata::Error naming the file when it cannot be read,
// is not a routing statistics file, is truncated or corrupt, was recorded for another model
// (expected_fingerprint) or for other dimensions than layers × experts.
RoutingStats load_routing_stats(const std::filesystem::path& path, const std::string& expected_fingerprint,
                                int64_t layers, int64_t experts);

}  // namespace strata
