// The exact tensor-core operand encoded on the host: a token table of x's rows (work.hpp, WorkItem::in_rows),
// byte for byte what the device's encode_i8_unit (kernels/encode_i8.cuh) writes for the same values.
#pragma once

#include <cstdint>

namespace strata_cuda {

// Bytes of the token table of n_rows rows of kp columns (padded to 64): 4 plane rows of kp bytes per row plus
// the zero token's, then f32 multipliers [n_rows + 1][kp / 64].
uint64_t token_table_bytes(int64_t n_rows, int64_t kp);

// Encodes rows t of x (f32, cols values each, ld_x apart) for which `used` is null or used[t] != 0 into the
// table at dst (token_table_bytes(n_rows, kp) bytes, 16-byte aligned), and the zero token (row n_rows). Rows
// not used are left as they are (no item reads them). Each 64-column group of a row: e the exponent of its
// largest |x| (|x| < 2^e), m = round_half_even(x 2^(30 - e)) as balanced base-256 digits, plane p at column
// i8_pos(c); multiplier 2^(e - 34), NaN for a group with a non-finite value (its digits zero).
void encode_token_table(const float* x, int64_t n_rows, int64_t cols, int64_t ld_x, int64_t kp,
                        const uint8_t* used, uint8_t* dst);

}  // namespace strata_cuda
