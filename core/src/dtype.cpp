// Element type names, sizes and scalar conversions.
#include "strata/dtype.hpp"

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

float round_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = x & 0x80000000u;
  uint32_t a = x ^ sign;
  if (a >= 0x7f800000u) return f;  // inf, NaN
  if (a < 0x38800000u) {
    // Below binary16's smallest normal (2^-14) the step is 2^-24: scaling by 2^24 is exact, and nearbyint
    // rounds ties to even in the default rounding mode.
    const float v = std::nearbyint(std::fabs(f) * 16777216.0f) / 16777216.0f;
    std::memcpy(&a, &v, 4);
  } else {
    a = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;  // keep 10 of 23 fraction bits, ties to even
    if (a >= 0x47800000u) a = 0x7f800000u;           // 65520 and beyond round to infinity
  }
  a |= sign;
  float r;
  std::memcpy(&r, &a, 4);
  return r;
}

}  // namespace strata
