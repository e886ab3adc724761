// Tensor-core (mma.sync: int8 m16n8k32 exact, bf16 m16n8k16 W4A16) kernels: the fused expert gate/up pass, h = silu(gate · x) ⊙ (up · x), for Q4_ROW experts.
// Instances: exact mode (int8 digit planes, 4 columns per token) with 1-4 n-tiles (up to 8 tokens), W4A16 (bf16) with
// 1, 2 or 4 n-tiles (up to 32 tokens). See tc_q4.cuh.
#include "tc_q4.cuh"

namespace strata_cuda {

cudaError_t launch_gate_up_q4row_tc(int splits, int nt, bool tiles, int ksg, const WorkItem* items, int n_items,
                                    int grid_x, const Queue& on) {
  return launch_tc_q4<kQ4Row, true>(splits, nt, tiles, ksg, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
