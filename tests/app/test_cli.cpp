// The strata executable, run as a user would: plugins, generate, logits (the oracle interface), inspect,
// errors.
#include "strata/error.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {
std::string bin() {
  return std::string("'") + STRATA_BIN + "'";
}
std::string fixture(const char* n) {
  return "'" + (fixtures_dir() / n).string() + "'";
}
std::string ids_of(const std::vector<int32_t>& v) {
  std::string s;
  for (auto i : v) s += (s.empty() ? "" : ",") + std::to_string(i);
  return s;
}
}  // namespace

TEST_CASE("strata plugins lists the CPU plugins with scores and the choice") {
  std::string out;
  REQUIRE(run_command(bin() + " plugins", &out) == 0);
  CHECK(out.find("cpu_generic") != std::string::npos);
  CHECK(out.find("score    1") != std::string::npos);
  CHECK(out.find("chosen for dense") != std::string::npos);
  if (!STRATA_X86_PLUGINS) {  // (not built off x86-64: only cpu_generic and, maybe, cuda)
    CHECK(out.find("cpu_avx512") == std::string::npos);
    return;
  }
  CHECK(out.find("cpu_avx512") != std::string::npos);
  CHECK(out.find("cpu_avx2") != std::string::npos);
  REQUIRE(run_command("STRATA_CPU_AVX512_PROBE=off " + bin() + " plugins", &out) == 0);
  CHECK(out.find("rejected: score 0: AVX-512 probe forced off") != std::string::npos);
  // configs/cpu-only.yaml lists cpu_avx512 first: where it cannot run, the next listed one runs the experts.
  REQUIRE(run_command("STRATA_CPU_AVX512_PROBE=off " + bin() + " plugins --config " + STRATA_SOURCE_DIR +
                          "/configs/cpu-only.yaml",
                      &out) == 0);
  CHECK(out.find("backends.experts: skipped plugin 'cpu_avx512' was rejected") != std::string::npos);
  // cpu_vnni (int8 activations) is listed as not exact, never chosen by auto, and named with a warning when
  // configs/cpu-int8.yaml picks it; where it cannot run, that config falls back to the exact plugins (for
  // dense and for experts, saying so), with no warning.
  const std::string int8 = " plugins --config " + std::string(STRATA_SOURCE_DIR) + "/configs/cpu-int8.yaml";
  REQUIRE(run_command(bin() + " plugins", &out) == 0);
  CHECK(out.find("warning") == std::string::npos);
  if (build_registry().find("cpu_vnni") != nullptr) {  // (this CPU has AVX-512 VNNI)
    CHECK(out.find("available (not exact mode: chosen only when a config names it)") != std::string::npos);
    CHECK(out.find("not exact: int8 activations") != std::string::npos);
    REQUIRE(run_command(bin() + int8, &out) == 0);
    CHECK(
        out.find("warning: plugin cpu_vnni (chosen for dense + experts) is not exact mode (opt-in): int8") !=
        std::string::npos);
  }
  REQUIRE(run_command("STRATA_CPU_VNNI_PROBE=off " + bin() + int8, &out) == 0);
  CHECK(
      out.find("backends.experts: skipped plugin 'cpu_vnni' was rejected: score 0: AVX-512 VNNI probe forced "
               "off") != std::string::npos);
  CHECK(out.find("backends.dense: skipped plugin 'cpu_vnni'") != std::string::npos);
  CHECK(out.find("score  100  chosen for dense + experts") != std::string::npos);
  CHECK(out.find("warning") == std::string::npos);
}

TEST_CASE("strata generate prints transformers' greedy tokens; logits writes the oracle file") {
  const Expected ex = load_expected(fixtures_dir() / "qwen3_moe-tiny");
  std::string out;
  const int n_new = static_cast<int>(ex.sequence.size() - ex.prompt.size());
  REQUIRE(run_command(bin() + " generate --model " + fixture("qwen3_moe-tiny") + " --ids " +
                          ids_of(ex.prompt) + " --max-new " + std::to_string(n_new) + " --greedy --print-ids",
                      &out) == 0);
  std::string want;
  for (size_t i = ex.prompt.size(); i < ex.sequence.size(); ++i)
    want += (want.empty() ? "" : " ") + std::to_string(ex.sequence[i]);
  CHECK(out == want + "\n");

  TempDir tmp;
  const fs::path f = tmp.path() / "l.safetensors";
  REQUIRE(run_command(bin() + " logits --model " + fixture("qwen3_moe-tiny") + " --ids " +
                          ids_of(ex.sequence) + " --prefill 4 --out '" + f.string() + "'",
                      &out) == 0);
  SafetensorsFile r(f);
  const TensorInfo* t = r.find("logits");
  REQUIRE(t != nullptr);
  CHECK(t->dtype == DType::F32);
  CHECK(t->shape == std::vector<int64_t>{static_cast<int64_t>(ex.sequence.size()), ex.vocab});
  const float* got = reinterpret_cast<const float*>(r.data(*t));
  float dev = 0;
  for (size_t i = 0; i < ex.logits.size(); ++i) dev = std::max(dev, std::fabs(got[i] - ex.logits[i]));
  CHECK(dev <= 1e-3f);
}

TEST_CASE("strata inspect reports KV bytes, parameters and expert size") {
  std::string out;
  REQUIRE(run_command(bin() + " inspect --model " + fixture("deepseek_v3-tiny"), &out) == 0);
  CHECK(out.find("family:       deepseek_v3") != std::string::npos);
  CHECK(out.find("KV cache:     80 floats per token per layer") != std::string::npos);
  CHECK(out.find("expert size:  24576 parameters") != std::string::npos);
}

TEST_CASE("strata bench measures the bundled model: medians, identical greedy tokens, JSON") {
  std::string out;
  REQUIRE(run_command(bin() + " bench --prefill 8 --decode 4 --reps 2 --warmup 1", &out) == 0);
  CHECK(out.find("strata-nano (glm_moe_dsa, 4 layers)") != std::string::npos);
  CHECK(out.find("warm-up 1: TTFT") != std::string::npos);
  CHECK(out.find("rep 2: TTFT") != std::string::npos);
  CHECK(out.find("median: prefill") != std::string::npos);
  CHECK(out.find("greedy tokens identical in every repetition") != std::string::npos);
  CHECK(out.find("expert hits vram 0.0, ram 12.0") != std::string::npos);  // 3 MoE layers × top-4, from RAM
  REQUIRE(run_command(bin() + " bench --prefill 8 --decode 4 --reps 1 --warmup 0 --json --threads 1", &out) ==
          0);
  const auto j = nlohmann::json::parse(out);
  CHECK(j["prefill_tok_s"].get<double>() > 0);
  CHECK(j["decode_tok_s"].get<double>() > 0);
  CHECK(j["tokens_identical"].get<bool>());
  CHECK(j["threads"].get<int>() == 1);
  CHECK(j["decode_telemetry"]["hits"]["ram"].get<int>() == 4 * 12);
  CHECK(run_command(bin() + " bench --reps 0", &out) != 0);
  CHECK(out.find("--reps") != std::string::npos);
}

TEST_CASE("bad input gives a clear message and a non-zero exit") {
  std::string out;
  CHECK(run_command(bin() + " generate --model /nonexistent --ids 1,2", &out) == 1);
  CHECK(out.find("not a model directory") != std::string::npos);
  CHECK(run_command(bin() + " generate --model " + fixture("qwen3_moe-tiny") + " --ids 1,x,3", &out) == 1);
  CHECK(out.find("--ids: 'x' is not a token id") != std::string::npos);
  CHECK(run_command(bin() + " generate --model " + fixture("qwen3_moe-tiny") + " --ids 1,99999", &out) == 1);
  CHECK(out.find("outside the vocabulary") != std::string::npos);
  CHECK(run_command(
            bin() + " logits --model " + fixture("qwen3_moe-tiny") + " --ids 1,2 --prefill 5 --out /tmp/x",
            &out) == 1);
  CHECK(out.find("--prefill 5 exceeds") != std::string::npos);
  TempDir tmp;
  write_text(tmp.path() / "bad.yaml", "backends:\n  dense: cpu_generic\n  turbo: true\n");
  CHECK(run_command(bin() + " plugins --config '" + (tmp.path() / "bad.yaml").string() + "'", &out) == 1);
  CHECK(out.find("bad.yaml:3: unknown key 'backends.turbo'") != std::string::npos);
  write_text(tmp.path() / "cfg.yaml",
             "backends:\n  dense: cpu_generic\n  experts: [cpu_generic]\nscheduler:\n  threads: 1\n");
  CHECK(run_command(bin() + " generate --config '" + (tmp.path() / "cfg.yaml").string() + "' --model " +
                        fixture("qwen3_moe-tiny") + " --ids 1,2,3 --max-new 2",
                    &out) == 0);
  CHECK(out.find("dense=cpu_generic experts=cpu_generic") != std::string::npos);
  CHECK(run_command(bin() + " frobnicate", &out) != 0);
}
