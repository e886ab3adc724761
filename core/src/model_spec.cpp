// config.json → ModelSpec for the supported families, with strict field checks.
#include "strata/model_spec.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/json_text.hpp"

namespace strata {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr std::string_view kComp = "config.json";

struct Reader {
  std::string file;
  const json& j;

  [[noreturn]] void bad(const std::string& key, const std::string& expected) const {
    fail(kComp, "{}: field '{}' {}", file, key, expected);
  }
  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const std::string& key) const {
    if (!has(key)) bad(key, "is missing (expected an integer)");
    if (!j[key].is_number_integer()) bad(key, fmt::format("must be an integer, got {}", j[key].dump()));
    return j[key].get<int64_t>();
  }
  // Sizes are bounded so that no loop over them runs for hours and no product of three of them overflows
  // (2^24 is 64× the largest vocabulary and 1000× the widest layer of any model this engine targets).
  static constexpr int64_t kMaxSize = int64_t{1} << 24;
  int64_t positive(const std::string& key, int64_t max = kMaxSize) const {
    const int64_t v = integer(key);
    if (v <= 0 || v > max) bad(key, fmt::format("must be from 1 to {}, got {}", max, v));
    return v;
  }
  int64_t size_or(const std::string& key, int64_t def) const {  // 0 allowed (absent)
    const int64_t v = integer_or(key, def);
    if (v < 0 || v > kMaxSize) bad(key, fmt::format("must be from 0 to {}, got {}", kMaxSize, v));
    return v;
  }
  int64_t integer_or(const std::string& key, int64_t def) const { return has(key) ? integer(key) : def; }
  double number_or(const std::string& key, double def) const {
    if (!has(key)) return def;
    if (!j[key].is_number()) bad(key, fmt::format("must be a number, got {}", j[key].dump()));
    return j[key].get<double>();
  }
  bool boolean_or(const std::string& key, bool def) const {
    if (!has(key)) return def;
    if (!j[key].is_boolean()) bad(key, fmt::format("must be true or false, got {}", j[key].dump()));
    return j[key].get<bool>();
  }
  std::vector<std::string> strings_or(const std::string& key, size_t n, const std::string& def) const {
    if (!has(key)) return std::vector<std::string>(n, def);
    if (!j[key].is_array() || j[key].size() != n) bad(key, fmt::format("must be a list of {} strings", n));
    std::vector<std::string> out;
    for (const auto& e : j[key]) {
      if (!e.is_string()) bad(key, fmt::format("must be a list of {} strings", n));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
};

void parse_rope(const Reader& r, RopeSpec& rope) {
  // transformers 5 keeps rope settings in rope_parameters; older configs use rope_theta / rope_scaling.
  json params = json::object();
  if (r.has("rope_parameters")) {
    if (!r.j["rope_parameters"].is_object()) r.bad("rope_parameters", "must be an object");
    params = r.j["rope_parameters"];
  } else if (r.has("rope_scaling") && r.j["rope_scaling"].is_object()) {
    params = r.j["rope_scaling"];
  }
  Reader p{r.file + " rope_parameters", params};
  rope.theta = p.has("rope_theta") ? p.number_or("rope_theta", 10000.0) : r.number_or("rope_theta", 10000.0);
  if (p.has("rope_type") || p.has("type")) {
    const auto& t = p.has("rope_type") ? params["rope_type"] : params["type"];
    if (!t.is_string()) p.bad("rope_type", "must be a string");
    rope.type = t.get<std::string>();
  }
  if (rope.type != "default" && rope.type != "yarn") {
    fail(kComp, "{}: rope type '{}' is not supported (expected 'default' or 'yarn')", r.file, rope.type);
  }
  if (rope.type == "yarn") {
    rope.factor = p.number_or("factor", 1.0);
    rope.original_max_position =
        p.number_or("original_max_position_embeddings", r.number_or("max_position_embeddings", 4096));
    rope.beta_fast = p.number_or("beta_fast", 32.0);
    rope.beta_slow = p.number_or("beta_slow", 1.0);
    rope.mscale = p.number_or("mscale", 0.0);  // 0 = not given (changes the yarn attention factor rule)
    rope.mscale_all_dim = p.number_or("mscale_all_dim", 0.0);
    rope.attention_factor = p.number_or("attention_factor", 0.0);
  }
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::string family_name(Family f) {
  switch (f) {
    case Family::Qwen3Moe:
      return "qwen3_moe";
    case Family::DeepseekV3:
      return "deepseek_v3";
    case Family::Glm4Moe:
      return "glm4_moe";
    case Family::GlmMoeDsa:
      return "glm_moe_dsa";
  }
  return "?";
}

double ModelSpec::attention_scale() const {
  const int64_t qk_dim = attention == AttentionKind::MLA ? qk_nope_dim + qk_rope_dim : head_dim;
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_dim));
  if (attention == AttentionKind::MLA && rope.type == "yarn" && rope.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

int64_t ModelSpec::kv_floats_per_token_per_layer() const {
  if (attention == AttentionKind::MLA) return kv_lora_rank + qk_rope_dim;
  return 2 * n_kv_heads * head_dim;
}

ModelSpec load_model_spec(const fs::path& model_dir) {
  const fs::path file = model_dir / "config.json";
  if (!fs::exists(file))
    fail(kComp, "{}: missing — a model folder needs a Hugging Face config.json", file.string());
  json j = parse_json_file(file, kComp);
  if (!j.is_object()) fail(kComp, "{}: expected a JSON object", file.string());
  // Multimodal wrappers keep the language model in text_config.
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("hidden_size")) {
    json merged = j["text_config"];
    if (j.contains("model_type") && !merged.contains("model_type")) merged["model_type"] = j["model_type"];
    j = merged;
  }
  Reader r{file.string(), j};
  ModelSpec s;
  if (!r.has("model_type") || !j["model_type"].is_string())
    r.bad("model_type", "is missing (expected a string)");
  s.model_type = j["model_type"].get<std::string>();
  if (s.model_type == "qwen3_moe") {
    s.family = Family::Qwen3Moe;
  } else if (s.model_type == "deepseek_v3" || s.model_type == "kimi_k2") {
    s.family = Family::DeepseekV3;
  } else if (s.model_type == "glm4_moe") {
    s.family = Family::Glm4Moe;
  } else if (s.model_type == "glm_moe_dsa") {
    s.family = Family::GlmMoeDsa;
  } else {
    fail(kComp,
         "{}: model_type '{}' is not supported (expected qwen3_moe, deepseek_v3, glm4_moe or glm_moe_dsa)",
         file.string(), s.model_type);
  }
  s.vocab = r.positive("vocab_size");
  s.hidden = r.positive("hidden_size");
  s.n_layers = r.positive("num_hidden_layers", 4096);
  s.n_heads = r.positive("num_attention_heads");
  s.n_kv_heads = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : s.n_heads;
  if (s.n_heads % s.n_kv_heads != 0) {
    r.bad("num_key_value_heads",
          fmt::format("must divide num_attention_heads ({}), got {}", s.n_heads, s.n_kv_heads));
  }
  s.head_dim = r.has("head_dim") ? r.positive("head_dim") : s.hidden / s.n_heads;
  // Defaults of the transformers config classes: 1e-5 for the GLM families, 1e-6 otherwise.
  const bool glm = s.family == Family::Glm4Moe || s.family == Family::GlmMoeDsa;
  s.rms_eps = r.number_or("rms_norm_eps", glm ? 1e-5 : 1e-6);
  s.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  s.max_positions =
      r.has("max_position_embeddings") ? r.positive("max_position_embeddings", int64_t{1} << 31) : 4096;
  parse_rope(r, s.rope);
  s.intermediate = r.size_or("intermediate_size", 0);
  s.moe_intermediate = r.positive("moe_intermediate_size");
  s.top_k = r.positive("num_experts_per_tok");
  s.norm_topk_prob = r.boolean_or("norm_topk_prob", s.family != Family::Qwen3Moe);

  if (s.family == Family::Qwen3Moe) {
    s.attention = AttentionKind::GQA;
    s.qk_norm = true;
    s.attn_bias = r.boolean_or("attention_bias", false);
    s.n_experts = r.has("num_experts") ? r.positive("num_experts") : r.positive("num_local_experts");
    s.router = RouterKind::SoftmaxTopK;
    s.rope.rotary_dim = s.head_dim;
    const int64_t step = r.integer_or("decoder_sparse_step", 1);
    std::vector<int64_t> mlp_only;
    if (r.has("mlp_only_layers")) {
      if (!j["mlp_only_layers"].is_array()) r.bad("mlp_only_layers", "must be a list of layer indices");
      for (const auto& e : j["mlp_only_layers"]) {
        if (!e.is_number_integer()) r.bad("mlp_only_layers", "must be a list of layer indices");
        mlp_only.push_back(e.get<int64_t>());
      }
    }
    for (int64_t l = 0; l < s.n_layers; ++l) {
      const bool only = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
      s.moe_layer.push_back(!only && s.n_experts > 0 && step > 0 && (l + 1) % step == 0);
    }
  } else {
    s.n_experts = r.positive("n_routed_experts");
    s.n_shared_experts = r.size_or("n_shared_experts", 0);
    s.router = RouterKind::SigmoidGrouped;
    s.routed_scaling = r.number_or("routed_scaling_factor", s.family == Family::Glm4Moe ? 1.0 : 2.5);
    s.n_group = r.integer_or("n_group", 1);
    s.topk_group = r.integer_or("topk_group", 1);
    if (s.n_group <= 0 || s.n_experts % s.n_group != 0) {
      r.bad("n_group", fmt::format("must divide n_routed_experts ({})", s.n_experts));
    }
    if (s.topk_group <= 0 || s.topk_group > s.n_group) r.bad("topk_group", "must be in [1, n_group]");
    const int64_t first_dense = r.integer_or("first_k_dense_replace", s.family == Family::Glm4Moe ? 1 : 3);
    auto mlp_types = r.strings_or("mlp_layer_types", static_cast<size_t>(s.n_layers), "");
    for (int64_t l = 0; l < s.n_layers; ++l) {
      const std::string& t = mlp_types[static_cast<size_t>(l)];
      if (!t.empty() && t != "dense" && t != "sparse")
        r.bad("mlp_layer_types", "entries must be 'dense' or 'sparse'");
      s.moe_layer.push_back(t.empty() ? l >= first_dense : t == "sparse");
    }
    if (s.family == Family::Glm4Moe) {
      s.attention = AttentionKind::GQA;
      s.qk_norm = r.boolean_or("use_qk_norm", false);
      s.attn_bias = r.boolean_or("attention_bias", false);
      double partial = r.number_or("partial_rotary_factor", 0.5);
      if (r.has("rope_parameters") && j["rope_parameters"].is_object()) {
        const Reader p{r.file + " rope_parameters", j["rope_parameters"]};
        partial = p.number_or("partial_rotary_factor", partial);
      }
      if (!(partial > 0.0 && partial <= 1.0)) r.bad("partial_rotary_factor", "must be in (0, 1]");
      s.rope.rotary_dim = static_cast<int64_t>(static_cast<double>(s.head_dim) * partial);
    } else {
      s.attention = AttentionKind::MLA;
      s.q_lora_rank = r.size_or("q_lora_rank", 0);
      s.kv_lora_rank = r.positive("kv_lora_rank");
      s.qk_nope_dim = r.positive("qk_nope_head_dim");
      s.qk_rope_dim = r.positive("qk_rope_head_dim");
      s.v_head_dim = r.positive("v_head_dim");
      s.rope.rotary_dim = s.qk_rope_dim;
      // glm_moe_dsa has no switch: its MLA and indexer rope are always interleaved (transformers 5.17).
      s.rope.interleave = s.family == Family::GlmMoeDsa ? true : r.boolean_or("rope_interleave", true);
    }
    if (s.family == Family::GlmMoeDsa) {
      s.dsa = true;
      s.index_n_heads = r.positive("index_n_heads");
      s.index_head_dim = r.positive("index_head_dim");
      s.index_topk = r.positive("index_topk");
      auto types = r.strings_or("indexer_types", static_cast<size_t>(s.n_layers), "full");
      for (int64_t l = 0; l < s.n_layers; ++l) {
        const std::string& t = types[static_cast<size_t>(l)];
        if (t != "full" && t != "shared") r.bad("indexer_types", "entries must be 'full' or 'shared'");
        if (l == 0 && t == "shared")
          r.bad("indexer_types", "layer 0 cannot be 'shared' (no previous selection)");
        s.indexer_full.push_back(t == "full");
      }
    }
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!r.has(key) || !j[key].is_string()) continue;
    const std::string d = j[key].get<std::string>();
    s.checkpoint_dtype = d;
    if (d == "bfloat16") s.rope.freq_dtype = "bf16";
    if (d == "float16") s.rope.freq_dtype = "f16";
    break;
  }
  if (s.top_k > s.n_experts) r.bad("num_experts_per_tok", "must not exceed the number of experts");
  if (s.rope.rotary_dim % 2 != 0)
    fail(kComp, "{}: the rotary dimension {} must be even", file.string(), s.rope.rotary_dim);
  for (const char* key : {"eos_token_id"}) {
    if (!r.has(key)) continue;
    if (j[key].is_number_integer())
      s.eos_ids.push_back(j[key].get<int64_t>());
    else if (j[key].is_array()) {
      for (const auto& e : j[key]) {
        if (e.is_number_integer()) s.eos_ids.push_back(e.get<int64_t>());
      }
    }
  }
  s.bos_id = r.integer_or("bos_token_id", -1);
  return s;
}

}  // namespace strata
