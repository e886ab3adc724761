// SIMT f32 kernels: y = W · x for up to 8 tokens, every weight format (dense matmul of F32/BF16/F16 weights,
// the expert down pass of float experts; int4 when the tensor-core kernels are off). See simt.cuh.
#include "simt.cuh"

namespace strata_cuda {

cudaError_t launch_linear_simt(int dtype, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  return launch_simt<false>(dtype, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
