// Exact-mode CPU kernels for float-format weights (F32/BF16/F16): dense matmul and the fused expert MLP.
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// y[S, O] = x[S, I] · W[O, I]^T. Parallel over blocks of output rows on the calling TBB arena; every output
// element is one canonical dot (dot.hpp), so results do not depend on the thread count or on S.
void matmul_float(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y);

// Every task of an expert group (see strata_expert_task): gate and up share one pass over each x row,
// h = silu(gate·x) ⊙ (up·x), then out = down · h. Parallel over experts and over output rows.
void expert_group_float(const float* x, int64_t hidden, int32_t n_tasks, const strata_expert_task* tasks);

}  // namespace strata_cpu
