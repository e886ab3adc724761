// bench_e2e: end-to-end prefill and greedy decode of a model folder under a runtime config — median tok/s,
// time to first token, peak RSS next to the model's dense and routed bytes; optional JSON (bench input for
// the expert tiers, with the synthetic GLM-5 containers of make_synthetic_model).
//
// Each repetition is a fresh Session: one prefill batch of --prefill random ids (fixed seed), the argmax of
// its last logits as the first token, then --decode single-token steps, each fed the previous argmax. The
// first --warmup repetitions (cold: the weights' pages are read from the file) are reported apart and left
// out of the medians.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e.hpp"
#include "strata/error.hpp"
#include "strata/model.hpp"
#include "strata/registry.hpp"
#include "strata/runtime_config.hpp"
#include "strata/safetensors.hpp"

using namespace strata;
using namespace strata::app;
using nlohmann::ordered_json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double mib(int64_t b) {
  return static_cast<double>(b) / 1048576.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_e2e: end-to-end prefill / decode tok/s, TTFT and peak RSS of a model folder"};
  std::string model_dir, config, json_out;
  int prefill = 64, decode = 32, reps = 3, warmup = 1, threads = -1;
  uint64_t seed = 1;
  app.add_option("--model", model_dir, "model folder (Hugging Face or strata container)")->required();
  app.add_option("--config", config, "runtime config YAML (default: none = auto)");
  app.add_option("--prefill", prefill, "prompt tokens, fed as one batch")->capture_default_str();
  app.add_option("--decode", decode, "greedy decode steps after the prefill")->capture_default_str();
  app.add_option("--reps", reps, "measured repetitions (medians)")->capture_default_str();
  app.add_option("--warmup", warmup, "repetitions run first and left out of the medians")
      ->capture_default_str();
  app.add_option("--threads", threads, "threads (-1 = the config's scheduler.threads, 0 = all)")
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the random prompt ids")->capture_default_str();
  app.add_option("--json", json_out, "also write the figures to this JSON file (atomically)");
  bool ab_overlap = false;
  app.add_flag("--ab-overlap", ab_overlap,
               "alternate scheduler.overlap on / off between repetitions (same process, same placement) and "
               "report the overlap efficiency: MoE layer time with overlap / max(CPU rows, GPU issue + take) "
               "without");
  CLI11_PARSE(app, argc, argv);
  try {
    // The model and its backends from the config, as the strata commands load them (app/commands.cpp load()).
    RuntimeConfig cfg = config.empty() ? RuntimeConfig{} : load_runtime_config(config);
    if (threads >= 0) cfg.scheduler.threads = threads;
    PluginRegistry reg(plugin_search_path(cfg.plugins.path));
    const auto t_load = Clock::now();
    LoadOptions lo;
    lo.store = StoreOptions::from(cfg);  // the expert tiers, as the strata commands load them
    Backends backends = choose_backends(reg, cfg);
    for (const auto& line : backends.approximations) fmt::print("warning: {}\n", line);
    std::shared_ptr<Model> model = Model::load(model_dir, std::move(backends), lo);
    ExpertStore* store = model->expert_store();
    if (store) fmt::print("{}\n", store->plan_text());
    const double load_s = seconds_since(t_load);
    const int64_t rss_loaded = proc_status_bytes("VmRSS");
    const ModelSpec& spec = model->spec();
    const auto pc = model->param_counts();
    std::vector<std::string> expert_backends;
    for (const auto& b : model->backends().experts) expert_backends.emplace_back(b->name());

    fmt::print("model {} ({}, {} layers, {} experts top-{}); dense={} experts={}; threads {}\n", model_dir,
               spec.model_type, spec.n_layers, spec.n_experts, spec.top_k, model->backends().dense->name(),
               fmt::join(expert_backends, ","), cfg.scheduler.threads);
    fmt::print(
        "weights: dense {:.1f} MiB ({} parameters), routed {:.1f} MiB ({} parameters, {:.2f} MiB per "
        "expert); loaded in {:.2f} s, RSS after load {:.1f} MiB\n",
        mib(static_cast<int64_t>(pc.dense_bytes)), pc.dense, mib(static_cast<int64_t>(pc.routed_bytes)),
        pc.routed, mib(static_cast<int64_t>(pc.per_expert_bytes)), load_s, mib(rss_loaded));

    E2eOptions eo;
    eo.prefill = prefill;
    eo.decode = decode;
    eo.reps = reps;
    eo.warmup = warmup;
    eo.seed = seed;
    eo.threads = cfg.scheduler.threads;
    eo.ab_overlap = ab_overlap;
    const E2eResult res = run_e2e(model, eo, [&](size_t r, const E2eRep& rep) {
      fmt::print("{} {}{}: TTFT {:.1f} ms, prefill {:.1f} tok/s, decode {:.2f} tok/s ({:.1f} ms/token)\n",
                 rep.warmup ? "warm-up" : "rep", rep.warmup ? r + 1 : r - warmup + 1,
                 ab_overlap ? (rep.overlap ? " (overlap on)" : " (overlap off)") : "", rep.ttft_s * 1e3,
                 prefill / rep.prefill_s, decode > 0 ? decode / rep.decode_s : 0.0,
                 decode > 0 ? rep.decode_s / decode * 1e3 : 0.0);
      if (store && decode > 0) {
        const StoreTelemetry& t = rep.tel;
        const double n = decode;
        fmt::print(
            "  decode per token: MoE layers {:.2f} ms (CPU rows {:.2f} ms starting {:.3f} ms and ending "
            "{:.3f} ms "
            "into the layers, GPU group issued {:.3f} ms and taken {:.3f} ms into them; "
            "GPU issue {:.2f} ms, GPU take wait {:.2f} ms, disk wait {:.2f} ms); hits vram {} ram {} cache "
            "{} "
            "disk {}; {:.1f} MiB read; prefetch {} read ahead, recall {:.2f}\n",
            t.layer_s / n * 1e3, t.cpu_rows_s / n * 1e3, t.cpu_start_s / n * 1e3, t.cpu_end_s / n * 1e3,
            t.gpu_issued_s / n * 1e3, t.gpu_done_s / n * 1e3, t.gpu_issue_s / n * 1e3, t.take_s / n * 1e3,
            t.disk_wait_s / n * 1e3, t.vram_hits, t.ram_hits, t.cache_hits, t.disk_reads,
            static_cast<double>(t.disk_bytes) / (1024.0 * 1024.0), t.prefetch_reads, t.prefetch_recall());
      }
    });
    const std::vector<E2eRep>& runs = res.runs;
    const bool same_tokens = res.same_tokens;
    const size_t kv_bytes = res.kv_bytes;
    if (ab_overlap) reps *= 2;  // reps of each mode

    // Overlap efficiency (per decode token, medians over each mode's repetitions).
    double eff = 0, ab_on_ms = 0, ab_cpu_ms = 0, ab_gpu_ms = 0, ab_off_ms = 0;
    if (ab_overlap && decode > 0) {
      std::vector<double> on, off, cpu, gpu, on_start, on_cpu, on_end, on_gpu_done, on_issued;
      for (int r = warmup; r < warmup + reps; ++r) {
        const E2eRep& rep = runs[static_cast<size_t>(r)];
        const StoreTelemetry& t = rep.tel;
        const double n = decode;
        if (rep.overlap) {
          on.push_back(t.layer_s / n * 1e3);
          on_start.push_back(t.cpu_start_s / n * 1e3);
          on_cpu.push_back(t.cpu_rows_s / n * 1e3);
          on_end.push_back(t.cpu_end_s / n * 1e3);
          on_gpu_done.push_back(t.gpu_done_s / n * 1e3);
          on_issued.push_back(t.gpu_issued_s / n * 1e3);
        } else {
          off.push_back(t.layer_s / n * 1e3);
          cpu.push_back(t.cpu_rows_s / n * 1e3);
          gpu.push_back((t.gpu_issue_s + t.take_s) / n * 1e3);
        }
      }
      ab_on_ms = median(on);
      ab_off_ms = median(off);
      ab_cpu_ms = median(cpu);
      ab_gpu_ms = median(gpu);
      eff = ab_on_ms / std::max({ab_cpu_ms, ab_gpu_ms, 1e-9});
      fmt::print(
          "overlap A/B, MoE layers per decode token (medians of {} each): overlap on {:.3f} ms; off {:.3f} "
          "ms = "
          "CPU rows {:.3f} ms, GPU issue + take {:.3f} ms, rest; overlap efficiency {:.3f} (on / max(CPU, "
          "GPU)); with overlap the CPU rows take {:.3f} ms, starting {:.3f} ms and ending {:.3f} ms into the "
          "layers, the GPU groups issued {:.3f} ms and taken {:.3f} ms into them\n",
          reps / 2, ab_on_ms, ab_off_ms, ab_cpu_ms, ab_gpu_ms, eff, median(on_cpu), median(on_start),
          median(on_end), median(on_issued), median(on_gpu_done));
    }

    const int64_t hwm = proc_status_bytes("VmHWM"), rss = proc_status_bytes("VmRSS");
    const double ttft_ms = res.ttft_ms, pre = res.prefill_tok_s, dec = res.decode_tok_s;
    fmt::print(
        "median of {}{}: prefill {} tokens {:.1f} tok/s, decode {} tokens {:.2f} tok/s, TTFT {:.1f} ms\n",
        reps, ab_overlap ? " (overlap on and off pooled)" : "", prefill, pre, decode, dec, ttft_ms);
    fmt::print(
        "memory: peak RSS (VmHWM) {:.1f} MiB, RSS now {:.1f} MiB; weights dense {:.1f} + routed {:.1f} = "
        "{:.1f} MiB; KV cache {:.1f} MiB\n",
        mib(hwm), mib(rss), mib(static_cast<int64_t>(pc.dense_bytes)),
        mib(static_cast<int64_t>(pc.routed_bytes)),
        mib(static_cast<int64_t>(pc.dense_bytes + pc.routed_bytes)), mib(static_cast<int64_t>(kv_bytes)));
    fmt::print("greedy tokens {}: {}\n",
               same_tokens ? "(identical in every repetition)" : "(DIFFER between repetitions)",
               fmt::join(runs.back().tokens, ","));

    if (!json_out.empty()) {
      ordered_json per_rep = ordered_json::array();
      for (size_t r = 0; r < runs.size(); ++r) {
        const E2eRep& rep = runs[r];
        per_rep.push_back(
            {{"warmup", static_cast<int>(r) < warmup},
             {"overlap", rep.overlap},
             {"ttft_ms", rep.ttft_s * 1e3},
             {"prefill_s", rep.prefill_s},
             {"decode_s", rep.decode_s},
             {"prefill_tok_s", prefill / rep.prefill_s},
             {"decode_tok_s", decode > 0 ? decode / rep.decode_s : 0.0},
             {"decode_moe_layers_s", rep.tel.layer_s},
             {"decode_cpu_rows_s", rep.tel.cpu_rows_s},
             {"decode_gpu_take_wait_s", rep.tel.take_s},
             {"decode_cpu_start_s", rep.tel.cpu_start_s},
             {"decode_cpu_end_s", rep.tel.cpu_end_s},
             {"decode_gpu_issued_s", rep.tel.gpu_issued_s},
             {"decode_gpu_done_s", rep.tel.gpu_done_s},
             {"decode_disk_wait_s", rep.tel.disk_wait_s},
             {"decode_hits", {rep.tel.vram_hits, rep.tel.ram_hits, rep.tel.cache_hits, rep.tel.disk_reads}},
             {"decode_disk_bytes", rep.tel.disk_bytes}});
      }
      const ordered_json j = {
          {"model", model_dir},
          {"model_type", spec.model_type},
          {"config", config},
          {"backends",
           {{"dense", std::string(model->backends().dense->name())}, {"experts", expert_backends}}},
          {"threads", cfg.scheduler.threads},
          {"prefill_tokens", prefill},
          {"decode_tokens", decode},
          {"reps", reps},  // with --ab-overlap: both modes, alternating (overlap_ab has the medians per mode)
          {"warmup", warmup},
          {"seed", seed},
          {"load_s", load_s},
          {"prefill_tok_s_median", pre},
          {"decode_tok_s_median", dec},
          {"ttft_ms_median", ttft_ms},
          {"peak_rss_bytes", hwm},
          {"rss_after_load_bytes", rss_loaded},
          {"rss_end_bytes", rss},
          {"dense_bytes", pc.dense_bytes},
          {"routed_bytes", pc.routed_bytes},
          {"per_expert_bytes", pc.per_expert_bytes},
          {"dense_params", pc.dense},
          {"routed_params", pc.routed},
          {"kv_bytes", kv_bytes},
          {"tokens_identical", same_tokens},
          {"overlap_ab", ab_overlap ? ordered_json{{"on_layer_ms", ab_on_ms},
                                                   {"off_layer_ms", ab_off_ms},
                                                   {"off_cpu_rows_ms", ab_cpu_ms},
                                                   {"off_gpu_ms", ab_gpu_ms},
                                                   {"efficiency", eff}}
                                    : ordered_json()},
          {"tokens", runs.back().tokens},
          {"runs", per_rep}};
      const std::string text = j.dump(2) + "\n";
      write_file_atomic(json_out, std::as_bytes(std::span<const char>(text.data(), text.size())));
      fmt::print("wrote {}\n", json_out);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: {}\n", e.what());
    return 1;
  }
}
