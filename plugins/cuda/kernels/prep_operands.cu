// Builds the input operands of a batch of work items from f32 activations (gather by row index; int8 digit
// planes for the exact tensor-core kernels, bf16 for the W4A16 ones, f32 rows for the SIMT kernels, scaled per
// column and in slot order for the gemv kernels) and clears the gate_up output regions.
#include "device_util.cuh"

namespace strata_cuda {
namespace {

// The exact tensor-core operand (work.hpp), a warp per (token r, 64-column group G): see i8_encode_group.
__device__ void encode_i8_planes(const PrepJob& j) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t first_warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int n_groups = j.kp / kColPad;
  const int64_t n_units = static_cast<int64_t>(j.ncols / kI8Planes) * n_groups;  // 2 NT tokens of room
  uint8_t* dst = static_cast<uint8_t*>(j.dst);
  float* mult = reinterpret_cast<float*>(dst + static_cast<int64_t>(j.ncols) * j.kp);
  for (int64_t u = first_warp; u < n_units; u += n_warps) {  // warp-uniform
    const int r = static_cast<int>(u / n_groups), grp = static_cast<int>(u - static_cast<int64_t>(r) * n_groups);
    float v[2] = {0.0f, 0.0f};
    if (r < j.n_tok) {
      const int64_t row = j.rows != nullptr ? j.rows[r] : static_cast<int64_t>(j.row0) + r;
      for (int h = 0; h < 2; ++h) {
        const int col = grp * kColPad + 2 * lane + h;
        if (col < j.cols) v[h] = j.x[row * j.x_ld + col];
      }
    }
    i8_encode_group(v[0], v[1], r < j.n_tok, r, grp, dst, j.kp, mult, n_groups, lane);
  }
}

__global__ void __launch_bounds__(256) prep_operands_kernel(const PrepJob* __restrict__ jobs) {
  grid_dep_launch();
  grid_dep_wait();  // the operands and h are read, and the outputs cleared, only after the previous kernel
  const PrepJob& j = jobs[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t kp = j.kp;
  const int64_t n_elem = j.splits == kI8Splits ? 0 : static_cast<int64_t>(j.ncols) * kp;
  if (j.splits == kI8Splits) encode_i8_planes(j);
  for (int64_t e = first; e < n_elem; e += stride) {
    const int n = static_cast<int>(e / kp);
    const int pos = static_cast<int>(e - n * kp);
    if (j.splits > 0) {
      const int r = n / j.splits, p = n - r * j.splits;
      const int col = operand_slot(pos);  // the column stored at this slot (the transpose is an involution)
      float v = 0.0f;
      if (r < j.n_tok && col < j.cols) {
        const int64_t row = j.rows != nullptr ? j.rows[r] : static_cast<int64_t>(j.row0) + r;
        v = j.x[row * j.x_ld + col];
      }
      static_cast<uint16_t*>(j.dst)[e] = split_part(v, p);
    } else {
      const bool gemv = j.splits == kGemvSplits;
      const int col = gemv ? gemv_col(pos) : pos;  // gemv: slot order (see gemv_slot)
      float v = 0.0f;
      if (n < j.n_tok && col < j.cols) {
        const int64_t row = j.rows != nullptr ? j.rows[n] : static_cast<int64_t>(j.row0) + n;
        v = j.x[row * j.x_ld + col];
      }
      if (gemv) v *= gemv_x_scale(col);
      static_cast<float*>(j.dst)[e] = v;
    }
  }
  if (j.zero != nullptr) {
    uint4* z = static_cast<uint4*>(j.zero);
    for (int64_t e = first; e < j.zero_bytes / 16; e += stride) z[e] = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace

cudaError_t launch_prep(const PrepJob* jobs, int n_jobs, int blocks_x, bool warp_jobs, const Queue& on) {
  if (n_jobs <= 0) return cudaSuccess;
  return launch_kernel(&prep_operands_kernel, dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(n_jobs)),
                       dim3(256), on, warp_jobs, jobs);
}

}  // namespace strata_cuda
