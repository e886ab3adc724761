// strata bench: prefill and decode speed of a model under a runtime config on this machine (what
// bench/bench_e2e measures, for users): medians of repetitions, TTFT, the expert tiers' counters per decode
// token, peak RSS.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "e2e.hpp"

namespace strata::app {

int cmd_bench(const ModelOptions& o, const BenchOptions& b) {
  Loaded l = load(o);
  const Model& m = *l.model;
  std::vector<std::string> experts;
  for (const auto& e : m.backends().experts) experts.emplace_back(e->name());
  E2eOptions eo = b.run;
  eo.threads = l.config.scheduler.threads;
  const bool text = !b.json;
  if (text) {
    fmt::print("{} ({}, {} layers); dense {}, experts (in preference order) {}; {} threads\n",
               o.model.empty() ? kBundledModel : o.model, m.spec().model_type, m.spec().n_layers,
               m.backends().dense->name(), fmt::join(experts, ","),
               eo.threads == 0 ? std::string("all") : std::to_string(eo.threads));
    fmt::print("{} random prompt tokens as one batch, then {} greedy steps; {} warm-up + {} repetitions\n",
               eo.prefill, eo.decode, eo.warmup, eo.reps);
  }
  const E2eResult res = run_e2e(l.model, eo, [&](size_t r, const E2eRep& rep) {
    if (!text) return;
    fmt::print("{} {}: TTFT {:.1f} ms, prefill {:.1f} tok/s, decode {:.2f} tok/s\n",
               rep.warmup ? "warm-up" : "rep", rep.warmup ? r + 1 : r + 1 - eo.warmup, rep.ttft_s * 1e3,
               eo.prefill / rep.prefill_s, eo.decode > 0 ? eo.decode / rep.decode_s : 0.0);
  });
  // The tier counters of the measured repetitions, per decode token.
  StoreTelemetry tel;
  int measured = 0;
  for (const E2eRep& rep : res.runs) {
    if (rep.warmup) continue;
    tel = tel + rep.tel;
    ++measured;
  }
  const double per = std::max(1.0, static_cast<double>(measured) * eo.decode);
  const int64_t hwm = proc_status_bytes("VmHWM");
  const auto pc = m.param_counts();
  if (!text) {
    nlohmann::json j = {{"model", o.model.empty() ? kBundledModel : o.model},
                        {"dense", std::string(m.backends().dense->name())},
                        {"experts", experts},
                        {"threads", eo.threads},
                        {"prefill_tokens", eo.prefill},
                        {"decode_tokens", eo.decode},
                        {"reps", eo.reps},
                        {"prefill_tok_s", res.prefill_tok_s},
                        {"decode_tok_s", res.decode_tok_s},
                        {"ttft_ms", res.ttft_ms},
                        {"tokens_identical", res.same_tokens},
                        {"peak_rss_bytes", hwm},
                        {"kv_bytes", res.kv_bytes},
                        {"decode_telemetry", telemetry_json(tel)}};
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("median: prefill {:.1f} tok/s, decode {:.2f} tok/s, TTFT {:.1f} ms; greedy tokens {}\n",
             res.prefill_tok_s, res.decode_tok_s, res.ttft_ms,
             res.same_tokens ? "identical in every repetition" : "DIFFER between repetitions");
  if (m.expert_store() != nullptr && eo.decode > 0) {
    fmt::print(
        "per decode token: MoE layers {:.2f} ms (CPU rows {:.2f} ms, GPU take wait {:.2f} ms, disk wait "
        "{:.2f} "
        "ms); expert hits vram {:.1f}, ram {:.1f}, cache {:.1f}, disk {:.1f}; {:.2f} MiB read\n",
        tel.layer_s / per * 1e3, tel.cpu_rows_s / per * 1e3, tel.take_s / per * 1e3,
        tel.disk_wait_s / per * 1e3, tel.vram_hits / per, tel.ram_hits / per, tel.cache_hits / per,
        tel.disk_reads / per, static_cast<double>(tel.disk_bytes) / per / 1048576.0);
  }
  fmt::print("memory: peak RSS {:.1f} MiB; weights dense {:.1f} + routed {:.1f} MiB; KV cache {:.2f} MiB\n",
             static_cast<double>(hwm) / 1048576.0, static_cast<double>(pc.dense_bytes) / 1048576.0,
             static_cast<double>(pc.routed_bytes) / 1048576.0, static_cast<double>(res.kv_bytes) / 1048576.0);
  return 0;
}

}  // namespace strata::app
