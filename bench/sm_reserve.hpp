// bench/sm_reserve.hpp: keeps some of the GPU's SMs busy with a waiting kernel while a bench measures, so
// that the kernels measured run on the others (bench_cuda and bench_read --reserve-sms).
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>

#include "kernels/work.hpp"  // launch_occupy

namespace strata_bench {

// --reserve-sms N: N SMs held by a block each of a kernel that waits (strata_cuda::launch_occupy) for the
// object's lifetime. The H200 has the H100's SMs and clocks with 1.43x the bandwidth, so a kernel bound by its
// per-SM work reaches a smaller share of the H200's peak. An H100 with fewer SMs at work has more bandwidth per
// SM: 40 held (92 left) is the H200's share per SM, but measured against the H200's own figures for one kernel
// (2026-12-05, run97 against run61) it took 52 held for the H100's % of peak to match the H200's at 1, 2 and
// 3-4 rows, so 52 is the stand-in. Nothing that waits for the whole device may run meanwhile (cudaFree,
// cudaDeviceSynchronize, and the first launch of a kernel loaded lazily: the program calls eager_modules()
// before its first CUDA call): it would wait until the kernel's time limit, and what it measured then ran on
// every SM (expired() says so).
class SmReserve {
 public:
  // Every kernel loaded when the context is made (CUDA_MODULE_LOADING=EAGER), not at its first launch, which
  // may wait for the device's other work. Before the program's first CUDA call.
  static void eager_modules() { setenv("CUDA_MODULE_LOADING", "EAGER", 1); }

  // The flags live in device memory, written and read by copies on a stream of their own: polling mapped
  // host memory from the waiting blocks slowed every kernel beside them ~10x (an H100, run94).
  SmReserve(int n, int sms, int limit_ms = 60000, bool announce = true) : n_(n) {
    if (n <= 0) return;
    if (n >= sms) throw std::runtime_error(fmt::format("--reserve-sms {}: the device has {} SMs", n, sms));
    try {
      hold(n, limit_ms);
    } catch (...) {
      release();  // (the waiting blocks stopped, so nothing waits for them)
      throw;
    }
    if (announce) {
      fmt::print("reserved {} of {} SMs (a waiting block each): the kernels below run on the other {}\n", n,
                 sms, sms - n);
    }
  }
  ~SmReserve() {
    const bool ran_out = expired();
    release();
    if (ran_out) {
      fmt::print("warning: the SM reservation ran out of time (or a call waited for the whole device): what was "
                 "measured while it was held ran partly on every SM\n");
    }
  }
  SmReserve(const SmReserve&) = delete;
  SmReserve& operator=(const SmReserve&) = delete;

  // The SMs held (their %smid), sorted.
  const std::set<int>& held() const { return held_; }

  // Whether the waiting blocks left because their time ran out: the SMs were not held all along.
  bool expired() {
    if (dev_ == nullptr || host_ == nullptr || ctl_ == nullptr) return false;
    read_flags(3 * sizeof(int));
    return host_[2] != 0;
  }

 private:
  void hold(int n, int limit_ms) {
    const size_t bytes = sizeof(int) * static_cast<size_t>(n + 3);
    if (cudaMalloc(reinterpret_cast<void**>(&dev_), bytes) != cudaSuccess ||
        cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, cudaHostAllocDefault) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&ctl_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMemsetAsync(dev_, 0, 3 * sizeof(int), ctl_) != cudaSuccess ||
        cudaMemsetAsync(dev_ + 3, 0xFF, sizeof(int) * static_cast<size_t>(n), ctl_) != cudaSuccess ||
        cudaStreamSynchronize(ctl_) != cudaSuccess) {
      throw std::runtime_error("--reserve-sms: no device memory or streams for the flags");
    }
    const cudaError_t e = strata_cuda::launch_occupy(n, dev_, dev_ + 1, dev_ + 2, dev_ + 3, limit_ms, stream_);
    if (e != cudaSuccess)
      throw std::runtime_error(fmt::format("--reserve-sms: launch_occupy: {}", cudaGetErrorName(e)));
    launched_ = true;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      read_flags(bytes);
      if (host_[1] >= n) break;
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5))
        throw std::runtime_error(fmt::format("--reserve-sms: only {} of {} blocks started", host_[1], n));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    held_ = std::set<int>(host_ + 3, host_ + 3 + n);
    if (static_cast<int>(held_.size()) != n || *held_.begin() < 0)
      throw std::runtime_error(fmt::format("--reserve-sms: {} blocks on only {} SMs", n, held_.size()));
  }
  // Stops the waiting blocks (when launched) and frees everything.
  void release() {
    if (launched_ && dev_ != nullptr && host_ != nullptr && ctl_ != nullptr) {
      host_[0] = 1;
      (void)cudaMemcpyAsync(dev_, host_, sizeof(int), cudaMemcpyHostToDevice, ctl_);
      (void)cudaStreamSynchronize(ctl_);
      if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    }
    launched_ = false;
    for (cudaStream_t* s : {&stream_, &ctl_}) {
      if (*s != nullptr) (void)cudaStreamDestroy(*s);
      *s = nullptr;
    }
    if (host_ != nullptr) (void)cudaFreeHost(host_);
    if (dev_ != nullptr) (void)cudaFree(dev_);
    host_ = nullptr;
    dev_ = nullptr;
  }
  void read_flags(size_t bytes) {
    (void)cudaMemcpyAsync(host_, dev_, bytes, cudaMemcpyDeviceToHost, ctl_);
    (void)cudaStreamSynchronize(ctl_);
  }
  int n_;
  std::set<int> held_;
  bool launched_ = false;
  int* dev_ = nullptr;   // stop flag, blocks started, time ran out, their SMs
  int* host_ = nullptr;  // (pinned: their copy)
  cudaStream_t stream_ = nullptr, ctl_ = nullptr;
};

}  // namespace strata_bench
