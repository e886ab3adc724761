// CUDA expert kernels (the cuda plugin's backend, used directly): kernel time from device events, medians.
//   1. the copy bandwidth of the device (the ceiling, read + write) and its datasheet figure (H200: 4.8
//   TB/s);
//   2. GLM-5.2 routed-expert layer at decode: 8 experts of gate/up 2048x6144 + down 6144x2048, Q4_G64 (and
//      Q4_ROW), 1-8 rows per expert, GB/s of weights read (cold: rotating over layers 10x the L2), for the
//      exact-mode kernels: gemv (opt-in: STRATA_CUDA_GEMV_MAX_ROWS), the exact tensor-core path (the default)
//      and SIMT;
//   3. the projection shape: 128 experts of 768x2048, top-8 of n = 1, 4, 32, 512 tokens routed at random;
//   4. the exact paths (gemv, exact int8 tensor cores: the default, wide kernels from 9 rows, and the narrow
//      ones alone) vs W4A16 at 1..512 rows per expert: TFLOP/s, and where W4A16 (and the tensor cores) start
//      to pay (the crossovers); alone with --prefill;
//   5. issue -> take latency of a small group (resident weights), and of an empty group (pure overhead);
//   6. (also with --decode, alone with --latency) a GLM-5.2 layer issued and taken as the engine does at
//   decode:
//      wall time from the issue to the take's return, back to back and after the device sat idle (the host
//      computing attention), with the take's polling as set and with a 50 us poll before sleeping.
// --reserve-sms N: suite 2's timed passes with N SMs held by a waiting kernel (sm_reserve.hpp): an H100 with 52
// held stands in for an H200 (calibrated against the H200's figures, docs/benchmarks.md).
// --timeline: instead of all that, where a GLM-5.2 layer launch's time goes at 1-4 rows: the layer kernel
// records each tile's SM, start, inputs and end (the device's ns clock), summarised per launch.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "cuda_backend.hpp"
#include "strata/safetensors.hpp"  // write_file_atomic
#include "kernels/work.hpp"  // launch_hold
#include "sm_reserve.hpp"

using strata_cuda::CudaBackend;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A random int4 matrix (any nibbles; scales ~0.01): the bytes are what matters for bandwidth.
struct HostQ4 {
  int32_t dtype;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

HostQ4 random_q4(int32_t dtype, int64_t rows, int64_t cols, uint64_t seed) {
  HostQ4 m{dtype, rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows * ((cols + 1) / 2))), {}};
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= m.bytes.size(); i += 8) {
    const uint64_t v = splitmix(s);
    std::memcpy(m.bytes.data() + i, &v, 8);
  }
  for (; i < m.bytes.size(); ++i) m.bytes[i] = static_cast<uint8_t>(splitmix(s));
  const int64_t n_scales = dtype == STRATA_DTYPE_Q4_G64 ? rows * ((cols + 63) / 64) : rows;
  m.scales.resize(static_cast<size_t>(n_scales));
  for (auto& v : m.scales) v = 0.005f + 0.01f * static_cast<float>(splitmix(s) % 1000) / 1000.0f;
  return m;
}

strata_matrix view(const HostQ4& m) {
  strata_matrix c{};
  c.dtype = m.dtype;
  c.rows = m.rows;
  c.cols = m.cols;
  c.data = m.bytes.data();
  c.scales = m.scales.data();
  return c;
}

double q4_bytes(int32_t dtype, int64_t rows, int64_t cols) {
  const double scales = dtype == STRATA_DTYPE_Q4_G64 ? static_cast<double>(rows * ((cols + 63) / 64)) : rows;
  return static_cast<double>(rows) * static_cast<double>((cols + 1) / 2) + 4 * scales;
}

// Experts resident on the device.
struct Pool {
  std::vector<strata_resident*> res;
  std::vector<strata_expert> experts;
  double bytes_per_expert = 0;
  CudaBackend* b = nullptr;
  ~Pool() {
    for (auto* r : res) {
      try {
        b->free(r);
      } catch (...) {
      }
    }
  }
};

void make_pool(Pool& p, CudaBackend& b, int32_t dtype, int n, int64_t hidden, int64_t ffn, uint64_t seed) {
  p.b = &b;
  p.experts.resize(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) {
    strata_matrix m[3];
    const int64_t shapes[3][2] = {{ffn, hidden}, {ffn, hidden}, {hidden, ffn}};
    for (int k = 0; k < 3; ++k) {
      const HostQ4 h = random_q4(dtype, shapes[k][0], shapes[k][1], seed + static_cast<uint64_t>(3 * e + k));
      strata_resident* r = b.upload(view(h));
      p.res.push_back(r);
      m[k] = strata_matrix{};
      m[k].dtype = dtype;
      m[k].rows = shapes[k][0];
      m[k].cols = shapes[k][1];
      m[k].resident = r;
    }
    p.experts[static_cast<size_t>(e)] = strata_expert{m[0], m[1], m[2]};
  }
  p.bytes_per_expert = 2 * q4_bytes(dtype, ffn, hidden) + q4_bytes(dtype, hidden, ffn);
}

// One group: per expert (index into the pool) its rows; outputs owned here.
struct Group {
  std::vector<std::vector<int32_t>> rows;
  std::vector<int> expert;
  std::vector<std::vector<float>> out;
  std::vector<strata_expert_task> tasks;
  int64_t total_rows = 0;
  void finalize(const Pool& p, int64_t hidden) {
    out.resize(rows.size());
    tasks.clear();
    total_rows = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      out[i].assign(rows[i].size() * static_cast<size_t>(hidden), 0.0f);
      strata_expert_task t{};
      t.expert = &p.experts[static_cast<size_t>(expert[i])];
      t.n_rows = static_cast<int32_t>(rows[i].size());
      t.rows = rows[i].data();
      t.out = out[i].data();
      tasks.push_back(t);
      total_rows += t.n_rows;
    }
  }
};

// Median kernel ms over `rounds` passes through the groups (each timed once per pass, after a warm-up pass).
// hold_us > 0: the launches queued behind a spinning kernel (device time without the host's submission).
// reserve_sms > 0: the timed passes with that many SMs held (sm_reserve.hpp); the warm-up pass, which may grow
// the slot's buffers (freeing memory waits for the whole device), without.
double time_groups(CudaBackend& b, std::vector<Group>& gs, const std::vector<float>& x, int64_t n_x,
                   int64_t hidden, int rounds, int hold_us = 0, int reserve_sms = 0) {
  std::vector<double> ms;
  std::unique_ptr<strata_bench::SmReserve> reserve;
  for (int r = 0; r <= rounds; ++r) {
    if (r == 1 && reserve_sms > 0) {
      int dev = 0, sms = 0;
      (void)cudaGetDevice(&dev);
      (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      reserve = std::make_unique<strata_bench::SmReserve>(reserve_sms, sms, 20000, false);
      static bool told = false;  // (once: which SMs the kernels measured do not run on, by %smid)
      if (!told) fmt::print("the SMs held: {}\n", fmt::join(reserve->held(), " "));
      told = true;
    }
    for (auto& g : gs) {
      const auto t = b.time_expert_group(x.data(), n_x, hidden, static_cast<int32_t>(g.tasks.size()),
                                         g.tasks.data(), 1, hold_us);
      if (r > 0) ms.push_back(t.at(0));
    }
  }
  if (reserve && reserve->expired())
    throw std::runtime_error("--reserve-sms: the SMs were not held during the whole measurement (time ran out)");
  return median(ms);
}

// The layer kernel's tile records of one launch (CudaBackend::time_expert_group's timeline), summarised:
// times in us from the first tile's start. in flight: tiles between their inputs and their end (a tile
// waiting for its inputs is not counted), per us.
struct TimelineSummary {
  double span = 0;          // the first tile's start to the last tile's end
  double inputs_first = 0;  // the first and the median input time of the first wave (the previous launch)
  double inputs_wave = 0;
  double out = 0;                   // the last ticket's start: the tickets run out
  double tile_gu = 0, tile_dn = 0;  // median tile time (inputs to end), gate/up and down
  double down_wait = 0;             // the longest a down tile waited for its h (start to inputs)
  int peak = 0;                     // most tiles in flight
  // The first preparation launch's earliest block start and latest block end (negative: before the first
  // tile's start), and the device's span from that start to the last tile's end (both launches' own time,
  // without the launch latency after the event that the queued time includes); 0 without its stamps.
  double prep_start = 0, prep_end = 0, device = 0;
  double full_until = 0;            // the last us with at least 90 % of the peak in flight
  std::vector<int> busy;            // tiles in flight per us
};

// A launch's records (time_expert_group's timeline): how many tickets, the first tile's start t0 (UINT64_MAX:
// none ran) and, when the first preparation launch stamped them, its earliest block start and latest block
// end in ns from t0 (negative: before it).
struct TimelineFrame {
  size_t n = 0;
  uint64_t t0 = UINT64_MAX;
  bool prep = false;
  int64_t prep_first = 0, prep_last = 0;
  uint64_t at(const std::vector<uint64_t>& rec, size_t t, int k) const {
    return rec[t * strata_cuda::kTimelineWords + static_cast<size_t>(k)];
  }
};
TimelineFrame timeline_frame(const std::vector<uint64_t>& rec) {
  namespace S = strata_cuda;
  TimelineFrame f;
  f.n = rec.size() / S::kTimelineWords;
  for (size_t t = 0; t < f.n; ++t) {
    if (f.at(rec, t, S::kTimelineBegin) != 0) f.t0 = std::min(f.t0, f.at(rec, t, S::kTimelineBegin));
  }
  if (f.t0 == UINT64_MAX || rec.size() % S::kTimelineWords != S::kPrepStampWords) return f;
  const uint64_t* st = rec.data() + f.n * S::kTimelineWords;
  if (st[S::kPrepStampFirst] != 0 && st[S::kPrepStampLast] != 0) {
    f.prep = true;
    f.prep_first = static_cast<int64_t>(~st[S::kPrepStampFirst]) - static_cast<int64_t>(f.t0);
    f.prep_last = static_cast<int64_t>(st[S::kPrepStampLast]) - static_cast<int64_t>(f.t0);
  }
  return f;
}

TimelineSummary summarize_timeline(const std::vector<uint64_t>& rec, int n_gu_tiles) {
  namespace S = strata_cuda;
  TimelineSummary r;
  const TimelineFrame f = timeline_frame(rec);
  if (f.t0 == UINT64_MAX) return r;
  const size_t n = f.n;
  const uint64_t t0 = f.t0;
  auto at = [&](size_t t, int k) { return f.at(rec, t, k); };
  uint64_t t_end = 0, t_out = 0;
  for (size_t t = 0; t < n; ++t) {
    if (at(t, S::kTimelineBegin) == 0) continue;  // (not run: none expected)
    t_end = std::max(t_end, at(t, S::kTimelineEnd));
    t_out = std::max(t_out, at(t, S::kTimelineBegin));
  }
  auto us = [&](uint64_t v) { return static_cast<double>(v - t0) * 1e-3; };
  r.span = us(t_end);
  r.out = us(t_out);
  if (f.prep) {
    r.prep_start = static_cast<double>(f.prep_first) * 1e-3;
    r.prep_end = static_cast<double>(f.prep_last) * 1e-3;
    r.device = r.span - r.prep_start;
  }
  std::vector<double> first_inputs, gu, dn;
  r.inputs_first = r.span;
  r.busy.assign(static_cast<size_t>(r.span) + 1, 0);
  for (size_t t = 0; t < n; ++t) {
    const uint64_t b = at(t, S::kTimelineBegin), in = at(t, S::kTimelineInputs), e = at(t, S::kTimelineEnd);
    if (b == 0 || in == 0) continue;  // (a tile past its item's rows: no inputs waited for)
    if (us(b) < 1.0) {
      first_inputs.push_back(us(in));
      r.inputs_first = std::min(r.inputs_first, us(in));
    }
    (static_cast<int>(t) < n_gu_tiles ? gu : dn).push_back(static_cast<double>(e - in) * 1e-3);
    if (static_cast<int>(t) >= n_gu_tiles)
      r.down_wait = std::max(r.down_wait, static_cast<double>(in - b) * 1e-3);
    for (size_t k = static_cast<size_t>(us(in)); k <= static_cast<size_t>(us(e)) && k < r.busy.size(); ++k) {
      ++r.busy[k];
    }
  }
  r.inputs_wave = first_inputs.empty() ? 0 : median(first_inputs);
  r.tile_gu = gu.empty() ? 0 : median(gu);
  r.tile_dn = dn.empty() ? 0 : median(dn);
  for (int v : r.busy) r.peak = std::max(r.peak, v);
  for (size_t k = 0; k < r.busy.size(); ++k) {
    if (10 * r.busy[k] >= 9 * r.peak) r.full_until = static_cast<double>(k + 1);
  }
  return r;
}

// One launch's tile records as CSV lines (times in ns from its first tile's start; the preparation's stamps,
// when present, on every line: negative before that start). kind: "gu" for tickets below n_gu_tiles.
void append_timeline_csv(std::string& csv, const std::vector<uint64_t>& rec, int rows, int pass, int layer,
                         int n_gu_tiles, int gu_rows, int dn_rows) {
  namespace S = strata_cuda;
  const TimelineFrame f = timeline_frame(rec);
  if (f.t0 == UINT64_MAX) return;
  auto at = [&](size_t t, int k) { return f.at(rec, t, k); };
  auto rel = [&](uint64_t v) { return v == 0 ? int64_t{0} : static_cast<int64_t>(v) - static_cast<int64_t>(f.t0); };
  for (size_t t = 0; t < f.n; ++t) {
    if (at(t, S::kTimelineBegin) == 0) continue;
    const uint64_t who = at(t, S::kTimelineWho);
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", rows, pass, layer, t,
                       static_cast<int>(t) < n_gu_tiles ? "gu" : "dn", who >> 32, who & 0xffffffffu,
                       rel(at(t, S::kTimelineBegin)), rel(at(t, S::kTimelineInputs)),
                       rel(at(t, S::kTimelineStored)), rel(at(t, S::kTimelineEnd)), f.prep_first, f.prep_last,
                       gu_rows, dn_rows);
  }
}

// The card's datasheet memory bandwidth in GB/s, by its name (the percentages below are of it); the H200's
// 4.8 TB/s, the issue's reference, for a card not in the list (said so).
struct Peak {
  double gbs;
  const char* source;
};
Peak datasheet_peak(const std::string& name) {
  struct Known {
    const char* a;
    const char* b;  // a second part of the name, or ""
    double gbs;
  };
  static const Known known[] = {{"GH200", "", 4000},    {"H200", "", 4800},    {"H100", "NVL", 3900},
                                {"H100", "PCIe", 2000}, {"H100", "", 3350},    {"H800", "", 3350},
                                {"A100", "80GB", 2039}, {"A100", "", 1555},    {"RTX 5090", "", 1792},
                                {"RTX 4090", "", 1008}, {"RTX 3090", "", 936}, {"L40S", "", 864}};
  for (const Known& k : known) {
    if (name.find(k.a) != std::string::npos && name.find(k.b) != std::string::npos)
      return {k.gbs, "datasheet"};
  }
  return {4800, "unknown card: the H200's datasheet figure"};
}

double copy_bandwidth_gbs(int device, size_t bytes) {
  void *a = nullptr, *c = nullptr;
  cudaSetDevice(device);
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&c, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(c, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i > 0) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(c);
  return 2.0 * static_cast<double>(bytes) / (median(t) * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_cuda: the cuda plugin's expert kernels, kernel time by device events (medians)"};
  int device = 0, rounds = 5;
  bool quick = false, smoke = false;
  app.add_option("--device", device);
  app.add_option("--rounds", rounds, "timed passes over each suite's groups");
  app.add_flag("--quick", quick, "fewer shapes");
  bool decode_only = false;
  app.add_flag("--smoke", smoke,
               "tiny shapes, one round: checks that the program runs (e.g. on the CPU emulation)");
  app.add_flag(
      "--decode", decode_only,
      "only the decode suites (GLM-5.2 layer, projection shape at n = 1, 4, issue -> take wall time)");
  bool latency_only = false;
  app.add_flag("--latency", latency_only, "only the GLM-5.2 layer's issue -> take wall time (suite 6)");
  bool layer_only = false;
  bool prefill_only = false;
  app.add_flag("--prefill", prefill_only, "only suite 4 (exact and W4A16 paths at 1..512 rows per expert)");
  app.add_flag("--layer", layer_only, "only the GLM-5.2 decode layer's kernels (suite 2; for A/B runs)");
  bool timeline = false;
  app.add_flag(
      "--timeline", timeline,
      "only the GLM-5.2 layer at 1-4 rows with the layer kernel's tile timeline (where a launch's time "
      "goes)");
  std::string timeline_csv;
  app.add_option("--timeline-csv", timeline_csv,
                 "with --timeline: every timed launch's tile records into this CSV file (rows, pass, layer, "
                 "ticket, kind, sm, block, begin/inputs/stored/end ns from the launch's first tile start, the "
                 "preparation's first start and last end, the gate/up and down tiles' rows); "
                 "tools/timeline_report.py reads it");
  int layer_experts = 8;
  int reserve_sms = 0;
  app.add_option("--reserve-sms", reserve_sms,
                 "suite 2's timed passes on the other SMs: this many are held by a waiting kernel (an H100 "
                 "with 52 of 132 held gives the H200's percentages of peak: calibrated, docs/benchmarks.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--layer-experts", layer_experts,
         "experts per group in suite 2 (8: a GLM-5.2 layer; more: what one launch's ramp and tail cost)")
      ->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);
  if (reserve_sms > 0 && timeline) {
    fmt::print(
        "bench_cuda: --reserve-sms does not go with --timeline (its buffer's cudaFree waits for the "
        "whole device, the reserved SMs too)\n");
    return 2;
  }
  if (!timeline_csv.empty() && !timeline) {
    fmt::print("bench_cuda: --timeline-csv goes with --timeline\n");
    return 2;
  }
  if (reserve_sms > 0) strata_bench::SmReserve::eager_modules();

  const std::string why = strata_cuda::cuda_unavailable_reason();
  if (!why.empty()) {
    fmt::print("bench_cuda: {}\n", why);
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    const Peak dp = datasheet_peak(prop.name);
    const double peak = dp.gbs;  // GB/s
    const double copy = copy_bandwidth_gbs(device, smoke ? size_t{1} << 20 : size_t{2} << 30);
    fmt::print("device {}: {} (sm_{}{}), {} SMs, {:.1f} GiB, L2 {:.0f} MiB\n", device, prop.name, prop.major,
               prop.minor, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
               prop.l2CacheSize / 1048576.0);
    fmt::print(
        "device-to-device copy: {:.0f} GB/s (read + write); peak used below ('% of peak'): {:.0f} GB/s "
        "({})\n",
        copy, peak, dp.source);
    if (reserve_sms >= prop.multiProcessorCount) {
      fmt::print("bench_cuda: --reserve-sms {}: the device has {} SMs\n", reserve_sms, prop.multiProcessorCount);
      return 2;
    }
    CudaBackend b(device);
    // (the persistent layer kernel's grid for the SMs left free, as on a device of that many SMs)
    if (reserve_sms > 0) b.settings().layer_sms = prop.multiProcessorCount - reserve_sms;
    // The layer kernel's tile rows (gate/up of F, down of H: WARP_ROWS and the gate/up K slices; the timeline's
    // tile counts below).
    const int layer_rows_gu = strata_cuda::tc_gate_up_rows(b.settings().gate_up_slices) * b.settings().layer_mt_gu;
    const int layer_rows_dn = strata_cuda::kTcRowsPerBlock * strata_cuda::kTcLinearTiles * b.settings().layer_mt_dn;
    const int share = b.settings().share_operands;
    fmt::print("layer kernel tiles: gate/up {} rows, down {} rows ({} gate/up K slice(s); WARP_ROWS {}/{}); "
               "equal gate/up operands shared: {}\n",
               layer_rows_gu, layer_rows_dn, b.settings().gate_up_slices, 16 * b.settings().layer_mt_gu,
               16 * b.settings().layer_mt_dn,
               share > 0 ? fmt::format("in {} cop{}", share, share > 1 ? "ies" : "y")
                         : share == 0 ? std::string("never") : std::string("auto (one copy from 2 n-tiles)"));
    std::mt19937 rng(11);

    // ---- 2. GLM-5.2 layer at decode ----
    if (smoke) {
      quick = true;
      rounds = 1;
    }
    const int64_t H = smoke ? 256 : 6144, F = smoke ? 128 : 2048;
    const int layers = smoke ? 2 : 8;  // 8 x 151 MB: the L2 holds a small part of it
    for (int32_t dtype : {STRATA_DTYPE_Q4_G64, STRATA_DTYPE_Q4_ROW}) {
      if (latency_only || prefill_only || ((quick || timeline) && dtype == STRATA_DTYPE_Q4_ROW)) continue;
      // The same weights in both resident layouts: 16-row tiles (the default, the tensor cores' load order)
      // and rows in order (what the gemv and SIMT kernels read best).
      Pool pool, pool_rows;
      make_pool(pool, b, dtype, layer_experts * layers, H, F, 1000);
      b.settings().tiles = false;
      make_pool(pool_rows, b, dtype, layer_experts * layers, H, F, 1000);
      b.settings().tiles = true;
      if (reserve_sms > 0) {
        fmt::print("{} of {} SMs reserved (a waiting block each) during the timed passes below: their kernels "
                   "run on the other {}\n",
                   reserve_sms, prop.multiProcessorCount, prop.multiProcessorCount - reserve_sms);
      }
      fmt::print(
          "\nGLM-5.2 layer, {}: {} experts of gate/up {}x{} + down {}x{} ({:.2f} MB each), cold over {} "
          "layers\n",
          dtype == STRATA_DTYPE_Q4_G64 ? "Q4_G64" : "Q4_ROW", layer_experts, F, H, H, F,
          pool.bytes_per_expert / 1e6, layers);
      const double layer_bytes = static_cast<double>(layer_experts) * pool.bytes_per_expert;
      if (timeline) {
        // Each layer's group once per pass (cold: the other layers' weights went through the L2 between),
        // queued behind a hold; the first pass warms up. Per launch: the event-timed µs, then the records.
        fmt::print(
            "timeline (default settings; us from the first tile's start; in flight: tiles between their "
            "inputs "
            "and their end):\n");
        fmt::print("{:>4} {:>6} {:>7} {:>7} {:>13} {:>7} {:>7} {:>7} {:>11} {:>7} {:>6} {:>13} {:>7}\n", "rows",
                   "pass", "queued", "span", "inputs 1st/wv", "out", "full", "tile gu", "tile dn", "dn wait",
                   "peak", "prep from/to", "device");
        std::string csv =
            "rows,pass,layer,ticket,kind,sm,block,begin_ns,inputs_ns,stored_ns,end_ns,prep_first_ns,prep_last_ns,"
            "gu_rows,dn_rows\n";
        for (int rows : {1, 2, 3, 4}) {
          std::vector<float> x(static_cast<size_t>(rows * H));
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (auto& v : x) v = nd(rng);
          std::vector<double> queued, span, full, device;
          TimelineSummary last;
          for (int pass = 0; pass <= rounds; ++pass) {
            for (int l = 0; l < layers; ++l) {
              Group g;
              for (int e = 0; e < layer_experts; ++e) {
                g.expert.push_back(l * layer_experts + e);
                std::vector<int32_t> r(static_cast<size_t>(rows));
                for (int i = 0; i < rows; ++i) r[static_cast<size_t>(i)] = i;
                g.rows.push_back(r);
              }
              g.finalize(pool, H);
              std::vector<uint64_t> rec;
              const auto t = b.time_expert_group(x.data(), rows, H, static_cast<int32_t>(g.tasks.size()),
                                                 g.tasks.data(), 1, 100, &rec);
              if (pass == 0) continue;
              const int rows_gu = layer_rows_gu, rows_dn = layer_rows_dn;
              const int n_gu_tiles = layer_experts * static_cast<int>((F + rows_gu - 1) / rows_gu);
              const TimelineSummary sm = summarize_timeline(rec, n_gu_tiles);
              if (!timeline_csv.empty()) append_timeline_csv(csv, rec, rows, pass, l, n_gu_tiles, rows_gu, rows_dn);
              queued.push_back(t.at(0) * 1e3);
              span.push_back(sm.span);
              full.push_back(sm.full_until);
              device.push_back(sm.device);
              if (l == 0) {
                fmt::print(
                    "{:>4} {:>6} {:>7.1f} {:>7.1f} {:>6.1f}/{:<6.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>11.1f} "
                    "{:>7.1f} {:>6} {:>6.1f}/{:<6.1f} {:>7.1f}\n",
                    rows, pass, t.at(0) * 1e3, sm.span, sm.inputs_first, sm.inputs_wave, sm.out,
                    sm.full_until, sm.tile_gu, sm.tile_dn, sm.down_wait, sm.peak, sm.prep_start, sm.prep_end,
                    sm.device);
              }
              last = sm;
            }
          }
          fmt::print(
              "{:>4} median queued {:.1f} us, span {:.1f} us, >= 90 % of the peak in flight until {:.1f} "
              "us; device (the preparation's start to the last tile's end) {:.1f} us, {:.1f} % of {:.0f} GB/s\n",
              rows, median(queued), median(span), median(full), median(device),
              100.0 * layer_bytes / (median(device) * 1e-6) / 1e9 / peak, peak);
          // (at most 120 figures: longer spans, e.g. on the emulation, are shown in wider steps, their
          // maxima)
          const size_t step = (last.busy.size() + 119) / 120;
          std::string prof;
          for (size_t k = 0; k < last.busy.size(); k += step) {
            int v = 0;
            for (size_t j = k; j < std::min(k + step, last.busy.size()); ++j) v = std::max(v, last.busy[j]);
            prof += fmt::format("{}{}", k ? " " : "", v);
          }
          fmt::print("{:>4} in flight per {} us (the last launch): {}\n", rows, step, prof);
        }
        if (!timeline_csv.empty()) {
          strata::write_file_atomic(timeline_csv, std::as_bytes(std::span<const char>(csv.data(), csv.size())));
          fmt::print("tile records: {} ({:.1f} MB)\n", timeline_csv, static_cast<double>(csv.size()) / 1e6);
        }
        continue;
      }
      fmt::print("memory floor: {:.1f} us for {:.1f} MB at {:.0f} GB/s\n", layer_bytes / (peak * 1e9) * 1e6,
                 layer_bytes / 1e6, peak);
      // copy: the device-to-device copy's read + write rate. queued: the same launches queued behind a
      // spinning kernel, so that the host's submission of them is not timed.
      fmt::print("{:<31} {:>5} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10}\n", "kernels", "rows", "median us",
                 "GB/s", "% of peak", "% of copy", "queued us", "% of peak");
      struct Variant {
        const char* name;
        int gemv_max_rows;
        bool simt, pdl, tiles, layer;
        int persistent;
        int lean;  // Settings::layer_lean: -1 auto (lean at 2 n-tiles), 0 never, 1 always
        int min_rows, max_rows;
        bool distinct = false;  // each expert its own tokens (else every expert the same rows, as at decode)
      };
      // The layer kernel's modes (STRATA_CUDA_LAYER_PERSISTENT 0, 1: "tile/block", "persistent") other than
      // the default, A/B in every run; "lean": its instances with one block more per SM
      // (STRATA_CUDA_LAYER_LEAN), also A/B.
      const int persistent_default = b.settings().layer_persistent;
      const int lean_default = b.settings().layer_lean;
      // (off where the device or the code that runs has no dependent launches: sm_8x, compute_80 PTX)
      const bool pdl_default = b.settings().pdl;
      const int pd = persistent_default;
      const int ld = lean_default;
      // the modes other than the default (both when it is auto: -1, the lean/persistent choice per n-tile)
      const int pa = pd == 0 ? 1 : 0, pb = pd < 0 ? 1 : -1;
      auto mode_name = [](int m) {
        return m == 0 ? "tensor cores, exact, tile/block" : "tensor cores, exact, persistent";
      };
      const Variant variants[] = {
          {"gemv f32 (exact, opt-in)", -1, false, true, false, true, pd, ld, 1, 8},
          {"tensor cores, exact (default)", 0, false, true, true, true, pd, ld, 1, 8},
          {mode_name(pa), 0, false, true, true, true, pa, ld, 1, 8},
          {pb < 0 ? "" : mode_name(pb), 0, false, true, true, true, pb, ld, 1, 8},
          {"tensor cores, exact, B-ahead", 0, false, true, true, true, pd, 0, 1, 4},
          {"tensor cores, exact, lean", 0, false, true, true, true, pd, 1, 1, 4},
          {"tensor cores, exact, own tokens", 0, false, true, true, true, pd, ld, 1, 4, true},
          {"tensor cores, exact, 2 passes", 0, false, true, true, false, pd, ld, 1, 2},
          {"tensor cores, exact, no PDL", 0, false, false, true, true, pd, ld, 1, 2},
          {"tensor cores, exact, rows", 0, false, true, false, true, pd, ld, 1, 2},
          {"SIMT f32", -1, true, true, false, true, pd, ld, 1, 4}};
      for (const Variant& v : variants) {
        if (v.name[0] == '\0') continue;  // (no second mode row: the default is one of them)
        const bool lean_ab = v.name == variants[4].name || v.name == variants[5].name;  // (B-ahead, lean)
        if (lean_ab && v.lean == ld) continue;  // (the same as the default row)
        if (!v.pdl && !pdl_default) continue;   // (every row runs without them already)
        const Pool& vp = v.tiles ? pool : pool_rows;
        b.settings().gemv_max_rows = v.gemv_max_rows;
        b.settings().force_simt = v.simt;
        b.settings().pdl = v.pdl && pdl_default;
        b.settings().layer_kernel = v.layer;
        b.settings().layer_persistent = v.persistent;
        b.settings().layer_lean = v.lean;
        for (int rows : {1, 2, 3, 4, 8}) {
          if (rows < v.min_rows || rows > v.max_rows ||
              (quick && (v.simt || v.max_rows == 2)))
            continue;  // A/B rows: full runs only
          // (own tokens: expert e of a layer reads tokens e * rows .. e * rows + rows - 1 of x)
          const int x_rows = v.distinct ? rows * layer_experts : rows;
          std::vector<float> x(static_cast<size_t>(x_rows * H));
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (auto& v : x) v = nd(rng);
          std::vector<Group> gs(static_cast<size_t>(layers));
          for (int l = 0; l < layers; ++l) {
            for (int e = 0; e < layer_experts; ++e) {
              gs[static_cast<size_t>(l)].expert.push_back(l * layer_experts + e);
              std::vector<int32_t> r(static_cast<size_t>(rows));
              for (int i = 0; i < rows; ++i) r[static_cast<size_t>(i)] = (v.distinct ? e * rows : 0) + i;
              gs[static_cast<size_t>(l)].rows.push_back(r);
            }
            gs[static_cast<size_t>(l)].finalize(vp, H);
          }
          const double ms = time_groups(b, gs, x, x_rows, H, rounds, 0, reserve_sms);
          const double qms = time_groups(b, gs, x, x_rows, H, rounds, 100, reserve_sms);
          const double gbs = layer_bytes / (ms * 1e-3) / 1e9;
          const double qgbs = layer_bytes / (qms * 1e-3) / 1e9;
          fmt::print("{:<31} {:>5} {:>10.1f} {:>9.0f} {:>9.1f}% {:>9.1f}% {:>10.1f} {:>9.1f}%\n", v.name,
                     rows, ms * 1e3, gbs, 100 * gbs / peak, copy > 0 ? 100 * gbs / copy : 0.0, qms * 1e3,
                     100 * qgbs / peak);
        }
      }
      b.settings().pdl = pdl_default;
      b.settings().layer_kernel = true;
      b.settings().layer_persistent = persistent_default;
      b.settings().layer_lean = lean_default;
      b.settings().force_simt = false;
      b.settings().gemv_max_rows = -1;
    }

    if (layer_only || timeline) return 0;
    // ---- 3. projection shape: 128 experts of 768 x 2048, top-8 of n tokens ----
    if (!latency_only && !prefill_only) {
      const int64_t h = smoke ? 128 : 2048, f = smoke ? 64 : 768;
      const int n_exp = smoke ? 16 : 128;
      Pool pool;
      make_pool(pool, b, STRATA_DTYPE_Q4_G64, n_exp, h, f, 5000);
      fmt::print(
          "\nprojection shape, Q4_G64: {} experts of gate/up {}x{} + down {}x{} ({:.2f} MB each), top-8 at "
          "random\n",
          n_exp, f, h, h, f, pool.bytes_per_expert / 1e6);
      fmt::print("{:<26} {:>5} {:>5} {:>10} {:>9} {:>10} {:>9}\n", "path", "n", "used", "median us", "GB/s",
                 "% of peak", "TFLOP/s");
      struct Path {
        const char* name;
        int gemv_max_rows, w4a16_min_rows;
      };
      const Path paths[] = {{"exact gemv (opt-in)", -1, 0},
                            {"exact tensor cores (default)", 0, 0},
                            {"W4A16 (>=16 rows)", -1, 16}};
      for (const Path& path : paths) {
        b.settings().gemv_max_rows = path.gemv_max_rows;
        b.settings().w4a16_min_rows = path.w4a16_min_rows;
        const int w4 = path.w4a16_min_rows;
        for (int n : {1, 4, 32, 512}) {
          if (w4 != 0 && n < 32) continue;
          if ((smoke || decode_only) && n > 32) continue;
          if (decode_only && n > 4) continue;
          std::vector<float> x(static_cast<size_t>(n * h));
          std::normal_distribution<float> nd(0.0f, 1.0f);
          for (auto& v : x) v = nd(rng);
          std::vector<Group> gs(8);  // 8 different routings
          int used = 0;
          int64_t rows_total = 0;
          for (auto& g : gs) {
            std::vector<std::vector<int32_t>> per(static_cast<size_t>(n_exp));
            std::uniform_int_distribution<int> pick(0, n_exp - 1);
            for (int t = 0; t < n; ++t) {
              std::set<int> chosen;
              while (chosen.size() < 8) chosen.insert(pick(rng));
              for (int e : chosen) per[static_cast<size_t>(e)].push_back(t);
            }
            for (int e = 0; e < n_exp; ++e) {
              if (per[static_cast<size_t>(e)].empty()) continue;
              g.expert.push_back(e);
              g.rows.push_back(per[static_cast<size_t>(e)]);
            }
            g.finalize(pool, h);
            used = static_cast<int>(g.rows.size());
            rows_total = g.total_rows;
          }
          const double ms = time_groups(b, gs, x, n, h, rounds);
          const double gbs = used * pool.bytes_per_expert / (ms * 1e-3) / 1e9;
          const double tflops =
              2.0 * 3 * static_cast<double>(f * h) * static_cast<double>(rows_total) / (ms * 1e-3) / 1e12;
          fmt::print("{:<26} {:>5} {:>5} {:>10.1f} {:>9.0f} {:>9.1f}% {:>9.2f}\n", path.name, n, used,
                     ms * 1e3, gbs, 100 * gbs / peak, tflops);
        }
      }
      b.settings().w4a16_min_rows = 0;
      b.settings().gemv_max_rows = -1;
    }
    // ---- 6. a GLM-5.2 layer (1 row per expert, resident, cold), issued and taken as the engine does ----
    {
      const int64_t iters = smoke ? 6 : 60;
      // Footprints: 8 layers (1.4 GB) and 64 (10.9 GB; on a device with less free memory, as many as fit).
      const double expert_bytes =
          2 * q4_bytes(STRATA_DTYPE_Q4_G64, F, H) + q4_bytes(STRATA_DTYPE_Q4_G64, H, F);
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      const int fit = static_cast<int>(0.8 * static_cast<double>(free_b) / (8 * expert_bytes));
      const int small = layers, large = std::max(small, smoke ? 2 * layers : std::min(64, fit));
      Pool pool;
      make_pool(pool, b, STRATA_DTYPE_Q4_G64, 8 * large, H, F, 7000);
      std::vector<float> x(static_cast<size_t>(H), 0.25f);
      std::vector<Group> gs(static_cast<size_t>(large));
      for (int l = 0; l < large; ++l) {
        for (int e = 0; e < 8; ++e) {
          gs[static_cast<size_t>(l)].expert.push_back(l * 8 + e);
          gs[static_cast<size_t>(l)].rows.push_back({0});
        }
        gs[static_cast<size_t>(l)].finalize(pool, H);
      }
      std::vector<Group> first(gs.begin(), gs.begin() + small);
      for (auto& g : first) g.finalize(pool, H);
      const double kernel_us = time_groups(b, first, x, 1, H, smoke ? 1 : 3) * 1e3;
      fmt::print(
          "\nGLM-5.2 layer (8 experts, Q4_G64, 1 row, resident) issued and taken: wall us from the issue to "
          "the "
          "take's return, and the device's time of the group alone (events around its launches), median "
          "(p90) "
          "of {}; the group back to back over {} layers (events): {:.1f} us\n",
          iters, small, kernel_us);
      // Scenarios: how long the device sat idle before the issue (the host computing attention), and whether
      // a one-thread kernel spun on another stream during the last part of it (does a busy device keep its
      // clocks?); the layers cycled over: 8 (1.4 GB) or all 64 (10.9 GB, as many experts as a real model's
      // VRAM tier touches).
      struct Scenario {
        const char* name;
        int idle_us, warm_us;
      };
      const Scenario scenarios[] = {{"back to back", 0, 0},
                                    {"after 1 ms idle", 1000, 0},
                                    {"after 10 ms idle", 10000, 0},
                                    {"10 ms idle, last 5 ms a 1-thread kernel", 10000, 5000}};
      const int spin_as_set = b.settings().spin_us;
      fmt::print("{:<40} {:>19} {:>19} {:>19} {:>19} {:>19}\n", "device before the issue",
                 fmt::format("wall, poll {} us", spin_as_set), "wall, poll 50 us", "device",
                 fmt::format("wall, {} layers", large), fmt::format("device, {} layers", large));
      cudaStream_t warm = nullptr;
      if (cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking) != cudaSuccess) warm = nullptr;
      auto idle = [&](const Scenario& sc) {
        if (sc.idle_us > sc.warm_us)
          std::this_thread::sleep_for(std::chrono::microseconds(sc.idle_us - sc.warm_us));
        if (sc.warm_us > 0 && warm != nullptr) {
          (void)strata_cuda::launch_hold(sc.warm_us, warm);
          std::this_thread::sleep_for(std::chrono::microseconds(sc.warm_us));
        }
      };
      // One layer's group: the wall time from its issue to the take's return, or (device) its launches' time
      // between events; us.
      auto one = [&](Group& g, bool device) {
        const auto n = static_cast<int32_t>(g.tasks.size());
        if (device) return b.time_expert_group(x.data(), 1, H, n, g.tasks.data(), 1).at(0) * 1e3;
        const auto a = std::chrono::steady_clock::now();
        b.take(b.issue(x.data(), 1, H, n, g.tasks.data()));
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
      };
      auto cell = [](std::vector<double> t) {
        std::sort(t.begin(), t.end());
        return fmt::format(" {:>19}", fmt::format("{:.1f} ({:.1f})", t[t.size() / 2], t[t.size() * 9 / 10]));
      };
      for (const Scenario& sc : scenarios) {
        std::string cells;
        struct Column {
          int spin, n_layers;
          bool device;
        };
        for (const Column c :
             {Column{spin_as_set, small, false}, Column{50, small, false}, Column{spin_as_set, small, true},
              Column{spin_as_set, large, false}, Column{spin_as_set, large, true}}) {
          b.settings().spin_us = c.spin;
          std::vector<double> t;
          for (int64_t i = 0; i <= iters; ++i) {
            idle(sc);
            const double us = one(gs[static_cast<size_t>(i % c.n_layers)], c.device);
            if (i > 0) t.push_back(us);
          }
          cells += cell(t);
        }
        fmt::print("{:<40}{}\n", sc.name, cells);
      }
      if (warm != nullptr) {
        (void)cudaStreamSynchronize(warm);
        (void)cudaStreamDestroy(warm);
      }
      b.settings().spin_us = spin_as_set;
    }
    if (decode_only || latency_only) return 0;

    // ---- 4. exact vs W4A16 at 1..512 rows per expert, GLM-5.2 layer (one layer, warm after the first pass)
    // ----
    {
      Pool pool;
      make_pool(pool, b, STRATA_DTYPE_Q4_G64, 8, H, F, 9000);
      const double floor_ms = 8 * pool.bytes_per_expert / (peak * 1e9) * 1e3;
      fmt::print(
          "\nexact (gemv, tensor cores) vs W4A16, GLM-5.2 layer (8 experts, Q4_G64), R rows per expert; "
          "memory "
          "floor {:.1f} us\n",
          floor_ms * 1e3);
      fmt::print("{:>5} {:>10} {:>9} {:>10} {:>9} {:>10} {:>9} {:>10} {:>9} {:>8}\n", "R", "gemv us", "TFLOP/s",
                 "tc us", "TFLOP/s", "narrow us", "TFLOP/s", "W4A16 us", "TFLOP/s", "speedup");
      int crossover = 0, tc_crossover = 0;
      const std::vector<int> rs = smoke   ? std::vector<int>{1, 16, 40}
                                  : quick ? std::vector<int>{1, 4, 16, 64, 256}
                                          : std::vector<int>{1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256, 512};
      for (int R : rs) {
        std::vector<float> x(static_cast<size_t>(R * H));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : x) v = nd(rng);
        std::vector<Group> gs(1);
        for (int e = 0; e < 8; ++e) {
          gs[0].expert.push_back(e);
          std::vector<int32_t> r(static_cast<size_t>(R));
          for (int i = 0; i < R; ++i) r[static_cast<size_t>(i)] = i;
          gs[0].rows.push_back(r);
        }
        gs[0].finalize(pool, H);
        const double flop = 2.0 * 3 * static_cast<double>(F * H) * 8 * R;
        b.settings().w4a16_min_rows = 0;
        const double ms_exact = time_groups(b, gs, x, R, H, rounds);
        b.settings().gemv_max_rows = 0;
        const double ms_tc = time_groups(b, gs, x, R, H, rounds);
        const int wide_min = b.settings().wide_min_rows;
        b.settings().wide_min_rows = 0;  // the narrow exact kernels alone
        const double ms_narrow = time_groups(b, gs, x, R, H, rounds);
        b.settings().wide_min_rows = wide_min;
        b.settings().gemv_max_rows = -1;
        b.settings().w4a16_min_rows = 1;
        const double ms_w4 = time_groups(b, gs, x, R, H, rounds);
        b.settings().w4a16_min_rows = 0;
        if (crossover == 0 && ms_w4 < 0.95 * ms_exact) crossover = R;
        if (tc_crossover == 0 && ms_tc < 0.95 * ms_exact) tc_crossover = R;
        auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
        fmt::print("{:>5} {:>10.1f} {:>9.2f} {:>10.1f} {:>9.2f} {:>10.1f} {:>9.2f} {:>10.1f} {:>9.2f} {:>7.2f}x\n", R,
                   ms_exact * 1e3, tf(ms_exact), ms_tc * 1e3, tf(ms_tc), ms_narrow * 1e3, tf(ms_narrow),
                   ms_w4 * 1e3, tf(ms_w4), ms_exact / ms_w4);
      }
      if (crossover > 0) {
        fmt::print(
            "W4A16 is >5% faster than the exact gemv path from {} rows per expert "
            "(STRATA_CUDA_W4A16_MIN_ROWS)\n",
            crossover);
      } else {
        fmt::print("W4A16 is never >5% faster here\n");
      }
      if (tc_crossover > 0) {
        fmt::print(
            "the exact tensor-core path is >5% faster than gemv from {} rows per expert "
            "(STRATA_CUDA_GEMV_MAX_ROWS={} would use it there, at the cost of prefill == decode bit for "
            "bit)\n",
            tc_crossover, tc_crossover - 1);
      } else {
        fmt::print("the exact tensor-core path is never >5% faster than gemv here\n");
      }
    }

    if (prefill_only) return 0;
    // ---- 5. issue -> take latency ----
    {
      const int64_t h = smoke ? 128 : 2048, f = smoke ? 64 : 768;
      const int iters = smoke ? 12 : 220;
      Pool pool;
      make_pool(pool, b, STRATA_DTYPE_Q4_G64, 8, h, f, 12000);
      std::vector<float> x(static_cast<size_t>(h), 0.5f);
      Group g;
      for (int e = 0; e < 8; ++e) {
        g.expert.push_back(e);
        g.rows.push_back({0});
      }
      g.finalize(pool, h);
      auto wall_us = [&](int32_t n_tasks) {
        std::vector<double> t;
        for (int i = 0; i < iters; ++i) {
          const auto a = std::chrono::steady_clock::now();
          strata_group* handle = b.issue(x.data(), 1, h, n_tasks, g.tasks.data());
          b.take(handle);
          if (i >= iters / 10) {
            t.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
          }
        }
        return median(t);
      };
      const double full = wall_us(8), empty = wall_us(0);
      const auto k = b.time_expert_group(x.data(), 1, h, 8, g.tasks.data(), iters / 4);
      std::vector<double> kd(k.begin() + 1, k.end());
      fmt::print(
          "\nissue -> take, 8 experts of {}x{} Q4_G64 x 1 row (resident): {:.1f} us wall (kernels {:.1f} "
          "us); "
          "empty group: {:.1f} us\n",
          f, h, full, median(kd) * 1e3, empty);
    }
  } catch (const std::exception& e) {
    fmt::print("bench_cuda failed: {}\n", e.what());
    return 1;
  }
  return 0;
}
