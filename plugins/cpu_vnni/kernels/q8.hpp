// cpu_vnni's int8 activations: the chunk layout an activation row is quantized into, and the kernels and
// drivers that multiply int4 weights with it (VNNI: unsigned weight nibbles times signed int8 activations).
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// 256 columns of one activation row in int8, one scale per 64-column group: d = absmax / 127 and
// q = x · (127 / absmax) (in double) rounded half to even, so x ≈ q · d; all q zero when absmax is 0, and d
// NaN when the group holds an Inf or NaN (its outputs are NaN then, as in exact mode).
//
// The layout follows the weights. Their 128 packed bytes for these columns hold columns 2j (low nibble) and
// 2j + 1 (high nibble) in byte j; loaded as two 64-byte halves A and B, whose 16-byte lanes 0-1 hold the
// first group of the half and lanes 2-3 the second, one 128-bit lane shuffle each makes S1 = (A0, A2, B0, B2)
// and S2 = (A1, A3, B1, B3): lane m of both now holds group m. The kernel multiplies four byte vectors, the
// low and high nibbles of S1 and of S2, with q[0..3] below, and all four VNNI products go into one
// accumulator whose 32-bit lane l sums group l / 4 only: the integer work per group is exact, and the float
// work (scale, accumulate) runs once per 256 columns instead of once per 64.
struct alignas(64) Q8Chunk {
  int8_t q[4][64];   // q[t][16 m + b]: the column that nibble meets in operand t (S1 lo, S1 hi, S2 lo, S2 hi)
  int32_t corr[16];  // lane l: -8 · (q summed over the 16 bytes lane l multiplies): nibble t encodes t - 8
  float d[16];       // lane l: the scale of group l / 4 (0 past the row's end)
};
constexpr int64_t kQ8Cols = 256;

inline int64_t q8_chunks(int64_t n) {
  return (n + kQ8Cols - 1) / kQ8Cols;
}

// The column of a chunk that byte i (0..63) of operand t meets: operand t = 2 · (S2 ? 1 : 0) + (high nibble ?
// 1 : 0); byte i lies in lane m = i / 16 of S1 or S2, which came from half m / 2 (A or B), 16-byte lane 2 ·
// (m % 2)
// + (S2 ? 1 : 0) of it.
constexpr int q8_column(int t, int i) {
  const int m = i / 16, b = i % 16, s2 = t / 2, high = t % 2;
  const int byte = 64 * (m / 2) + 16 * (2 * (m % 2) + s2) + b;
  return 2 * byte + high;
}

// Quantizes n columns of x into q8_chunks(n) chunks (the padding quantizes as zeros).
void quantize_q8(const float* x, int64_t n, Q8Chunk* out);

// y[s * y_stride + j] = W[o0 + j] · x_s for j in [0, o1 - o0), s in [0, n_x), W int4 (Q4_ROW or Q4_G64) with
// w.cols columns and each x_s a quantized row of w.cols columns. Per 64-column group the integer dot is
// exact; the groups' dots, times (weight scale · activation scale), are summed in f32 in one fixed order per
// output, so a result depends on neither the thread count nor which other rows are in the batch.
void dot_q4_q8(const strata_matrix& w, int64_t o0, int64_t o1, const Q8Chunk* const* x, int64_t n_x, float* y,
               int64_t y_stride);

// The backend's ops (drivers_approx.cpp): int4 weights through the int8 kernels, BF16 weights through the
// bf16 kernel where the CPU has AVX512_BF16, the rest through the exact AVX-512 kernels.
struct VnniKernels {
  static void matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y);
  static void expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                           const strata_expert_task* tasks);
};

}  // namespace strata_cpu
