// The exact tensor-core operand's encoding (int8 digit planes of a per-group fixed-point form), shared by the
// preparation pass (prep_operands.cu) and the layer kernel, which encodes each expert's down operand itself.
#pragma once

#include "device_util.cuh"

namespace strata_cuda {

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
// One unit (token r, group grp; r may be past j.n_tok: zeros) by the calling warp; load(p) reads an
// activation (the preparation pass: a plain load; the layer kernel: through L2, as it was written in the same
// launch).
template <class Load>
__device__ __forceinline__ void encode_i8_unit(const PrepJob& j, int r, int grp, Load&& load) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int n_groups = j.kp / kColPad;
  uint8_t* dst = static_cast<uint8_t*>(j.dst);
  float* mult = reinterpret_cast<float*>(dst + static_cast<int64_t>(j.ncols) * j.kp);
  float v[2] = {0.0f, 0.0f};
  if (r < j.n_tok) {
    const int64_t row = j.rows != nullptr ? j.rows[r] : static_cast<int64_t>(j.row0) + r;
    for (int h = 0; h < 2; ++h) {
      const int col = grp * kColPad + 2 * lane + h;
      if (col < j.cols) v[h] = load(j.x + row * j.x_ld + col);
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
    const int at = i8_pos(grp * kColPad + 2 * lane + h, j.kp);
    for (int p = 0; p < kI8Planes; ++p) {
      const int d = p + 1 < kI8Planes ? static_cast<int8_t>(static_cast<uint8_t>(m & 0xFF)) : m;
      dst[i8_at(kI8Planes * r + p, at, j.kp, j.ncols)] = static_cast<uint8_t>(d);
      m = (m - d) >> 8;  // exact: m - d is a multiple of 256
    }
  }
  if (lane == 0) {
    mult[static_cast<int64_t>(r) * n_groups + grp] =
        bad != 0.0f ? __uint_as_float(0x7fc00000u) : r < j.n_tok ? ldexpf(1.0f, e - 34) : 0.0f;
  }
}

// Every unit of the operand (2 NT tokens of room, tokens past j.n_tok zero): warps first_warp, first_warp +
// n_warps, .. of the launch take them in turn.
__device__ __forceinline__ void encode_i8_planes(const PrepJob& j, int64_t first_warp, int64_t n_warps) {
  const int n_groups = j.kp / kColPad;
  const int64_t n_units = static_cast<int64_t>(j.ncols / kI8Planes) * n_groups;
  for (int64_t u = first_warp; u < n_units; u += n_warps) {  // warp-uniform
    const int r = static_cast<int>(u / n_groups), grp = static_cast<int>(u - static_cast<int64_t>(r) * n_groups);
    encode_i8_unit(j, r, grp, [](const float* p) { return *p; });
  }
}

}  // namespace strata_cuda
