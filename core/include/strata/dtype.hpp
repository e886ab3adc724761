// Element types of tensors in checkpoints and in memory, with sizes and names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // the safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view name);

float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);
// f rounded to the nearest IEEE binary16 value (ties to even; beyond 65504 rounds to ±inf, NaN stays NaN),
// returned as f32: what a cast through float16 gives, without the compiler's _Float16 (absent on some
// targets and compilers).
float round_to_f16(float f);
uint16_t f32_to_f16_bits(float f);  // the same rounding, as binary16 bits

}  // namespace strata
