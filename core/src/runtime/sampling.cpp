// Token sampling (greedy, temperature, top-k, top-p, min-p) over one row of logits.
#include "strata/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "strata/error.hpp"

namespace strata {

void check_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f)
    fail("sampling", "temperature {} is outside [0, 100]", p.temperature);
  if (p.top_k < 0) fail("sampling", "top_k {} must be >= 0 (0 = off)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("sampling", "top_p {} is outside (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("sampling", "min_p {} is outside [0, 1]", p.min_p);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed ? *p.seed : std::random_device{}()) {
  check_sampling_params(p_);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) fail("sampling", "no logits to sample from");
  if (p_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const auto n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  int32_t keep = n;
  if (p_.top_k > 0 && p_.top_k < n) {
    keep = p_.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  idx.resize(static_cast<size_t>(keep));
  // Softmax at temperature, in double for a stable tail.
  std::vector<double> prob(idx.size());
  const double m = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    prob[i] = std::exp((static_cast<double>(logits[idx[i]]) - m) / p_.temperature);
    sum += prob[i];
  }
  for (auto& v : prob) v /= sum;
  size_t cut = prob.size();
  if (p_.top_p < 1.0f) {
    double c = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      c += prob[i];
      if (c >= p_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0.0f) {
    const double floor = p_.min_p * prob[0];
    size_t k = 1;
    while (k < cut && prob[k] >= floor) ++k;
    cut = k;
  }
  double total = 0;
  for (size_t i = 0; i < cut; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  const double r = u(rng_);
  double c = 0;
  for (size_t i = 0; i < cut; ++i) {
    c += prob[i];
    if (r < c) return idx[i];
  }
  return idx[cut - 1];
}

}  // namespace strata
