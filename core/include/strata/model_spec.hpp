// ModelSpec: the architecture of a checkpoint, read from its config.json (model_type selects the family).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace strata {

enum class Family { Qwen3Moe, DeepseekV3, Glm4Moe, GlmMoeDsa };
enum class AttentionKind { GQA, MLA };
enum class RouterKind {
  SoftmaxTopK,     // qwen3_moe: softmax over experts, top-k, optional renormalisation
  SigmoidGrouped,  // deepseek_v3 / glm: sigmoid + correction bias for choice, group-limited top-k
};

struct RopeSpec {
  std::string type = "default";  // default | yarn
  double theta = 10000.0;
  int64_t rotary_dim =
      0;  // dims of each head that rotate (head_dim × partial_rotary_factor, or qk_rope_head_dim)
  bool interleave = false;  // pairs (2i, 2i+1) instead of halves (i, i + d/2)
  // yarn
  double factor = 1.0;
  double original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;  // 0 = not given
  double mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // 0 = not given
  // Precision of the inverse frequencies. transformers keeps inv_freq as a float buffer that is cast with the
  // model: a model cast to its checkpoint dtype (config.json "dtype"/"torch_dtype", e.g. bfloat16) computes
  // rope with bf16-rounded frequencies, and the oracle fixtures were made that way. "f32" keeps them exact.
  std::string freq_dtype = "f32";  // f32 | bf16 | f16
};

struct ModelSpec {
  std::string model_type;
  Family family = Family::Qwen3Moe;
  int64_t vocab = 0, hidden = 0, n_layers = 0;
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  double rms_eps = 1e-6;
  bool tie_embeddings = false;
  int64_t max_positions = 0;

  AttentionKind attention = AttentionKind::GQA;
  bool qk_norm = false;    // per-head RMSNorm of q and k (qwen3_moe, glm4_moe with use_qk_norm)
  bool attn_bias = false;  // bias on q/k/v projections (glm4_moe)
  // MLA (deepseek_v3, glm_moe_dsa)
  int64_t q_lora_rank = 0;  // 0 = q_proj directly
  int64_t kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  RopeSpec rope;

  // Feed-forward
  int64_t intermediate = 0;      // dense MLP width
  int64_t moe_intermediate = 0;  // routed expert width
  int64_t n_experts = 0, top_k = 0, n_shared_experts = 0;
  RouterKind router = RouterKind::SoftmaxTopK;
  bool norm_topk_prob = false;
  double routed_scaling = 1.0;
  int64_t n_group = 1, topk_group = 1;
  std::vector<bool> moe_layer;  // per layer: routed experts (true) or a dense MLP

  // DSA lightning indexer (glm_moe_dsa)
  bool dsa = false;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  std::vector<bool>
      indexer_full;  // per layer: computes its own selection (true) or reuses the previous (false)

  std::string checkpoint_dtype;  // config.json "dtype" / "torch_dtype" ("" when absent)
  std::vector<int64_t> eos_ids;
  int64_t bos_id = -1;

  double attention_scale() const;  // softmax scale (includes the yarn mscale when applicable)
  int64_t kv_floats_per_token_per_layer() const;
};

// Parses <dir>/config.json. Errors name the file and the field, and what was expected.
ModelSpec load_model_spec(const std::filesystem::path& model_dir);
std::string family_name(Family f);

}  // namespace strata
