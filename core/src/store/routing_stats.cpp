// Routing statistics: recording, ranking, the model fingerprint, and the checksummed binary file.
#include "strata/routing_stats.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <span>

#include "strata/error.hpp"
#include "strata/safetensors.hpp"

namespace strata {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kComp = "routing_stats";

// File layout (little-endian), version 1:
//   0  char[8] magic "STRATARS"
//   8  u32 version
//  12  u32 fingerprint length F
//  16  i64 layers
//  24  i64 experts
//  32  u64 turns
//  40  F bytes fingerprint
//      u64 count[layers * experts]
//      u64 last_turn[layers * experts]
//      u64 FNV-1a 64 of every byte before it
constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'R', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 40;
constexpr uint32_t kMaxFingerprint = 256;
// Far above any real model (DeepSeek-V3: 58 × 256); a larger product in a header means a corrupt file.
constexpr int64_t kMaxEntries = int64_t{1} << 28;
static_assert(std::endian::native == std::endian::little, "the routing statistics file is little-endian");

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

// Both dimensions positive and their product at most kMaxEntries (checked without overflowing).
bool valid_shape(int64_t layers, int64_t experts) {
  return layers >= 1 && experts >= 1 && layers <= kMaxEntries && experts <= kMaxEntries &&
         layers * experts <= kMaxEntries;
}

uint64_t fnv1a(uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

}  // namespace

RoutingStats::RoutingStats(int64_t n_layers, int64_t n_experts, std::string model)
    : layers(n_layers), experts(n_experts), fingerprint(std::move(model)) {
  if (!valid_shape(layers, experts)) {
    fail(kComp, "statistics for {} layers × {} experts: expected both >= 1 and at most {} entries", layers,
         experts, kMaxEntries);
  }
  count.assign(static_cast<size_t>(layers * experts), 0);
  last_turn.assign(static_cast<size_t>(layers * experts), 0);
}

void RoutingStats::record(int64_t layer, int64_t expert, uint64_t n, uint64_t turn) {
  if (layer < 0 || layer >= layers || expert < 0 || expert >= experts) {
    fail(kComp, "record: (layer {}, expert {}) is out of range (expected layer < {}, expert < {})", layer,
         expert, layers, experts);
  }
  const auto i = static_cast<size_t>(layer * experts + expert);
  STRATA_CHECK(i < count.size() && i < last_turn.size());
  count[i] += n;
  last_turn[i] = std::max(last_turn[i], turn);
  turns = std::max(turns, turn);
}

uint64_t RoutingStats::count_of(int64_t layer, int64_t expert) const {
  if (layer < 0 || layer >= layers || expert < 0 || expert >= experts) {
    fail(kComp, "count_of: (layer {}, expert {}) is out of range (expected layer < {}, expert < {})", layer,
         expert, layers, experts);
  }
  return count[static_cast<size_t>(layer * experts + expert)];
}

std::vector<std::pair<int64_t, int64_t>> RoutingStats::ranked() const {
  const size_t n = static_cast<size_t>(layers * experts);
  STRATA_CHECK(count.size() == n && last_turn.size() == n);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Index order is (layer, expert) order, so the last key is the index itself: a total order, hence
  // deterministic whatever std::sort does with ties.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (count[a] != count[b]) return count[a] > count[b];
    if (last_turn[a] != last_turn[b]) return last_turn[a] > last_turn[b];
    return a < b;
  });
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(n);
  for (size_t i : order)
    out.emplace_back(static_cast<int64_t>(i) / experts, static_cast<int64_t>(i) % experts);
  return out;
}

std::string model_fingerprint(const fs::path& model_dir, const SafetensorsSet& tensors) {
  const fs::path config = model_dir / "config.json";
  std::ifstream in(config, std::ios::binary);
  if (!in)
    fail(kComp, "{}: cannot read it for the model fingerprint: {}", config.string(), std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t h = fnv1a(kFnvOffset, "strata model fingerprint 1\nconfig.json\n");
  h = fnv1a(h, bytes);
  h = fnv1a(h, "\ntensors\n");
  // all() is a std::map: sorted by name, whatever the shards and their order.
  for (const auto& [name, ref] : tensors.all()) {
    h = fnv1a(h, name);
    h = fnv1a(h, std::string_view("\0", 1));
    h = fnv1a(h, dtype_name(ref.info->dtype));
    h = fnv1a(h, ref.info->shape_str());
    h = fnv1a(h, "\n");
  }
  return fmt::format("{:016x}", h);
}

std::string model_fingerprint(const fs::path& model_dir) {
  const SafetensorsSet tensors(model_dir);
  return model_fingerprint(model_dir, tensors);
}

void save_routing_stats(const RoutingStats& stats, const fs::path& path) {
  if (!valid_shape(stats.layers, stats.experts)) {
    fail(kComp,
         "cannot save routing statistics to {}: {} layers × {} experts (expected both >= 1, at most {} "
         "entries)",
         path.string(), stats.layers, stats.experts, kMaxEntries);
  }
  const int64_t entries = stats.layers * stats.experts;
  if (stats.count.size() != static_cast<size_t>(entries) ||
      stats.last_turn.size() != static_cast<size_t>(entries)) {
    fail(kComp,
         "cannot save routing statistics to {}: count has {} and last_turn {} entries, expected {} × {} = {}",
         path.string(), stats.count.size(), stats.last_turn.size(), stats.layers, stats.experts, entries);
  }
  if (stats.fingerprint.size() > kMaxFingerprint) {
    fail(kComp, "cannot save routing statistics to {}: fingerprint of {} bytes (expected at most {})",
         path.string(), stats.fingerprint.size(), kMaxFingerprint);
  }

  std::string out;
  out.reserve(kHeaderBytes + stats.fingerprint.size() + 16 * static_cast<size_t>(entries) + 8);
  out.append(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, static_cast<uint32_t>(stats.fingerprint.size()));
  put(out, stats.layers);
  put(out, stats.experts);
  put(out, stats.turns);
  out += stats.fingerprint;
  for (uint64_t c : stats.count) put(out, c);
  for (uint64_t t : stats.last_turn) put(out, t);
  put(out, fnv1a(kFnvOffset, out));
  write_file_atomic(path, std::as_bytes(std::span(out.data(), out.size())));
}

RoutingStats load_routing_stats(const fs::path& path, const std::string& expected_fingerprint, int64_t layers,
                                int64_t experts) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(kComp, "cannot open routing statistics {}: {}", name, std::strerror(errno));
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(kComp, "cannot read routing statistics {}", name);

  // The header, then the size its dimensions imply, then the checksum: a damaged file is reported as such
  // before its (possibly damaged) fingerprint or dimensions are compared with this model's.
  if (b.size() >= sizeof kMagic && std::memcmp(b.data(), kMagic, sizeof kMagic) != 0)
    fail(kComp, "{} is not a strata routing statistics file (expected it to start with 'STRATARS')", name);
  if (b.size() < kHeaderBytes) {
    fail(kComp, "routing statistics in {} are truncated: {} bytes, expected at least the {}-byte header",
         name, b.size(), kHeaderBytes);
  }
  const auto version = get<uint32_t>(b, 8);
  if (version != kVersion) {
    fail(kComp, "routing statistics in {} have format version {}; expected version {}", name, version,
         kVersion);
  }
  const auto fp_len = get<uint32_t>(b, 12);
  const auto file_layers = get<int64_t>(b, 16);
  const auto file_experts = get<int64_t>(b, 24);
  if (fp_len > kMaxFingerprint || !valid_shape(file_layers, file_experts)) {
    fail(kComp,
         "routing statistics in {} are corrupt: header says {} layers × {} experts and a {}-byte fingerprint "
         "(expected positive dimensions of at most {} entries and at most {} bytes)",
         name, file_layers, file_experts, fp_len, kMaxEntries, kMaxFingerprint);
  }
  const auto entries = static_cast<size_t>(file_layers * file_experts);
  const size_t expected_size = kHeaderBytes + fp_len + 16 * entries + 8;
  if (b.size() != expected_size) {
    fail(kComp, "routing statistics in {} are {}: {} bytes, expected {} for {} layers × {} experts", name,
         b.size() < expected_size ? "truncated" : "corrupt (trailing bytes)", b.size(), expected_size,
         file_layers, file_experts);
  }
  const uint64_t stored = get<uint64_t>(b, expected_size - 8);
  const uint64_t computed = fnv1a(kFnvOffset, std::string_view(b.data(), expected_size - 8));
  if (stored != computed) {
    fail(kComp, "routing statistics in {} are corrupt: checksum {:016x}, expected {:016x}", name, stored,
         computed);
  }

  RoutingStats s;
  s.fingerprint = b.substr(kHeaderBytes, fp_len);
  if (s.fingerprint != expected_fingerprint) {
    fail(
        kComp,
        "routing statistics in {} were recorded for another model (fingerprint {}, this model is {}); delete "
        "it or set memory.pin: none",
        name, s.fingerprint, expected_fingerprint);
  }
  if (file_layers != layers || file_experts != experts) {
    fail(
        kComp,
        "routing statistics in {} are for {} layers × {} experts; this model has {} × {} (delete the file or "
        "set memory.pin: none)",
        name, file_layers, file_experts, layers, experts);
  }
  s.layers = file_layers;
  s.experts = file_experts;
  s.turns = get<uint64_t>(b, 32);
  s.count.resize(entries);
  s.last_turn.resize(entries);
  const size_t at = kHeaderBytes + fp_len;
  std::memcpy(s.count.data(), b.data() + at, 8 * entries);
  std::memcpy(s.last_turn.data(), b.data() + at + 8 * entries, 8 * entries);
  return s;
}

}  // namespace strata
