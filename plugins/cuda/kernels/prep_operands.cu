// Builds the input operands of a batch of work items from f32 activations (gather by row index; int8 digit
// planes for the exact tensor-core kernels, bf16 for the W4A16 ones, f32 rows for the SIMT kernels, scaled per
// column and in slot order for the gemv kernels) and clears the gate_up output regions.
#include "device_util.cuh"

namespace strata_cuda {
namespace {

__device__ __forceinline__ int round_to_int(float v) {
#if defined(STRATA_CUDA_EMULATE)
  return static_cast<int>(nearbyintf(v));  // the default rounding mode: to nearest, ties to even
#else
  return __float2int_rn(v);
#endif
}

// The exact tensor-core operand (work.hpp): a warp per (token r, 64-column group G); lane l holds columns
// 2l, 2l + 1 of the group. With e the exponent of the group's largest |x| (|x| < 2^e), each x is the integer
// m = round(x · 2^(30 - e)), |m| <= 2^30 (a rounding error of at most 2^-31 of the group's largest value:
// far below the f32 rounding of the dot product, so "exact" in the sense of the 1e-5 conformance bound), as
// balanced base-256 digits d0..d3 in [-128, 127]: m = d0 + 256 d1 + 65536 d2 + 2^24 d3. The kernel's A bytes
// are 16 (nibble - 8), so the group's dot product is 2^(e - 34) · sum_p 256^p (A · d_p), the multiplier it
// reads being 2^(e - 34); a group holding a NaN or an infinity gets NaN (its token's outputs become NaN).
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
    const bool finite = isfinite(v[0]) && isfinite(v[1]);
    float amax = finite ? fmaxf(fabsf(v[0]), fabsf(v[1])) : 0.0f;
    float bad = finite ? 0.0f : 1.0f;
    for (int off = 16; off >= 1; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      bad = fmaxf(bad, __shfl_xor_sync(0xffffffffu, bad, off));
    }
    int e = 0;
    if (amax > 0.0f) (void)frexpf(amax, &e);  // amax = f · 2^e, f in [0.5, 1)
    for (int h = 0; h < 2; ++h) {
      int m = bad != 0.0f ? 0 : round_to_int(ldexpf(v[h], 30 - e));
      const int64_t at = grp * kColPad + i8_slot(2 * lane + h);
      for (int p = 0; p < kI8Planes; ++p) {
        const int d = p + 1 < kI8Planes ? static_cast<int8_t>(static_cast<uint8_t>(m & 0xFF)) : m;
        dst[static_cast<int64_t>(kI8Planes * r + p) * j.kp + at] = static_cast<uint8_t>(d);
        m = (m - d) >> 8;  // exact: m - d is a multiple of 256
      }
    }
    if (lane == 0) {
      mult[static_cast<int64_t>(r) * n_groups + grp] =
          bad != 0.0f ? __uint_as_float(0x7fc00000u) : r < j.n_tok ? ldexpf(1.0f, e - 34) : 0.0f;
    }
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
