// Kernel benchmark: dense matmul and the fused expert MLP of every CPU plugin, in GB/s of weights read, against
// the measured memory read bandwidth. Shapes default to one GLM-5.2 routed expert (hidden 6144, width 2048).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstring>
#include <random>

#include "bench_util.hpp"
#include "strata/registry.hpp"

using namespace strata;

namespace {
std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 0.02f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = d(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    x = static_cast<uint16_t>(b >> 16);
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_kernels: expert MLP and matmul GB/s per CPU plugin"};
  int64_t hidden = 6144, ffn = 2048;
  int experts = 8, reps = 7, threads = 0;
  std::vector<int> rows_list = {1, 2, 4};
  app.add_option("--hidden", hidden);
  app.add_option("--ffn", ffn, "expert width (moe_intermediate_size)");
  app.add_option("--experts", experts, "experts in the layer-sized group");
  app.add_option("--rows", rows_list, "rows (tokens) routed to each expert");
  app.add_option("--reps", reps);
  app.add_option("--threads", threads, "0 = all");
  CLI11_PARSE(app, argc, argv);

  const double bw = bench::measured_read_bandwidth_gbs(threads);
  fmt::print("measured read bandwidth: {:.1f} GB/s ({} threads)\n", bw, threads);
  fmt::print("shape: {} experts of gate/up {}x{}, down {}x{}, BF16\n", experts, ffn, hidden, hidden, ffn);

  std::mt19937 rng(1);
  std::vector<std::vector<uint16_t>> store;
  std::vector<ExpertMatrices> ex;
  for (int e = 0; e < experts; ++e) {
    store.push_back(random_bf16(static_cast<size_t>(ffn * hidden), rng));
    store.push_back(random_bf16(static_cast<size_t>(ffn * hidden), rng));
    store.push_back(random_bf16(static_cast<size_t>(hidden * ffn), rng));
  }
  for (int e = 0; e < experts; ++e) {
    ex.push_back({Matrix{WeightFormat::BF16, ffn, hidden, store[3 * e].data()},
                  Matrix{WeightFormat::BF16, ffn, hidden, store[3 * e + 1].data()},
                  Matrix{WeightFormat::BF16, hidden, ffn, store[3 * e + 2].data()}});
  }
  const double weight_bytes = static_cast<double>(experts) * 3 * ffn * hidden * 2;

  PluginRegistry reg(plugin_search_path({}));
  fmt::print("{:<12} {:>5} {:>12} {:>10} {:>8}\n", "plugin", "rows", "median ms", "GB/s", "% of bw");
  for (const auto* p : reg.ranked()) {
    auto backend = reg.create(*p, threads);
    for (int rows : rows_list) {
      std::vector<float> x(static_cast<size_t>(rows * hidden), 0.01f);
      std::vector<int32_t> idx(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) idx[r] = r;
      std::vector<std::vector<float>> out(static_cast<size_t>(experts), std::vector<float>(static_cast<size_t>(rows * hidden)));
      std::vector<ExpertTask> tasks;
      for (int e = 0; e < experts; ++e) tasks.push_back({&ex[e], idx, out[e].data()});
      const double s = bench::median_seconds(reps, [&] { backend->expert_group(x.data(), rows, hidden, tasks); });
      const double gbs = weight_bytes / s / 1e9;
      fmt::print("{:<12} {:>5} {:>12.3f} {:>10.1f} {:>7.1f}%\n", p->name, rows, s * 1e3, gbs, 100 * gbs / bw);
    }
    // Dense matmul of one [hidden, hidden]-sized BF16 matrix, 1 row.
    auto w = random_bf16(static_cast<size_t>(hidden * hidden), rng);
    std::vector<float> x(static_cast<size_t>(hidden), 0.01f), y(static_cast<size_t>(hidden));
    const Matrix m{WeightFormat::BF16, hidden, hidden, w.data()};
    const double s = bench::median_seconds(reps, [&] { backend->matmul(m, x.data(), 1, y.data()); });
    const double gbs = static_cast<double>(hidden * hidden * 2) / s / 1e9;
    fmt::print("{:<12} {:>5} {:>12.3f} {:>10.1f} {:>7.1f}%   (matmul {}x{})\n", p->name, 1, s * 1e3, gbs, 100 * gbs / bw,
               hidden, hidden);
  }
  return 0;
}
