// Plugin registry: real plugins load and score; broken ones are rejected with a reason, never a crash.
#include <algorithm>
#include <cstdlib>

#include "strata/error.hpp"
#include "strata/plugin_abi.h"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {
const PluginRecord* record(const PluginRegistry& r, const std::string& name) {
  for (const auto& p : r.plugins()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}
}  // namespace

TEST_CASE("the build's plugins are found, versioned and scored") {
  PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR)});
  const PluginRecord* g = record(reg, "cpu_generic");
  REQUIRE(g != nullptr);
  CHECK(g->usable);
  CHECK(g->score == 1);
  CHECK(!g->version.empty());
  const PluginRecord* a = record(reg, "cpu_avx512");
  if (!STRATA_X86_PLUGINS) {  // not built off x86-64
    CHECK(a == nullptr);
    CHECK(record(reg, "cpu_avx2") == nullptr);
    return;
  }
  REQUIRE(a != nullptr);
  if (a->usable) {
    CHECK(a->score > g->score);
    const auto ranked = reg.ranked();  // a usable GPU plugin may rank above both
    const auto cpu =
        std::find_if(ranked.begin(), ranked.end(), [](auto* p) { return p->name.rfind("cpu_", 0) == 0; });
    REQUIRE(cpu != ranked.end());
    CHECK((*cpu)->name == "cpu_avx512");
  } else {
    CHECK(a->reason.find("AVX-512") != std::string::npos);
  }
  const PluginRecord* v = record(reg, "cpu_avx2");
  REQUIRE(v != nullptr);
  if (v->usable) {
    CHECK(v->score > g->score);
    CHECK(v->score > 50);  // above the cuda plugin's (dense stays on the CPU), below cpu_avx512's
    CHECK((!a->usable || a->score > v->score));
  } else {
    CHECK(v->reason.find("AVX2") != std::string::npos);
  }
}

TEST_CASE("broken plugins are rejected with the reason") {
  PluginRegistry reg({fs::path(STRATA_TEST_PLUGIN_DIR), fs::path(STRATA_PLUGIN_BUILD_DIR)});
  const PluginRecord* abi = record(reg, "bad_abi");
  REQUIRE(abi != nullptr);
  CHECK(!abi->usable);
  CHECK(abi->reason.find("ABI version 999") != std::string::npos);
  const PluginRecord* ms = record(reg, "missing_score");
  REQUIRE(ms != nullptr);
  CHECK(!ms->usable);
  CHECK(ms->reason == "missing symbol strata_plugin_score");
  const PluginRecord* z = record(reg, "score_zero");
  REQUIRE(z != nullptr);
  CHECK(!z->usable);
  CHECK(z->reason == "score 0: needs the imaginary XYZ-9000 accelerator");
  CHECK(reg.find("score_zero") == nullptr);
  // The good ones still load beside them.
  CHECK(reg.find("cpu_generic") != nullptr);
}

TEST_CASE("the same plugin found twice: the first wins, the second is reported as shadowed") {
  PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR), fs::path(STRATA_PLUGIN_BUILD_DIR) / "."});
  int usable = 0, shadowed = 0;
  for (const auto& p : reg.plugins()) {
    if (p.name != "cpu_generic") continue;
    if (p.usable) ++usable;
    if (p.reason.find("shadowed") != std::string::npos) ++shadowed;
  }
  CHECK(usable == 1);
  CHECK(shadowed == 1);
}

TEST_CASE("the AVX-512 and AVX2 plugins score 0 when their probes say no") {
  if (!STRATA_X86_PLUGINS) return;  // (not built off x86-64)
  ::setenv("STRATA_CPU_AVX512_PROBE", "off", 1);
  ::setenv("STRATA_CUDA_PROBE", "off", 1);  // and no GPU plugin either, on hosts that have one
  {
    // An AVX2 machine without AVX-512 (a desktop Intel or Zen 3): auto choice takes cpu_avx2 where it runs.
    PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR)});
    const PluginRecord* a = record(reg, "cpu_avx512");
    REQUIRE(a != nullptr);
    CHECK(!a->usable);
    CHECK(a->reason.find("forced off") != std::string::npos);
    const PluginRecord* v = record(reg, "cpu_avx2");
    REQUIRE(v != nullptr);
    const Backends b = choose_backends(reg, RuntimeConfig{});
    CHECK(b.dense->name() == (v->usable ? "cpu_avx2" : "cpu_generic"));
  }
  ::setenv("STRATA_CPU_AVX2_PROBE", "off", 1);
  PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR)});
  ::unsetenv("STRATA_CPU_AVX512_PROBE");
  ::unsetenv("STRATA_CPU_AVX2_PROBE");
  ::unsetenv("STRATA_CUDA_PROBE");
  const PluginRecord* v = record(reg, "cpu_avx2");
  REQUIRE(v != nullptr);
  CHECK(!v->usable);
  CHECK(v->reason == "score 0: AVX2 probe forced off by STRATA_CPU_AVX2_PROBE=off");
  // Auto choice then falls back to the portable plugin.
  const Backends b = choose_backends(reg, RuntimeConfig{});
  CHECK(b.dense->name() == "cpu_generic");
}

TEST_CASE("STRATA_PLUGIN_PATH and plugins.path extend the search path, in order") {
  ::setenv("STRATA_PLUGIN_PATH", "/tmp/strata-a:/tmp/strata-b", 1);
  const auto path = plugin_search_path({fs::path("/tmp/strata-c")});
  ::unsetenv("STRATA_PLUGIN_PATH");
  auto pos = [&](const char* p) { return std::find(path.begin(), path.end(), fs::path(p)) - path.begin(); };
  CHECK(pos("/tmp/strata-a") < pos("/tmp/strata-b"));
  CHECK(pos("/tmp/strata-b") < pos("/tmp/strata-c"));
  CHECK(pos("/tmp/strata-c") < static_cast<long>(path.size()));
  CHECK(pos(STRATA_PLUGIN_BUILD_DIR) < pos("/tmp/strata-a"));
}

TEST_CASE("backend choice from the config") {
  auto& reg = build_registry();
  RuntimeConfig cfg;
  cfg.backends.dense = {"cpu_generic"};
  cfg.backends.experts = {"cpu_generic"};
  const Backends b = choose_backends(reg, cfg);
  CHECK(b.dense->name() == "cpu_generic");
  CHECK(b.experts.size() == 1);
  cfg.backends.experts = {"cuda_nonexistent"};
  CHECK_THROWS_WITH_AS(choose_backends(reg, cfg),
                       doctest::Contains("plugin 'cuda_nonexistent' was not found"), Error);
  PluginRegistry broken({fs::path(STRATA_TEST_PLUGIN_DIR)});
  cfg.backends.dense = {"score_zero"};
  CHECK_THROWS_WITH_AS(choose_backends(broken, cfg), doctest::Contains("no usable backend plugin"), Error);
  PluginRegistry mixed({fs::path(STRATA_TEST_PLUGIN_DIR), fs::path(STRATA_PLUGIN_BUILD_DIR)});
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("plugin 'score_zero' was rejected: score 0"), Error);
  // The experts list is an ordered preference: a listed plugin that cannot run here is passed over (and
  // said so) when another one can; alone, or with a name found nowhere, it is an error.
  cfg.backends.dense = {"cpu_generic"};
  cfg.backends.experts = {"score_zero", "cpu_generic"};
  const Backends m = choose_backends(mixed, cfg);
  REQUIRE(m.experts.size() == 1);
  CHECK(m.experts.front()->name() == "cpu_generic");
  REQUIRE(m.skipped.size() == 1);
  CHECK(m.skipped.front().find("skipped plugin 'score_zero' was rejected: score 0") != std::string::npos);
  cfg.backends.experts = {"score_zero"};
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("plugin 'score_zero' was rejected: score 0"), Error);
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("list another after it: backends.experts: [score_zero, auto]"),
                       Error);
  cfg.backends.experts = {"score_zero", "score_zero"};
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("none of the listed plugins can run here"), Error);
  // backends.dense is an ordered preference too: the first entry that runs; auto anywhere in it.
  cfg.backends.experts = {"cpu_generic"};
  cfg.backends.dense = {"score_zero", "cpu_generic"};
  const Backends d = choose_backends(mixed, cfg);
  CHECK(d.dense->name() == "cpu_generic");
  CHECK(d.dense_reason == "configured");
  REQUIRE(d.skipped.size() == 1);
  CHECK(d.skipped.front().find("backends.dense: skipped plugin 'score_zero' was rejected: score 0") !=
        std::string::npos);
  cfg.backends.dense = {"score_zero", "auto"};
  CHECK(choose_backends(mixed, cfg).dense_reason == "auto: highest score");
  cfg.backends.dense = {"score_zero", "score_zero"};
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("backends.dense: none of the listed plugins can run here"), Error);
  cfg.backends.dense = {"cuda_nonexistent",
                        "cpu_generic"};  // a name found nowhere is a mistake, not a fallback
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("backends.dense: plugin 'cuda_nonexistent' was not found"), Error);
  cfg.backends.dense = {"cpu_generic"};
  // auto in the experts list adds the exact-mode plugins by score, each once.
  cfg.backends.experts = {"score_zero", "cpu_generic", "auto"};
  const Backends a = choose_backends(mixed, cfg);
  CHECK(a.experts.front()->name() == "cpu_generic");
  CHECK(a.experts.size() == mixed.ranked(/*exact_only=*/true).size());
  CHECK(a.skipped.size() == 1);
  cfg.backends.experts = {"cuda_nonexistent", "cpu_generic"};
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg),
                       doctest::Contains("plugin 'cuda_nonexistent' was not found"), Error);
  // A plugin that failed to load (here: another ABI) is a broken install, not a machine that lacks something:
  // an error even with another plugin after it.
  cfg.backends.experts = {"bad_abi", "cpu_generic"};
  CHECK_THROWS_WITH_AS(choose_backends(mixed, cfg), doctest::Contains("plugin 'bad_abi' was rejected: "),
                       Error);
  cfg.backends.experts = {"cpu_generic", "score_zero"};  // (skipped even after a usable one)
  CHECK(choose_backends(mixed, cfg).skipped.size() == 1);
  cfg.backends.experts = {"cpu_generic"};
  CHECK(choose_backends(mixed, cfg).skipped.empty());
}

TEST_CASE("configs/cpu-only.yaml runs on a CPU without AVX-512, and off x86-64") {
  ::setenv("STRATA_CPU_AVX512_PROBE", "off", 1);
  PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR)});
  ::unsetenv("STRATA_CPU_AVX512_PROBE");
  const RuntimeConfig cfg = load_runtime_config(fs::path(STRATA_SOURCE_DIR) / "configs" / "cpu-only.yaml");
  if (!STRATA_X86_PLUGINS) {
    // The x86 plugins are not even there: a name found nowhere stays an error (a typo must not pass).
    CHECK_THROWS_WITH_AS(choose_backends(reg, cfg), doctest::Contains("plugin 'cpu_avx512' was not found"),
                         Error);
    return;
  }
  const Backends b = choose_backends(reg, cfg);
  REQUIRE(!b.experts.empty());
  CHECK(b.experts.front()->name() == (reg.find("cpu_avx2") != nullptr ? "cpu_avx2" : "cpu_generic"));
  REQUIRE(!b.skipped.empty());
  CHECK(b.skipped.front().find("cpu_avx512") != std::string::npos);
}

TEST_CASE(
    "the vtable size check: a plugin from before the device slots is refused; CPU plugins leave them NULL") {
  PluginRegistry reg({fs::path(STRATA_TEST_OLD_PLUGIN_DIR)});
  const PluginRecord* old = record(reg, "old_vtable");
  REQUIRE(old != nullptr);
  CHECK(!old->usable);
  CHECK(old->reason.find("smaller than the " + std::to_string(STRATA_PLUGIN_VTABLE_MIN_SIZE)) !=
        std::string::npos);
  // Built before the appended `approximation`: loads, and counts as exact mode (the garbage past its end is
  // not read), so auto may choose it.
  const PluginRecord* pre = record(reg, "pre_approximation");
  REQUIRE(pre != nullptr);
  CHECK(pre->usable);
  CHECK(pre->approximation.empty());
  CHECK(reg.ranked(/*exact_only=*/true).size() == 1);
  // The CPU plugins carry the whole vtable with the device slots empty.
  const PluginRecord* g = record(build_registry(), "cpu_generic");
  REQUIRE(g != nullptr);
  CHECK(g->vtable->struct_size >= STRATA_PLUGIN_VTABLE_MIN_SIZE);
  auto cpu = build_registry().create(*g, 1);
  CHECK(!cpu->has_device_memory());
  CHECK(!cpu->has_async());
  Matrix m{WeightFormat::F32, 1, 1, nullptr, nullptr};
  CHECK_THROWS_WITH_AS(cpu->upload(m), doctest::Contains("device memory is not offered"), Error);
  CHECK_THROWS_WITH_AS(cpu->issue(nullptr, 0, 1, {}), doctest::Contains("not offered"), Error);
}
