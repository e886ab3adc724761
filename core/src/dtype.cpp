// Element type names, sizes and scalar conversions.
#include "strata/dtype.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

namespace strata {
namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 11> kInfo{{{DType::F32, "F32", 4},
                                           {DType::F16, "F16", 2},
                                           {DType::BF16, "BF16", 2},
                                           {DType::F64, "F64", 8},
                                           {DType::I64, "I64", 8},
                                           {DType::I32, "I32", 4},
                                           {DType::I16, "I16", 2},
                                           {DType::I8, "I8", 1},
                                           {DType::U8, "U8", 1},
                                           {DType::BOOL, "BOOL", 1},
                                           {DType::F8_E4M3, "F8_E4M3", 1}}};
}  // namespace

size_t dtype_size(DType t) {
  return kInfo[static_cast<size_t>(t)].size;
}
std::string_view dtype_name(DType t) {
  return kInfo[static_cast<size_t>(t)].name;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo) {
    if (i.name == name) return i.type;
  }
  return std::nullopt;
}

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  if (a >= 0x38800000u) {
    // Normal in binary16 (or beyond): keep 10 of 23 fraction bits, ties to even, and rebias the exponent
    // (127 - 15 = 112). A carry out of the fraction moves to the next binade, up to infinity (0x7c00);
    // every input from 65520 up, infinity included, lands on it.
    const uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) - (112u << 23);
    return static_cast<uint16_t>(sign | std::min<uint32_t>(r >> 13, 0x7c00u));
  }
  // Below 2^-14 the step is 2^-24: scaling by 2^24 is exact, nearbyint rounds ties to even (default mode).
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::fabs(f) * 16777216.0f)));
}

float round_to_f16(float f) {
  return f16_to_f32(f32_to_f16_bits(f));
}

}  // namespace strata
