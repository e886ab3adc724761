// The YAML runtime configuration: plugin search path, backend choice, memory budgets, scheduler.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace strata {

struct RuntimeConfig {
  struct Plugins {
    std::vector<std::filesystem::path> path;  // extra plugin folders, searched after the defaults
  } plugins;
  struct Backends {
    // Ordered preference: the first entry that runs on this machine; "auto" = the highest-scoring plugin in
    // exact mode. A YAML string is a list of one.
    std::vector<std::string> dense = {"auto"};
    std::vector<std::string> experts;  // ordered preference, every entry that runs; empty = "auto"
  } backends;
  struct Memory {
    std::optional<double> vram_gb;  // nullopt = auto
    std::optional<double> ram_gb;   // nullopt = auto
    double reserve_gb = 1.0;
    std::string pin = "auto";  // auto | none | path to a file
  } memory;
  struct Disk {                      // reads of experts that are not in RAM (the expert tiers)
    std::string direct_io = "auto";  // auto | true | false (O_DIRECT)
    int queue_depth = 32;            // reads in flight at most
    std::string engine = "auto";     // auto (io_uring when the kernel allows it) | io_uring | pread
  } disk;
  struct Scheduler {
    int threads = 0;  // 0 = all hardware threads
    bool overlap = true;
    bool prefetch = false;  // router look-ahead reads of the next layer's experts (expert tiers, streaming)
  } scheduler;

  std::filesystem::path source;  // the file it was read from (empty for defaults)
};

// Parses a YAML file. Unknown keys, wrong types and malformed YAML are errors naming the file, the line and
// what was expected. Relative plugin paths are resolved against the YAML file's folder.
RuntimeConfig load_runtime_config(const std::filesystem::path& file);
RuntimeConfig parse_runtime_config(const std::string& yaml_text, const std::filesystem::path& origin);

}  // namespace strata
