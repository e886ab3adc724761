// The AVX2 + FMA row-block dot kernel (declaration; the definition is compiled with AVX2/FMA/F16C flags).
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// Same contract as dot_block_generic (kernels/dot.hpp: DotBlockFn), bit for bit: weights decoded to f32 in
// registers, even and odd accumulators (two 8-lane registers each) with fused multiply-adds, the canonical
// fold. 2 weight rows × 1 x row (or 1 × 2) are in flight at once: 8 accumulators hide the FMA latency.
void dot_block_avx2(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                    int64_t x_stride, float* y, int64_t y_stride);

}  // namespace strata_cpu
