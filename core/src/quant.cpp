// Reference int4 quantization and dequantization (the ground truth the kernels are tested against).
#include "strata/quant.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>

#include "strata/error.hpp"

namespace strata {

QuantizedMatrix quantize_q4(std::span<const float> w, int64_t rows, int64_t cols, WeightFormat format) {
  if (format != WeightFormat::Q4_ROW && format != WeightFormat::Q4_G64) {
    fail("quant", "quantize_q4: {} is not an int4 format", weight_format_name(format));
  }
  STRATA_CHECK(static_cast<int64_t>(w.size()) == rows * cols);
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  const int64_t rb = q4_row_bytes(cols), ng = q4_scales_per_row(format, cols);
  const int64_t group = format == WeightFormat::Q4_G64 ? kQ4Group : cols;
  q.packed.assign(static_cast<size_t>(rows * rb), 0x88);  // q = 0 in both nibbles
  q.scales.resize(static_cast<size_t>(rows * ng));
  STRATA_CHECK(std::fegetround() == FE_TONEAREST);
  for (int64_t o = 0; o < rows; ++o) {
    const float* row = w.data() + o * cols;
    uint8_t* dst = q.packed.data() + o * rb;
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = g * group, c1 = std::min(cols, c0 + group);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = std::max(amax / 7.0f, 1e-8f);
      q.scales[static_cast<size_t>(o * ng + g)] = s;
      for (int64_t c = c0; c < c1; ++c) {
        const float r = std::nearbyint(row[c] / s);
        const int qv = static_cast<int>(std::clamp(r, -8.0f, 7.0f));
        const auto nib = static_cast<uint8_t>(qv + 8);
        uint8_t& b = dst[c / 2];
        b = (c % 2 == 0) ? static_cast<uint8_t>((b & 0xf0) | nib)
                         : static_cast<uint8_t>((b & 0x0f) | (nib << 4));
      }
    }
  }
  return q;
}

void dequantize_q4(const Matrix& q, float* out) {
  STRATA_CHECK(q.format == WeightFormat::Q4_ROW || q.format == WeightFormat::Q4_G64);
  const int64_t rb = q4_row_bytes(q.cols), ng = q4_scales_per_row(q.format, q.cols);
  const auto* packed = static_cast<const uint8_t*>(q.data);
  for (int64_t o = 0; o < q.rows; ++o) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const uint8_t b = packed[o * rb + c / 2];
      const int nib = (c % 2 == 0) ? (b & 0x0f) : (b >> 4);
      const float s = q.scales[o * ng + (q.format == WeightFormat::Q4_G64 ? c / kQ4Group : 0)];
      out[o * q.cols + c] = static_cast<float>(nib - 8) * s;
    }
  }
}

std::optional<WeightFormat> parse_quant_name(std::string_view name) {
  if (name == "q4_g64") return WeightFormat::Q4_G64;
  if (name == "q4_row") return WeightFormat::Q4_ROW;
  if (name == "none") return std::nullopt;
  fail("quant", "unknown quantization '{}' (expected q4_g64, q4_row or none)", name);
}

}  // namespace strata
