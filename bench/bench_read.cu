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
//   bulk S x C: tiled, each warp's tile through its own shared-memory ring of S stages of C bytes filled by
//   bulk copies (cp.async.bulk, the TMA engine's 1-D form, completed on an mbarrier per stage), read back from
//   shared memory by every lane: (S - 1) C bytes in flight per warp without holding them in registers;
//   occupancy is what the shared memory allows.
// Every configuration reads one set (100.7 MB, like a decode layer) and then all 4 sets in one launch: the
// difference of the two times is the steady rate without the launch's ramp and last-wave tail.
// --reserve-sms N: the reads on the SMs but N (sm_reserve.hpp: an H100 with 40 held has an H200's bandwidth per
// SM; 52 held matched the H200's figures for the decode layer); --only PATTERN: the configurations whose name
// starts with it.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <fmt/format.h>
#include <memory>
#include <string>
#include <vector>

#include "sm_reserve.hpp"

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

__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// PF > 0 (tiled only): lane 0 also requests the steps PF ahead of the loads into the L2 (a bulk prefetch).
template <int PAT, int DEPTH, int PF = 0>
__global__ void __launch_bounds__(128) read_kernel(const uint8_t* __restrict__ base, int n_tiles, uint32_t* sink) {
  extern __shared__ uint32_t cap[];  // occupancy cap only
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int tile = static_cast<int>(blockIdx.x) * 4 + warp;
  if (tile >= n_tiles) return;
  static_assert(kSteps % DEPTH == 0, "whole rounds");
  uint4 buf[DEPTH][2];
  const uint8_t* tile_at = base + static_cast<int64_t>(tile) * kTile * kRowBytes;
  if (PF > 0 && lane == 0) prefetch_l2(tile_at + DEPTH * 1024, PF * 1024);
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
        if (PF > 0 && h == 0 && lane == 0 && s0 + DEPTH + i + PF < kSteps) {
          prefetch_l2(tile_at + (s0 + DEPTH + i + PF) * 1024, 1024);
        }
        if (s0 + DEPTH + i < kSteps) buf[i][h] = ld_stream(addr<PAT>(base, tile, lane, s0 + DEPTH + i, h));
      }
    }
  }
  if (acc == 0x9e3779b9u) cap[0] = acc;  // keeps the loads (practically never true)
  if (acc == 0x9e3779b9u) sink[0] = cap[0];
}

// Pieces of PIECE KB (tiled, 1 KB steps, DEPTH steps in flight per thread) per warp instead of whole 48 KB
// tiles: how much a warp's short stream (the layer kernel's warps read 16-24 KB per tile) costs in pipeline
// start. TICKET: each block takes its pieces by an atomic ticket, as the layer kernel does.
template <int DEPTH, int PIECE, bool TICKET>
__global__ void __launch_bounds__(128) piece_kernel(const uint8_t* __restrict__ base, int n_tiles, uint32_t* sink) {
  __shared__ int s_ticket;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  int blk = static_cast<int>(blockIdx.x);
  if (TICKET) {
    if (threadIdx.x == 0) s_ticket = static_cast<int>(atomicAdd(sink + 1, 1u));
    __syncthreads();
    blk = s_ticket;
  }
  const int piece = blk * 4 + warp;
  if (piece >= n_tiles * (kSteps / PIECE)) return;
  const uint8_t* p = base + static_cast<int64_t>(piece) * PIECE * 1024 + 16 * lane;
  static_assert(kSteps % PIECE == 0 && PIECE % DEPTH == 0, "whole pieces and rounds");
  uint4 buf[DEPTH][2];
#pragma unroll
  for (int i = 0; i < DEPTH; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) buf[i][h] = ld_stream(p + 1024 * i + 512 * h);
  uint32_t acc = 0;
  for (int s0 = 0; s0 < PIECE; s0 += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc ^= buf[i][h].x ^ buf[i][h].y ^ buf[i][h].z ^ buf[i][h].w;
        if (s0 + DEPTH + i < PIECE) buf[i][h] = ld_stream(p + 1024 * (s0 + DEPTH + i) + 512 * h);
      }
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads (practically never true)
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int STAGES, int CHUNK>
__global__ void __launch_bounds__(128) bulk_kernel(const uint8_t* __restrict__ base, int n_tiles, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kTileBytes = kTile * kRowBytes, kChunks = kTileBytes / CHUNK;
  static_assert(kTileBytes % CHUNK == 0 && CHUNK % 512 == 0, "whole chunks");
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int tile = static_cast<int>(blockIdx.x) * 4 + warp;
  uint8_t* ring = smem + warp * STAGES * CHUNK;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 4 * STAGES * CHUNK) + warp * STAGES;
  if (tile >= n_tiles) return;
  const uint8_t* src = base + static_cast<int64_t>(tile) * kTileBytes;
  if (lane == 0) {
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar + s)) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int c) {
    if (lane != 0) return;
    const int s = c % STAGES;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar + s)), "r"(CHUNK)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(ring + s * CHUNK)),
                 "l"(src + static_cast<int64_t>(c) * CHUNK), "r"(CHUNK), "r"(smem_u32(bar + s))
                 : "memory");
  };
  for (int c = 0; c < STAGES && c < kChunks; ++c) issue(c);
  uint32_t acc = 0;
  for (int c = 0; c < kChunks; ++c) {
    const int s = c % STAGES;
    const uint32_t parity = static_cast<uint32_t>(c / STAGES) & 1u;
    uint32_t done = 0;
    do {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_u32(bar + s)), "r"(parity)
          : "memory");
    } while (done == 0);
#pragma unroll
    for (int j = 0; j < CHUNK / 512; ++j) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(smem_u32(ring + s * CHUNK + 512 * j + 16 * lane)));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();
    if (c + STAGES < kChunks) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      issue(c + STAGES);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads (practically never true)
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
  int reserve_sms = 0;
  app.add_option("--reserve-sms", reserve_sms, "this many SMs held by a waiting kernel while the reads run")
      ->check(CLI::NonNegativeNumber);
  std::string only;
  app.add_option("--only", only, "the configurations whose name starts with this (tiled, bulk, piece, ...)");
  CLI11_PARSE(app, argc, argv);
  if (reserve_sms > 0) strata_bench::SmReserve::eager_modules();
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
  if (cudaMalloc(&data, set_bytes * kSets) != cudaSuccess || cudaMalloc(&sink, 8) != cudaSuccess) {
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
  std::unique_ptr<strata_bench::SmReserve> reserve;
  try {
    reserve = std::make_unique<strata_bench::SmReserve>(reserve_sms, prop.multiProcessorCount);
  } catch (const std::exception& e) {
    fmt::print("bench_read: {}\n", e.what());
    return 1;
  }
  fmt::print("device {}: {}, {} SMs; device-to-device copy {:.0f} GB/s (read + write)\n", device, prop.name,
             prop.multiProcessorCount, copy);
  fmt::print("reads of {:.1f} MB (16 matrices of {}x{} bytes), 16-row tiles, one warp per tile\n",
             set_bytes / 1e6, kRows, kRowBytes);
  fmt::print("{:<12} {:>6} {:>9} {:>10} {:>9} {:>11} {:>10} {:>10} {:>10}\n", "pattern", "depth", "blocks/SM",
             "median us", "GB/s", "% of 4.8TB", "% of copy", "steady", "% of 4.8TB");
  const int n_tiles = kMats * kRows / kTile;
  // One launch reading `sets` consecutive sets (tiles of every set), smem bytes of dynamic shared memory.
  // per_tile: warps per 48 KB tile (the piece kernels: 48 / PIECE).
  auto time_it = [&](auto kernel, int smem, int sets, int per_tile) {
    std::vector<double> t;
    const int tiles = n_tiles * sets, nblk = (tiles * per_tile + 3) / 4;
    for (int r = 0; r <= reps; ++r) {
      const uint8_t* base = data + (sets == 1 ? static_cast<size_t>(r % kSets) * set_bytes : 0);
      cudaMemsetAsync(sink, 0, 8);
      cudaEventRecord(e0);
      kernel<<<nblk, 128, smem>>>(base, tiles, sink);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (r > 0) t.push_back(ms);
    }
    return median(t);
  };
  auto report = [&](auto kernel, const char* name, int depth, int smem, int per_tile = 1) {
    if (std::string(name).rfind(only, 0) != 0) return;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem);
    const double ms = time_it(kernel, smem, 1, per_tile), ms4 = time_it(kernel, smem, kSets, per_tile);
    if (cudaGetLastError() != cudaSuccess) {
      fmt::print("{}: launch failed\n", name);
      return;
    }
    const double gbs = set_bytes / (ms * 1e-3) / 1e9;
    const double steady = (kSets - 1) * set_bytes / ((ms4 - ms) * 1e-3) / 1e9;
    fmt::print("{:<12} {:>6} {:>9} {:>10.1f} {:>9.0f} {:>10.1f}% {:>9.1f}% {:>10.0f} {:>9.1f}%\n", name, depth,
               per_sm, ms * 1e3, gbs, 100 * gbs / 4800, 100 * gbs / copy, steady, 100 * steady / 4800);
  };
  auto run = [&](auto kernel, const char* name, int depth) {
    for (int cap : {4, 0}) {
      report(kernel, name, depth, cap > 0 ? static_cast<int>(prop.sharedMemPerMultiprocessor / cap) - 1024 : 0);
    }
  };
  auto run_bulk = [&](auto kernel, int stages, int chunk) {
    const std::string name = fmt::format("bulk {}x{}K", stages, chunk / 1024);
    report(kernel, name.c_str(), stages, 4 * stages * (chunk + 8));
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
  const int cap4 = static_cast<int>(prop.sharedMemPerMultiprocessor / 4) - 1024;
  report(piece_kernel<2, 48, false>, "piece 48K", 2, cap4, 1);
  report(piece_kernel<2, 24, false>, "piece 24K", 2, cap4, 2);
  report(piece_kernel<2, 16, false>, "piece 16K", 2, cap4, 3);
  report(piece_kernel<2, 8, false>, "piece 8K", 2, cap4, 6);
  report(piece_kernel<2, 48, true>, "ticket 48K", 2, cap4, 1);
  report(piece_kernel<2, 16, true>, "ticket 16K", 2, cap4, 3);
  report(piece_kernel<4, 16, false>, "piece 16K", 4, cap4, 3);
  report(read_kernel<2, 2, 4>, "tiled+pf4", 2, static_cast<int>(prop.sharedMemPerMultiprocessor / 4) - 1024);
  report(read_kernel<2, 2, 8>, "tiled+pf8", 2, static_cast<int>(prop.sharedMemPerMultiprocessor / 4) - 1024);
  report(read_kernel<2, 2, 16>, "tiled+pf16", 2, static_cast<int>(prop.sharedMemPerMultiprocessor / 4) - 1024);
  run_bulk(bulk_kernel<4, 2048>, 4, 2048);
  run_bulk(bulk_kernel<8, 2048>, 8, 2048);
  run_bulk(bulk_kernel<4, 4096>, 4, 4096);
  run_bulk(bulk_kernel<3, 4096>, 3, 4096);
  run_bulk(bulk_kernel<6, 4096>, 6, 4096);
  run_bulk(bulk_kernel<3, 8192>, 3, 8192);
  run_bulk(bulk_kernel<4, 8192>, 4, 8192);
  run_bulk(bulk_kernel<2, 16384>, 2, 16384);
  reserve.reset();  // (before cudaFree, which waits for the whole device)
  cudaFree(data);
  cudaFree(sink);
  return 0;
}
