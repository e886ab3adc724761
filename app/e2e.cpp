// The end-to-end measurement shared by `strata bench` and bench/bench_e2e (app/e2e.hpp).
#include "e2e.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>

#include "strata/error.hpp"

namespace strata::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<int32_t> random_prompt(uint64_t seed, int n, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(splitmix64(seed) % static_cast<uint64_t>(vocab));
  return ids;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;  // "...  kB"
  }
  return -1;
}

E2eResult run_e2e(const std::shared_ptr<Model>& model, const E2eOptions& o,
                  const std::function<void(size_t, const E2eRep&)>& on_rep) {
  if (o.prefill < 1 || o.decode < 0 || o.reps < 1 || o.warmup < 0)
    fail("cli", "need --prefill >= 1, --decode >= 0, --reps >= 1, --warmup >= 0");
  ExpertStore* store = model->expert_store();
  if (o.ab_overlap && store == nullptr) fail("cli", "--ab-overlap needs routed experts (an expert store)");
  const std::vector<int32_t> ids = random_prompt(o.seed, o.prefill, model->spec().vocab);
  const int total = o.warmup + (o.ab_overlap ? 2 : 1) * o.reps;
  E2eResult res;
  for (int r = 0; r < total; ++r) {
    E2eRep rep;
    rep.warmup = r < o.warmup;
    // A/B: overlap on in even repetitions, off in odd ones (so drifts of the machine hit both alike).
    rep.overlap = !o.ab_overlap || r % 2 == 0;
    if (o.ab_overlap) store->set_overlap(rep.overlap);
    const auto t0 = Clock::now();
    Session s(model, o.threads);
    const auto t1 = Clock::now();
    int32_t tok = argmax(s.forward(ids, false));
    rep.ttft_s = seconds_since(t0);
    rep.prefill_s = seconds_since(t1);
    rep.tokens.push_back(tok);
    const StoreTelemetry before = store ? store->telemetry() : StoreTelemetry{};
    const auto t2 = Clock::now();
    for (int i = 0; i < o.decode; ++i) {
      tok = argmax(s.forward(std::span<const int32_t>(&tok, 1), false));
      rep.tokens.push_back(tok);
    }
    rep.decode_s = seconds_since(t2);
    if (store) {
      rep.tel = store->telemetry() - before;
      store->end_turn();
    }
    res.kv_bytes = s.kv_bytes();
    on_rep(res.runs.size(), rep);
    res.runs.push_back(std::move(rep));
  }
  std::vector<double> ttft, pre, dec;
  for (const E2eRep& rep : res.runs) {
    res.same_tokens = res.same_tokens && rep.tokens == res.runs.front().tokens;
    if (rep.warmup) continue;
    ttft.push_back(rep.ttft_s * 1e3);
    pre.push_back(o.prefill / rep.prefill_s);
    if (o.decode > 0) dec.push_back(o.decode / rep.decode_s);
  }
  res.ttft_ms = median(ttft);
  res.prefill_tok_s = median(pre);
  res.decode_tok_s = median(dec);
  return res;
}

}  // namespace strata::app
