// config.json parsing: family selection, defaults of each family, and errors naming the field.
#include "strata/error.hpp"
#include "strata/model_spec.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {
ModelSpec spec_of(const nlohmann::json& j) {
  TempDir tmp;
  write_text(tmp.path() / "config.json", j.dump());
  return load_model_spec(tmp.path());
}
nlohmann::json fixture_config(const char* name) {
  return nlohmann::json::parse(read_text(fixtures_dir() / name / "config.json"));
}
}  // namespace

TEST_CASE("fixture configs map to the right families and layer kinds") {
  const ModelSpec q = load_model_spec(fixtures_dir() / "qwen3_moe-tiny");
  CHECK(q.family == Family::Qwen3Moe);
  CHECK(q.n_experts == 16);  // spelled num_local_experts in this config
  CHECK(q.qk_norm);
  CHECK(q.rope.rotary_dim == q.head_dim);
  CHECK(q.rope.freq_dtype == "bf16");
  const ModelSpec d = load_model_spec(fixtures_dir() / "deepseek_v3-tiny");
  CHECK(d.attention == AttentionKind::MLA);
  CHECK(d.moe_layer == std::vector<bool>{false, true, true});
  CHECK(d.rope.interleave);
  CHECK(d.kv_floats_per_token_per_layer() == 64 + 16);
  const ModelSpec g = load_model_spec(fixtures_dir() / "glm_moe_dsa-tiny");
  CHECK(g.dsa);
  CHECK(g.index_topk == 6);
  CHECK(g.indexer_full == std::vector<bool>{true, true, true});
  const ModelSpec g4 = load_model_spec(fixtures_dir() / "glm4_moe-tiny");
  CHECK(g4.family == Family::Glm4Moe);
  CHECK(g4.rope.rotary_dim == g4.head_dim / 2);
  CHECK(g4.attn_bias);
  CHECK(load_model_spec(fixtures_dir() / "glm_moe_dsa-tiny-q4").rope.freq_dtype == "f32");
}

TEST_CASE("yarn softmax scale and qwen3 layer rules") {
  auto j = fixture_config("deepseek_v3-tiny");
  j["rope_parameters"] = {{"rope_type", "yarn"},   {"rope_theta", 10000.0},
                          {"factor", 40.0},        {"mscale", 1.0},
                          {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  const ModelSpec s = spec_of(j);
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(s.attention_scale() == doctest::Approx(m * m / std::sqrt(48.0)).epsilon(1e-12));
  auto q = fixture_config("qwen3_moe-tiny");
  q["mlp_only_layers"] = {1};
  q["decoder_sparse_step"] = 1;
  CHECK(spec_of(q).moe_layer == std::vector<bool>{true, false, true});
  q["mlp_only_layers"] = nlohmann::json::array();
  q["decoder_sparse_step"] = 2;
  CHECK(spec_of(q).moe_layer == std::vector<bool>{false, true, false});
}

TEST_CASE("bad config.json: errors name the field and what was expected") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(load_model_spec(tmp.path()), doctest::Contains("config.json: missing"), Error);
  write_text(tmp.path() / "config.json", "{ \"model_type\": ");
  CHECK_THROWS_WITH_AS(load_model_spec(tmp.path()), doctest::Contains("not valid JSON"), Error);
  auto j = fixture_config("qwen3_moe-tiny");
  j["model_type"] = "llama_moe_9000";
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("model_type 'llama_moe_9000' is not supported"), Error);
  j = fixture_config("qwen3_moe-tiny");
  j.erase("hidden_size");
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'hidden_size' is missing (expected an integer)"),
                       Error);
  j = fixture_config("qwen3_moe-tiny");
  j["num_attention_heads"] = "four";
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'num_attention_heads' must be an integer"),
                       Error);
  j = fixture_config("qwen3_moe-tiny");
  j["num_key_value_heads"] = 3;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("must divide num_attention_heads"), Error);
  j = fixture_config("deepseek_v3-tiny");
  j["n_group"] = 3;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'n_group' must divide n_routed_experts"), Error);
  j = fixture_config("glm_moe_dsa-tiny");
  j["indexer_types"] = {"full", "sometimes", "full"};
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("'full' or 'shared'"), Error);
  j = fixture_config("qwen3_moe-tiny");
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e6}};
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("rope type 'longrope' is not supported"), Error);
  // Sizes a downloaded config could carry to hang or overflow the loader (a 10^15-layer loop ran for hours).
  j = fixture_config("qwen3_moe-tiny");
  j["num_hidden_layers"] = 1000000000000000LL;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'num_hidden_layers' must be from 1 to 4096"),
                       Error);
  j = fixture_config("qwen3_moe-tiny");
  j["hidden_size"] = 1LL << 40;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'hidden_size' must be from 1 to 16777216"),
                       Error);
  j = fixture_config("qwen3_moe-tiny");
  j["intermediate_size"] = -5;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'intermediate_size' must be from 0 to"), Error);
  j = fixture_config("qwen3_moe-tiny");
  j["max_position_embeddings"] = 0;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'max_position_embeddings' must be from 1 to"),
                       Error);
  j = fixture_config("glm4_moe-tiny");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", "half"}};
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'partial_rotary_factor' must be a number"),
                       Error);
  write_text(tmp.path() / "config.json", R"({"model_type": "qwen3_moe", "hidden_size": )" +
                                             std::string(100000, '[') + std::string(100000, ']') + "}");
  CHECK_THROWS_WITH_AS(load_model_spec(tmp.path()),
                       doctest::Contains("config.json: arrays and objects nest deeper than 128 levels"),
                       Error);
  j["rope_parameters"]["partial_rotary_factor"] = 1e300;
  CHECK_THROWS_WITH_AS(spec_of(j), doctest::Contains("field 'partial_rotary_factor' must be in (0, 1]"),
                       Error);
}
