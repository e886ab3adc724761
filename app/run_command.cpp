// strata run (one prompt → streamed completion) and strata chat (interactive, chat template, Ctrl-C stops the
// answer).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "strata/error.hpp"

namespace strata::app {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
  g_interrupted = true;
}

// Ctrl-C sets a flag instead of ending the process; reads are not restarted, so a waiting getline returns.
void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

struct TurnStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  std::optional<StoreTelemetry> tiers;  // this turn's expert-tier counters (when the model has a store)
  double ttft_s = 0, total_s = 0;
  std::string finish;
  std::string text;  // the completion
  double decode_tok_s() const {
    const double d = total_s - ttft_s;
    return new_tokens > 1 && d > 0 ? static_cast<double>(new_tokens - 1) / d : 0.0;
  }
};

void print_stats(const TurnStats& s, const std::string& mode, const Model& m) {
  if (mode == "json") {
    nlohmann::json j = {{"prompt_tokens", s.prompt_tokens},
                        {"new_tokens", s.new_tokens},
                        {"ttft_s", s.ttft_s},
                        {"total_s", s.total_s},
                        {"decode_tok_per_s", s.decode_tok_s()},
                        {"prefill_tok_per_s", s.ttft_s > 0 ? s.prompt_tokens / s.ttft_s : 0.0},
                        {"finish_reason", s.finish},
                        {"dense_backend", std::string(m.backends().dense->name())},
                        {"expert_backend", std::string(m.backends().experts.front()->name())}};
    if (s.tiers) j["experts"] = telemetry_json(*s.tiers);
    fmt::print(stderr, "{}\n", j.dump());
    return;
  }
  std::string tiers;
  if (s.tiers && (s.tiers->vram_hits + s.tiers->cache_hits + s.tiers->disk_reads) > 0) {
    const auto& t = *s.tiers;
    tiers =
        fmt::format("; experts vram {} ram {} cache {} disk {} ({:.1f} MiB read)", t.vram_hits, t.ram_hits,
                    t.cache_hits, t.disk_reads, static_cast<double>(t.disk_bytes) / (1024.0 * 1024.0));
  }
  fmt::print(stderr, "[{} prompt tok, {} new tok, TTFT {:.3f} s, {:.1f} tok/s decode, {}; {} / {}{}]\n",
             s.prompt_tokens, s.new_tokens, s.ttft_s, s.decode_tok_s(), s.finish, m.backends().dense->name(),
             m.backends().experts.front()->name(), tiers);
}

// Feeds `ids` after what the session already holds (or from scratch when the session's history is not a
// prefix), then generates with streaming output. history: the ids the session has consumed.
TurnStats generate_turn(Session& session, std::vector<int32_t>& history, const std::vector<int32_t>& ids,
                        const Loaded& l, const GenOptions& g, bool print) {
  TurnStats st;
  st.prompt_tokens = static_cast<int64_t>(ids.size());
  size_t common = 0;
  while (common < history.size() && common < ids.size() && history[common] == ids[common]) ++common;
  if (common < history.size() || common == ids.size()) {
    session.reset();
    history.clear();
    common = 0;
  }
  const int64_t ctx = l.assets->context_length;
  if (ctx > 0 && static_cast<int64_t>(ids.size()) >= ctx) {
    fail("run", "the prompt has {} tokens but the model's context is {}", ids.size(), ctx);
  }
  const int64_t max_new =
      ctx > 0 ? std::min<int64_t>(g.max_new, ctx - static_cast<int64_t>(ids.size())) : g.max_new;
  Generation gen(l.assets->tokenizer, g.sampling(*l.assets), l.assets->eos_ids, g.stop, max_new);
  ExpertStore* store = l.model->expert_store();
  const StoreTelemetry before = store ? store->telemetry() : StoreTelemetry{};
  const auto t0 = Clock::now();
  g_interrupted = false;  // a Ctrl-C from here on (prefill included) stops this answer
  std::vector<float> logits =
      session.forward(std::span<const int32_t>(ids.data() + common, ids.size() - common), false);
  history = ids;
  st.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (;;) {
    if (g_interrupted) {
      gen.cancel();
      break;
    }
    const int32_t id = gen.step(logits);
    const std::string text = gen.take_text();
    if (print && !text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (id < 0 || gen.done()) break;
    logits = session.forward(std::span<const int32_t>(&id, 1), false);
    history.push_back(id);
  }
  st.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  st.new_tokens = static_cast<int64_t>(gen.ids().size());
  st.finish = gen.finish_reason();
  st.text = gen.text();
  if (store) {
    st.tiers = store->telemetry() - before;
    store->end_turn();
  }
  return st;
}

}  // namespace

SamplingParams GenOptions::sampling(const ModelAssets& a) const {
  SamplingParams p = a.defaults;
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (top_k) p.top_k = *top_k;
  if (min_p) p.min_p = *min_p;
  if (seed) p.seed = *seed;
  check_sampling_params(p);
  return p;
}

int cmd_run(const ModelOptions& o, const GenOptions& g, const std::string& prompt) {
  Loaded l = load(o, true);
  const Tokenizer& tok = l.assets->require_tokenizer();
  const std::vector<int32_t> ids = tok.encode(prompt, true);
  if (ids.empty()) fail("run", "--prompt encodes to no tokens");
  install_sigint();
  Session session(l.model, l.config.scheduler.threads);
  std::vector<int32_t> history;
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  const TurnStats st = generate_turn(session, history, ids, l, g, true);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_stats(st, g.stats, *l.model);
  return 0;
}

int cmd_chat(const ModelOptions& o, const GenOptions& g, const std::string& system) {
  Loaded l = load(o, true);
  const Tokenizer& tok = l.assets->require_tokenizer();
  if (!l.assets->chat_template)
    fail("chat", "{}: the model has no chat template (tokenizer_config.json chat_template)",
         l.model->dir().string());
  install_sigint();
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  Session session(l.model, l.config.scheduler.threads);
  std::vector<int32_t> history;
  nlohmann::json messages = nlohmann::json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  TurnStats last;
  if (tty)
    fmt::print(stderr,
               "strata chat — /reset clears the conversation, /stats shows the last turn, Ctrl-C stops an "
               "answer, Ctrl-D quits.\n");
  for (;;) {
    if (tty) fmt::print(stderr, "> ");
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt (the read fails with EINTR): a fresh prompt
        std::cin.clear();
        std::clearerr(stdin);
        fmt::print(stderr, "\n");
        continue;
      }
      break;
    }
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = nlohmann::json::array();
      if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
      session.reset();
      history.clear();
      fmt::print(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line == "/stats") {
      print_stats(last, g.stats, *l.model);
      fmt::print(stderr, "KV cache: {} tokens, {:.1f} KiB\n", session.n_past(), session.kv_bytes() / 1024.0);
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string rendered = l.assets->chat_template->render(messages, true);
    const std::vector<int32_t> ids = tok.encode(rendered, false);
    last = generate_turn(session, history, ids, l, g, true);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    // The answer so far (also when Ctrl-C cut it short) becomes part of the conversation.
    messages.push_back({{"role", "assistant"}, {"content", last.text}});
    if (!g.stats.empty() || last.finish == "cancelled") print_stats(last, g.stats, *l.model);
  }
  return 0;
}

}  // namespace strata::app
