// int4 reference formats (byte layout, rounding, round trips, grid values, zero and tail groups); f16
// rounding.
#include <cmath>
#include <cstring>

#include "strata/dtype.hpp"
#include "strata/error.hpp"
#include "strata/quant.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

TEST_CASE("byte layout: low nibble = even column, nibble = q + 8, one scale per 64 inputs") {
  // Row 0: absmax 7 -> s = 1; values -7..7 land on q exactly.
  std::vector<float> w = {-7, 1, 2, -3, 7, 0};  // 1 x 6
  const auto q = quantize_q4(w, 1, 6, WeightFormat::Q4_G64);
  REQUIRE(q.packed.size() == 3);
  REQUIRE(q.scales.size() == 1);
  CHECK(q.scales[0] == 1.0f);
  CHECK(q.packed[0] == ((1 + 8) << 4 | (-7 + 8)));
  CHECK(q.packed[1] == ((-3 + 8) << 4 | (2 + 8)));
  CHECK(q.packed[2] == ((0 + 8) << 4 | (7 + 8)));
  // Odd column count: the unused high nibble is 8 (q = 0).
  std::vector<float> w3 = {7, -7, 3.5f};
  const auto q3 = quantize_q4(w3, 1, 3, WeightFormat::Q4_ROW);
  CHECK(q3.packed.size() == 2);
  CHECK((q3.packed[1] >> 4) == 8);
  // Round half to even: 3.5 -> 4, 2.5 -> 2 (s = 1).
  CHECK((q3.packed[1] & 0x0f) == 4 + 8);
  std::vector<float> w4 = {7, 2.5f};
  CHECK((quantize_q4(w4, 1, 2, WeightFormat::Q4_ROW).packed[0] >> 4) == 2 + 8);
}

TEST_CASE("values on the grid survive exactly; zero groups; tail groups") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> qd(-7, 7);
  std::uniform_real_distribution<float> sd(0.01f, 2.0f);
  for (int64_t cols : {64, 130, 200, 63, 1}) {
    const int64_t rows = 5, ng = (cols + 63) / 64;
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t g = 0; g < ng; ++g) {
        const float s = o == 2 ? 0.0f : sd(rng);  // row 2 is all zeros
        const int64_t c1 = std::min(cols, (g + 1) * 64);
        for (int64_t c = g * 64; c < c1; ++c) w[o * cols + c] = static_cast<float>(qd(rng)) * s;
        w[o * cols + g * 64] = 7 * s;  // pin the group's absmax so the scale is s (up to rounding)
      }
    }
    CAPTURE(cols);
    const auto q = quantize_q4(w, rows, cols, WeightFormat::Q4_G64);
    CHECK(q.scales.size() == static_cast<size_t>(rows * ng));
    std::vector<float> back(w.size());
    dequantize_q4(q.view(), back.data());
    for (size_t i = 0; i < w.size(); ++i) {
      CHECK(std::fabs(back[i] - w[i]) <= 1e-6f * std::fabs(w[i]));
    }
    for (int64_t c = 0; c < cols; ++c) CHECK(back[2 * cols + c] == 0.0f);
    CHECK(q.scales[2 * ng] == 1e-8f);  // all-zero group: the floor scale
    // Quantizing the dequantized values is a fixed point (bit for bit).
    const auto q2 = quantize_q4(back, rows, cols, WeightFormat::Q4_G64);
    CHECK(q2.packed == q.packed);
  }
}

TEST_CASE("round trip error is bounded by half a step; Q4_ROW uses one scale per row") {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1);
  const int64_t rows = 7, cols = 300;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = d(rng);
  for (WeightFormat f : {WeightFormat::Q4_ROW, WeightFormat::Q4_G64}) {
    const auto q = quantize_q4(w, rows, cols, f);
    CHECK(q.scales.size() == static_cast<size_t>(rows * q4_scales_per_row(f, cols)));
    std::vector<float> back(w.size());
    dequantize_q4(q.view(), back.data());
    const int64_t ng = q4_scales_per_row(f, cols);
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t c = 0; c < cols; ++c) {
        const float s = q.scales[o * ng + (ng == 1 ? 0 : c / 64)];
        CHECK(std::fabs(back[o * cols + c] - w[o * cols + c]) <= 0.5f * s * 1.0001f);
      }
    }
  }
  CHECK_THROWS_WITH_AS(quantize_q4(w, rows, cols, WeightFormat::BF16),
                       doctest::Contains("not an int4 format"), Error);
  CHECK(parse_quant_name("q4_g64") == WeightFormat::Q4_G64);
  CHECK(parse_quant_name("q4_row") == WeightFormat::Q4_ROW);
  CHECK(!parse_quant_name("none").has_value());
  CHECK_THROWS_WITH_AS(parse_quant_name("q3_k"), doctest::Contains("unknown quantization 'q3_k'"), Error);
}

TEST_CASE("round_to_f16, f32_to_f16_bits: the nearest binary16 value, as the compiler's float16 cast gives") {
  using strata::round_to_f16;
  CHECK(round_to_f16(1.0f) == 1.0f);
  CHECK(round_to_f16(65504.0f) == 65504.0f);
  CHECK(round_to_f16(65519.99f) == 65504.0f);
  CHECK(std::isinf(round_to_f16(65520.0f)));
  CHECK(round_to_f16(-65520.0f) == -INFINITY);
  CHECK(round_to_f16(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(round_to_f16(std::ldexp(1.0f, -25)) == 0.0f);                   // a tie: to even (zero)
  CHECK(round_to_f16(std::ldexp(3.0f, -25)) == std::ldexp(1.0f, -23));  // a tie: to even (2 steps)
  CHECK(std::signbit(round_to_f16(-1e-30f)));
  CHECK(std::isnan(round_to_f16(NAN)));
  CHECK(round_to_f16(1.0f + std::ldexp(1.0f, -11)) == 1.0f);                             // tie, even stays
  CHECK(round_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 1.0f + std::ldexp(1.0f, -9));  // tie, odd rounds up
#if defined(__FLT16_MAX__)
  // Against the compiler's own conversion, on every 251st bit pattern (17 million values of every class).
  uint64_t mismatches = 0;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 251) {
    const auto bits = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &bits, 4);
    const _Float16 h = static_cast<_Float16>(f);
    const float want = static_cast<float>(h);
    const float got = round_to_f16(f);
    if (std::isnan(want) ? !std::isnan(got) : std::memcmp(&want, &got, 4) != 0) ++mismatches;
    uint16_t want_bits;
    std::memcpy(&want_bits, &h, 2);
    if (!std::isnan(want) && strata::f32_to_f16_bits(f) != want_bits) ++mismatches;
  }
  CHECK(mismatches == 0);
#endif
}
