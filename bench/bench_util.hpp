// Benchmark helpers: timing medians and the machine's measured memory read bandwidth.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

namespace strata::bench {

// Runs f `reps` times after one warm-up; returns the median seconds.
double median_seconds(int reps, const std::function<void()>& f);

// Multi-threaded streaming read of a buffer much larger than the caches; median GB/s (1e9 bytes/s).
double measured_read_bandwidth_gbs(int threads);

}  // namespace strata::bench
