// int4 weight formats (DESIGN §4, byte-compatible with colibri fmt=2 / fmt=4): reference quantize and
// dequantize.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "strata/backend.hpp"

namespace strata {

constexpr int64_t kQ4Group = 64;

// Bytes of packed nibbles per row and scales per row of a Q4 matrix with `cols` inputs.
inline int64_t q4_row_bytes(int64_t cols) {
  return (cols + 1) / 2;
}
inline int64_t q4_scales_per_row(WeightFormat f, int64_t cols) {
  return f == WeightFormat::Q4_G64 ? (cols + kQ4Group - 1) / kQ4Group : 1;
}

// A quantized matrix that owns its bytes.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::Q4_G64;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed;  // [rows, q4_row_bytes(cols)]
  std::vector<float> scales;    // [rows * q4_scales_per_row]
  Matrix view() const { return Matrix{format, rows, cols, packed.data(), scales.data()}; }
};

// Quantizes W[rows, cols] (f32): per row (Q4_ROW) or per 64 inputs (Q4_G64, the last group may be shorter),
// s = max(absmax / 7, 1e-8), q = clamp(rint(w / s), -8, 7) with rint = round half to even, nibble = q + 8,
// the even column in the low nibble. An odd last column leaves the high nibble of the row's last byte at 8 (q
// = 0).
QuantizedMatrix quantize_q4(std::span<const float> w, int64_t rows, int64_t cols, WeightFormat format);

// w = (nibble − 8) · s, as f32 (one rounding). Works for any Matrix in a Q4 format.
void dequantize_q4(const Matrix& q, float* out);

// "q4_g64" | "q4_row" | "none" → format (nullopt for none); errors otherwise.
std::optional<WeightFormat> parse_quant_name(std::string_view name);

}  // namespace strata
