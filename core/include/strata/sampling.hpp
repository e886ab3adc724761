// Token sampling: greedy, temperature, top-k, top-p, min-p, with a seeded generator.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;      // <= 0 means greedy (argmax, first maximum wins)
  int32_t top_k = 0;             // 0 = off
  float top_p = 1.0f;            // 1 = off
  float min_p = 0.0f;            // 0 = off; keeps tokens with p >= min_p · p_max
  std::optional<uint64_t> seed;  // nullopt = a random seed
};

// Draws one id from logits. Filters apply in llama.cpp's order: top-k, temperature softmax, top-p, min-p.
// With a seed the draws are reproducible (same build, same logits → same ids). Not thread-safe; one per
// sequence.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Validates ranges; errors name the parameter and the accepted range.
void check_sampling_params(const SamplingParams& p);

}  // namespace strata
