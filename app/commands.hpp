// The strata subcommands: each takes its parsed options and returns a process exit code.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e.hpp"
#include "strata/generation.hpp"
#include "strata/model.hpp"
#include "strata/registry.hpp"
#include "strata/runtime_config.hpp"

namespace strata::app {

struct CommonOptions {
  std::string config;  // YAML file ("" = defaults)
  int threads = -1;    // -1 = from the config
};

struct ModelOptions {
  CommonOptions common;
  std::string model;           // "" = the bundled model (run, chat, serve)
  std::string ids;             // "3,17,42"
  std::string quant = "none";  // routed experts quantized at load: q4_g64 | q4_row | none
};

// A loaded model with what it runs on; assets (tokenizer, template, EOS) when asked for.
struct Loaded {
  RuntimeConfig config;
  std::unique_ptr<PluginRegistry> registry;
  std::shared_ptr<Model> model;
  std::shared_ptr<ModelAssets> assets;
};
RuntimeConfig config_of(const CommonOptions& o);
inline constexpr const char* kBundledModel = "strata-nano";
std::string
default_model_dir();  // STRATA_MODEL, else the bundled model beside the executable; throws if absent
// Per-turn expert-tier counters as JSON (hits per tier, bytes read, time per phase).
nlohmann::json telemetry_json(const StoreTelemetry& t);
// Loads o.model, or the bundled model when o.model is empty. The experts get tiers (StoreOptions from the
// config); the plan is printed on stderr on a terminal, or whenever it streams, uses a GPU or warns.
Loaded load(const ModelOptions& o, bool with_assets = false);

// Sampling and stopping options shared by run, chat and serve's defaults.
struct GenOptions {
  int64_t max_new = 256;
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::string stats;                                    // "" | "json"
  SamplingParams sampling(const ModelAssets& a) const;  // model defaults overridden by the flags given
};

int cmd_run(const ModelOptions& o, const GenOptions& g, const std::string& prompt);
int cmd_chat(const ModelOptions& o, const GenOptions& g, const std::string& system);

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;     // "" = none; also STRATA_API_KEY
  std::string model_name;  // "" = the model folder's name
  int parallel = 8;        // sequences decoded together
  int queue = 16;          // waiting requests beyond which requests get 429
  int64_t max_body_kb = 4096;
};
int cmd_serve(const ModelOptions& o, const GenOptions& g, const ServeOptions& s);

// strata bench (app/bench_command.cpp).
struct BenchOptions {
  E2eOptions run;     // prefill, decode, reps, warmup, seed (threads come from the config)
  bool json = false;  // one JSON object on stdout instead of text
};
int cmd_bench(const ModelOptions& o, const BenchOptions& b);

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

// strata tokenize (app/tokenize_command.cpp): JSON list of strings → JSON list of id lists (or back with
// decode).
struct TokenizeOptions {
  std::string tokenizer, input;  // tokenizer.json; JSON input file ("-" = stdin)
  bool decode = false, add_special_tokens = false, skip_special_tokens = false;
};
int cmd_tokenize(const TokenizeOptions& o);

}  // namespace strata::app
