// Benchmark helpers: medians and a STREAM-like read-bandwidth probe (sum of 1 GiB of floats, all threads).
#include "bench_util.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdio>

namespace strata::bench {

double median_seconds(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double measured_read_bandwidth_gbs(int threads) {
  const size_t n = (1ull << 30) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  volatile float sink = 0;
  const double sec = median_seconds(5, [&] {
    arena.execute([&] {
      sink = tbb::parallel_reduce(
          tbb::blocked_range<size_t>(0, n, 1 << 16), 0.0f,
          [&](const tbb::blocked_range<size_t>& r, float acc) {
            float a[16] = {};
            for (size_t i = r.begin(); i + 16 <= r.end(); i += 16) {
              for (int l = 0; l < 16; ++l) a[l] += buf[i + l];
            }
            for (float v : a) acc += v;
            return acc;
          },
          [](float x, float y) { return x + y; });
    });
  });
  (void)sink;
  return static_cast<double>(n * sizeof(float)) / sec / 1e9;
}

}  // namespace strata::bench
