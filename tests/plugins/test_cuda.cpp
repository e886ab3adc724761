// The cuda plugin (label "gpu"). On a host without a CUDA driver or device every case checks that the plugin
// is there and rejected with a reason, then skips (and passes); a build with STRATA_CUDA on whose plugin file
// is missing fails. With a device: conformance against cpu_generic for every format and shape class (exact
// paths: max |y - ref| <= 1e-5 * max(max |ref|, 1); the W4A16 path: its stated tolerance), prefill rows equal
// decode rows bit for bit (the int4 gemv kernels at every token count 1..8, the exact tensor cores, the
// STRATA_CUDA_GEMV_MAX_ROWS switch between them), device memory and its accounting, asynchronous groups
// (several in flight, threads, devices), injected and real failures returned as statuses, and every model
// fixture with its experts on the GPU.
//
// Runs from the build tree or from a bundle (tools/device/cuda_check.sh): plugins are found beside the
// executable; STRATA_FIXTURES_DIR overrides the fixtures folder.

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "strata/error.hpp"
#include "strata/plugin_abi.h"
#include "strata/quant.hpp"
#include "test_matrices.hpp"
#include "test_util.hpp"

#ifndef STRATA_CUDA_BUILT
#define STRATA_CUDA_BUILT 0
#endif

using namespace strata;
using namespace strata::test;

namespace {

// The build's (or the bundle's) plugins, plus the CPU emulation of the cuda plugin when it was built.
std::vector<fs::path> search_path() {
  auto p = plugin_search_path({});
#ifdef STRATA_CUDA_EMU_DIR
  if (std::getenv("STRATA_CUDA_NO_EMU") == nullptr) p.push_back(fs::path(STRATA_CUDA_EMU_DIR));
#endif
  return p;
}

PluginRegistry& registry() {
  static PluginRegistry reg(search_path());
  return reg;
}

const PluginRecord* find_record(const std::string& name) {
  for (const auto& p : registry().plugins()) {
    if (p.name == name || p.file.filename() == "libstrata_" + name + ".so") return &p;
  }
  return nullptr;
}

// The backends the GPU cases run on: the cuda plugin when it is usable here, and its CPU emulation (cuda_emu,
// the same host code and kernels compiled with g++) when it was built. Says why a case is skipped.
std::vector<const PluginRecord*> cuda_backends() {
  std::vector<const PluginRecord*> out;
  const PluginRecord* r = find_record("cuda");
  if (r == nullptr) {
    if (STRATA_CUDA_BUILT)
      FAIL("this build has STRATA_CUDA on, but libstrata_cuda.so is not in the plugin path");
    MESSAGE("SKIPPED on a GPU: this build has no CUDA plugin (STRATA_CUDA off)");
  } else if (!r->usable) {
    if (std::getenv("STRATA_CUDA_REQUIRE") != nullptr)
      FAIL("STRATA_CUDA_REQUIRE is set, but the cuda plugin is rejected: " << r->reason);
    MESSAGE("SKIPPED on a GPU: the cuda plugin is rejected: " << r->reason);
  } else {
    out.push_back(r);
  }
  const PluginRecord* e = find_record("cuda_emu");
  if (e != nullptr && e->usable) {
    MESSAGE("running on the CPU emulation of the cuda plugin (cuda_emu)");
    out.push_back(e);
  }
  return out;
}

std::shared_ptr<Backend> make_backend(const PluginRecord& r, int device = 0) {
  return std::make_shared<Backend>(r.library, r.vtable, 0, device);
}

// A cuda backend created with these environment settings (var, value; read at create), which are then unset.
std::shared_ptr<Backend> make_cuda_with_envs(const PluginRecord& r,
                                             const std::vector<std::pair<const char*, const char*>>& env) {
  for (const auto& [var, value] : env) ::setenv(var, value, 1);
  std::shared_ptr<Backend> b;
  try {
    b = make_backend(r);
  } catch (...) {
    for (const auto& [var, value] : env) ::unsetenv(var);
    throw;
  }
  for (const auto& [var, value] : env) ::unsetenv(var);
  return b;
}

std::shared_ptr<Backend> make_cuda_with_env(const PluginRecord& r, const char* var, const char* value) {
  return make_cuda_with_envs(r, {{var, value}});
}

std::shared_ptr<Backend> cpu_reference() {
  const PluginRecord* g = find_record("cpu_generic");
  REQUIRE(g != nullptr);
  REQUIRE(g->usable);
  return make_backend(*g);
}

fs::path fixtures_root() {
  if (const char* env = std::getenv("STRATA_FIXTURES_DIR")) return fs::path(env);
  return fixtures_dir();
}

std::vector<fs::path> fixtures() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fixtures_root())) {
    if (fs::exists(e.path() / "expected.safetensors") && fs::exists(e.path() / "config.json"))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- formats under test (random weights: test_matrices.hpp) ----

const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16,
                                 WeightFormat::Q4_ROW, WeightFormat::Q4_G64};

// max |y - ref| / max(max |ref|, 1): relative to the output's scale, absolute for outputs below 1 (as the CPU
// conformance test's 1e-5 * (1 + |r|)); infinite when y has a NaN (unwritten outputs are poisoned with NaN).
double rel_err(const float* y, const float* ref, size_t n) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) return INFINITY;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(y[i]) - ref[i]));
  }
  return max_diff / std::max(max_ref, 1.0);
}

// ‖y - ref‖₂ / ‖ref‖₂.
double norm_err(const float* y, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) return INFINITY;
    const double d = static_cast<double>(y[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

constexpr double kExactTol = 1e-5;
// W4A16: activations (x, then h) rounded to bf16 (relative error <= 2^-9 each); expected ~2e-3 normwise.
constexpr double kW4A16NormTol = 1e-2;

// A set of experts with routed rows, run on any backend (tests/test_matrices.hpp).
using Group = RandomExpertGroup;

}  // namespace

TEST_CASE("cuda plugin: built, found, and usable or rejected with the reason") {
  const PluginRecord* r = find_record("cuda");
  if (r == nullptr) {
    if (STRATA_CUDA_BUILT)
      FAIL("this build has STRATA_CUDA on, but libstrata_cuda.so is not in the plugin path");
    MESSAGE("SKIPPED: this build has no CUDA plugin (STRATA_CUDA off)");
    return;
  }
  if (!r->usable) {
    if (std::getenv("STRATA_CUDA_REQUIRE") != nullptr)
      FAIL("STRATA_CUDA_REQUIRE is set, but the cuda plugin is rejected: " << r->reason);
    MESSAGE("cuda plugin rejected: " << r->reason);
    CHECK(r->reason.find("score 0:") != std::string::npos);
    CHECK(r->reason.find("CUDA") != std::string::npos);
    // The other plugins are unaffected.
    CHECK(registry().find("cpu_generic") != nullptr);
    return;
  }
  CHECK(r->score > 1);  // above the portable plugin (below cpu_avx512 until the core keeps weights resident)
  auto b = make_backend(*r);
  CHECK(b->name() == "cuda");
  CHECK(b->has_device_memory());
  CHECK(b->has_async());
  for (WeightFormat f : kFormats) {
    CHECK(b->supports_matmul(f));
    CHECK(b->supports_expert_group(f));
  }
  CHECK(!b->supports_matmul(static_cast<WeightFormat>(17)));
  // The probe can be forced off, and then the reason says so.
  ::setenv("STRATA_CUDA_PROBE", "off", 1);
  PluginRegistry off(plugin_search_path({}));
  ::unsetenv("STRATA_CUDA_PROBE");
  for (const auto& p : off.plugins()) {
    if (p.name == "cuda") CHECK(p.reason.find("forced off") != std::string::npos);
  }
}

// sm_80, sm_86 and sm_89 (A100, RTX 30xx/40xx) run the same kernels without programmatic dependent launches
// (griddepcontrol is sm_90's), and so does an sm_90 device running kernels compiled from compute_80 PTX (they
// hold no griddepcontrol.wait); older devices are refused with the reason. Only the emulation can pose as
// another device (STRATA_CUDA_EMU_SM, STRATA_CUDA_EMU_PTX); its launches fail when one asks for a dependent
// launch there. (It checks the switch and the bookkeeping, not the device: the emulation has no dependent
// launches to get wrong, and its grids do not depend on the SM count.)
TEST_CASE("cuda plugin on sm_8x or compute_80 code: no programmatic dependent launches, the same bits") {
  const PluginRecord* e = find_record("cuda_emu");
  if (e == nullptr || !e->usable) {
    MESSAGE("SKIPPED: needs the CPU emulation of the cuda plugin (cuda_emu)");
    return;
  }
  struct Env {  // set for one scope (unset also when a check throws)
    std::vector<const char*> vars;
    Env(std::initializer_list<std::pair<const char*, const char*>> kv) {
      for (const auto& [k, v] : kv) {
        ::setenv(k, v, 1);
        vars.push_back(k);
      }
    }
    ~Env() {
      for (const char* k : vars) ::unsetenv(k);
    }
  };
  std::mt19937 rng(880);
  // Decode-sized groups of both int4 formats (the layer kernel after the preparation launch) and a prefill-
  // sized one (separate launches; the wide kernels, within the 99 KB per block of the consumer cards sm_86, 89
  // and 120, whose emulated launches fail above it), each launch of which would ask for a dependent launch on
  // sm_90.
  std::vector<Group> groups;
  groups.emplace_back(rng, 200, 130, 3, std::vector<int>{1, 1, 2}, same_format(WeightFormat::Q4_G64, 3));
  groups.emplace_back(rng, 130, 96, 2, std::vector<int>{1, 2}, same_format(WeightFormat::Q4_ROW, 2));
  groups.emplace_back(rng, 96, 64, 40, std::vector<int>{0, 20, 33}, same_format(WeightFormat::Q4_G64, 3));
  std::vector<std::vector<std::vector<float>>> want;
  {
    auto sm90 = make_backend(*e);
    for (const auto& g : groups) want.push_back(g.run(*sm90));
  }
  const std::pair<const char*, const char*> setups[] = {
      {"80", "80"}, {"86", "86"}, {"89", "89"}, {"90", "80"}, {"120", "120"}};
  for (const auto& [sm, ptx] : setups) {
    const std::string device = std::string("sm_") + sm + ", compute_" + ptx;
    CAPTURE(device);
    Env env{{"STRATA_CUDA_EMU_SM", sm}, {"STRATA_CUDA_EMU_PTX", ptx}};
    auto b = make_cuda_with_env(*e, "STRATA_CUDA_PDL", "1");  // (asked for, and still off there)
    for (size_t i = 0; i < groups.size(); ++i) {
      CAPTURE(i);
      CHECK(groups[i].run(*b) == want[i]);
    }
    std::vector<std::vector<float>> out;
    const auto t = groups[0].tasks(out);
    PendingGroup pg = b->issue(groups[0].x.data(), groups[0].n_x, groups[0].hidden, t);
    pg.take();
    CHECK(out == want[0]);
  }
  {
    Env env{{"STRATA_CUDA_EMU_SM", "75"}};
    PluginRegistry old(search_path());
    bool seen = false;
    for (const auto& p : old.plugins()) {
      if (p.name != e->name) continue;
      seen = true;
      CHECK(!p.usable);
      CHECK(p.reason.find("compute capability 8.0 or newer (found sm_75") != std::string::npos);
    }
    CHECK(seen);
    // A backend asked for anyway (the probe said no) refuses to start, with the reason.
    CHECK_THROWS_WITH(make_backend(*e), doctest::Contains("is sm_75; this plugin needs sm_80 or newer"));
  }
}

static void gpu_case_1(const PluginRecord* rec) {
  auto ref = cpu_reference();
  auto cuda = make_backend(*rec);
  auto simt = make_cuda_with_env(*rec, "STRATA_CUDA_KERNELS", "simt");
  auto tc = make_cuda_with_env(*rec, "STRATA_CUDA_GEMV_MAX_ROWS", "0");  // int4 on the exact tensor cores
  std::mt19937 rng(4321);
  double worst = 0;
  struct Shape {
    int64_t o, i, s;
  };
  for (Shape sh : {Shape{1, 1, 1}, Shape{7, 13, 1}, Shape{33, 64, 3}, Shape{65, 100, 17}, Shape{130, 257, 5},
                   Shape{16, 2048, 2}, Shape{9, 129, 4}, Shape{5, 63, 6}, Shape{200, 6144, 1},
                   Shape{70, 640, 9}, Shape{1000, 96, 33}, Shape{17, 65, 8}}) {
    for (WeightFormat f : kFormats) {
      CAPTURE(sh.o);
      CAPTURE(sh.i);
      CAPTURE(sh.s);
      CAPTURE(weight_format_name(f));
      const HostMatrix w = random_matrix(rng, f, sh.o, sh.i);
      const auto x = random_vec(rng, static_cast<size_t>(sh.s * sh.i));
      const size_t n = static_cast<size_t>(sh.s * sh.o);
      std::vector<float> want(n), y(n, NAN), y2(n, NAN), yr(n, NAN), ys(n, NAN);
      ref->matmul(w.view(), x.data(), sh.s, want.data());
      cuda->matmul(w.view(), x.data(), sh.s, y.data());
      const double err = rel_err(y.data(), want.data(), n);
      worst = std::max(worst, err);
      CHECK(err <= kExactTol);
      cuda->matmul(w.view(), x.data(), sh.s, y2.data());
      CHECK(std::memcmp(y.data(), y2.data(), n * 4) == 0);  // deterministic
      // Decode = prefill: each row alone gives the same bits as within the batch.
      for (int64_t s = 0; s < sh.s; s += std::max<int64_t>(1, sh.s / 4)) {
        std::vector<float> one(static_cast<size_t>(sh.o), NAN);
        cuda->matmul(w.view(), x.data() + s * sh.i, 1, one.data());
        CHECK(std::memcmp(one.data(), y.data() + s * sh.o, one.size() * 4) == 0);
      }
      // Resident weights (with and without the host copy attached) give the same bits as host weights.
      ResidentMatrix r = cuda->upload(w.view());
      cuda->matmul(r.matrix(), x.data(), sh.s, yr.data());
      CHECK(std::memcmp(yr.data(), y.data(), n * 4) == 0);
      Matrix bare = r.matrix();
      bare.data = nullptr;
      bare.scales = nullptr;
      std::fill(yr.begin(), yr.end(), NAN);
      cuda->matmul(bare, x.data(), sh.s, yr.data());
      CHECK(std::memcmp(yr.data(), y.data(), n * 4) == 0);
      // The SIMT kernels (the only path for float weights, a switchable one for int4) agree too.
      simt->matmul(w.view(), x.data(), sh.s, ys.data());
      CHECK(rel_err(ys.data(), want.data(), n) <= kExactTol);
      // int4: so do the exact tensor-core kernels (the default is gemv), and their rows are independent too.
      if (is_q4(f)) {
        std::vector<float> yt(n, NAN), one(static_cast<size_t>(sh.o), NAN);
        tc->matmul(w.view(), x.data(), sh.s, yt.data());
        CHECK(rel_err(yt.data(), want.data(), n) <= kExactTol);
        const int64_t last = sh.s - 1;
        tc->matmul(w.view(), x.data() + last * sh.i, 1, one.data());
        CHECK(std::memcmp(one.data(), yt.data() + last * sh.o, one.size() * 4) == 0);
      }
    }
  }
  MESSAGE(rec->name << " matmul: largest max|y - ref| / max(max|ref|, 1) against cpu_generic = " << worst);
}

TEST_CASE("cuda matmul equals cpu_generic within 1e-5 for every format and shape; rows are independent") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_1(rec);
  }
}

static void gpu_case_2(const PluginRecord* rec) {
  auto ref = cpu_reference();
  auto cuda = make_backend(*rec);
  auto simt = make_cuda_with_env(*rec, "STRATA_CUDA_KERNELS", "simt");
  auto tc = make_cuda_with_env(*rec, "STRATA_CUDA_GEMV_MAX_ROWS", "0");  // int4 on the exact tensor cores
  std::mt19937 rng(99);
  double worst = 0;
  const std::vector<int> counts = {0, 1, 4, 64, 3, 8, 9, 2};
  for (WeightFormat f : kFormats) {
    for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{24, 40},
                                   {96, 33},
                                   {130, 64},
                                   {200, 129},
                                   {256, 512},
                                   {64, 1},
                                   {1, 16}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(weight_format_name(f));
      CAPTURE(hidden);
      CAPTURE(ffn);
      const Group grp(rng, hidden, ffn, 70, counts, same_format(f, counts.size()));
      const auto want = grp.run(*ref);
      const auto got = grp.run(*cuda);
      const auto got_simt = grp.run(*simt);
      const auto got_tc = is_q4(f) ? grp.run(*tc) : got;
      for (size_t e = 0; e < counts.size(); ++e) {
        CAPTURE(e);
        const double err = rel_err(got[e].data(), want[e].data(), want[e].size());
        worst = std::max(worst, err);
        CHECK(err <= kExactTol);
        CHECK(rel_err(got_simt[e].data(), want[e].data(), want[e].size()) <= kExactTol);
        CHECK(rel_err(got_tc[e].data(), want[e].data(), want[e].size()) <= kExactTol);
      }
      // Decode = prefill: every row of the 64-row expert alone, as its own task, gives the same bits.
      const size_t big = 3;
      std::vector<ExpertTask> singles;
      std::vector<std::vector<float>> outs(grp.rows[big].size(),
                                           std::vector<float>(static_cast<size_t>(hidden), NAN));
      for (size_t r = 0; r < grp.rows[big].size(); ++r) {
        singles.push_back(
            {&grp.experts[big], std::span<const int32_t>(&grp.rows[big][r], 1), outs[r].data()});
      }
      cuda->expert_group(grp.x.data(), grp.n_x, hidden, singles);
      bool same = true;
      for (size_t r = 0; r < outs.size(); ++r) {
        same = same && std::memcmp(outs[r].data(), got[big].data() + r * hidden,
                                   static_cast<size_t>(hidden) * 4) == 0;
      }
      CHECK(same);
    }
  }
  MESSAGE(rec->name << " expert_group: largest max|y - ref| / max(max|ref|, 1) against cpu_generic = "
                    << worst);
}

TEST_CASE("cuda expert_group equals cpu_generic within 1e-5: every format, 0/1/4/64 rows, odd sizes") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_2(rec);
  }
}

// The int4 gemv kernels (the exact-mode int4 path at every row count by default): each token count 1..8 is
// its own kernel instance, so every one is checked against cpu_generic and, bit for bit, against the same
// tokens computed one at a time; shapes whose rows are not a multiple of a warp's (4 linear, 2 gate/up) or a
// block's, columns that are not a multiple of 64 (Q4_G64 groups, Q4_ROW padding) or of 1024 (a warp step),
// rows of more than one step (the one-token prefetch). STRATA_CUDA_GEMV_MAX_ROWS=8 runs experts/calls with at
// most 8 rows on gemv and the rest on the exact tensor cores, bit for bit as the two backends that use one
// each.
static void gpu_case_gemv(const PluginRecord* rec) {
  auto ref = cpu_reference();
  auto gemv = make_cuda_with_env(*rec, "STRATA_CUDA_GEMV_MAX_ROWS", "all");
  auto tc = make_cuda_with_env(*rec, "STRATA_CUDA_GEMV_MAX_ROWS", "0");
  auto cut = make_cuda_with_env(*rec, "STRATA_CUDA_GEMV_MAX_ROWS", "8");
  std::mt19937 rng(808);
  double worst = 0;
  int differ = 0;  // experts whose gemv and tensor-core bits differ: the two really are different kernels
  auto same_bits = [](const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; };

  // matmul: S = 11 (chunks of 8 and 3 tokens), then the first S = 1..7 rows alone: the same bits.
  struct Shape {
    int64_t o, i;
  };
  for (Shape sh : {Shape{1, 1}, Shape{3, 31}, Shape{5, 63}, Shape{6, 64}, Shape{7, 65}, Shape{18, 96},
                   Shape{33, 130}, Shape{35, 768}, Shape{21, 1030}, Shape{13, 2100}}) {
    for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
      CAPTURE(sh.o);
      CAPTURE(sh.i);
      CAPTURE(weight_format_name(f));
      constexpr int64_t S = 11;
      const HostMatrix w = random_matrix(rng, f, sh.o, sh.i);
      const auto x = random_vec(rng, static_cast<size_t>(S * sh.i));
      const size_t n = static_cast<size_t>(S * sh.o);
      std::vector<float> want(n), y(n, NAN), yt(n, NAN), yc(n, NAN);
      ref->matmul(w.view(), x.data(), S, want.data());
      gemv->matmul(w.view(), x.data(), S, y.data());
      const double err = rel_err(y.data(), want.data(), n);
      worst = std::max(worst, err);
      CHECK(err <= kExactTol);
      tc->matmul(w.view(), x.data(), S, yt.data());
      CHECK(rel_err(yt.data(), want.data(), n) <= kExactTol);
      cut->matmul(w.view(), x.data(), S, yc.data());
      CHECK(same_bits(yc.data(), yt.data(), n));  // 11 rows > 8: the tensor cores
      for (int64_t s = 1; s <= 7; ++s) {
        CAPTURE(s);
        const size_t m = static_cast<size_t>(s * sh.o);
        std::vector<float> part(m, NAN), part_cut(m, NAN);
        gemv->matmul(w.view(), x.data(), s, part.data());
        CHECK(same_bits(part.data(), y.data(), m));
        cut->matmul(w.view(), x.data(), s, part_cut.data());
        CHECK(same_bits(part_cut.data(), y.data(), m));  // <= 8 rows: gemv
      }
      // The last row alone (decode) equals its place in the batch (prefill).
      std::vector<float> one(static_cast<size_t>(sh.o), NAN);
      gemv->matmul(w.view(), x.data() + (S - 1) * sh.i, 1, one.data());
      CHECK(same_bits(one.data(), y.data() + (S - 1) * sh.o, one.size()));
    }
  }

  // expert_group: experts of 0..9 and 17 rows; int4 in both passes and mixed with float formats (the gate/up
  // output operand goes gemv -> SIMT, SIMT -> gemv, gemv -> gemv of the other int4 format).
  const std::vector<int> counts = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
  const std::vector<std::vector<std::pair<WeightFormat, WeightFormat>>> format_sets = {
      same_format(WeightFormat::Q4_G64, counts.size()),
      same_format(WeightFormat::Q4_ROW, counts.size()),
      {{WeightFormat::Q4_G64, WeightFormat::BF16},
       {WeightFormat::F16, WeightFormat::Q4_ROW},
       {WeightFormat::Q4_ROW, WeightFormat::Q4_G64},
       {WeightFormat::Q4_G64, WeightFormat::Q4_ROW},
       {WeightFormat::BF16, WeightFormat::Q4_G64},
       {WeightFormat::Q4_ROW, WeightFormat::F32},
       {WeightFormat::Q4_G64, WeightFormat::Q4_G64},
       {WeightFormat::Q4_ROW, WeightFormat::Q4_ROW},
       {WeightFormat::Q4_G64, WeightFormat::F16},
       {WeightFormat::F32, WeightFormat::Q4_G64},
       {WeightFormat::Q4_ROW, WeightFormat::Q4_G64}}};
  for (size_t fs = 0; fs < format_sets.size(); ++fs) {
    for (const auto& hidden_ffn :
         {std::pair<int64_t, int64_t>{130, 33}, {64, 1}, {1, 16}, {96, 70}, {2100, 40}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(fs);
      CAPTURE(hidden);
      CAPTURE(ffn);
      const Group grp(rng, hidden, ffn, 20, counts, format_sets[fs]);
      const auto want = grp.run(*ref);
      const auto got = grp.run(*gemv);
      const auto got_tc = grp.run(*tc);
      const auto got_cut = grp.run(*cut);
      for (size_t e = 0; e < counts.size(); ++e) {
        CAPTURE(counts[e]);
        const double err = rel_err(got[e].data(), want[e].data(), want[e].size());
        worst = std::max(worst, err);
        CHECK(err <= kExactTol);
        CHECK(rel_err(got_tc[e].data(), want[e].data(), want[e].size()) <= kExactTol);
        CHECK(got_cut[e] == (counts[e] <= 8 ? got[e] : got_tc[e]));
        differ += got[e] != got_tc[e] ? 1 : 0;
      }
      // Decode = prefill: every routed row of every expert alone, as its own task, gives the same bits; and
      // the 17-row expert cut into tasks of 5 and 12 rows too.
      std::vector<ExpertTask> singles;
      std::vector<std::vector<float>> outs;
      std::vector<std::pair<size_t, size_t>> where;  // (expert, row)
      for (size_t e = 0; e < counts.size(); ++e) {
        for (size_t r = 0; r < grp.rows[e].size(); ++r) where.emplace_back(e, r);
      }
      outs.assign(where.size(), std::vector<float>(static_cast<size_t>(hidden), NAN));
      for (size_t k = 0; k < where.size(); ++k) {
        const auto [e, r] = where[k];
        singles.push_back({&grp.experts[e], std::span<const int32_t>(&grp.rows[e][r], 1), outs[k].data()});
      }
      gemv->expert_group(grp.x.data(), grp.n_x, hidden, singles);
      bool same = true;
      for (size_t k = 0; k < where.size(); ++k) {
        const auto [e, r] = where[k];
        same = same && same_bits(outs[k].data(), got[e].data() + r * static_cast<size_t>(hidden),
                                 static_cast<size_t>(hidden));
      }
      CHECK(same);
      const size_t big = counts.size() - 1;
      std::vector<float> a(5 * static_cast<size_t>(hidden), NAN), b(12 * static_cast<size_t>(hidden), NAN);
      const std::vector<ExpertTask> split = {
          {&grp.experts[big], std::span<const int32_t>(grp.rows[big].data(), 5), a.data()},
          {&grp.experts[big], std::span<const int32_t>(grp.rows[big].data() + 5, 12), b.data()}};
      gemv->expert_group(grp.x.data(), grp.n_x, hidden, split);
      CHECK(same_bits(a.data(), got[big].data(), a.size()));
      CHECK(same_bits(b.data(), got[big].data() + a.size(), b.size()));
    }
  }
  CHECK(differ > 0);
  // A non-finite activation gives non-finite outputs for its token (as the f32 reference does), never a
  // finite number; the other tokens are untouched. On gemv and on the exact tensor cores (whose int8 encoding
  // marks the group's multiplier NaN), in matmul and in an expert (where the gate/up output h carries it to
  // down).
  for (float bad : {NAN, INFINITY}) {
    for (Backend* be : {gemv.get(), tc.get()}) {
      CAPTURE(bad);
      CAPTURE(be == tc.get());
      const HostMatrix w = random_matrix(rng, WeightFormat::Q4_G64, 9, 200);
      auto x = random_vec(rng, 3 * 200);
      x[200 + 77] = bad;  // token 1
      std::vector<float> y(27, 0.0f), want(27);
      be->matmul(w.view(), x.data(), 3, y.data());
      ref->matmul(w.view(), x.data(), 3, want.data());
      for (int o = 0; o < 9; ++o) {
        CHECK(!std::isfinite(y[static_cast<size_t>(9 + o)]));
        CHECK(y[static_cast<size_t>(o)] == doctest::Approx(want[static_cast<size_t>(o)]).epsilon(1e-4));
        CHECK(y[static_cast<size_t>(18 + o)] ==
              doctest::Approx(want[static_cast<size_t>(18 + o)]).epsilon(1e-4));
      }
      Group grp(rng, 200, 70, 3, {3}, same_format(WeightFormat::Q4_G64, 1));
      grp.rows[0] = {0, 1, 2};
      Group poisoned = grp;       // shares grp's weights (the views point into grp.store)
      poisoned.x[200 + 5] = bad;  // x row 1: the expert's token 1
      const auto got = poisoned.run(*be);
      const auto clean = grp.run(*ref);
      for (int o = 0; o < 200; ++o) {
        CHECK(!std::isfinite(got[0][static_cast<size_t>(200 + o)]));
        CHECK(got[0][static_cast<size_t>(o)] ==
              doctest::Approx(clean[0][static_cast<size_t>(o)]).epsilon(1e-4));
      }
    }
  }
  // Activations over a wide range in the same 64-column groups (outliers 1e4 times the typical value beside
  // values 1e-6 times it, as "massive activations" are): the exact tensor cores keep each group in fixed
  // point to 2^-31 of its largest value, which stays within the bound; so does gemv (plain f32).
  {
    const HostMatrix w = random_matrix(rng, WeightFormat::Q4_G64, 48, 640);
    auto x = random_vec(rng, 3 * 640);
    for (size_t k = 0; k < x.size(); ++k) x[k] *= k % 97 == 5 ? 1e4f : k % 3 == 0 ? 1e-6f : 1.0f;
    std::vector<float> want(3 * 48);
    ref->matmul(w.view(), x.data(), 3, want.data());
    for (Backend* be : {gemv.get(), tc.get()}) {
      std::vector<float> y(want.size(), NAN);
      be->matmul(w.view(), x.data(), 3, y.data());
      CHECK(rel_err(y.data(), want.data(), y.size()) <= kExactTol);
    }
  }
  MESSAGE(rec->name << " gemv: largest max|y - ref| / max(max|ref|, 1) against cpu_generic = " << worst);
}

TEST_CASE(
    "cuda int4 gemv kernels (matmul and expert_group, 1-8 tokens per kernel): within 1e-5, prefill == "
    "decode") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_gemv(rec);
  }
}

static void gpu_case_3(const PluginRecord* rec) {
  auto ref = cpu_reference();
  auto cuda = make_backend(*rec);
  std::mt19937 rng(7);
  const std::vector<std::pair<WeightFormat, WeightFormat>> formats = {
      {WeightFormat::Q4_G64, WeightFormat::Q4_G64}, {WeightFormat::BF16, WeightFormat::BF16},
      {WeightFormat::Q4_G64, WeightFormat::BF16},   {WeightFormat::BF16, WeightFormat::Q4_ROW},
      {WeightFormat::F16, WeightFormat::Q4_G64},    {WeightFormat::Q4_ROW, WeightFormat::F32}};
  const Group grp(rng, 192, 160, 40, {1, 5, 12, 3, 9, 40}, formats);
  const auto want = grp.run(*ref);
  const auto got = grp.run(*cuda);
  for (size_t e = 0; e < formats.size(); ++e) {
    CAPTURE(e);
    CHECK(rel_err(got[e].data(), want[e].data(), want[e].size()) <= kExactTol);
  }
}

TEST_CASE("cuda expert_group: mixed formats in one group and within one expert") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_3(rec);
  }
}

static void gpu_case_4(const PluginRecord* rec, const char* gate_up_slices) {
  auto ref = cpu_reference();
  auto exact = make_cuda_with_env(*rec, "STRATA_CUDA_GATE_UP_SLICES", gate_up_slices);
  auto w4 = make_cuda_with_envs(*rec, {{"STRATA_CUDA_W4A16_MIN_ROWS", "16"},
                                       {"STRATA_CUDA_GATE_UP_SLICES", gate_up_slices}});
  std::mt19937 rng(16);
  for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
    for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{256, 128}, {130, 200}, {2048, 768}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(weight_format_name(f));
      CAPTURE(hidden);
      CAPTURE(ffn);
      const std::vector<int> counts = {4, 16, 33, 64, 15};
      const Group grp(rng, hidden, ffn, 96, counts, same_format(f, counts.size()));
      const auto want = grp.run(*ref);
      const auto got = grp.run(*w4);
      const auto got_exact = grp.run(*exact);
      for (size_t e = 0; e < counts.size(); ++e) {
        CAPTURE(counts[e]);
        const double nerr = norm_err(got[e].data(), want[e].data(), want[e].size());
        if (counts[e] >= 16) {
          MESSAGE(weight_format_name(f) << " " << hidden << "x" << ffn << ", " << counts[e]
                                        << " rows: W4A16 normwise error " << nerr);
          CHECK(nerr <= kW4A16NormTol);
          CHECK(nerr > 0);  // it really took the bf16 path
        } else {
          CHECK(got[e] == got_exact[e]);  // below the threshold: the exact kernels, bit for bit
          CHECK(rel_err(got[e].data(), want[e].data(), want[e].size()) <= kExactTol);
        }
      }
    }
  }
}

TEST_CASE("cuda W4A16 path (STRATA_CUDA_W4A16_MIN_ROWS): within its tolerance; smaller experts stay exact") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    for (const char* slices : {"2", "1"}) {  // (gate/up K slices: the default, and one)
      CAPTURE(slices);
      gpu_case_4(rec, slices);
    }
  }
}

static void gpu_case_5(const PluginRecord* rec) {
  auto cuda = make_backend(*rec);
  std::mt19937 rng(3);
  const MemoryInfo m0 = cuda->memory_info();
  CHECK(m0.total > 0);
  CHECK(m0.free <= m0.total);
  CHECK(m0.used >= m0.resident);
  // Device bytes of a resident copy: rows padded to 64 columns (int4: 16-row tiles of rows padded to 128
  // columns), then the scales at a 256-byte boundary (Q4_G64: in blocks of 16 rows x 4 groups).
  auto expected = [](const HostMatrix& h) {
    const uint64_t kp = static_cast<uint64_t>((h.cols + 63) / 64 * 64);
    const uint64_t row = h.format == WeightFormat::F32 ? kp * 4
                         : is_q4(h.format)             ? (kp + 127) / 128 * 64
                                                       : kp * 2;
    uint64_t bytes = static_cast<uint64_t>(is_q4(h.format) ? (h.rows + 15) / 16 * 16 : h.rows) * row;
    if (is_q4(h.format)) {
      bytes = (bytes + 255) / 256 * 256;
      bytes += 4 * static_cast<uint64_t>(h.format == WeightFormat::Q4_G64
                                             ? (h.rows + 15) / 16 * ((h.cols + 255) / 256) * 64
                                             : h.rows);
    }
    return bytes;
  };
  std::vector<HostMatrix> hosts;
  for (WeightFormat f : kFormats) hosts.push_back(random_matrix(rng, f, 37, 200));
  for (WeightFormat f : kFormats)
    hosts.push_back(random_matrix(rng, f, 5, 3));  // 5 padded rows: no 256-B multiple
  std::vector<ResidentMatrix> res;
  uint64_t want = 0;
  for (const auto& h : hosts) {
    res.push_back(cuda->upload(h.view()));
    want += expected(h);
  }
  const MemoryInfo m1 = cuda->memory_info();
  CHECK(m1.resident == m0.resident + want);
  CHECK(m1.used >= m1.resident);
  cuda->free(res[0]);
  CHECK(!res[0]);
  CHECK(cuda->memory_info().resident == m0.resident + want - expected(hosts[0]));
  res.clear();  // the destructors free the rest
  CHECK(cuda->memory_info().resident == m0.resident);

  // A 256 MiB upload shows in the device's free memory.
  {
    HostMatrix big{WeightFormat::BF16,
                   8192,
                   16384,
                   std::vector<std::byte>(size_t{8192} * 16384 * 2, std::byte{0x3c}),
                   {}};
    const MemoryInfo before = cuda->memory_info();
    ResidentMatrix r = cuda->upload(big.view());
    const MemoryInfo after = cuda->memory_info();
    CHECK(after.resident == before.resident + 8192ull * 16384 * 2);
    CHECK(before.free >= after.free + 200ull * 1024 * 1024);
  }

  // Out of device memory is a status, and the backend goes on working.
  const strata_plugin_vtable* vt = rec->vtable;
  strata_backend* raw = nullptr;
  strata_backend_options opt{};
  opt.struct_size = sizeof opt;
  REQUIRE(vt->create(&opt, &raw) == STRATA_OK);
  float dummy[4] = {};
  strata_matrix huge{};
  huge.dtype = STRATA_DTYPE_F32;
  huge.rows = int64_t{1} << 20;
  huge.cols = int64_t{1} << 18;  // 1 TiB: never fits, and the host data is never read
  huge.data = dummy;
  strata_resident* h = nullptr;
  CHECK(vt->upload_matrix(raw, &huge, &h) == STRATA_ERR_OUT_OF_MEMORY);
  CHECK(h == nullptr);
  CHECK(std::string(vt->last_error()).find("out of memory") != std::string::npos);
  // Handles that are not this backend's: errors, not crashes.
  strata_resident* bogus = reinterpret_cast<strata_resident*>(dummy);
  CHECK(vt->free_matrix(raw, bogus) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(vt->expert_group_take(raw, reinterpret_cast<strata_group*>(dummy)) == STRATA_ERR_INVALID_ARGUMENT);
  CHECK(vt->free_matrix(raw, nullptr) == STRATA_OK);
  vt->destroy(raw);

  // After all that, it still computes.
  const HostMatrix w = random_matrix(rng, WeightFormat::Q4_G64, 64, 128);
  const auto x = random_vec(rng, 128);
  std::vector<float> y(64), want_y(64);
  cuda->matmul(w.view(), x.data(), 1, y.data());
  cpu_reference()->matmul(w.view(), x.data(), 1, want_y.data());
  CHECK(rel_err(y.data(), want_y.data(), y.size()) <= kExactTol);
}

TEST_CASE("cuda device memory: upload, free, accounting, out of memory") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_5(rec);
  }
}

static void gpu_case_6(const PluginRecord* rec) {
  auto a = make_backend(*rec);
  auto b = make_backend(*rec);
  std::mt19937 rng(11);
  const HostMatrix w = random_matrix(rng, WeightFormat::Q4_G64, 48, 96);
  const auto x = random_vec(rng, 2 * 96);
  std::vector<float> ya(96, NAN), yb(96, NAN);
  ResidentMatrix ra = a->upload(w.view());
  a->matmul(ra.matrix(), x.data(), 2, ya.data());
  b->matmul(ra.matrix(), x.data(), 2, yb.data());  // b computes from the host data
  CHECK(ya == yb);
  Matrix bare = ra.matrix();
  bare.data = nullptr;
  CHECK_THROWS_WITH_AS(b->matmul(bare, x.data(), 2, yb.data()),
                       doctest::Contains("resident on another backend"), Error);
  Matrix wrong = ra.matrix();
  wrong.rows = 47;
  CHECK_THROWS_WITH_AS(a->matmul(wrong, x.data(), 2, ya.data()), doctest::Contains("the resident copy is"),
                       Error);
  // The CPU reference ignores the device copy and reads the host data.
  std::vector<float> yc(96);
  cpu_reference()->matmul(ra.matrix(), x.data(), 2, yc.data());
  CHECK(rel_err(ya.data(), yc.data(), yc.size()) <= kExactTol);
}

TEST_CASE("cuda resident matrices: another backend's copy is not used, a mismatched one is refused") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_6(rec);
  }
}

// Resident int4 matrices are stored in 16-row tiles in the tensor-core kernels' load order (kTiles), their
// Q4_G64 scales in 16 x 4 blocks; host weights staged per call keep their rows (and scales) in order: every
// kernel family reads both and gives the same bits (rows that are not a multiple of 16, columns that are not
// a multiple of 64, 128 or 256, one to many tokens).
static void gpu_case_tiles(const PluginRecord* rec) {
  struct Family {
    const char *name, *var, *value;
  };
  const Family families[] = {{"tensor cores", "STRATA_CUDA_GEMV_MAX_ROWS", "0"},
                             {"gemv", "STRATA_CUDA_GEMV_MAX_ROWS", "all"},
                             {"SIMT", "STRATA_CUDA_KERNELS", "simt"},
                             {"W4A16", "STRATA_CUDA_W4A16_MIN_ROWS", "1"}};
  std::mt19937 rng(4242);
  for (const Family& fam : families) {
    CAPTURE(fam.name);
    auto cuda = make_cuda_with_env(*rec, fam.var, fam.value);
    for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
      CAPTURE(weight_format_name(f));
      for (const auto& o_i :
           {std::pair<int64_t, int64_t>{1, 1}, {17, 65}, {33, 130}, {16, 128}, {40, 2100}}) {
        const int64_t o = o_i.first, i = o_i.second;  // (clang 14 cannot capture bindings)
        CAPTURE(o);
        CAPTURE(i);
        const HostMatrix w = random_matrix(rng, f, o, i);
        ResidentMatrix r = cuda->upload(w.view());
        Matrix bare = r.matrix();  // the device copy only
        bare.data = nullptr;
        bare.scales = nullptr;
        for (int64_t s : {1, 3, 6, 20}) {  // (tensor cores: 1, 2, 3 and 4 n-tiles)
          CAPTURE(s);
          const auto x = random_vec(rng, static_cast<size_t>(s * i));
          const size_t n = static_cast<size_t>(s * o);
          std::vector<float> staged(n, NAN), tiled(n, NAN);
          cuda->matmul(w.view(), x.data(), s, staged.data());
          cuda->matmul(bare, x.data(), s, tiled.data());
          CHECK(std::memcmp(staged.data(), tiled.data(), n * 4) == 0);
        }
      }
      // Expert groups of 3 experts with 1, 3 and 20 rows, resident vs staged: small (every warp only in the
      // remainder of its K slice), and 1100 x 600 (whole load batches and a remainder in the same slice).
      // With only the gate resident, gate and up differ in layout within one expert.
      for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{130, 33}, {1100, 600}}) {
        const int64_t hidden = hidden_ffn.first,
                      ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
        CAPTURE(hidden);
        const Group grp(rng, hidden, ffn, 24, {1, 3, 20}, same_format(f, 3));
        const auto want = grp.run(*cuda);
        for (bool gate_only : {false, true}) {
          CAPTURE(gate_only);
          std::vector<ResidentMatrix> keep;
          std::vector<ExpertMatrices> resident;
          for (const auto& e : grp.experts) {
            keep.push_back(cuda->upload(e.gate));
            ExpertMatrices m{keep.back().matrix(), e.up, e.down};
            if (!gate_only) {
              keep.push_back(cuda->upload(e.up));
              m.up = keep.back().matrix();
              keep.push_back(cuda->upload(e.down));
              m.down = keep.back().matrix();
            }
            resident.push_back(m);
          }
          std::vector<std::vector<float>> got(resident.size());
          std::vector<ExpertTask> tasks;
          for (size_t e = 0; e < resident.size(); ++e) {
            got[e].assign(grp.rows[e].size() * static_cast<size_t>(grp.hidden), NAN);
            tasks.push_back({&resident[e], grp.rows[e], got[e].data()});
          }
          cuda->expert_group(grp.x.data(), grp.n_x, grp.hidden, tasks);
          for (size_t e = 0; e < resident.size(); ++e) {
            CAPTURE(e);
            CHECK(std::memcmp(got[e].data(), want[e].data(), want[e].size() * 4) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda resident int4 matrices in 16-row tiles: every kernel family gives the bits of staged rows") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_tiles(rec);
  }
}

// g with its experts' matrices uploaded to b (kept alive by keep): the layer kernel runs on resident weights
// only.
static Group on_device(const Backend& b, const Group& g, std::vector<ResidentMatrix>& keep) {
  Group d = g;
  for (auto& e : d.experts) {
    keep.push_back(b.upload(e.gate));
    keep.push_back(b.upload(e.up));
    keep.push_back(b.upload(e.down));
    e = {keep[keep.size() - 3].matrix(), keep[keep.size() - 2].matrix(), keep.back().matrix()};
  }
  return d;
}

// The layer kernel (decode groups on the exact tensor cores: gate/up and down tiles in one launch) against
// the separate launches (STRATA_CUDA_LAYER=0): the same bits with resident weights (staged host weights take
// the separate launches in both; checked too), both int4 formats,
// odd shapes (partial tiles, K slices with a remainder), 1-3 rows per expert and an expert without rows, 8
// experts of the same row (as at decode); several threads with layer kernels in flight at once on one device.
// The layer kernel's mode: its environment settings (var, value).
static void gpu_case_layer(const PluginRecord* rec,
                           const std::vector<std::pair<const char*, const char*>>& env) {
  auto layer = make_cuda_with_envs(*rec, env);
  // (the separate launches with the same gate/up K slices: the other setting gives other bits)
  std::vector<std::pair<const char*, const char*>> passes_env = {{"STRATA_CUDA_LAYER", "0"}};
  for (const auto& kv : env)
    if (std::string(kv.first) == "STRATA_CUDA_GATE_UP_SLICES") passes_env.push_back(kv);
  auto passes = make_cuda_with_envs(*rec, passes_env);
  auto ref = cpu_reference();
  std::mt19937 rng(2027);
  for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
    CAPTURE(weight_format_name(f));
    // Load batches per warp (gate/up: 2 K slices; down: 1): 0 (130 x 33), 3 and 1 / 2 (1100 x 600), 1 and 0
    // / 0 (256 x 96), 4 and 2 / 0 (1600 x 40), 5 and 3 / 0 (2100 x 40), 0 / 4 (130 x 1100), 0 / 5
    // (130 x 1300): every place where run_batches frees a buffer for the next tile's loads.
    for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{130, 33},
                                   {1100, 600},
                                   {256, 96},
                                   {1600, 40},
                                   {2100, 40},
                                   {130, 1100},
                                   {130, 1300},
                                   {2101, 40},
                                   {1601, 40},
                                   {131, 1101},
                                   {131, 1301}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(hidden);
      CAPTURE(ffn);
      // (odd hidden: at most 2 rows per expert, so one n-tile: 5 and 3 / 0 (2101 x 40), 4 and 2 / 0
      // (1601 x 40), 0 / 4 (131 x 1101), 0 / 5 (131 x 1301) load batches per warp, with an odd K)
      const std::vector<int> counts = hidden == 256     ? std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1}
                                      : hidden % 2 == 1 ? std::vector<int>{1, 2, 0, 2}
                                                        : std::vector<int>{1, 2, 0, 3};
      Group grp(rng, hidden, ffn, 5, counts, same_format(f, counts.size()));
      if (hidden == 256) {  // as at decode: every expert has the same row
        for (auto& r : grp.rows) r.assign(r.size(), 3);
      }
      const auto want = grp.run(*passes);
      const auto cpu = grp.run(*ref);
      for (bool resident : {false, true}) {
        CAPTURE(resident);
        std::vector<ResidentMatrix> keep;
        const auto got = resident ? on_device(*layer, grp, keep).run(*layer) : grp.run(*layer);
        for (size_t e = 0; e < grp.experts.size(); ++e) {
          CAPTURE(e);
          CHECK(std::memcmp(got[e].data(), want[e].data(), want[e].size() * 4) == 0);
          CHECK(rel_err(got[e].data(), cpu[e].data(), cpu[e].size()) <= kExactTol);
        }
      }
    }
  }
  // One small expert: 3 gate/up tiles and 3 down tiles, so a persistent block takes a down tile while the
  // others still hold gate/up tiles of the same expert, and waits for them (on the emulation too: its blocks
  // take turns). With 320 rows (20 gate/up tiles, 5 groups of h: a whole load batch and a remainder), its
  // down tiles are taken when the first groups are encoded and the last are not.
  for (const int64_t ffn : {48, 320}) {
    CAPTURE(ffn);
    const Group one(rng, 130, ffn, 3, {2}, same_format(WeightFormat::Q4_G64, 1));
    std::vector<ResidentMatrix> keep;
    const auto a = one.run(*passes), b = on_device(*layer, one, keep).run(*layer), c = one.run(*ref);
    CHECK(std::memcmp(a[0].data(), b[0].data(), a[0].size() * 4) == 0);
    CHECK(rel_err(b[0].data(), c[0].data(), c[0].size()) <= kExactTol);
  }
  // Experts of different widths in one group (the narrower one's last tiles are past its rows; 40 rows: a
  // partial 64-row group), each expert with its own rows of one x.
  {
    const Group wide(rng, 320, 200, 5, {1, 2}, same_format(WeightFormat::Q4_G64, 2));
    const Group narrow(rng, 320, 40, 5, {2, 1}, same_format(WeightFormat::Q4_G64, 2));
    std::vector<ResidentMatrix> keep;
    const Group wide_d = on_device(*layer, wide, keep), narrow_d = on_device(*layer, narrow, keep);
    auto run = [&](const Backend& b, bool resident) {
      const std::vector<const Group*> from =
          resident ? std::vector<const Group*>{&wide_d, &narrow_d, &wide_d, &narrow_d}
                   : std::vector<const Group*>{&wide, &narrow, &wide, &narrow};
      std::vector<std::vector<float>> out(4);
      std::vector<ExpertTask> tasks;
      for (size_t k = 0; k < 4; ++k) {
        const Group& g = *from[k];
        out[k].assign(g.rows[k / 2].size() * 320, NAN);
        tasks.push_back({&g.experts[k / 2], g.rows[k / 2], out[k].data()});
      }
      b.expert_group(wide.x.data(), wide.n_x, 320, tasks);
      return out;
    };
    const auto a = run(*passes, false), b = run(*layer, true), c = run(*ref, false);
    for (size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      CHECK(std::memcmp(a[k].data(), b[k].data(), a[k].size() * 4) == 0);
      CHECK(rel_err(b[k].data(), c[k].data(), c[k].size()) <= kExactTol);
    }
  }
  // Layer kernels of several threads' groups in flight at once (each slot has its own stream).
  const Group host(rng, 512, 256, 4, {1, 1, 2, 1, 1, 1}, same_format(WeightFormat::Q4_G64, 6));
  std::vector<ResidentMatrix> keep;
  const Group grp = on_device(*layer, host, keep);
  const auto want = host.run(*passes);
  std::vector<std::thread> threads;
  std::vector<int> ok(6, 0);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      bool good = true;
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::vector<float>> out;
        const auto tasks = grp.tasks(out);
        PendingGroup g = layer->issue(grp.x.data(), grp.n_x, grp.hidden, tasks);
        g.take();
        good = good && out == want;
      }
      ok[static_cast<size_t>(t)] = good ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(std::all_of(ok.begin(), ok.end(), [](int v) { return v == 1; }));
}

TEST_CASE(
    "cuda layer kernel: one launch gives the bits of the separate gate/up, preparation and down launches") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    // A block per tile; persistent blocks taking tiles in turn (each loading its next tile's first weights
    // before its current tile's epilogue); the lean instances (B values loaded at use, one block more per SM)
    // and the B-ahead ones, each alone and persistent; with two row tiles per warp.
    using Env = std::vector<std::pair<const char*, const char*>>;
    // (The default is lean at 2 n-tiles only; LEAN=0 runs the B-ahead instances at every n-tile count.)
    const Env modes[] = {{{"STRATA_CUDA_LAYER_PERSISTENT", "0"}},
                         {{"STRATA_CUDA_LAYER_PERSISTENT", "1"}},
                         {{"STRATA_CUDA_LAYER_PERSISTENT", "1"}, {"STRATA_CUDA_LAYER_LEAN", "0"}},
                         {{"STRATA_CUDA_LAYER_LEAN", "0"}},
                         {{"STRATA_CUDA_LAYER_LEAN", "1"}},
                         {{"STRATA_CUDA_LAYER_LEAN", "1"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"}},
                         // (a persistent grid for 2 SMs: few blocks take every tile; on a GPU only, the
                         // emulation's grid is 3 blocks anyway)
                         {{"STRATA_CUDA_LAYER_PERSISTENT", "1"}, {"STRATA_CUDA_LAYER_SMS", "2"}},
                         // two 16-row tiles per warp (gate/up tiles of 32 rows, down tiles of 128; every
                         // instance, alone and persistent), and in the gate/up tiles only
                         {{"STRATA_CUDA_LAYER_WARP_ROWS", "32"}, {"STRATA_CUDA_LAYER_PERSISTENT", "0"}},
                         {{"STRATA_CUDA_LAYER_WARP_ROWS", "32"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"},
                          {"STRATA_CUDA_LAYER_LEAN", "0"}},
                         {{"STRATA_CUDA_LAYER_WARP_ROWS", "32"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"},
                          {"STRATA_CUDA_LAYER_LEAN", "1"}},
                         {{"STRATA_CUDA_LAYER_WARP_ROWS", "32/16"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"}},
                         {{"STRATA_CUDA_LAYER_WARP_ROWS", "32/16"}, {"STRATA_CUDA_LAYER_PERSISTENT", "0"},
                          {"STRATA_CUDA_LAYER_LEAN", "0"}},
                         // gate/up in one K slice (tiles of 32 rows of h, each warp over the whole K): a block
                         // per tile and persistent, lean and B-ahead
                         {{"STRATA_CUDA_GATE_UP_SLICES", "1"}, {"STRATA_CUDA_LAYER_PERSISTENT", "0"}},
                         {{"STRATA_CUDA_GATE_UP_SLICES", "1"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"},
                          {"STRATA_CUDA_LAYER_LEAN", "0"}},
                         {{"STRATA_CUDA_GATE_UP_SLICES", "1"}, {"STRATA_CUDA_LAYER_PERSISTENT", "1"},
                          {"STRATA_CUDA_LAYER_LEAN", "1"}},
                         // and with down tiles of 128 rows (two row tiles per down warp)
                         {{"STRATA_CUDA_GATE_UP_SLICES", "1"}, {"STRATA_CUDA_LAYER_WARP_ROWS", "16/32"}},
                         {{"STRATA_CUDA_GATE_UP_SLICES", "1"}, {"STRATA_CUDA_LAYER_WARP_ROWS", "16/32"},
                          {"STRATA_CUDA_LAYER_PERSISTENT", "1"}, {"STRATA_CUDA_LAYER_LEAN", "0"}}};
    // Row tiles per warp that no instance has are refused by name.
    CHECK_THROWS_WITH(make_cuda_with_env(*rec, "STRATA_CUDA_LAYER_WARP_ROWS", "16/32"),
                      doctest::Contains("STRATA_CUDA_LAYER_WARP_ROWS is '16/32'; expected 16, 32/16 or 32"));
    CHECK_THROWS_WITH(make_cuda_with_envs(*rec, {{"STRATA_CUDA_GATE_UP_SLICES", "1"},
                                                 {"STRATA_CUDA_LAYER_WARP_ROWS", "32"}}),
                      doctest::Contains("STRATA_CUDA_LAYER_WARP_ROWS is '32'; expected 16 or 16/32"));
    for (const Env& env : modes) {
      std::string mode;
      for (const auto& [var, value] : env) mode += std::string(mode.empty() ? "" : " ") + var + "=" + value;
      CAPTURE(mode);
      gpu_case_layer(rec, env);
    }
  }
}

// Experts with the same rows of x share one gate/up input operand (plan_group; every expert of a one-token decode
// group): in one copy (STRATA_CUDA_SHARE_OPERANDS=1), in two (=2: experts 0 and 1 encode one each, 2 reads 0's)
// and by default (auto: not at one tensor-core n-tile, so here the 1-row experts get their own and the 3-row
// ones share) the bits of an operand per expert (=0), and cpu_generic's results (within 1e-5; W4A16 within its
// tolerance), in every kernel family that reads such an operand: the layer kernel (one format, resident tiles,
// 1-3 rows), the narrow exact kernels, the wide ones (16 rows), W4A16, gemv and SIMT. Only equal operands are
// shared: the same rows in another order, a subset, or the rows of an expert in another launch class (Q4_ROW
// beside Q4_G64, a wide chunk beside narrow ones) get their own; a shared operand's own region is never
// written, so a chunk reading it would fail here.
static void gpu_case_shared_operands(const PluginRecord* rec) {
  for (const char* bad : {"yes", "9", "-1"}) {
    CHECK_THROWS_WITH(make_cuda_with_env(*rec, "STRATA_CUDA_SHARE_OPERANDS", bad),
                      doctest::Contains((std::string("STRATA_CUDA_SHARE_OPERANDS is '") + bad +
                                         "'; expected auto or the copies of a shared operand, 0").c_str()));
  }
  auto ref = cpu_reference();
  using Env = std::vector<std::pair<const char*, const char*>>;
  const Env families[] = {{},
                          {{"STRATA_CUDA_LAYER", "0"}},
                          {{"STRATA_CUDA_W4A16_MIN_ROWS", "1"}},
                          {{"STRATA_CUDA_GEMV_MAX_ROWS", "8"}},
                          {{"STRATA_CUDA_KERNELS", "simt"}}};
  std::mt19937 rng(4242);
  // A decode group of one format (the layer kernel on resident tiles): experts 0-2 row 4; 3-4 rows 2, 7, 11;
  // 5 those in another order; 6 two of them.
  Group decode(rng, 320, 200, 20, {1, 1, 1, 3, 3, 3, 2}, same_format(WeightFormat::Q4_G64, 7));
  decode.rows = {{4}, {4}, {4}, {2, 7, 11}, {2, 7, 11}, {11, 2, 7}, {2, 7}};
  // A mixed group: 0-1 row 4 (Q4_G64), 2 row 4 (Q4_ROW), 3-4 rows 0..15 (wide chunks), 5 rows 0..11, 6 rows
  // 0..11 and 4 again.
  std::vector<std::pair<WeightFormat, WeightFormat>> formats = same_format(WeightFormat::Q4_G64, 7);
  formats[2] = {WeightFormat::Q4_ROW, WeightFormat::Q4_ROW};
  Group mixed(rng, 320, 200, 20, {1, 1, 1, 16, 16, 12, 13}, formats);
  std::vector<int32_t> r16(16), r12(12);
  for (int i = 0; i < 16; ++i) r16[static_cast<size_t>(i)] = i;
  for (int i = 0; i < 12; ++i) r12[static_cast<size_t>(i)] = i;
  std::vector<int32_t> r13 = r12;
  r13.push_back(4);
  mixed.rows = {{4}, {4}, {4}, r16, r16, r12, r13};
  for (const Group* grp : {&decode, &mixed}) {
    const bool is_decode = grp == &decode;
    CAPTURE(is_decode);
    const auto want = grp->run(*ref);
    for (const Env& fam : families) {
      std::string name = "default";
      for (const auto& [var, value] : fam) name = std::string(var) + "=" + value;
      CAPTURE(name);
      // An operand per expert (=0) first, then one copy, two copies and the default (auto).
      const char* const shares[] = {"0", "1", "2", nullptr};
      std::vector<decltype(make_cuda_with_envs(*rec, fam))> backends;
      for (const char* share : shares) {
        Env env = fam;
        if (share != nullptr) env.emplace_back("STRATA_CUDA_SHARE_OPERANDS", share);
        backends.push_back(make_cuda_with_envs(*rec, env));
      }
      const bool w4a16 = !fam.empty() && std::string(fam[0].first) == "STRATA_CUDA_W4A16_MIN_ROWS";
      for (bool resident : {false, true}) {
        CAPTURE(resident);
        std::vector<ResidentMatrix> keep;
        std::vector<decltype(grp->run(*backends[0]))> out;
        for (auto& be : backends) out.push_back(resident ? on_device(*be, *grp, keep).run(*be) : grp->run(*be));
        const auto& b = out[0];
        const auto& a = out[1];
        for (size_t e = 0; e < want.size(); ++e) {
          CAPTURE(e);
          for (size_t s = 1; s < out.size(); ++s) {
            const char* share = shares[s] != nullptr ? shares[s] : "auto";
            CAPTURE(share);
            CHECK(std::memcmp(out[s][e].data(), b[e].data(), b[e].size() * 4) == 0);
          }
          if (w4a16) {
            CHECK(norm_err(a[e].data(), want[e].data(), want[e].size()) <= kW4A16NormTol);
          } else {
            CHECK(rel_err(a[e].data(), want[e].data(), want[e].size()) <= kExactTol);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda experts with the same rows share one gate/up operand: the bits of an operand per expert") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_shared_operands(rec);
  }
}

// The wide exact kernels (tc_wide.cuh: the 16-token chunks of experts and matmul calls with at least
// STRATA_CUDA_WIDE_MIN_ROWS rows; 8 warps sharing each load batch's operand through shared memory) against
// the narrow ones (STRATA_CUDA_WIDE_MIN_ROWS=0): the same bits, and cpu_generic within 1e-5. Both int4
// formats, staged rows and resident tiles, K slices with whole batches, partial batches, half units and no
// batch at all (gate/up K = 130, 1100, 2100, 600; down K = 33, 72, 1300, 290), slices of unequal lengths, row
// blocks past the matrix (33 gate rows, 130 down rows), experts of 16, 33 and 40 rows (wide chunks plus a
// narrow rest), 12 and 29 (a partly filled wide chunk) beside small ones; matmul at 9 (a partly filled
// wide chunk), 16, 17 (a narrow rest of 1), 25 (16 + 9) and 40 rows. In the emulation, also that the wide kernels
// really ran: with dynamic shared memory refused (STRATA_CUDA_EMU_NO_DYN_SMEM=1) such a group fails on the wide
// backend and not on the narrow one.
static void gpu_case_wide(const PluginRecord* rec, const char* gate_up_slices) {
  auto wide = make_cuda_with_envs(*rec, {{"STRATA_CUDA_WIDE_MIN_ROWS", "9"},
                                         {"STRATA_CUDA_GATE_UP_SLICES", gate_up_slices}});
  auto narrow = make_cuda_with_envs(*rec, {{"STRATA_CUDA_WIDE_MIN_ROWS", "0"},
                                           {"STRATA_CUDA_GATE_UP_SLICES", gate_up_slices}});
  auto ref = cpu_reference();
  std::mt19937 rng(1616);
  const std::vector<int> counts = {16, 0, 40, 3, 33, 12, 29};
  for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
    CAPTURE(weight_format_name(f));
    for (const auto& hidden_ffn :
         {std::pair<int64_t, int64_t>{130, 33}, {1100, 72}, {2100, 40}, {130, 1300}, {600, 290}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(hidden);
      CAPTURE(ffn);
      const Group grp(rng, hidden, ffn, 48, counts, same_format(f, counts.size()));
      const auto want = grp.run(*ref);
      for (bool resident : {false, true}) {
        CAPTURE(resident);
        std::vector<ResidentMatrix> keep;
        const auto got_w = resident ? on_device(*wide, grp, keep).run(*wide) : grp.run(*wide);
        const auto got_n = resident ? on_device(*narrow, grp, keep).run(*narrow) : grp.run(*narrow);
        for (size_t e = 0; e < counts.size(); ++e) {
          CAPTURE(counts[e]);
          CHECK(std::memcmp(got_w[e].data(), got_n[e].data(), got_n[e].size() * 4) == 0);
          CHECK(rel_err(got_w[e].data(), want[e].data(), want[e].size()) <= kExactTol);
        }
      }
    }
    for (const auto& shape : {std::pair<int64_t, int64_t>{33, 130}, {300, 600}, {129, 2100}}) {
      const int64_t o = shape.first, i = shape.second;
      CAPTURE(o);
      CAPTURE(i);
      const HostMatrix w = random_matrix(rng, f, o, i);
      const auto x = random_vec(rng, static_cast<size_t>(40 * i));
      for (int64_t n : {9, 16, 17, 25, 40}) {
        CAPTURE(n);
        const size_t m = static_cast<size_t>(n * o);
        std::vector<float> want(m), yw(m, NAN), yn(m, NAN);
        ref->matmul(w.view(), x.data(), n, want.data());
        wide->matmul(w.view(), x.data(), n, yw.data());
        narrow->matmul(w.view(), x.data(), n, yn.data());
        CHECK(std::memcmp(yw.data(), yn.data(), m * 4) == 0);
        CHECK(rel_err(yw.data(), want.data(), m) <= kExactTol);
      }
    }
  }
  if (rec->name == std::string("cuda_emu")) {
    const Group grp(rng, 130, 72, 20, {16}, same_format(WeightFormat::Q4_G64, 1));
    ::setenv("STRATA_CUDA_EMU_NO_DYN_SMEM", "1", 1);
    CHECK_THROWS(grp.run(*wide));
    CHECK_NOTHROW(grp.run(*narrow));
    ::unsetenv("STRATA_CUDA_EMU_NO_DYN_SMEM");
  }
}

TEST_CASE("cuda wide exact kernels (prefill, 16-token chunks): the narrow kernels' bits, within 1e-5") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    // (gate/up in 2 K slices, the default, and in 1: blocks of 32 / 64 rows; bits of their own)
    for (const char* slices : {"2", "1"}) {
      CAPTURE(slices);
      gpu_case_wide(rec, slices);
    }
    // The setting really switches the gate/up kernels: other sums' order, other bits somewhere (both within 1e-5).
    {
      auto two = make_cuda_with_env(*rec, "STRATA_CUDA_GATE_UP_SLICES", "2");
      auto one = make_cuda_with_env(*rec, "STRATA_CUDA_GATE_UP_SLICES", "1");
      std::mt19937 rng(77);
      const Group grp(rng, 1100, 72, 8, {1, 3, 20}, same_format(WeightFormat::Q4_G64, 3));
      const auto a = grp.run(*two), b = grp.run(*one), want = grp.run(*cpu_reference());
      int differ = 0;
      for (size_t e = 0; e < a.size(); ++e) {
        differ += a[e] == b[e] ? 0 : 1;
        CHECK(rel_err(b[e].data(), want[e].data(), want[e].size()) <= kExactTol);
      }
      CHECK(differ > 0);
    }
    // Another count of slices is refused by name.
    CHECK_THROWS_WITH(make_cuda_with_env(*rec, "STRATA_CUDA_GATE_UP_SLICES", "4"),
                      doctest::Contains("STRATA_CUDA_GATE_UP_SLICES is '4'; expected 1 or 2"));
  }
}

// A group's launch sequence is captured as a CUDA graph once per shape and slot and replayed (the emulation
// captures and replays too): groups of several shapes (the layer kernel, separate launches, SIMT, more
// tokens than one chunk; the same tasks and rows with other matrix sizes, which only the grids tell apart),
// interleaved and repeated, and matmuls of several row counts and sizes give the bits of direct launches
// (STRATA_CUDA_GRAPHS=0); a larger group after them grows the slot (its graphs dropped); more shapes than a
// slot keeps graphs of.
static void gpu_case_graphs(const PluginRecord* rec) {
  auto graphs = make_backend(*rec);
  auto direct = make_cuda_with_env(*rec, "STRATA_CUDA_GRAPHS", "0");
  std::mt19937 rng(4242);
  std::vector<Group> groups;
  const std::vector<std::vector<int>> counts = {{1, 1, 1, 1}, {2, 1, 0, 1}, {3, 4, 1, 2}, {9, 1, 17, 2}};
  for (const auto& c : counts)
    groups.emplace_back(rng, 200, 72, 24, c, same_format(WeightFormat::Q4_G64, c.size()));
  for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{200, 100}, {136, 72}, {136, 100}}) {
    const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
    groups.emplace_back(rng, hidden, ffn, 24, counts[0], same_format(WeightFormat::Q4_G64, 4));
    groups.emplace_back(rng, hidden, ffn, 24, counts[1], same_format(WeightFormat::Q4_G64, 4));
  }
  groups.emplace_back(rng, 200, 72, 24, std::vector<int>{1, 2}, same_format(WeightFormat::BF16, 2));
  for (int rep = 0; rep < 3; ++rep) {
    CAPTURE(rep);
    for (size_t i = 0; i < groups.size(); ++i) {
      CAPTURE(i);
      CHECK(groups[i].run(*graphs) == groups[i].run(*direct));
    }
  }
  const Group big(rng, 640, 200, 40, {5, 30, 2}, same_format(WeightFormat::Q4_G64, 3));
  CHECK(big.run(*graphs) == big.run(*direct));
  for (const Group& g : groups) CHECK(g.run(*graphs) == g.run(*direct));
  // The pinned head buffer alone grows (a group of many x rows, few routed, fits the device buffer): the
  // graphs that copied the head from the old one go too.
  const Group many_x(rng, 200, 72, 600, {1, 1, 1, 1}, same_format(WeightFormat::Q4_G64, 4));
  CHECK(many_x.run(*graphs) == many_x.run(*direct));
  for (const Group& g : groups) CHECK(g.run(*graphs) == g.run(*direct));
  const HostMatrix ws[] = {random_matrix(rng, WeightFormat::Q4_G64, 96, 200),
                           random_matrix(rng, WeightFormat::Q4_G64, 160, 200)};
  const std::vector<float> x = random_vec(rng, 13 * 200);
  for (int rep = 0; rep < 2; ++rep) {
    for (const HostMatrix& w : ws) {
      for (int64_t n : {1, 13, 3}) {
        CAPTURE(n);
        std::vector<float> a(static_cast<size_t>(n * w.rows)), b(a.size());
        graphs->matmul(w.view(), x.data(), n, a.data());
        direct->matmul(w.view(), x.data(), n, b.data());
        CHECK(a == b);
      }
    }
  }
  // More shapes than a slot keeps graphs of (64): the least recently used go, and come back when used again.
  std::vector<HostMatrix> many;
  for (int k = 1; k <= 70; ++k) many.push_back(random_matrix(rng, WeightFormat::Q4_G64, 64 * k, 64));
  int differ = 0;
  for (int rep = 0; rep < 2; ++rep) {
    for (const HostMatrix& w : many) {
      std::vector<float> a(static_cast<size_t>(w.rows)), b(a.size());
      graphs->matmul(w.view(), x.data(), 1, a.data());
      direct->matmul(w.view(), x.data(), 1, b.data());
      differ += a == b ? 0 : 1;
    }
  }
  CHECK(differ == 0);
}

TEST_CASE("cuda graphs: replayed launch sequences give the bits of direct launches") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_graphs(rec);
  }
}

// Outputs in host memory registered with the backend are copied there by the device (no staging copy):
// the same bits as unregistered outputs, for a group whose outputs lie partly inside and partly outside the
// registered range; overlapping registrations are refused; after unregistering, the staged path again.
static void gpu_case_registered(const PluginRecord* rec, WeightFormat format, const char* direct_writes) {
  auto cuda = make_cuda_with_env(*rec, "STRATA_CUDA_DIRECT_WRITES", direct_writes);
  std::mt19937 rng(99);
  const Group grp(rng, 300, 70, 6, {1, 2, 1, 3, 1}, same_format(format, 5));
  const auto want = grp.run(*cuda);
  size_t total = 0;
  for (const auto& r : grp.rows) total += r.size() * static_cast<size_t>(grp.hidden);
  const size_t bytes = (total * sizeof(float) + 4095) / 4096 * 4096;
  float* arena = static_cast<float*>(std::aligned_alloc(4096, bytes));
  REQUIRE(arena != nullptr);
  REQUIRE(cuda->register_host(arena, bytes));
  CHECK_FALSE(cuda->register_host(arena + 16, 64));  // overlaps
  // Experts 0, 1, 3 (adjacent: one copy for 0-1) write into the arena, 2 and 4 into ordinary vectors.
  std::vector<std::vector<float>> plain(grp.experts.size());
  std::vector<float*> outs(grp.experts.size());
  size_t at = 0;
  for (size_t e = 0; e < grp.experts.size(); ++e) {
    const size_t n = grp.rows[e].size() * static_cast<size_t>(grp.hidden);
    if (e == 2 || e == 4) {
      plain[e].assign(n, NAN);
      outs[e] = plain[e].data();
    } else {
      outs[e] = arena + at;
      std::fill(outs[e], outs[e] + n, NAN);
      at += n;
    }
  }
  for (int rep = 0; rep < 2; ++rep) {
    CAPTURE(rep);
    std::vector<ExpertTask> tasks;
    for (size_t e = 0; e < grp.experts.size(); ++e) tasks.push_back({&grp.experts[e], grp.rows[e], outs[e]});
    PendingGroup g = cuda->issue(grp.x.data(), grp.n_x, grp.hidden, tasks);
    g.take();
    for (size_t e = 0; e < grp.experts.size(); ++e) {
      CAPTURE(e);
      CHECK(std::memcmp(outs[e], want[e].data(), want[e].size() * 4) == 0);
      std::fill(outs[e], outs[e] + want[e].size(), NAN);
    }
    if (rep == 0) cuda->unregister_host(arena);  // the second round goes through the staging buffers
  }
  // Every output registered (no staged copy at all).
  REQUIRE(cuda->register_host(arena, bytes));
  {
    std::vector<ExpertTask> tasks;
    size_t off = 0;
    for (size_t e = 0; e < grp.experts.size(); ++e) {
      const size_t n = grp.rows[e].size() * static_cast<size_t>(grp.hidden);
      std::fill(arena + off, arena + off + n, NAN);
      tasks.push_back({&grp.experts[e], grp.rows[e], arena + off});
      off += n;
    }
    PendingGroup g = cuda->issue(grp.x.data(), grp.n_x, grp.hidden, tasks);
    g.take();
    off = 0;
    for (size_t e = 0; e < grp.experts.size(); ++e) {
      CAPTURE(e);
      CHECK(std::memcmp(arena + off, want[e].data(), want[e].size() * 4) == 0);
      off += want[e].size();
    }
  }
  cuda->unregister_host(arena);
  std::free(arena);
}

TEST_CASE("cuda outputs in registered host memory: written by the device, the same bits") {
  // The down kernels' stores straight into the registered rows (the default), and copies after the group.
  for (const char* direct_writes : {"1", "0"}) {
    CAPTURE(direct_writes);
    for (const PluginRecord* rec : cuda_backends()) {
      CAPTURE(rec->name);
      for (WeightFormat f : {WeightFormat::Q4_G64, WeightFormat::BF16}) {
        gpu_case_registered(rec, f, direct_writes);
      }
    }
  }
}

static void gpu_case_7(const PluginRecord* rec) {
  auto cuda = make_backend(*rec);
  std::mt19937 rng(21);
  std::vector<Group> groups;
  for (int k = 0; k < 4; ++k) {
    const WeightFormat f = k % 2 == 0 ? WeightFormat::Q4_G64 : WeightFormat::BF16;
    groups.emplace_back(rng, 256, 128, 12, std::vector<int>{1, 2, 0, 5, 12}, same_format(f, 5));
  }
  std::vector<std::vector<std::vector<float>>> want;
  for (const auto& g : groups) want.push_back(g.run(*cuda));

  // Resident weights for half of them.
  std::vector<ResidentMatrix> keep;
  std::vector<std::vector<ExpertMatrices>> resident_experts(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    for (const auto& e : groups[k].experts) {
      if (k % 2 == 1) {
        resident_experts[k].push_back(e);
        continue;
      }
      keep.push_back(cuda->upload(e.gate));
      keep.push_back(cuda->upload(e.up));
      keep.push_back(cuda->upload(e.down));
      resident_experts[k].push_back(
          {keep[keep.size() - 3].matrix(), keep[keep.size() - 2].matrix(), keep.back().matrix()});
    }
  }
  std::vector<std::vector<std::vector<float>>> outs(groups.size());
  std::vector<PendingGroup> pending;
  for (size_t k = 0; k < groups.size(); ++k) {
    const Group& g = groups[k];
    outs[k].assign(g.experts.size(), {});
    std::vector<ExpertTask> tasks;
    for (size_t e = 0; e < g.experts.size(); ++e) {
      outs[k][e].assign(g.rows[e].size() * static_cast<size_t>(g.hidden), NAN);
      tasks.push_back({&resident_experts[k][e], g.rows[e], outs[k][e].data()});
    }
    pending.push_back(cuda->issue(g.x.data(), g.n_x, g.hidden, tasks));
    for (const auto& o : outs[k])
      CHECK(std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); }));
  }
  for (size_t k = groups.size(); k-- > 0;) {  // taken in reverse order
    pending[k].take();
    CHECK(!pending[k]);
    CHECK(outs[k] == want[k]);
  }

  // Dropped without take: waited for and discarded, outputs untouched, the backend fine.
  {
    std::vector<std::vector<float>> out;
    const auto tasks = groups[0].tasks(out);
    { PendingGroup dropped = cuda->issue(groups[0].x.data(), groups[0].n_x, groups[0].hidden, tasks); }
    for (const auto& o : out) CHECK(std::all_of(o.begin(), o.end(), [](float v) { return std::isnan(v); }));
    CHECK(groups[0].run(*cuda) == want[0]);
  }
  // A handle is consumed by take: a second take is an error.
  {
    std::vector<std::vector<float>> out;
    const auto tasks = groups[1].tasks(out);
    PendingGroup g = cuda->issue(groups[1].x.data(), groups[1].n_x, groups[1].hidden, tasks);
    g.take();
    CHECK_THROWS_AS(g.take(), Error);
  }

  // Several threads issuing and taking on one backend at once.
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const size_t k = static_cast<size_t>(t) % groups.size();
      bool good = true;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<std::vector<float>> out;
        const auto tasks = groups[k].tasks(out);
        PendingGroup g = cuda->issue(groups[k].x.data(), groups[k].n_x, groups[k].hidden, tasks);
        g.take();
        good = good && out == want[k];
      }
      ok[static_cast<size_t>(t)] = good ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(std::all_of(ok.begin(), ok.end(), [](int v) { return v == 1; }));

  // Every device at once (one group in flight on each).
  std::vector<std::shared_ptr<Backend>> devices;
  for (int d = 0; d < 16; ++d) {
    try {
      devices.push_back(make_backend(*rec, d));
    } catch (const Error&) {
      break;
    }
  }
  MESSAGE(devices.size() << " CUDA device(s)");
  std::vector<std::vector<std::vector<float>>> dev_out(devices.size());
  std::vector<PendingGroup> dev_pending;
  for (size_t d = 0; d < devices.size(); ++d) {
    const auto tasks = groups[0].tasks(dev_out[d]);
    dev_pending.push_back(devices[d]->issue(groups[0].x.data(), groups[0].n_x, groups[0].hidden, tasks));
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    dev_pending[d].take();
    CHECK(dev_out[d] == want[0]);
  }
}

TEST_CASE("cuda issue/take: several groups in flight, out of order, from threads, on every device") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_7(rec);
  }
}

static void gpu_case_8(const PluginRecord* rec) {
  const strata_plugin_vtable* vt = rec->vtable;
  std::mt19937 rng(5);
  const Group grp(rng, 128, 64, 6, {2, 3}, same_format(WeightFormat::Q4_G64, 2));
  auto want = grp.run(*cpu_reference());
  for (const char* what : {"oom", "device"}) {
    CAPTURE(what);
    ::setenv("STRATA_CUDA_FAIL_NEXT", what, 1);
    strata_backend* raw = nullptr;
    strata_backend_options opt{};
    opt.struct_size = sizeof opt;
    const strata_status made = vt->create(&opt, &raw);
    ::unsetenv("STRATA_CUDA_FAIL_NEXT");
    REQUIRE(made == STRATA_OK);
    std::vector<strata_expert> ce;
    for (const auto& e : grp.experts) {
      auto c = [](const Matrix& m) {
        strata_matrix s{};
        s.dtype = static_cast<int32_t>(m.format);
        s.rows = m.rows;
        s.cols = m.cols;
        s.data = m.data;
        s.scales = m.scales;
        return s;
      };
      ce.push_back({c(e.gate), c(e.up), c(e.down)});
    }
    std::vector<std::vector<float>> out(2);
    std::vector<strata_expert_task> tasks(2);
    for (size_t e = 0; e < 2; ++e) {
      out[e].assign(grp.rows[e].size() * 128, NAN);
      tasks[e].expert = &ce[e];
      tasks[e].n_rows = static_cast<int32_t>(grp.rows[e].size());
      tasks[e].rows = grp.rows[e].data();
      tasks[e].out = out[e].data();
    }
    strata_group* g = nullptr;
    const strata_status s = vt->expert_group_issue(raw, grp.x.data(), grp.n_x, 128, 2, tasks.data(), &g);
    CHECK(s == (std::string(what) == "oom" ? STRATA_ERR_OUT_OF_MEMORY : STRATA_ERR_DEVICE));
    CHECK(g == nullptr);
    CHECK(std::string(vt->last_error()).find("injected") != std::string::npos);
    // The next issue works.
    REQUIRE(vt->expert_group_issue(raw, grp.x.data(), grp.n_x, 128, 2, tasks.data(), &g) == STRATA_OK);
    REQUIRE(vt->expert_group_take(raw, g) == STRATA_OK);
    for (size_t e = 0; e < 2; ++e) CHECK(rel_err(out[e].data(), want[e].data(), want[e].size()) <= kExactTol);
    vt->destroy(raw);
  }
  // Through the C++ face the failure is a strata::Error naming the status.
  auto b = make_cuda_with_env(*rec, "STRATA_CUDA_FAIL_NEXT", "oom");
  std::vector<std::vector<float>> out;
  const auto tasks = grp.tasks(out);
  CHECK_THROWS_WITH_AS(b->issue(grp.x.data(), grp.n_x, 128, tasks), doctest::Contains("status 3"), Error);

  // Bad arguments, as the CPU backends report them.
  auto cuda = make_backend(*rec);
  const HostMatrix w = random_matrix(rng, WeightFormat::F32, 4, 8);
  std::vector<float> x(16), y(8), o(16);
  ExpertMatrices e{w.view(), w.view(), random_matrix(rng, WeightFormat::F32, 8, 4).view()};
  std::vector<int32_t> rows = {0, 5};
  ExpertTask t{&e, rows, o.data()};
  CHECK_THROWS_WITH_AS(cuda->expert_group(x.data(), 2, 8, std::span(&t, 1)),
                       doctest::Contains("row index 5 outside [0, 2)"), Error);
  Matrix q = w.view();
  q.format = WeightFormat::Q4_G64;
  CHECK_THROWS_WITH_AS(cuda->matmul(q, x.data(), 2, y.data()),
                       doctest::Contains("int4 matrix without scales"), Error);
  q.format = static_cast<WeightFormat>(17);
  CHECK_THROWS_WITH_AS(cuda->matmul(q, x.data(), 2, y.data()),
                       doctest::Contains("is not supported by this backend"), Error);
  // A matmul of no rows writes nothing, and its matrix is still checked.
  std::fill(y.begin(), y.end(), NAN);
  cuda->matmul(w.view(), x.data(), 0, y.data());
  CHECK(std::isnan(y[0]));
  CHECK_THROWS_WITH_AS(cuda->matmul(q, x.data(), 0, y.data()),
                       doctest::Contains("is not supported by this backend"), Error);
  ExpertMatrices bad{w.view(), w.view(), w.view()};
  ExpertTask tb{&bad, std::span<const int32_t>(rows.data(), 1), o.data()};
  CHECK_THROWS_WITH_AS(cuda->expert_group(x.data(), 2, 8, std::span(&tb, 1)),
                       doctest::Contains("inconsistent gate/up/down shapes"), Error);
  // A group with no rows at all completes and writes nothing.
  std::fill(o.begin(), o.end(), NAN);
  ExpertTask empty{&e, std::span<const int32_t>(), o.data()};
  cuda->expert_group(x.data(), 2, 8, std::span(&empty, 1));
  PendingGroup pg = cuda->issue(x.data(), 2, 8, std::span(&empty, 1));
  pg.take();
  CHECK(std::isnan(o[0]));
}

TEST_CASE("cuda failures are statuses: injected out-of-memory and device errors, bad arguments") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_8(rec);
  }
}

static void gpu_case_9(const PluginRecord* rec) {
  const auto dirs = fixtures();
  REQUIRE(dirs.size() >= 4);
  RuntimeConfig cfg;
  cfg.backends.experts = {rec->name};
  cfg.backends.dense = {rec->name == "cuda" ? "cuda"
                                            : "cpu_generic"};  // the emulation is slow for every matmul
  for (const auto& dir : dirs) {
    CAPTURE(dir.filename().string());
    const Expected ex = load_expected(dir);
    const bool q4 = nlohmann::json::parse(read_text(dir / "expected.json")).value("variant", "") == "q4g64";
    for (bool quant : {false, true}) {
      if (quant && !q4) continue;
      CAPTURE(quant);
      LoadOptions lo;
      if (quant) lo.expert_quant = WeightFormat::Q4_G64;
      auto backends = choose_backends(registry(), cfg);
      const std::string dense = std::string(backends.dense->name());
      auto model = Model::load(dir, std::move(backends), lo);
      Session s(model);
      const auto full = s.forward(ex.sequence, true);
      float dev = 0;
      for (size_t i = 0; i < full.size(); ++i) dev = std::max(dev, std::fabs(full[i] - ex.logits[i]));
      MESSAGE(dir.filename().string()
              << std::string(quant ? " (Q4_G64 experts)" : "") << ", experts on " << rec->name
              << ", dense on " << dense << ": max |logit - transformers| = " << dev);
      CHECK(dev <= 1e-3f);
      // Prefill vs one token at a time: bit for bit (the exact kernels do not depend on the batch).
      Session s1(model);
      std::vector<float> stepwise;
      for (size_t t = 0; t < ex.sequence.size(); ++t) {
        const auto part = s1.forward(std::span<const int32_t>(ex.sequence.data() + t, 1), true);
        stepwise.insert(stepwise.end(), part.begin(), part.end());
      }
      CHECK(stepwise == full);
      Session g(model);
      const auto gen =
          generate_greedy(g, ex.prompt, static_cast<int64_t>(ex.sequence.size() - ex.prompt.size()));
      CHECK(gen == std::vector<int32_t>(ex.sequence.begin() + static_cast<std::ptrdiff_t>(ex.prompt.size()),
                                        ex.sequence.end()));
    }
  }
}

TEST_CASE("every model fixture with its experts on the GPU gives the oracle's greedy tokens") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_9(rec);
  }
}

// The expert tiers with a GPU: part of the experts in VRAM (issued asynchronously), the rest on the CPU, at
// the same time or one after the other — bitwise the same; an injected device failure is recomputed on the
// CPU and gives the same greedy tokens.
static void gpu_case_store(const PluginRecord* rec) {
  for (const char* name : {"glm_moe_dsa-tiny", "deepseek_v3-tiny"}) {
    const fs::path dir = fixtures_root() / name;
    if (!fs::exists(dir)) continue;
    CAPTURE(name);
    const Expected ex = load_expected(dir);
    RuntimeConfig cfg;
    cfg.backends.experts = {rec->name};
    cfg.backends.dense = {rec->name == "cuda" ? "auto" : "cpu_generic"};
    auto load = [&](bool overlap, std::optional<double> ram_gb = std::nullopt) {
      LoadOptions probe_lo;
      auto probe = Model::load(dir, choose_backends(registry(), cfg), probe_lo);
      StoreOptions so;
      so.pin = "none";
      so.overlap = overlap;
      so.ram_gb = ram_gb;
      so.vram_gb = static_cast<double>(probe->param_counts().routed_bytes) / 2 / (1024.0 * 1024 * 1024);
      LoadOptions lo;
      lo.store = so;
      return Model::load(dir, choose_backends(registry(), cfg), lo);
    };
    auto on = load(true);
    const StorePlan& plan = on->expert_store()->plan();
    MESSAGE(on->expert_store()->plan_text());
    CHECK(plan.vram > 0);
    CHECK(plan.ram > 0);
    Session a(on);
    const auto la = a.forward(ex.sequence, true);
    const auto tel = on->expert_store()->telemetry();
    CHECK(tel.vram_hits > 0);
    CHECK(tel.ram_hits > 0);
    // Where in the layers things happened (sums over layers): the GPU groups issued before they were taken,
    // both within the layers' time; the CPU rows started before they ended.
    CHECK(tel.gpu_issued_s > 0);
    CHECK(tel.gpu_issued_s <= tel.gpu_done_s);
    CHECK(tel.gpu_done_s <= tel.layer_s);
    CHECK(tel.cpu_start_s <= tel.cpu_end_s);
    CHECK(tel.cpu_end_s <= tel.layer_s);
    auto off = load(false);
    Session b(off);
    const auto lb = b.forward(ex.sequence, true);
    CHECK(la == lb);
    Session a5(on, 5);  // another thread count, the same bits
    CHECK(a5.forward(ex.sequence, true) == la);
    const std::vector<int32_t> want(ex.sequence.begin() + static_cast<std::ptrdiff_t>(ex.prompt.size()),
                                    ex.sequence.end());
    Session g(on);
    CHECK(generate_greedy(g, ex.prompt, static_cast<int64_t>(want.size())) == want);
    // VRAM and disk together: half the experts on the GPU, the rest streamed (HF fixtures store float experts
    // without transformation, so they stream) through the minimum cache; overlap on == off bit for bit.
    auto hyb_on = load(true, 0.0), hyb_off = load(false, 0.0);
    CHECK(hyb_on->expert_store()->plan().vram > 0);
    CHECK(hyb_on->expert_store()->plan().streamed > 0);
    Session h1(hyb_on), h2(hyb_off);
    const auto lh1 = h1.forward(ex.sequence, true);
    CHECK(lh1 == h2.forward(ex.sequence, true));
    CHECK(hyb_on->expert_store()->telemetry().disk_reads > 0);
    CHECK(hyb_on->expert_store()->pinned_slots() == 0);
    // A device error in the first GPU group: the layer is recomputed on the CPU, the request completes.
    ::setenv("STRATA_CUDA_FAIL_NEXT", "device", 1);
    auto failing = load(true);
    ::unsetenv("STRATA_CUDA_FAIL_NEXT");
    Session f(failing);
    CHECK(generate_greedy(f, ex.prompt, static_cast<int64_t>(want.size())) == want);
    CHECK(failing->expert_store()->telemetry().gpu_fallbacks >= 1);
  }
}

TEST_CASE(
    "expert tiers with a GPU: overlap on == off bit for bit, a failed GPU group is recomputed on the CPU") {
  for (const PluginRecord* rec : cuda_backends()) {
    CAPTURE(rec->name);
    gpu_case_store(rec);
  }
}
