// The wide exact tensor-core kernels (prefill: items of 16 tokens, the operand shared through shared memory) for Q4_ROW experts: gate/up and linear. See tc_wide.cuh.
#include "tc_wide.cuh"

namespace strata_cuda {

cudaError_t launch_wide_q4row_tc(bool gate_up, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                                 const Queue& on) {
  return launch_tc_q4_wide<kQ4Row>(gate_up, tiles, ksg, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
