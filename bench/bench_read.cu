// bench_read: how fast the GPU reads int4 expert weights in the access patterns a decode kernel can use (pure
// reads, no arithmetic), against the device-to-device copy: the ceiling for the decode kernels' layout choice.
//
// The data: GLM-5.2 gate/up matrices (16 of 2048 rows x 3072 bytes: 8 experts), 100.7 MB per set, 4 sets used
// in turn so that the 50 MB L2 never holds a set. A warp reads one 16-row tile over the whole row:
//   rows64:  row-major, each load instruction 8 rows x 64 bytes (the exact tensor-core kernels' loads);
//   rows128: row-major, each load instruction 4 rows x 128 bytes;
//   tiled:   the tile's 48 KB stored contiguously in load order, each instruction 512 contiguous bytes.
// Each thread keeps `depth` steps of 32 bytes (2 loads of 16) in flight; occupancy is capped at 4 blocks
// (16 warps) per SM like the tensor-core kernels, or left at what the registers allow.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <fmt/format.h>
#include <vector>

namespace {

constexpr int kRows = 2048, kRowBytes = 3072, kMats = 16, kSets = 4;
constexpr int kTile = 16, kSteps = kRowBytes * kTile / 1024;  // 1 KB per warp step (32 lanes x 2 x 16 B)

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Address of load h (0, 1) of step s for lane `lane` of the warp reading tile `tile` (base: the set).
template <int PAT>
__device__ __forceinline__ const uint8_t* addr(const uint8_t* base, int tile, int lane, int s, int h) {
  const int64_t tile_base = static_cast<int64_t>(tile) * kTile * kRowBytes;  // tiles of a matrix are adjacent
  if (PAT == 0) {  // rows64: rows g (h = 0) and g + 8, bytes 64 s + 16 q
    const int g = lane >> 2, q = lane & 3;
    return base + tile_base + static_cast<int64_t>(g + 8 * h) * kRowBytes + 64 * s + 16 * q;
  } else if (PAT == 1) {  // rows128: rows r, r + 4 (h) + 8 (s odd): 128 bytes per row
    const int r = lane >> 3, c = lane & 7;
    const int row = r + 4 * h + 8 * (s & 1);
    return base + tile_base + static_cast<int64_t>(row) * kRowBytes + 128 * (s >> 1) + 16 * c;
  } else {  // tiled
    return base + tile_base + 1024 * s + 512 * h + 16 * lane;
  }
}

template <int PAT, int DEPTH>
__global__ void __launch_bounds__(128) read_kernel(const uint8_t* __restrict__ base, int n_tiles, uint32_t* sink) {
  extern __shared__ uint32_t cap[];  // occupancy cap only
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int tile = static_cast<int>(blockIdx.x) * 4 + warp;
  if (tile >= n_tiles) return;
  static_assert(kSteps % DEPTH == 0, "whole rounds");
  uint4 buf[DEPTH][2];
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) buf[i][h] = ld_stream(addr<PAT>(base, tile, lane, i, h));
  uint32_t acc = 0;
  for (int s0 = 0; s0 < kSteps; s0 += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc ^= buf[i][h].x ^ buf[i][h].y ^ buf[i][h].z ^ buf[i][h].w;
        if (s0 + DEPTH + i < kSteps) buf[i][h] = ld_stream(addr<PAT>(base, tile, lane, s0 + DEPTH + i, h));
      }
    }
  }
  if (acc == 0x9e3779b9u) cap[0] = acc;  // keeps the loads (practically never true)
  if (acc == 0x9e3779b9u) sink[0] = cap[0];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_read: HBM read rate of int4 weight access patterns (pure reads)"};
  int device = 0, reps = 20;
  app.add_option("--device", device);
  app.add_option("--reps", reps, "timed passes per configuration");
  CLI11_PARSE(app, argc, argv);
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    fmt::print("bench_read: no CUDA device\n");
    return 1;
  }
  cudaSetDevice(device);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  const size_t set_bytes = static_cast<size_t>(kMats) * kRows * kRowBytes;
  uint8_t* data = nullptr;
  uint32_t* sink = nullptr;
  if (cudaMalloc(&data, set_bytes * kSets) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess) {
    fmt::print("bench_read: cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(data, 0x5a, set_bytes * kSets);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // The copy rate, as bench_cuda measures it.
  std::vector<double> ct;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(data + 2 * set_bytes, data, 2 * set_bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) ct.push_back(ms);
  }
  const double copy = 2.0 * 2 * set_bytes / (median(ct) * 1e-3) / 1e9;
  fmt::print("device {}: {}, {} SMs; device-to-device copy {:.0f} GB/s (read + write)\n", device, prop.name,
             prop.multiProcessorCount, copy);
  fmt::print("reads of {:.1f} MB (16 matrices of {}x{} bytes), 16-row tiles, one warp per tile\n",
             set_bytes / 1e6, kRows, kRowBytes);
  fmt::print("{:<9} {:>6} {:>12} {:>10} {:>9} {:>11} {:>10}\n", "pattern", "depth", "blocks/SM", "median us",
             "GB/s", "% of 4.8TB", "% of copy");
  const int n_tiles = kMats * kRows / kTile;
  const int blocks = (n_tiles + 3) / 4;
  auto run = [&](auto kernel, const char* name, int depth) {
    for (int cap : {4, 0}) {
      const int smem = cap > 0 ? static_cast<int>(prop.sharedMemPerMultiprocessor / cap) - 1024 : 0;
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem);
      std::vector<double> t;
      for (int r = 0; r <= reps; ++r) {
        const uint8_t* base = data + static_cast<size_t>(r % kSets) * set_bytes;
        cudaEventRecord(e0);
        kernel<<<blocks, 128, smem>>>(base, n_tiles, sink);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0) t.push_back(ms);
      }
      if (cudaGetLastError() != cudaSuccess) {
        fmt::print("{}: launch failed\n", name);
        return;
      }
      const double ms = median(t), gbs = set_bytes / (ms * 1e-3) / 1e9;
      fmt::print("{:<9} {:>6} {:>12} {:>10.1f} {:>9.0f} {:>10.1f}% {:>9.1f}%\n", name, depth, per_sm, ms * 1e3,
                 gbs, 100 * gbs / 4800, 100 * gbs / copy);
    }
  };
  run(read_kernel<0, 2>, "rows64", 2);
  run(read_kernel<0, 4>, "rows64", 4);
  run(read_kernel<0, 8>, "rows64", 8);
  run(read_kernel<1, 2>, "rows128", 2);
  run(read_kernel<1, 4>, "rows128", 4);
  run(read_kernel<1, 8>, "rows128", 8);
  run(read_kernel<2, 2>, "tiled", 2);
  run(read_kernel<2, 4>, "tiled", 4);
  run(read_kernel<2, 8>, "tiled", 8);
  cudaFree(data);
  cudaFree(sink);
  return 0;
}
