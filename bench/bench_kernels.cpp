// Kernel benchmark: the fused expert MLP (and one dense matmul) of every CPU plugin, in GB/s of weight bytes
// read, against the read bandwidth measured in the same run. Two suites: a GLM-5.2 routed-expert layer
// (hidden 6144, width 2048, 8 experts, 1/2/4 rows each) and the projection shape other MoE benchmarks use
// (128 experts of 768 × 2048, top-8, n = 1/4/32/512 tokens routed at random), cache-warm and cold.
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "bench_util.hpp"
#include "strata/quant.hpp"
#include "strata/registry.hpp"

using namespace strata;

namespace {

struct Pool {
  std::vector<QuantizedMatrix> q;         // int4 storage
  std::vector<std::vector<uint16_t>> bf;  // bf16 storage
  std::vector<ExpertMatrices> experts;
  double bytes_per_expert = 0;
};

Matrix make(Pool& p, WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = d(rng);
  if (f == WeightFormat::BF16) {
    std::vector<uint16_t> b(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &w[i], 4);
      b[i] = static_cast<uint16_t>(u >> 16);
    }
    p.bf.push_back(std::move(b));
    return Matrix{f, rows, cols, p.bf.back().data()};
  }
  p.q.push_back(quantize_q4(w, rows, cols, f));
  return p.q.back().view();
}

Pool make_pool(WeightFormat f, int n, int64_t hidden, int64_t ffn) {
  Pool p;
  p.q.reserve(static_cast<size_t>(3 * n));
  p.bf.reserve(static_cast<size_t>(3 * n));
  std::mt19937 rng(7);
  for (int e = 0; e < n; ++e) {
    ExpertMatrices m{make(p, f, ffn, hidden, rng), make(p, f, ffn, hidden, rng),
                     make(p, f, hidden, ffn, rng)};
    p.experts.push_back(m);
  }
  const auto& e = p.experts[0];
  p.bytes_per_expert = static_cast<double>(e.gate.bytes() + e.up.bytes() + e.down.bytes());
  return p;
}

struct Layer {
  std::vector<std::vector<int32_t>> rows;  // per expert of the pool
  int used = 0;
};

// n tokens, each routed to k distinct experts among [first, first + span).
Layer route(int n, int k, int first, int span, std::mt19937& rng, int pool) {
  Layer l;
  l.rows.resize(static_cast<size_t>(pool));
  std::uniform_int_distribution<int> pick(0, span - 1);
  for (int t = 0; t < n; ++t) {
    std::set<int> chosen;
    while (static_cast<int>(chosen.size()) < std::min(k, span)) chosen.insert(first + pick(rng));
    for (int e : chosen) l.rows[static_cast<size_t>(e)].push_back(t);
  }
  for (const auto& r : l.rows) l.used += r.empty() ? 0 : 1;
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_kernels: expert MLP GB/s per CPU plugin against measured read bandwidth"};
  std::string format = "q4_g64", only;
  int reps = 7, threads = 0;
  bool skip_projection = false;
  app.add_option("--format", format, "weight format: q4_g64, q4_row or bf16")
      ->check(CLI::IsMember({"q4_g64", "q4_row", "bf16"}));
  app.add_option("--plugin", only, "only this plugin");
  app.add_option("--reps", reps);
  app.add_option("--threads", threads, "0 = all");
  app.add_flag("--skip-projection", skip_projection, "only the GLM-5.2 suite");
  CLI11_PARSE(app, argc, argv);
  const WeightFormat f = format == "bf16" ? WeightFormat::BF16 : *parse_quant_name(format);

  const double bw = bench::measured_read_bandwidth_gbs(threads);
  const long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  fmt::print("measured read bandwidth: {:.1f} GB/s; last-level cache {:.0f} MiB; {} threads; format {}\n", bw,
             llc / 1048576.0,
             threads == 0 ? std::thread::hardware_concurrency() : static_cast<unsigned>(threads), format);
  PluginRegistry reg(plugin_search_path({}));
  std::mt19937 rng(3);

  // Suite 1: one GLM-5.2 layer's routed work: 8 experts, the same rows routed to each. Runs rotate over
  // enough layers' worth of distinct experts to exceed 2.5x the last-level cache, so every run reads from
  // memory.
  {
    const int64_t hidden = 6144, ffn = 2048;
    const double per_layer =
        8.0 * 3 * static_cast<double>(ffn * hidden) * (f == WeightFormat::BF16 ? 2.0 : 0.53);
    const int layers =
        std::max(3, static_cast<int>(2.5 * static_cast<double>(std::max(llc, 0L)) / per_layer) + 1);
    Pool pool = make_pool(f, 8 * layers, hidden, ffn);
    fmt::print(
        "\nGLM-5.2 expert layer: 8 experts of gate/up {}x{}, down {}x{}; {:.1f} MB per expert; cold "
        "(rotating "
        "over {} layers, {:.0f} MB)\n",
        ffn, hidden, hidden, ffn, pool.bytes_per_expert / 1e6, layers,
        8 * layers * pool.bytes_per_expert / 1e6);
    fmt::print("{:<12} {:>5} {:>11} {:>9} {:>8}\n", "plugin", "rows", "median ms", "GB/s", "% of bw");
    for (const auto* p : reg.ranked()) {
      if (!only.empty() && p->name != only) continue;
      auto b = reg.create(*p, threads);
      for (int rows : {1, 2, 4}) {
        std::vector<Layer> ls;
        for (int l = 0; l < layers; ++l) {
          Layer x;
          x.rows.resize(pool.experts.size());
          for (int e = 0; e < 8; ++e) {
            for (int r = 0; r < rows; ++r) x.rows[static_cast<size_t>(l * 8 + e)].push_back(r);
          }
          x.used = 8;
          ls.push_back(x);
        }
        int next = 0;
        std::vector<float> xin(static_cast<size_t>(rows * hidden), 0.01f);
        std::vector<float> out(static_cast<size_t>(rows * hidden) * 8 * static_cast<size_t>(layers));
        const double s = bench::median_seconds(reps * layers, [&] {
          const Layer& l = ls[static_cast<size_t>(next++ % layers)];
          std::vector<ExpertTask> tasks;
          for (size_t e = 0; e < l.rows.size(); ++e) {
            if (!l.rows[e].empty())
              tasks.push_back({&pool.experts[e], l.rows[e], out.data() + e * rows * hidden});
          }
          b->expert_group(xin.data(), rows, hidden, tasks);
        });
        const double gbs = 8 * pool.bytes_per_expert / s / 1e9;
        fmt::print("{:<12} {:>5} {:>11.3f} {:>9.1f} {:>7.1f}%\n", p->name, rows, s * 1e3, gbs,
                   100 * gbs / bw);
      }
    }
  }
  if (skip_projection) return 0;
  // Suite 2: 128 experts of 768 x 2048, top-8 of n tokens at random. Warm: always the same 8-expert span (n =
  // 1) or the whole pool, which fits the cache; cold: rotating over 4 pools so every run reads from memory.
  {
    const int64_t hidden = 2048, ffn = 768;
    const int n_exp = 128;
    const double pool_bytes =
        n_exp * 3.0 * static_cast<double>(ffn * hidden) * (f == WeightFormat::BF16 ? 2.0 : 0.53);
    const int pools =
        std::max(2, static_cast<int>(2.5 * static_cast<double>(std::max(llc, 0L)) / pool_bytes) + 1);
    Pool pool = make_pool(f, n_exp * pools, hidden, ffn);
    fmt::print(
        "\nprojection shape: {} experts of {}x{} (gate/up) + {}x{} (down), top-8; {:.2f} MB per expert; cold "
        "rotates over {} pools ({:.0f} MB)\n",
        n_exp, ffn, hidden, hidden, ffn, pool.bytes_per_expert / 1e6, pools,
        pools * n_exp * pool.bytes_per_expert / 1e6);
    fmt::print("{:<12} {:>5} {:>5} {:>8} {:>11} {:>9} {:>8}\n", "plugin", "n", "used", "cache", "median ms",
               "GB/s", "% of bw");
    for (const auto* p : reg.ranked()) {
      if (!only.empty() && p->name != only) continue;
      auto b = reg.create(*p, threads);
      for (int n : {1, 4, 32, 512}) {
        for (bool cold : {false, true}) {
          std::vector<Layer> ls;
          for (int k = 0; k < (cold ? pools : 1); ++k)
            ls.push_back(route(n, 8, k * n_exp, n_exp, rng, n_exp * pools));
          int next = 0;
          std::vector<float> x(static_cast<size_t>(n) * hidden, 0.01f);
          std::vector<std::vector<float>> outs(static_cast<size_t>(n_exp * pools));
          const double s = bench::median_seconds(reps * static_cast<int>(ls.size()), [&] {
            const Layer& l = ls[static_cast<size_t>(next++) % ls.size()];
            std::vector<ExpertTask> tasks;
            for (size_t e = 0; e < l.rows.size(); ++e) {
              if (l.rows[e].empty()) continue;
              outs[e].resize(l.rows[e].size() * static_cast<size_t>(hidden));
              tasks.push_back({&pool.experts[e], l.rows[e], outs[e].data()});
            }
            b->expert_group(x.data(), n, hidden, tasks);
          });
          const double bytes = ls[0].used * pool.bytes_per_expert;
          const double gbs = bytes / s / 1e9;
          fmt::print("{:<12} {:>5} {:>5} {:>8} {:>11.3f} {:>9.1f} {:>7.1f}%\n", p->name, n, ls[0].used,
                     cold ? "cold" : "warm", s * 1e3, gbs, 100 * gbs / bw);
        }
      }
    }
  }
  return 0;
}
