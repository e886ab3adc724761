// cpu_vnni's int8 activations: the chunk layout an activation row is quantized into, and the kernels and
// drivers that multiply int4 weights with it (VNNI: unsigned weight nibbles times signed int8 activations).
#pragma once

#include <cstdint>

#include "strata/plugin_abi.h"

namespace strata_cpu {

// 128 columns of one activation row in int8, one scale per 64 columns: d = absmax / 127 and q = x · (127 /
// absmax) rounded half to even (all zero when absmax is 0), so x ≈ q · d. Laid out against the weights'
// packed bytes: byte k of 64 holds columns 2k (low nibble) and 2k + 1 (high nibble), so `even` pairs with the
// low nibbles and `odd` with the high ones, and one 32-bit lane of a VNNI product (4 bytes) covers columns
// 8l .. 8l + 7, which lie in one 64-column group: lanes 0-7 sum the first group, 8-15 the second.
struct alignas(64) Q8Chunk {
  int8_t even[64];   // q of column 2k at k
  int8_t odd[64];    // q of column 2k + 1 at k
  int32_t corr[16];  // lane l: -8 · (q summed over columns 8l .. 8l + 7): nibble t encodes t - 8
  float d[16];       // lanes 0-7: the first group's scale, 8-15: the second's (0 past the row's end)
};
constexpr int64_t kQ8Cols = 128;

inline int64_t q8_chunks(int64_t n) {
  return (n + kQ8Cols - 1) / kQ8Cols;
}

// Quantizes n columns of x into q8_chunks(n) chunks (the padding quantizes as zeros).
void quantize_q8(const float* x, int64_t n, Q8Chunk* out);

// y[s * y_stride + j] = W[o0 + j] · x_s for j in [0, o1 - o0), s in [0, n_x), W int4 (Q4_ROW or Q4_G64) with
// w.cols columns and each x_s a quantized row of w.cols columns. Per 64-column group the integer dot is
// exact; the groups' dots, times (weight scale · activation scale), are summed in f32 in one fixed order per
// output, so a result depends on neither the thread count nor which other rows are in the batch.
void dot_q4_q8(const strata_matrix& w, int64_t o0, int64_t o1, const Q8Chunk* const* x, int64_t n_x, float* y,
               int64_t y_stride);

// The backend's ops: int4 weights through the int8 kernels, float weights through the exact AVX-512 ones.
struct VnniKernels {
  static void matmul(const strata_matrix& w, const float* x, int64_t n_x_rows, float* y);
  static void expert_group(const float* x, int64_t n_x_rows, int64_t hidden, int32_t n_tasks,
                           const strata_expert_task* tasks);
};

}  // namespace strata_cpu
