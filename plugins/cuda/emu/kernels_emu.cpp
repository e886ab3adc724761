// The kernel sources, compiled with g++ for the CPU emulation (STRATA_CUDA_EMULATE; see emu.cpp).
#include "../kernels/gate_up_q4g64_gemv.cu"
#include "../kernels/hold.cu"
#include "../kernels/gate_up_q4g64_tc.cu"
#include "../kernels/gate_up_q4row_gemv.cu"
#include "../kernels/gate_up_q4row_tc.cu"
#include "../kernels/gate_up_simt.cu"
#include "../kernels/layer_q4g64_tc.cu"
#include "../kernels/layer_q4row_tc.cu"
#include "../kernels/linear_q4g64_gemv.cu"
#include "../kernels/linear_q4g64_tc.cu"
#include "../kernels/linear_q4row_gemv.cu"
#include "../kernels/linear_q4row_tc.cu"
#include "../kernels/linear_simt.cu"
#include "../kernels/prep_operands.cu"
#include "../kernels/wide_q4g64_tc.cu"
#include "../kernels/wide_q4row_tc.cu"

// For test_cuda, which finds it with dlsym in the loaded plugin: the host's token table (host_operand.cpp)
// against the preparation kernel's encoding of the same rows of x (f32, n_rows x cols): 1 when every digit and
// multiplier is the same byte for byte, 0 when not (the first difference is printed), -1 when the emulated
// runtime failed.
#include <cstdio>
#include <vector>

#include "../host_operand.hpp"

extern "C" __attribute__((visibility("default"))) int strata_cuda_emu_same_encoding(const float* x,
                                                                                   int64_t n_rows,
                                                                                   int64_t cols) {
  using namespace strata_cuda;
  const int64_t kp = (cols + kColPad - 1) / kColPad * kColPad, n_groups = kp / kColPad;
  const int ncols = static_cast<int>((kI8Planes * n_rows + 7) / 8 * 8);  // whole n-tiles of the operand
  const uint64_t op_bytes = static_cast<uint64_t>(ncols) * kp + static_cast<uint64_t>(ncols / kI8Planes) * n_groups * 4;
  const uint64_t x_bytes = static_cast<uint64_t>(n_rows * cols) * 4;
  void *dx = nullptr, *dop = nullptr, *djob = nullptr;
  cudaStream_t st = nullptr;
  auto release = [&] {
    (void)cudaFree(dx), (void)cudaFree(dop), (void)cudaFree(djob);
    if (st != nullptr) (void)cudaStreamDestroy(st);
  };
  auto fail = [&] {
    release();
    return -1;
  };
  if (cudaMalloc(&dx, x_bytes) != cudaSuccess || cudaMalloc(&dop, op_bytes) != cudaSuccess ||
      cudaMalloc(&djob, sizeof(PrepJob)) != cudaSuccess || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
    return fail();
  }
  PrepJob j{};
  j.x = static_cast<const float*>(dx);
  j.x_ld = cols;
  j.dst = dop;
  j.n_tok = static_cast<int32_t>(n_rows);
  j.cols = static_cast<int32_t>(cols);
  j.kp = static_cast<int32_t>(kp);
  j.splits = kI8Splits;
  j.ncols = ncols;
  if (cudaMemcpy(dx, x, x_bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(djob, &j, sizeof j, cudaMemcpyHostToDevice) != cudaSuccess ||
      launch_prep(static_cast<const PrepJob*>(djob), 1, 3, true, Queue{st, false}) != cudaSuccess ||
      cudaStreamSynchronize(st) != cudaSuccess) {
    return fail();
  }
  std::vector<uint8_t> dev(op_bytes), tab(token_table_bytes(n_rows, kp)), other(tab.size());
  if (cudaMemcpy(dev.data(), dop, op_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return fail();
  release();
  encode_token_table(x, cols, cols, kp, nullptr, n_rows, tab.data());
  // (every code gives the same bytes: a value at a time, AVX2, AVX-512)
  for (const TableCode code : {TableCode::kScalar, TableCode::kAvx2, TableCode::kAvx512}) {
    // (kAvx2 where the CPU has no AVX2 runs the portable code: compared all the same)
    encode_token_table_as(x, cols, cols, kp, nullptr, n_rows, other.data(), code);
    if (tab != other) {
      std::fprintf(stderr, "token table: the encoding by code %d differs from the default one\n",
                   static_cast<int>(code));
      return 0;
    }
  }
  const uint8_t* tab_mult = tab.data() + static_cast<uint64_t>(n_rows) * kI8Planes * kp;
  const uint8_t* dev_mult = dev.data() + static_cast<uint64_t>(ncols) * kp;
  for (int64_t t = 0; t < n_rows; ++t) {
    for (int p = 0; p < kI8Planes; ++p) {
      const uint64_t at = static_cast<uint64_t>(kI8Planes * t + p) * kp;  // (the same row in both)
      for (int64_t c = 0; c < kp; ++c) {
        if (dev[at + c] != tab[at + c]) {
          std::fprintf(stderr, "token table: row %lld plane %d byte %lld: host %d, device %d\n",
                       static_cast<long long>(t), p, static_cast<long long>(c), tab[at + c], dev[at + c]);
          return 0;
        }
      }
    }
    for (int64_t g = 0; g < n_groups; ++g) {
      const uint64_t at = static_cast<uint64_t>(t * n_groups + g) * 4;
      if (std::memcmp(tab_mult + at, dev_mult + at, 4) != 0) {
        std::fprintf(stderr, "token table: row %lld group %lld: the multipliers differ\n", static_cast<long long>(t),
                     static_cast<long long>(g));
        return 0;
      }
    }
  }
  return 1;
}
