// Memory-bound SIMT f32 (gemv) kernels: the fused expert gate/up pass, h = silu(gate · x) ⊙ (up · x), for
// Q4_G64 experts, 1..8 tokens per item (the exact-mode int4 path). See gemv_q4.cuh.
#include "gemv_q4.cuh"

namespace strata_cuda {

cudaError_t launch_gate_up_q4g64_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  return launch_gemv_q4<kQ4G64, true>(t, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
