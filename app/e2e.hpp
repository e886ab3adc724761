// The end-to-end measurement shared by `strata bench` and bench/bench_e2e: repetitions of one prefill batch
// of random ids and greedy decode steps, each in a fresh Session, with the expert tiers' counters per
// repetition.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/expert_store.hpp"
#include "strata/model.hpp"

namespace strata::app {

struct E2eOptions {
  int prefill = 64;  // prompt tokens, one batch
  int decode = 32;   // greedy steps after it
  int reps = 3;      // measured repetitions (with ab_overlap: of each mode)
  int warmup = 1;    // repetitions run first and left out of the medians
  uint64_t seed = 1;
  int threads = 0;          // Session threads (0 = all)
  bool ab_overlap = false;  // alternate scheduler overlap on (even repetitions) and off
};

struct E2eRep {
  bool warmup = false;
  bool overlap = true;
  double ttft_s = 0;     // Session construction + prefill + argmax
  double prefill_s = 0;  // the prefill forward alone
  double decode_s = 0;   // the decode steps
  std::vector<int32_t> tokens;
  StoreTelemetry tel;  // the decode steps' expert-tier counters
};

struct E2eResult {
  std::vector<E2eRep> runs;  // warm-ups first
  size_t kv_bytes = 0;       // of the last Session
  bool same_tokens = true;   // every repetition generated the same tokens
  // Medians over the measured repetitions.
  double ttft_ms = 0, prefill_tok_s = 0, decode_tok_s = 0;
};

// --prefill ids drawn from the seed (splitmix64), the same for every repetition and run.
std::vector<int32_t> random_prompt(uint64_t seed, int n, int64_t vocab);

double median(std::vector<double> v);

// A field of /proc/self/status in bytes (VmHWM = peak resident set, VmRSS = current); -1 when absent.
int64_t proc_status_bytes(const std::string& key);

// Runs o.warmup + o.reps repetitions (twice o.reps with ab_overlap); on_rep(index, rep) after each.
E2eResult run_e2e(const std::shared_ptr<Model>& model, const E2eOptions& o,
                  const std::function<void(size_t, const E2eRep&)>& on_rep);

}  // namespace strata::app
