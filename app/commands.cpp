// Implementation of the strata subcommands plugins, logits, generate and inspect, and the shared model
// loading.
#include "commands.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "strata/error.hpp"
#include "strata/model.hpp"
#include "strata/quant.hpp"
#include "strata/registry.hpp"
#include "strata/runtime_config.hpp"
#include "strata/safetensors.hpp"

namespace strata::app {
namespace fs = std::filesystem;

RuntimeConfig config_of(const CommonOptions& o) {
  RuntimeConfig cfg = o.config.empty() ? RuntimeConfig{} : load_runtime_config(o.config);
  if (o.threads >= 0) cfg.scheduler.threads = o.threads;
  return cfg;
}

// The bundled model (models/strata-nano in the source tree, share/strata/models/strata-nano when installed):
// run, chat and serve use it when no --model is given. STRATA_MODEL overrides the search.
std::string default_model_dir() {
  if (const char* env = std::getenv("STRATA_MODEL"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> tried;
  if (!ec) {
    const fs::path bin = exe.parent_path();
    for (const fs::path& c : {bin / "../share/strata/models" / kBundledModel,  // installed: PREFIX/bin/strata
                              bin / "../../models" / kBundledModel,            // build tree: build/bin/strata
                              bin / "../models" / kBundledModel}) {
      tried.push_back(c.lexically_normal());
      if (fs::exists(c / "config.json", ec)) return c.lexically_normal().string();
    }
  }
  std::string where;
  for (const auto& t : tried) where += "\n  " + t.string();
  throw Error("model", fmt::format("no --model given and the bundled model {} was not found; looked in:{}\n"
                                   "pass --model DIR or set STRATA_MODEL",
                                   kBundledModel,
                                   where.empty() ? std::string(" (cannot locate the executable)") : where));
}

Loaded load(const ModelOptions& given, bool with_assets) {
  ModelOptions o = given;
  if (o.model.empty()) o.model = default_model_dir();
  Loaded l;
  l.config = config_of(o.common);
  l.registry = std::make_unique<PluginRegistry>(plugin_search_path(l.config.plugins.path));
  LoadOptions lo;
  lo.expert_quant = parse_quant_name(o.quant);
  lo.store = StoreOptions::from(l.config);
  // A bar redrawn in place on a terminal. Without a terminal (logs, pipes), plain lines at every 10 % — but
  // only once the load has taken 2 s, so quick loads (small models, tests) print nothing.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string name = fs::path(o.model).filename().string();
  int64_t last_decile = 0;
  lo.progress = [&, tty](int64_t done, int64_t total) {
    total = std::max<int64_t>(total, 1);
    if (tty) {
      const int width = 30, filled = static_cast<int>(width * done / total);
      fmt::print(stderr, "\rloading {} [{}{}] {}/{} layers", name, std::string(filled, '#'),
                 std::string(width - filled, ' '), done, total);
      return;
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t decile = 10 * done / total;
    if (sec > 2.0 && decile > last_decile) {
      last_decile = decile;
      fmt::print(stderr, "loading {}: {}% ({}/{} layers, {:.1f} s)\n", name, 10 * decile, done, total, sec);
    }
  };
  Backends backends = choose_backends(*l.registry, l.config);
  for (const auto& line : backends.skipped)
    fmt::print(stderr, "strata: {}\n", line);  // (a preference passed over)
  for (const auto& line : backends.approximations) fmt::print(stderr, "strata: warning: {}\n", line);
  l.model = Model::load(o.model, std::move(backends), lo);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty) {
    const auto pc = l.model->param_counts();
    fmt::print(stderr, "\rloaded {} ({}, {:.2f} B parameters) in {:.2f} s{:20}\n", o.model,
               family_name(l.model->spec().family), static_cast<double>(pc.dense + pc.routed) / 1e9, sec, "");
  }
  if (const ExpertStore* st = l.model->expert_store()) {
    const StorePlan& p = st->plan();
    if (tty || !p.mapped || !p.gpu.empty() || !p.warnings.empty())
      fmt::print(stderr, "{}\n", st->plan_text());
  }
  if (with_assets) l.assets = std::make_shared<ModelAssets>(ModelAssets::load(o.model, l.model->spec()));
  return l;
}

nlohmann::json telemetry_json(const StoreTelemetry& t) {
  return {
      {"hits", {{"vram", t.vram_hits}, {"ram", t.ram_hits}, {"cache", t.cache_hits}, {"disk", t.disk_reads}}},
      {"disk_bytes", t.disk_bytes},
      {"gpu_fallbacks", t.gpu_fallbacks},
      {"prefetch", {{"reads", t.prefetch_reads}, {"hits", t.prefetch_hits}, {"recall", t.prefetch_recall()}}},
      {"seconds",
       {{"moe_layers", t.layer_s},
        {"gpu_issue", t.gpu_issue_s},
        {"cpu_rows", t.cpu_rows_s},
        {"cpu_start", t.cpu_start_s},
        {"cpu_end", t.cpu_end_s},
        {"gpu_issued", t.gpu_issued_s},
        {"gpu_done", t.gpu_done_s},
        {"disk_wait", t.disk_wait_s},
        {"gpu_take", t.take_s}}}};
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = text.find(',', pos);
    const std::string tok = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    char* stop = nullptr;
    errno = 0;
    const long v = std::strtol(tok.c_str(), &stop, 10);
    if (tok.empty() || *stop != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      fail("cli",
           "--ids: '{}' is not a token id (expected comma-separated non-negative integers, e.g. 3,17,42)",
           tok);
    }
    ids.push_back(static_cast<int32_t>(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return ids;
}

int cmd_plugins(const CommonOptions& o) {
  const RuntimeConfig cfg = config_of(o);
  PluginRegistry reg(plugin_search_path(cfg.plugins.path));
  fmt::print("search path:\n");
  for (const auto& d : reg.search_path())
    fmt::print("  {}{}\n", d.string(), fs::is_directory(d) ? "" : "  (absent)");
  std::string dense_name, expert_names;
  std::string choose_error;
  std::vector<std::string> skipped, approximations;
  try {
    const Backends b = choose_backends(reg, cfg);
    dense_name = std::string(b.dense->name());
    for (const auto& e : b.experts)
      expert_names += (expert_names.empty() ? "" : ",") + std::string(e->name());
    skipped = b.skipped;
    approximations = b.approximations;
  } catch (const Error& e) {
    choose_error = e.what();
  }
  fmt::print("plugins:\n");
  if (reg.plugins().empty()) fmt::print("  (none found)\n");
  for (const auto& p : reg.plugins()) {
    std::string status;
    if (!p.usable) {
      status = "rejected: " + p.reason;
    } else {
      std::vector<std::string> roles;
      if (p.name == dense_name) roles.push_back("dense");
      if (("," + expert_names + ",").find("," + p.name + ",") != std::string::npos)
        roles.push_back("experts");
      if (!roles.empty()) {
        status = fmt::format("chosen for {}", fmt::join(roles, " + "));
      } else {
        status = p.approximation.empty() ? "available (not chosen)"
                                         : "available (not exact mode: chosen only when a config names it)";
      }
    }
    fmt::print("  {:<14} {:<8} score {:>4}  {}\n", p.name, p.version.empty() ? "-" : p.version, p.score,
               status);
    if (!p.approximation.empty()) fmt::print("  {:<14} not exact: {}\n", "", p.approximation);
    fmt::print("  {:<14} {}\n", "", p.file.string());
  }
  if (!expert_names.empty()) fmt::print("experts preference: {}\n", expert_names);
  for (const auto& line : skipped) fmt::print("{}\n", line);
  for (const auto& line : approximations) fmt::print("warning: {}\n", line);
  if (!choose_error.empty()) {
    fmt::print(stderr, "strata: {}\n", choose_error);
    return 1;
  }
  return 0;
}

int cmd_logits(const ModelOptions& o, int64_t prefill, const std::string& out) {
  const std::vector<int32_t> ids = parse_ids(o.ids);
  const int64_t T = static_cast<int64_t>(ids.size());
  if (prefill < 0) prefill = T;
  if (prefill > T) fail("cli", "--prefill {} exceeds the number of ids ({})", prefill, T);
  Loaded l = load(o);
  Session s(l.model, l.config.scheduler.threads);
  const int64_t V = l.model->spec().vocab;
  std::vector<float> logits;
  logits.reserve(static_cast<size_t>(T * V));
  if (prefill > 0) {
    auto part = s.forward(std::span<const int32_t>(ids.data(), static_cast<size_t>(prefill)), true);
    logits.insert(logits.end(), part.begin(), part.end());
  }
  for (int64_t t = prefill; t < T; ++t) {
    auto part = s.forward(std::span<const int32_t>(ids.data() + t, 1), true);
    logits.insert(logits.end(), part.begin(), part.end());
  }
  write_safetensors(
      out, {TensorToWrite{"logits", DType::F32, {T, V}, std::as_bytes(std::span<const float>(logits))}},
      {{"model", l.model->dir().string()}, {"prefill", std::to_string(prefill)}});
  fmt::print(stderr, "wrote logits [{}, {}] to {}\n", T, V, out);
  return 0;
}

int cmd_generate(const ModelOptions& o, int64_t max_new, bool print_ids) {
  const std::vector<int32_t> ids = parse_ids(o.ids);
  if (max_new < 0) fail("cli", "--max-new must be >= 0");
  Loaded l = load(o);
  Session s(l.model, l.config.scheduler.threads);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> out = generate_greedy(s, ids, max_new);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{}\n", fmt::join(out, " "));
  if (!print_ids) {
    fmt::print(stderr,
               "{} prompt + {} new tokens in {:.3f} s ({:.1f} tok/s); backends: dense={} experts={}\n",
               ids.size(), out.size(), sec, sec > 0 ? static_cast<double>(out.size()) / sec : 0.0,
               l.model->backends().dense->name(), l.model->backends().experts.front()->name());
  }
  return 0;
}

int cmd_inspect(const ModelOptions& o) {
  Loaded l = load(o);
  const ModelSpec& s = l.model->spec();
  const auto pc = l.model->param_counts();
  const int64_t kv_floats = s.kv_floats_per_token_per_layer();
  fmt::print("model:        {}\n", l.model->dir().string());
  fmt::print("family:       {} ({})\n", family_name(s.family), s.model_type);
  fmt::print("layers:       {} ({} with routed experts)\n", s.n_layers,
             std::count(s.moe_layer.begin(), s.moe_layer.end(), true));
  fmt::print("hidden:       {}   vocab: {}\n", s.hidden, s.vocab);
  fmt::print("attention:    {}  heads {}  kv heads {}\n", s.attention == AttentionKind::MLA ? "MLA" : "GQA",
             s.n_heads, s.n_kv_heads);
  fmt::print("experts:      {} routed, top-{}, {} shared, width {}\n", s.n_experts, s.top_k,
             s.n_shared_experts, s.moe_intermediate);
  fmt::print("parameters:   {} total = {} dense + {} routed experts\n", pc.dense + pc.routed, pc.dense,
             pc.routed);
  fmt::print("expert size:  {} parameters, {} bytes as stored\n", pc.per_expert, pc.per_expert_bytes);
  fmt::print("KV cache:     {} floats per token per layer = {} bytes per token (f32, all layers)\n",
             kv_floats, kv_floats * 4 * s.n_layers + (s.dsa ? s.index_head_dim * 4 * s.n_layers : 0));
  return 0;
}

}  // namespace strata::app
