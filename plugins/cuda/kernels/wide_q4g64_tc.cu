// The wide exact tensor-core kernels (prefill: items of 16 tokens, the operand shared through shared memory) for Q4_G64 experts: gate/up and linear. See tc_wide.cuh.
#include <algorithm>

#include "tc_wide.cuh"

namespace strata_cuda {

cudaError_t launch_wide_q4g64_tc(bool gate_up, bool tiles, int ksg, const WorkItem* items, int n_items, int grid_x,
                                 const Queue& on) {
  return launch_tc_q4_wide<kQ4G64>(gate_up, tiles, ksg, items, n_items, grid_x, on);
}

unsigned wide_smem_bytes() {
  return static_cast<unsigned>(
      std::max({WideShape<true, 1>::kSmemBytes, WideShape<true, 2>::kSmemBytes, WideShape<false>::kSmemBytes}));
}

}  // namespace strata_cuda
