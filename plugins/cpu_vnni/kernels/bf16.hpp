// cpu_vnni's bf16 activations for BF16 weights (AVX512_BF16): the padded row layout, the conversion and the
// kernel (vdpbf16ps: 32 products per instruction, accumulated in f32).
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// Columns of a bf16 activation row: the row's, rounded up to 32 (the padding is zero).
inline int64_t bf16_cols(int64_t n) {
  return (n + 31) / 32 * 32;
}

// Whether this CPU has AVX512_BF16 (where it lacks it, BF16 weights take the exact kernels). A probe,
// compiled without ISA flags.
bool cpu_has_avx512_bf16();

// Rounds n floats of x to bf16 (to nearest even; NaN stays NaN) into out, bf16_cols(n) values, zero-padded.
void to_bf16(const float* x, int64_t n, uint16_t* out);

// y[s * y_stride + j] = W[o0 + j] · x_s for BF16 W: pairs of columns multiplied exactly, summed in f32 in one
// fixed order per output (independent of the thread count and of the other rows of the batch).
void dot_bf16(const strata_matrix& w, int64_t o0, int64_t o1, const uint16_t* const* x, int64_t n_x, float* y,
              int64_t y_stride);

}  // namespace strata_cpu
