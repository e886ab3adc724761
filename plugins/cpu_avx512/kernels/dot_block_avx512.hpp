// The AVX-512 row-block dot kernel (declaration; the definition is compiled with AVX-512 flags).
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// Same contract as dot_block_generic (kernels/dot.hpp: DotBlockFn), bit for bit: weights decoded to f32 in
// registers, even and odd accumulators with fused multiply-adds, the canonical fold. Up to 4 weight
// rows × 2 x rows (or 2 × 4) are in flight at once so the add latency is hidden.
void dot_block_avx512(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                      int64_t x_stride, float* y, int64_t y_stride);

}  // namespace strata_cpu
