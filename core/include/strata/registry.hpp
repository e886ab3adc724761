// Plugin registry: finds libstrata_*.so plugins, loads them with Boost.DLL, checks ABI and score, and creates
// the backends a RuntimeConfig asks for.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/backend.hpp"
#include "strata/runtime_config.hpp"

struct strata_plugin_vtable;

namespace strata {

struct PluginRecord {
  std::filesystem::path file;
  std::string name;  // from the vtable; the file name when the plugin could not be read
  std::string version;
  std::string description;
  uint32_t score = 0;
  // Empty for a plugin in exact mode (DESIGN §6); else what it approximates, in its own words (the vtable's
  // `approximation`). Such a plugin is chosen only by name, never by auto.
  std::string approximation;
  bool usable = false;
  std::string reason;  // why it was rejected (usable == false)
  const strata_plugin_vtable* vtable = nullptr;
  std::shared_ptr<void> library;  // keeps the .so loaded for the life of the process
};

// Where plugins are looked for, in order: the folders next to the executable (bin/plugins,
// ../lib/strata/plugins), the build tree's plugin folder, STRATA_PLUGIN_PATH (':'-separated), then `extra`
// (YAML plugins.path).
std::vector<std::filesystem::path> plugin_search_path(const std::vector<std::filesystem::path>& extra);

class PluginRegistry {
 public:
  // Loads every libstrata_*.so in the given folders, in order. A plugin that cannot be loaded, lacks a
  // symbol, has another ABI version, scores 0 or repeats an earlier name is kept as a rejected record.
  explicit PluginRegistry(const std::vector<std::filesystem::path>& search_path);

  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  const std::vector<std::filesystem::path>& search_path() const { return search_path_; }
  // The usable plugin with this name, or nullptr.
  const PluginRecord* find(const std::string& name) const;
  // Usable plugins, highest score first (ties: discovery order); with exact_only, those in exact mode only.
  std::vector<const PluginRecord*> ranked(bool exact_only = false) const;

  std::shared_ptr<Backend> create(const PluginRecord& plugin, int n_threads) const;

 private:
  void load(const std::filesystem::path& file);
  std::vector<std::filesystem::path> search_path_;
  std::vector<PluginRecord> plugins_;
};

// The backends a model runs on, chosen from a config. Dense ops go to `dense`; routed experts to the first of
// `experts` that supports their format.
struct Backends {
  std::shared_ptr<Backend> dense;
  std::vector<std::shared_ptr<Backend>> experts;
  std::string dense_reason;  // "configured" or "auto: highest score"
  // Listed expert plugins that cannot run on this machine and were passed over, each with the reason.
  std::vector<std::string> skipped;
  // One line per configured plugin that is not exact mode, naming what it approximates (said at load).
  std::vector<std::string> approximations;
  // Picks the expert backend for a format; errors when none of the chosen ones supports it.
  const Backend& expert_backend_for(WeightFormat f) const;
};

Backends choose_backends(const PluginRegistry& registry, const RuntimeConfig& config);

}  // namespace strata
