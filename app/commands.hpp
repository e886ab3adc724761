// The strata subcommands: each takes its parsed options and returns a process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::app {

struct CommonOptions {
  std::string config;  // YAML file ("" = defaults)
  int threads = -1;    // -1 = from the config
};

struct ModelOptions {
  CommonOptions common;
  std::string model;
  std::string ids;  // "3,17,42"
  std::string quant = "none";  // routed experts quantized at load: q4_g64 | q4_row | none
};

int cmd_plugins(const CommonOptions& o);
int cmd_logits(const ModelOptions& o, int64_t prefill, const std::string& out);
int cmd_generate(const ModelOptions& o, int64_t max_new, bool print_ids);
int cmd_inspect(const ModelOptions& o);

std::vector<int32_t> parse_ids(const std::string& text);

// strata convert (app/convert_command.cpp).
struct ConvertCliOptions {
  std::string in, out;
  std::string format = "q4_g64";  // routed experts: q4_g64 | q4_row
  std::string dense = "keep";     // keep | bf16 | q4_g64
  int64_t shard_size_mb = 2048;
  bool force = false;
};
int cmd_convert(const ConvertCliOptions& o);

}  // namespace strata::app
