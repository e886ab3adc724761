// Bench helpers: a one-thread kernel that spins for a given time (the bench queues a group's launches behind
// it, so that their device time no longer includes the host's submission of them: bench_cuda's "queued"
// column), and one that keeps SMs to itself (bench_cuda --reserve-sms: the kernels measured run on the other
// SMs).
#include "device_util.cuh"

namespace strata_cuda {
namespace {

__global__ void hold_kernel(uint64_t ns) {
#if !defined(STRATA_CUDA_EMULATE)
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
#else
  (void)ns;  // the emulation runs launches in order on the host: nothing to hold
#endif
}

#if !defined(STRATA_CUDA_EMULATE)
// One block per SM: it asks for all the shared memory a block may have, so no other block fits beside it, and
// spins (sleeping, reading no memory but the flag in device memory) until *stop is set or limit_ns has passed
// (then sets *expired). Its SM goes to smids[blockIdx.x] before the block counts itself in *started.
__global__ void occupy_kernel(const volatile int* stop, int* started, int* expired, int* smids,
                              uint64_t limit_ns) {
  if (threadIdx.x != 0) return;
  unsigned sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  smids[blockIdx.x] = static_cast<int>(sm);
  __threadfence();
  atomicAdd(started, 1);
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(20000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*stop == 0 && t - t0 < limit_ns);
  if (*stop == 0) *reinterpret_cast<volatile int*>(expired) = 1;
}
#endif

}  // namespace

cudaError_t launch_occupy(int n_sms, const volatile int* stop, int* started, int* expired, int* smids,
                          int limit_ms, cudaStream_t stream) {
#if defined(STRATA_CUDA_EMULATE)
  (void)n_sms, (void)stop, (void)started, (void)expired, (void)smids, (void)limit_ms, (void)stream;
  return cudaErrorNotSupported;  // (the emulation runs one launch at a time: a waiting block never ends)
#else
  int dev = 0, smem = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(reinterpret_cast<const void*>(&occupy_kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  return launch_kernel_smem(&occupy_kernel, dim3(static_cast<unsigned>(n_sms)), dim3(32),
                            static_cast<unsigned>(smem), Queue{stream, false}, false, stop, started, expired,
                            smids, static_cast<uint64_t>(limit_ms) * 1000000u);
#endif
}

cudaError_t launch_hold(int us, cudaStream_t stream) {
  if (us <= 0) return cudaSuccess;
  return launch_kernel(&hold_kernel, dim3(1), dim3(1), Queue{stream, false}, false,
                       static_cast<uint64_t>(us) * 1000u);
}

}  // namespace strata_cuda
