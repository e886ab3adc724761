// Model (weights of a checkpoint, laid out per layer for the families) and Session (one sequence: KV cache
// and the forward pass).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/backend.hpp"
#include "strata/expert_store.hpp"
#include "strata/model_spec.hpp"
#include "strata/quant.hpp"
#include "strata/registry.hpp"
#include "strata/safetensors.hpp"

namespace strata {

// Grouped-query attention (qwen3_moe, glm4_moe).
struct GqaWeights {
  Matrix q, k, v, o;
  std::vector<float> q_bias, k_bias, v_bias;  // empty when the family has none
  std::vector<float> q_norm, k_norm;          // per-head RMSNorm weights (empty when unused)
};

// The DSA lightning indexer of a glm_moe_dsa layer.
struct IndexerWeights {
  Matrix wq_b;                            // [index_heads * index_head_dim, q_lora_rank]
  Matrix wk;                              // [index_head_dim, hidden]
  std::vector<float> k_norm_w, k_norm_b;  // LayerNorm(index_head_dim), eps 1e-6
  std::vector<float> weights_proj;        // [index_heads, hidden], f32
};

// Multi-head latent attention (deepseek_v3, glm_moe_dsa), kept in the absorbed form: kv_b_proj is split per
// head into W_k^h (stored transposed, [kv_lora_rank, qk_nope]) and W_v^h ([v_head_dim, kv_lora_rank]), so
// attention runs on the cached latent and never expands K/V.
struct MlaWeights {
  Matrix q;    // q_proj [H * qk_head, hidden] when q_lora_rank == 0
  Matrix q_a;  // [q_lora_rank, hidden]
  std::vector<float> q_a_norm;
  Matrix q_b;   // [H * qk_head, q_lora_rank]
  Matrix kv_a;  // [kv_lora_rank + qk_rope, hidden]
  std::vector<float> kv_a_norm;
  std::vector<Matrix> k_absorb;  // per head [kv_lora_rank, qk_nope] (transposed slice of kv_b_proj)
  std::vector<Matrix> v_up;      // per head [v_head_dim, kv_lora_rank] (slice of kv_b_proj)
  Matrix o;                      // [hidden, H * v_head_dim]
  bool has_indexer = false;
  IndexerWeights indexer;
};

struct MoeWeights {
  std::vector<float> router;       // [E, hidden] f32
  std::vector<float> router_bias;  // e_score_correction_bias [E] (sigmoid routers)
  std::vector<ExpertMatrices> experts;
  bool has_shared = false;
  ExpertMatrices shared;  // n_shared_experts fused into one MLP, as the checkpoints store them
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm;
  GqaWeights gqa;
  MlaWeights mla;
  bool moe = false;
  ExpertMatrices dense_mlp;  // when !moe
  MoeWeights experts;        // when moe
};

struct LoadOptions {
  // Quantize float routed experts at load (Q4_ROW or Q4_G64); nullopt keeps them as stored. Experts already
  // stored as int4 (U8 + `.qs`, a strata or colibri container) are used as they are.
  std::optional<WeightFormat> expert_quant;
  // Called after each layer is bound (layers done, layers total), on the loading thread; may be empty.
  std::function<void(int64_t, int64_t)> progress;
  // Expert tiers (VRAM / RAM / cache / disk) planned from these budgets; nullopt = every routed expert is used
  // from the mapped checkpoint by the first chosen expert backend (no store, no routing statistics).
  std::optional<StoreOptions> store;
};

class Model {
 public:
  // Reads config.json and the safetensors of `dir`, checks every tensor's presence, dtype and shape, and
  // binds the backends that will run it. Tensors stay memory-mapped; only small ones are copied (to f32).
  // Weights may be F32/BF16/F16, or int4 (U8 [O, ceil(I/2)] with F32 scales under `<name>.qs`).
  static std::shared_ptr<Model> load(const std::filesystem::path& dir, Backends backends,
                                     const LoadOptions& options = {});

  const ModelSpec& spec() const { return spec_; }
  const Backends& backends() const { return backends_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const Matrix& embedding() const { return embed_; }
  const Matrix& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }

  struct ParamCounts {
    int64_t dense = 0;   // attention, norms, embeddings, lm_head, dense MLPs, shared experts, routers
    int64_t routed = 0;  // routed experts
    int64_t per_expert = 0;
    size_t routed_bytes = 0;
    size_t per_expert_bytes = 0;
    size_t dense_bytes = 0;  // the dense weights as bound (Matrix::bytes; f32 vectors 4 bytes a value)
  };
  ParamCounts param_counts() const;
  // The expert tiers, when LoadOptions::store asked for them (else nullptr). Its state (cache, statistics)
  // changes as forward passes run; it serializes them layer by layer.
  ExpertStore* expert_store() const { return store_.get(); }

 private:
  Model() = default;
  std::filesystem::path dir_;
  ModelSpec spec_;
  Backends backends_;
  std::unique_ptr<SafetensorsSet> st_;
  std::vector<std::vector<std::byte>> owned_;  // buffers made at load (transposed slices, realigned copies)
  std::vector<std::unique_ptr<QuantizedMatrix>> quantized_;  // experts quantized at load
  LoadOptions options_;
  Matrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  std::unique_ptr<ExpertStore> store_;  // after backends_ and st_: destroyed before them
  friend class ModelLoader;
};

// One sequence. Not thread-safe: one caller at a time; its forward pass is parallel inside (oneTBB).
class Session {
 public:
  // n_threads: 0 = all hardware threads. Results are bitwise independent of it.
  explicit Session(std::shared_ptr<const Model> model, int n_threads = 0);
  ~Session();

  // Feeds ids at positions n_past() .. n_past() + ids.size() - 1 (prefill when several, decode when one) and
  // returns logits: [ids.size(), vocab] when all_logits, else only the last position's [vocab].
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits);
  int64_t n_past() const { return n_past_; }
  void reset();
  size_t kv_bytes() const;

  // How a glm_moe_dsa session uses its DSA indexer. Set before the first forward (it is not switchable
  // mid-sequence). kSelectAll runs the indexer and the sparse key-gather path with every causal key selected;
  // kOff is plain dense MLA attention. The two must agree bit for bit (tested).
  enum class IndexerMode { kNormal, kSelectAll, kOff };
  void set_indexer_mode(IndexerMode m) { indexer_mode_ = m; }

  friend std::vector<std::vector<float>> forward_batch(std::span<Session* const> sessions,
                                                       std::span<const std::span<const int32_t>> ids,
                                                       bool all_logits);

 private:
  struct Impl;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Impl> impl_;
  int64_t n_past_ = 0;
  IndexerMode indexer_mode_ = IndexerMode::kNormal;
};

// Feeds ids[i] to sessions[i] for every i in ONE forward pass (decode of several sequences at once): the
// routed experts of all sequences are read once per layer. Every session's logits are bitwise those it would
// get alone. Sessions must share the model and be distinct. Returns per session what Session::forward would.
std::vector<std::vector<float>> forward_batch(std::span<Session* const> sessions,
                                              std::span<const std::span<const int32_t>> ids, bool all_logits);

// Greedy continuation: prefill `prompt` as one batch, then decode one token at a time; returns the new ids.
std::vector<int32_t> generate_greedy(Session& session, std::span<const int32_t> prompt, int64_t max_new);

}  // namespace strata
