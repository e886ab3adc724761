// Parallel drivers of the exact-mode CPU ops (matmul, expert_group) over a row-block dot kernel.
#pragma once

#include <cstdint>

#include "dot.hpp"
#include "strata/plugin_abi.h"

namespace strata_cpu {

// y[S, O] = x[S, I] · W^T, parallel over blocks of output rows on the calling TBB arena. Every output element
// is one canonical dot, so results do not depend on the thread count, on S, or on which DotBlockFn computes
// them.
void matmul_driver(DotBlockFn dot, const strata_matrix& w, const float* x, int64_t n_x_rows, float* y);

// Every task of an expert group: for each routed row, h = silu(gate·x) ⊙ (up·x) with gate and up rows of a
// block read together, then out = down · h. Parallel over experts and over blocks of output rows.
void expert_group_driver(DotBlockFn dot, const float* x, int64_t hidden, int32_t n_tasks,
                         const strata_expert_task* tasks);

// The portable dot kernel (decode a row to f32, canonical dot for each x row).
void dot_block_generic(const strata_matrix& w, int64_t o0, int64_t o1, const float* x, int64_t n_x,
                       int64_t x_stride, float* y, int64_t y_stride);

}  // namespace strata_cpu
