// SIMT f32 kernels: the fused expert gate/up pass, h = silu(gate · x) ⊙ (up · x), for every weight format
// (F32/BF16/F16 experts; int4 when the tensor-core kernels are off). See simt.cuh.
#include "simt.cuh"

namespace strata_cuda {

cudaError_t launch_gate_up_simt(int dtype, const WorkItem* items, int n_items, int grid_x, const Queue& on) {
  return launch_simt<true>(dtype, items, n_items, grid_x, on);
}

}  // namespace strata_cuda
