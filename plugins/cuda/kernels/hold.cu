// A one-thread kernel that spins for a given time: the bench queues a group's launches behind it, so that
// their device time no longer includes the host's submission of them (bench_cuda's "queued" column).
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

}  // namespace

cudaError_t launch_hold(int us, cudaStream_t stream) {
  if (us <= 0) return cudaSuccess;
  return launch_kernel(&hold_kernel, dim3(1), dim3(1), Queue{stream, false}, false,
                       static_cast<uint64_t>(us) * 1000u);
}

}  // namespace strata_cuda
