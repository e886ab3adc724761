// CPU emulation of the CUDA device features the kernels use (STRATA_CUDA_EMULATE builds only; see emu.cpp):
// thread/block coordinates, __ldg/__ldcg, atomicAdd, __threadfence, warp shuffles, __syncwarp, __syncthreads,
// mma.sync m16n8k16 bf16 and m16n8k32 s8, one bf16x2 fma, cp.async (queued per thread, carried out at its
// wait) and dynamic shared memory, with warps run as 32 fibers that meet at every collective instruction.
#pragma once

#include <cuda_runtime.h>

#include <math.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace strata_cuda::emu {

struct Coords {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim;
  dim3 grid_dim;
  uint64_t launch = 0;  // which launch the block belongs to (run_grid counts them)
};
Coords& coords();

// Runs body for every thread of the grid, block after block (with collectives and at most 8 blocks, taking
// turns at each __syncthreads and spin-wait); with collectives, each warp as 32 fibers.
void run_grid(dim3 grid, dim3 block, bool collectives, const std::function<void()>& body);
// A stream operation: runs now, or, while s is capturing, joins the graph being captured (and runs when the
// graph is launched).
void enqueue(cudaStream_t s, std::function<void()> op);

// The emulated devices' compute capability as 10 major + minor: STRATA_CUDA_EMU_SM (read at every call, so a
// test sets it around one backend), 90 by default. Below 90 a launch that asks for a programmatic dependent
// launch fails, as the hardware has none.
int sm_version();
// The PTX version the emulated kernels are "compiled from": STRATA_CUDA_EMU_PTX, else sm_version() (machine
// code for the device itself). Below 90 they hold no griddepcontrol, and a launch asking for a dependent
// launch fails too (on a GPU it would race).
int ptx_version();

// The most shared memory a block may ask for on the emulated device (cudaDevAttrMaxSharedMemoryPerBlockOptin):
// sm_80/87 163 KB, sm_90/100 227 KB, the others (sm_86, 89, 120: consumer cards) 99 KB. A launch asking for
// more fails, as on the hardware.
int max_smem_optin();
// The calling block's dynamic shared memory (STRATA_DYN_SMEM): max_smem_optin() bytes, filled with 0xA5 when a
// block first asks for it, so a read of a place no copy has landed in yet gives garbage, not a value an earlier
// block left there.
uint8_t* dyn_smem();
// cp.async (device_util.cuh): a copy is queued for the calling thread and carried out only when a
// cp_async_wait lets its group complete, so a missing wait (or barrier) reads the poison above. Sizes 4, 8, 16;
// both addresses aligned to the size.
void cp_async(void* dst, const void* src, int bytes);
void cp_async_commit();
void cp_async_wait(int n);  // all but the newest n committed groups
// The most dynamic shared memory a launch of `kernel` may ask for: 48 KB unless cudaFuncSetAttribute
// (cudaFuncAttributeMaxDynamicSharedMemorySize) allowed more. STRATA_CUDA_EMU_NO_DYN_SMEM=1: none at all (a
// test's way to see that a path launched a kernel with dynamic shared memory: its launch then fails).
int max_dyn_smem(const void* kernel);

// A spin-wait's pause (sleep_ns): another block's turn; dies in a grid whose blocks run one after another.
void spin_pause();
// %globaltimer: the host's steady clock in ns.
uint64_t now_ns();
void syncwarp();
void syncthreads();
float shfl_xor(float v, int lane_mask);
// D = A * B + C by the PTX ISA's m16n8k16 fragment layouts (products exact, sum in double, rounded once).
void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                    uint32_t b1, float c0, float c1, float c2, float c3);
// D = A * B + C by the PTX ISA's m16n8k32 .s8 fragment layouts (int32, exact; wraps as the hardware does).
void mma_s8_16832(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                  uint32_t b1, int32_t c0, int32_t c1, int32_t c2, int32_t c3);
// fma.rn.bf16x2(v, 1.0, -136.0) for v = two bf16 values in [128, 144): exact, (v - 136) each.
uint32_t bf16x2_sub136(uint32_t v);
[[noreturn]] void die(const char* what);

template <class T>
T load(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) die("misaligned device load");
  return *p;
}

}  // namespace strata_cuda::emu

#undef __shared__
#define __shared__ static thread_local
#undef __launch_bounds__
#define __launch_bounds__(...)
#define threadIdx (::strata_cuda::emu::coords().thread_idx)
#define blockIdx (::strata_cuda::emu::coords().block_idx)
#define blockDim (::strata_cuda::emu::coords().block_dim)
#define gridDim (::strata_cuda::emu::coords().grid_dim)

template <class T>
inline T __ldg(const T* p) {
  return ::strata_cuda::emu::load(p);
}
template <class T>
inline T __ldcg(const T* p) {
  return ::strata_cuda::emu::load(p);
}
// One block runs at a time, and blocks change turns only at __syncthreads and spin-waits: atomics and fences
// need nothing more.
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old > v ? old : v;
  return old;
}
inline void __threadfence() {}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  return ::strata_cuda::emu::shfl_xor(v, lane_mask);
}
inline void __syncwarp() {
  ::strata_cuda::emu::syncwarp();
}
inline void __syncthreads() {
  ::strata_cuda::emu::syncthreads();
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
