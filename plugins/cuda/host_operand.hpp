// The exact tensor-core operand encoded on the host: a token table of x's rows (work.hpp, WorkItem::in_rows),
// byte for byte what the device's encode_i8_unit (kernels/encode_i8.cuh) writes for the same values.
#pragma once

#include <cstdint>

namespace strata_cuda {

// Bytes of the token table of n_rows rows of kp columns (padded to 64): 4 plane rows of kp bytes per row, then
// f32 multipliers [n_rows + 1][kp / 64] (the last row the zero token's: only multipliers, all 0).
uint64_t token_table_bytes(int64_t n_rows, int64_t kp);

// Encodes row t < n_rows of the table from row src[t] of x (src null: row t), f32, cols values each, ld_x
// apart, into dst (token_table_bytes(n_rows, kp) bytes), and the zero token's multipliers. Each 64-column
// group of a row: e the exponent of its largest |x| (|x| < 2^e), m = round_half_even(x 2^(30 - e)) as balanced
// base-256 digits, plane p at column i8_pos(c); multiplier 2^(e - 34), NaN for a group with a non-finite value
// (its digits zero).
void encode_token_table(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                        int64_t n_rows, uint8_t* dst);
// The same by a given code: a value at a time (portable), 32 values at a time with AVX2 or 64 with AVX-512
// (x86-64: encode_token_table takes the widest the CPU has); all must give the same bytes (test_cuda compares
// them with the device's). A code this build or CPU lacks runs the portable one.
enum class TableCode { kScalar, kAvx2, kAvx512 };
void encode_token_table_as(const float* x, int64_t ld_x, int64_t cols, int64_t kp, const int32_t* src,
                           int64_t n_rows, uint8_t* dst, TableCode code);

}  // namespace strata_cuda
