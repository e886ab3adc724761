// Memory-bound SIMT f32 (gemv) kernels: y = W · x for Q4_ROW weights (expert down pass and dense matmul),
// 1..8 tokens per item (the exact-mode int4 path). See gemv_q4.cuh.
#include "gemv_q4.cuh"

namespace strata_cuda {

cudaError_t launch_linear_q4row_gemv(int t, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  return launch_gemv_q4<kQ4Row, false>(t, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
