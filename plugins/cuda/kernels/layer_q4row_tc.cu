// The layer kernel (gate/up and down tiles of an expert group in one launch, exact mode) for Q4_ROW experts;
// instances with 1 and 2 n-tiles (up to 4 tokens per expert), each also lean. See tc_layer.cuh.
#include "tc_layer.cuh"

namespace strata_cuda {

cudaError_t launch_layer_q4row_tc(int nt, bool lean, int mg, int md, int ksg, const LayerWork& lw, const Queue& on) {
  return launch_tc_q4_layer<kQ4Row>(nt, lean, mg, md, ksg, lw, on);
}

}  // namespace strata_cuda
