// Tensor-core (mma.sync: int8 m16n8k32 exact, bf16 m16n8k16 W4A16) kernels: y = W · x for Q4_G64 weights (expert down pass and dense matmul).
// Instances: exact mode (int8 digit planes, 4 columns per token) with 1-4 n-tiles (up to 8 tokens), W4A16 (bf16) with
// 1, 2 or 4 n-tiles (up to 32 tokens). See tc_q4.cuh.
#include "tc_q4.cuh"

namespace strata_cuda {

cudaError_t launch_linear_q4g64_tc(int splits, int nt, bool tiles, const WorkItem* items, int n_items,
                                 int grid_x, const Queue& on) {
  return launch_tc_q4<kQ4G64, false>(splits, nt, tiles, 2, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
