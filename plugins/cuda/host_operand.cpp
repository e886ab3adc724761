// The exact tensor-core operand's token table, encoded on the host (host_operand.hpp): the arithmetic of the
// device's encode_i8_unit (kernels/encode_i8.cuh) in exactly rounded IEEE steps, so the bytes are the same.
#include "host_operand.hpp"

#include <cmath>
#include <cstring>

#include "kernels/work.hpp"

namespace strata_cuda {
namespace {

// The column stored at position c of a plane row of kp bytes (device_util.cuh's i8_pos, the same formula).
int64_t i8_pos_host(int64_t c, int64_t kp) {
  const int64_t in16 = (c & 8) | ((c & 1) << 2) | ((c >> 1) & 3);
  const int64_t unit = c & ~int64_t{127};
  if (unit + 128 > kp) return (c & ~int64_t{15}) | in16;
  return unit | (((c >> 4) & 3) << 5) | (((c >> 6) & 1) << 4) | in16;
}

// v 2^k rounded once to f32, as ldexpf does: |v 2^k| < 2^30 here and k <= 178, so a product by 2^127 first
// (exact: the magnitude grows and stays normal) and then by the rest (one rounding, where the result is
// subnormal) gives the correctly rounded value.
float scale_pow2(float v, int k) {
  if (k > 127) return v * std::ldexp(1.0f, 127) * std::ldexp(1.0f, k - 127);
  return v * std::ldexp(1.0f, k);
}

// Round half to even to an integer, for |s| < 2^30 (the device's __float2int_rn): the double sum is rounded
// to an integer by the addition itself (1.5 * 2^52 puts the units digit at the last mantissa bit).
int32_t round_half_even(float s) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double t = static_cast<double>(s) + kMagic;  // (IEEE arithmetic: no -ffast-math here)
  return static_cast<int32_t>(t - kMagic);
}

}  // namespace

uint64_t token_table_bytes(int64_t n_rows, int64_t kp) {
  const auto tokens = static_cast<uint64_t>(n_rows + 1);
  return tokens * kI8Planes * static_cast<uint64_t>(kp) + tokens * static_cast<uint64_t>(kp / kColPad) * 4;
}

void encode_token_table(const float* x, int64_t n_rows, int64_t cols, int64_t ld_x, int64_t kp,
                        const uint8_t* used, uint8_t* dst) {
  const int64_t n_groups = kp / kColPad;
  float* mult = reinterpret_cast<float*>(dst + static_cast<uint64_t>(n_rows + 1) * kI8Planes * kp);
  // The zero token: digits and multipliers 0 (the items' tokens past their rows).
  std::memset(dst + static_cast<uint64_t>(n_rows) * kI8Planes * kp, 0, static_cast<size_t>(kI8Planes * kp));
  std::memset(mult + n_rows * n_groups, 0, static_cast<size_t>(n_groups) * 4);
  float v[kColPad];
  for (int64_t t = 0; t < n_rows; ++t) {
    if (used != nullptr && used[t] == 0) continue;
    const float* row = x + t * ld_x;
    uint8_t* planes = dst + static_cast<uint64_t>(t) * kI8Planes * kp;
    for (int64_t grp = 0; grp < n_groups; ++grp) {
      const int64_t c0 = grp * kColPad;
      bool bad = false;
      float amax = 0.0f;
      for (int i = 0; i < kColPad; ++i) {
        v[i] = c0 + i < cols ? row[c0 + i] : 0.0f;
        bad = bad || !std::isfinite(v[i]);
        amax = std::fmax(amax, std::fabs(v[i]));
      }
      int e = 0;
      if (!bad && amax > 0.0f) (void)std::frexp(amax, &e);  // amax = f 2^e, f in [0.5, 1)
      for (int i = 0; i < kColPad; ++i) {
        int32_t m = bad ? 0 : round_half_even(scale_pow2(v[i], 30 - e));
        const int64_t at = i8_pos_host(c0 + i, kp);
        for (int p = 0; p < kI8Planes; ++p) {
          const int32_t d = p + 1 < kI8Planes ? static_cast<int8_t>(static_cast<uint8_t>(m & 0xFF)) : m;
          planes[p * kp + at] = static_cast<uint8_t>(d);
          m = (m - d) >> 8;  // exact: m - d is a multiple of 256
        }
      }
      float mu = std::ldexp(1.0f, e - 34);
      if (bad) {
        const uint32_t nan = 0x7fc00000u;
        std::memcpy(&mu, &nan, 4);
      }
      mult[t * n_groups + grp] = mu;
    }
  }
}

}  // namespace strata_cuda
