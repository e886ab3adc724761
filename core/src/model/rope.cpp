// Rotary position frequencies: default and yarn, as transformers' rope init functions compute them (f32).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "ops.hpp"
#include "strata/dtype.hpp"

namespace strata::ops {
namespace {
double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// Round to the nearest bf16 / f16 value (ties to even), returned as f32 — what casting the buffer does.
float round_to(float f, const std::string& dtype) {
  if (dtype == "bf16") {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (dtype == "f16") return round_to_f16(f);
  return f;
}
}  // namespace

Rope::Rope(const RopeSpec& spec) : dim_(spec.rotary_dim) {
  const int64_t half = dim_ / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  const float base = static_cast<float>(spec.theta);
  // pos_freqs = base ** (arange(0, dim, 2).float() / dim), in f32.
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim_);
    pos_freq[i] = std::pow(base, e);
  }
  if (spec.type != "yarn") {
    for (int64_t i = 0; i < half; ++i) inv_freq_[i] = round_to(1.0f / pos_freq[i], spec.freq_dtype);
    return;
  }
  const double factor = spec.factor;
  auto correction_dim = [&](double n_rot) {
    return (static_cast<double>(dim_) *
            std::log(spec.original_max_position / (n_rot * 2 * std::numbers::pi))) /
           (2 * std::log(spec.theta));
  };
  double low = std::floor(correction_dim(spec.beta_fast));
  double high = std::ceil(correction_dim(spec.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim_ - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    float ramp = static_cast<float>((static_cast<double>(i) - low) / (high - low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extra = 1.0f - ramp;
    const float inv_extra = 1.0f / pos_freq[i];
    const float inv_inter = 1.0f / (static_cast<float>(factor) * pos_freq[i]);
    inv_freq_[i] = round_to(inv_inter * (1.0f - extra) + inv_extra * extra, spec.freq_dtype);
  }
  double af = spec.attention_factor;
  if (af == 0.0) {
    af = (spec.mscale != 0.0 && spec.mscale_all_dim != 0.0)
             ? yarn_mscale(factor, spec.mscale) / yarn_mscale(factor, spec.mscale_all_dim)
             : yarn_mscale(factor, 1.0);
  }
  attention_factor_ = static_cast<float>(af);
}

void Rope::angles(int64_t pos, float* cos_out, float* sin_out) const {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float a = inv_freq_[i] * p;  // f32 product, as the f32 matmul of inv_freq and positions
    cos_out[i] = static_cast<float>(std::cos(static_cast<double>(a))) * attention_factor_;
    sin_out[i] = static_cast<float>(std::sin(static_cast<double>(a))) * attention_factor_;
  }
}

}  // namespace strata::ops
