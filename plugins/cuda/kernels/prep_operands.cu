// Builds the input operands of a batch of work items from f32 activations (gather by row index; int8 digit
// planes for the exact tensor-core kernels, bf16 for the W4A16 ones, f32 rows for the SIMT kernels, scaled per
// column and in slot order for the gemv kernels) and clears the gate_up output regions.
#include "encode_i8.cuh"

namespace strata_cuda {
namespace {

// stamps: NULL, or the launch's kPrepStamp* words (bench_cuda --timeline).
__global__ void __launch_bounds__(256) prep_operands_kernel(const PrepJob* __restrict__ jobs, uint64_t* stamps) {
  grid_dep_launch();
  auto stamp = [&](int k, uint64_t v) {
    atomicMax(reinterpret_cast<unsigned long long*>(stamps + k), static_cast<unsigned long long>(v));
  };
  if (stamps != nullptr && threadIdx.x == 0) stamp(kPrepStampFirst, ~global_ns());
  grid_dep_wait();  // the operands and h are read, and the outputs cleared, only after the previous kernel
  const PrepJob& j = jobs[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t kp = j.kp;
  const int64_t n_elem = j.splits == kI8Splits ? 0 : static_cast<int64_t>(j.ncols) * kp;
  if (j.splits == kI8Splits) {
    encode_i8_planes(j, (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5,
                     (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5);
  }
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
  if (stamps != nullptr) {  // (block-uniform)
    __syncthreads();
    if (threadIdx.x == 0) stamp(kPrepStampLast, global_ns());
  }
}

}  // namespace

int kernels_ptx_version() {
#if defined(STRATA_CUDA_EMULATE)
  return emu::ptx_version();
#else
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, &prep_operands_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return a.ptxVersion;
#endif
}

cudaError_t launch_prep(const PrepJob* jobs, int n_jobs, int blocks_x, bool warp_jobs, uint64_t* stamps,
                        const Queue& on) {
  if (n_jobs <= 0) return cudaSuccess;
  return launch_kernel(&prep_operands_kernel, dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(n_jobs)),
                       dim3(256), on, warp_jobs, jobs, stamps);
}

}  // namespace strata_cuda
