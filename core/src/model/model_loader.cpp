// Model loading: binds every tensor of a checkpoint to the per-family layer layout, checking presence, dtype
// and shape, and prepares the absorbed MLA slices.
#include <cstring>

#include "strata/error.hpp"
#include "strata/model.hpp"

namespace strata {
namespace fs = std::filesystem;

namespace {
constexpr std::string_view kComp = "model";

std::string shape_str(std::initializer_list<int64_t> s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}
}  // namespace

class ModelLoader {
 public:
  explicit ModelLoader(Model& m) : m_(m) {}

  TensorRef tensor(const std::string& name, std::initializer_list<int64_t> shape) const {
    auto ref = m_.st_->find(name);
    if (!ref) {
      fail(kComp, "{}: missing tensor '{}' (expected shape {} for model_type {})", m_.dir_.string(), name,
           shape_str(shape), m_.spec_.model_type);
    }
    const auto& info = *ref->info;
    if (info.shape != std::vector<int64_t>(shape)) {
      fail(kComp, "{}: tensor '{}' has shape {}, expected {}", ref->file->path().string(), name,
           info.shape_str(), shape_str(shape));
    }
    return *ref;
  }

  // A pointer whose alignment the kernels may rely on: copies the bytes when the file placed them off their
  // element alignment (safetensors does not align tensors).
  const void* aligned(const std::byte* p, size_t bytes, size_t align) {
    if (reinterpret_cast<uintptr_t>(p) % align == 0) return p;
    m_.owned_.emplace_back(p, p + bytes);
    return m_.owned_.back().data();
  }

  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    auto ref = m_.st_->find(name);
    if (ref && ref->info->dtype == DType::U8) return q4_matrix(*ref, name, rows, cols);
    TensorRef t = tensor(name, {rows, cols});
    Matrix mat;
    switch (t.info->dtype) {
      case DType::F32:
        mat.format = WeightFormat::F32;
        break;
      case DType::BF16:
        mat.format = WeightFormat::BF16;
        break;
      case DType::F16:
        mat.format = WeightFormat::F16;
        break;
      default:
        fail(kComp,
             "{}: tensor '{}' has dtype {}, expected F32, BF16 or F16 (or U8 int4 with '{}.qs' scales)",
             t.file->path().string(), name, dtype_name(t.info->dtype), name);
    }
    mat.rows = rows;
    mat.cols = cols;
    mat.data = aligned(t.data(), t.info->nbytes, dtype_size(t.info->dtype));
    return mat;
  }

  // An int4 tensor: U8 [O, ceil(I/2)] plus F32 scales `<name>.qs` with O (Q4_ROW) or O·ceil(I/64) (Q4_G64)
  // values.
  Matrix q4_matrix(const TensorRef& ref, const std::string& name, int64_t rows, int64_t cols) {
    const std::string file = ref.file->path().string();
    if (ref.info->shape != std::vector<int64_t>{rows, q4_row_bytes(cols)}) {
      fail(kComp,
           "{}: int4 tensor '{}' has shape {}, expected [{}, {}] (packed nibbles of a [{}, {}] matrix)", file,
           name, ref.info->shape_str(), rows, q4_row_bytes(cols), rows, cols);
    }
    auto qs = m_.st_->find(name + ".qs");
    if (!qs) fail(kComp, "{}: int4 tensor '{}' has no scales tensor '{}.qs'", file, name, name);
    if (qs->info->dtype != DType::F32) {
      fail(kComp, "{}: scales '{}.qs' have dtype {}, expected F32", qs->file->path().string(), name,
           dtype_name(qs->info->dtype));
    }
    const int64_t n = qs->info->numel(), ng = q4_scales_per_row(WeightFormat::Q4_G64, cols);
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    if (n == rows * ng) {
      m.format = WeightFormat::Q4_G64;  // with I <= 64 the two formats are the same bytes
    } else if (n == rows) {
      m.format = WeightFormat::Q4_ROW;
    } else {
      fail(kComp, "{}: scales '{}.qs' hold {} values, expected {} (Q4_ROW) or {} (Q4_G64)",
           qs->file->path().string(), name, n, rows, rows * ng);
    }
    m.data = ref.data();
    m.scales = static_cast<const float*>(aligned(qs->data(), qs->info->nbytes, 4));
    return m;
  }

  // Routed experts may be quantized at load (LoadOptions::expert_quant).
  Matrix expert_matrix(const std::string& name, int64_t rows, int64_t cols) {
    Matrix m = matrix(name, rows, cols);
    const auto q = m_.options_.expert_quant;
    if (!q || m.format == WeightFormat::Q4_ROW || m.format == WeightFormat::Q4_G64) return m;
    std::vector<float> f(static_cast<size_t>(rows * cols));
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        const size_t k = static_cast<size_t>(o * cols + i);
        if (m.format == WeightFormat::F32) {
          f[k] = static_cast<const float*>(m.data)[k];
        } else {
          const uint16_t h = static_cast<const uint16_t*>(m.data)[k];
          f[k] = m.format == WeightFormat::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
      }
    }
    m_.quantized_.push_back(std::make_unique<QuantizedMatrix>(quantize_q4(f, rows, cols, *q)));
    return m_.quantized_.back()->view();
  }

  std::vector<float> vector_f32(const std::string& name, std::initializer_list<int64_t> shape) const {
    TensorRef ref = tensor(name, shape);
    const int64_t n = ref.info->numel();
    std::vector<float> out(static_cast<size_t>(n));
    const std::byte* p = ref.data();
    for (int64_t i = 0; i < n; ++i) {
      switch (ref.info->dtype) {
        case DType::F32:
          std::memcpy(&out[i], p + 4 * i, 4);
          break;
        case DType::BF16: {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[i] = bf16_to_f32(h);
          break;
        }
        case DType::F16: {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[i] = f16_to_f32(h);
          break;
        }
        default:
          fail(kComp, "{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", ref.file->path().string(),
               name, dtype_name(ref.info->dtype));
      }
    }
    return out;
  }

  bool has(const std::string& name) const { return m_.st_->find(name).has_value(); }

  ExpertMatrices mlp(const std::string& prefix, int64_t ffn, bool routed = false) {
    const int64_t h = m_.spec_.hidden;
    auto get = [&](const std::string& n, int64_t r, int64_t c) {
      return routed ? expert_matrix(n, r, c) : matrix(n, r, c);
    };
    return ExpertMatrices{get(prefix + ".gate_proj.weight", ffn, h), get(prefix + ".up_proj.weight", ffn, h),
                          get(prefix + ".down_proj.weight", h, ffn)};
  }

  // Rows [r0, r0 + n) of a matrix, as a view.
  static Matrix row_slice(const Matrix& m, int64_t r0, int64_t n) {
    Matrix s = m;
    const size_t elem = m.format == WeightFormat::F32 ? 4 : 2;
    s.data = static_cast<const std::byte*>(m.data) + static_cast<size_t>(r0 * m.cols) * elem;
    s.rows = n;
    return s;
  }

  // The transpose of rows [r0, r0 + n) of a float matrix, in the same element format (lossless).
  Matrix transposed_slice(const Matrix& m, int64_t r0, int64_t n) {
    const size_t elem = m.format == WeightFormat::F32 ? 4 : 2;
    std::vector<std::byte> buf(static_cast<size_t>(n * m.cols) * elem);
    const auto* src = static_cast<const std::byte*>(m.data);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < m.cols; ++c) {
        std::memcpy(buf.data() + static_cast<size_t>(c * n + r) * elem,
                    src + static_cast<size_t>((r0 + r) * m.cols + c) * elem, elem);
      }
    }
    m_.owned_.push_back(std::move(buf));
    Matrix t;
    t.format = m.format;
    t.rows = m.cols;
    t.cols = n;
    t.data = m_.owned_.back().data();
    return t;
  }

  void load_layer(int64_t l) {
    const ModelSpec& s = m_.spec_;
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& L = m_.layers_[static_cast<size_t>(l)];
    L.input_norm = vector_f32(p + "input_layernorm.weight", {s.hidden});
    L.post_norm = vector_f32(p + "post_attention_layernorm.weight", {s.hidden});
    if (s.attention == AttentionKind::GQA) {
      GqaWeights& a = L.gqa;
      const int64_t qd = s.n_heads * s.head_dim, kd = s.n_kv_heads * s.head_dim;
      a.q = matrix(p + "self_attn.q_proj.weight", qd, s.hidden);
      a.k = matrix(p + "self_attn.k_proj.weight", kd, s.hidden);
      a.v = matrix(p + "self_attn.v_proj.weight", kd, s.hidden);
      a.o = matrix(p + "self_attn.o_proj.weight", s.hidden, qd);
      if (s.attn_bias) {
        a.q_bias = vector_f32(p + "self_attn.q_proj.bias", {qd});
        a.k_bias = vector_f32(p + "self_attn.k_proj.bias", {kd});
        a.v_bias = vector_f32(p + "self_attn.v_proj.bias", {kd});
      }
      if (s.qk_norm) {
        a.q_norm = vector_f32(p + "self_attn.q_norm.weight", {s.head_dim});
        a.k_norm = vector_f32(p + "self_attn.k_norm.weight", {s.head_dim});
      }
    } else {
      MlaWeights& a = L.mla;
      const int64_t qk_head = s.qk_nope_dim + s.qk_rope_dim;
      if (s.q_lora_rank > 0) {
        a.q_a = matrix(p + "self_attn.q_a_proj.weight", s.q_lora_rank, s.hidden);
        a.q_a_norm = vector_f32(p + "self_attn.q_a_layernorm.weight", {s.q_lora_rank});
        a.q_b = matrix(p + "self_attn.q_b_proj.weight", s.n_heads * qk_head, s.q_lora_rank);
      } else {
        a.q = matrix(p + "self_attn.q_proj.weight", s.n_heads * qk_head, s.hidden);
      }
      a.kv_a = matrix(p + "self_attn.kv_a_proj_with_mqa.weight", s.kv_lora_rank + s.qk_rope_dim, s.hidden);
      a.kv_a_norm = vector_f32(p + "self_attn.kv_a_layernorm.weight", {s.kv_lora_rank});
      const int64_t per_head = s.qk_nope_dim + s.v_head_dim;
      const Matrix kv_b = matrix(p + "self_attn.kv_b_proj.weight", s.n_heads * per_head, s.kv_lora_rank);
      if (kv_b.scales != nullptr) {
        fail(kComp,
             "{}: '{}self_attn.kv_b_proj.weight' is int4; it must stay F32/BF16/F16 (it is split per head "
             "for absorbed attention)",
             m_.dir_.string(), p);
      }
      for (int64_t h = 0; h < s.n_heads; ++h) {
        a.k_absorb.push_back(transposed_slice(kv_b, h * per_head, s.qk_nope_dim));
        a.v_up.push_back(row_slice(kv_b, h * per_head + s.qk_nope_dim, s.v_head_dim));
      }
      a.o = matrix(p + "self_attn.o_proj.weight", s.hidden, s.n_heads * s.v_head_dim);
      if (s.dsa && s.indexer_full[static_cast<size_t>(l)]) {
        if (s.q_lora_rank <= 0) fail(kComp, "{}: glm_moe_dsa needs q_lora_rank > 0", m_.dir_.string());
        a.has_indexer = true;
        IndexerWeights& ix = a.indexer;
        const std::string ip = p + "self_attn.indexer.";
        ix.wq_b = matrix(ip + "wq_b.weight", s.index_n_heads * s.index_head_dim, s.q_lora_rank);
        ix.wk = matrix(ip + "wk.weight", s.index_head_dim, s.hidden);
        ix.k_norm_w = vector_f32(ip + "k_norm.weight", {s.index_head_dim});
        ix.k_norm_b = vector_f32(ip + "k_norm.bias", {s.index_head_dim});
        ix.weights_proj = vector_f32(ip + "weights_proj.weight", {s.index_n_heads, s.hidden});
      }
    }
    L.moe = s.moe_layer[static_cast<size_t>(l)];
    if (!L.moe) {
      if (s.intermediate <= 0)
        fail(kComp, "{}: layer {} is dense but intermediate_size is missing", m_.dir_.string(), l);
      L.dense_mlp = mlp(p + "mlp", s.intermediate);
      return;
    }
    MoeWeights& e = L.experts;
    e.router = vector_f32(p + "mlp.gate.weight", {s.n_experts, s.hidden});
    if (s.router == RouterKind::SigmoidGrouped) {
      e.router_bias = vector_f32(p + "mlp.gate.e_score_correction_bias", {s.n_experts});
    }
    e.experts.reserve(static_cast<size_t>(s.n_experts));
    for (int64_t x = 0; x < s.n_experts; ++x) {
      e.experts.push_back(mlp(fmt::format("{}mlp.experts.{}", p, x), s.moe_intermediate, true));
    }
    if (s.n_shared_experts > 0) {
      e.has_shared = true;
      e.shared = mlp(p + "mlp.shared_experts", s.moe_intermediate * s.n_shared_experts);
    }
  }

  void check_backends() const {
    auto check_dense = [&](const Matrix& m, const char* what) {
      if (!m_.backends_.dense->supports_matmul(m.format)) {
        fail("backends", "dense backend {} cannot run {} weights of {}", m_.backends_.dense->name(),
             weight_format_name(m.format), what);
      }
    };
    check_dense(m_.lm_head_, "lm_head");
    for (const auto& L : m_.layers_) {
      if (L.moe) {
        for (const auto& e : L.experts.experts) (void)m_.backends_.expert_backend_for(e.gate.format);
        if (L.experts.has_shared &&
            !m_.backends_.dense->supports_expert_group(L.experts.shared.gate.format)) {
          fail("backends", "dense backend {} cannot run the shared expert's {} weights",
               m_.backends_.dense->name(), weight_format_name(L.experts.shared.gate.format));
        }
      } else if (!m_.backends_.dense->supports_expert_group(L.dense_mlp.gate.format)) {
        fail("backends", "dense backend {} cannot run the dense MLP's {} weights", m_.backends_.dense->name(),
             weight_format_name(L.dense_mlp.gate.format));
      }
    }
  }

  void load() {
    const ModelSpec& s = m_.spec_;
    m_.embed_ = matrix("model.embed_tokens.weight", s.vocab, s.hidden);
    if (m_.embed_.scales != nullptr)
      fail(kComp, "{}: the embedding must be F32/BF16/F16, not int4", m_.dir_.string());
    if (s.tie_embeddings && !has("lm_head.weight")) {
      m_.lm_head_ = m_.embed_;
    } else {
      m_.lm_head_ = matrix("lm_head.weight", s.vocab, s.hidden);
    }
    m_.final_norm_ = vector_f32("model.norm.weight", {s.hidden});
    m_.layers_.resize(static_cast<size_t>(s.n_layers));
    for (int64_t l = 0; l < s.n_layers; ++l) {
      load_layer(l);
      if (m_.options_.progress) m_.options_.progress(l + 1, s.n_layers);
    }
    check_backends();
  }

 private:
  Model& m_;
};

std::shared_ptr<Model> Model::load(const fs::path& dir, Backends backends, const LoadOptions& options) {
  if (!fs::is_directory(dir)) fail(kComp, "{}: not a model directory", dir.string());
  std::shared_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->spec_ = load_model_spec(dir);
  m->backends_ = std::move(backends);
  m->options_ = options;
  m->st_ = std::make_unique<SafetensorsSet>(dir);
  ModelLoader(*m).load();
  if (options.store) m->store_ = std::make_unique<ExpertStore>(*m, *m->st_, *options.store);
  return m;
}

Model::ParamCounts Model::param_counts() const {
  ParamCounts c;
  // Dense parameters and their bytes: a matrix counts rows × cols and Matrix::bytes(), an f32 vector its size
  // and 4 bytes a value.
  auto n = [&](const Matrix& m) {
    c.dense_bytes += m.bytes();
    return m.rows * m.cols;
  };
  auto v = [&](size_t values) {
    c.dense_bytes += 4 * values;
    return static_cast<int64_t>(values);
  };
  auto mlp_n = [](const ExpertMatrices& e) {
    return e.gate.rows * e.gate.cols + e.up.rows * e.up.cols + e.down.rows * e.down.cols;
  };
  auto dense_mlp = [&](const ExpertMatrices& e) { return n(e.gate) + n(e.up) + n(e.down); };
  c.dense += n(embed_) + v(final_norm_.size());
  if (lm_head_.data != embed_.data) c.dense += n(lm_head_);
  for (const auto& L : layers_) {
    c.dense += v(L.input_norm.size() + L.post_norm.size());
    if (spec_.attention == AttentionKind::GQA) {
      const auto& a = L.gqa;
      c.dense += n(a.q) + n(a.k) + n(a.v) + n(a.o) +
                 v(a.q_bias.size() + a.k_bias.size() + a.v_bias.size() + a.q_norm.size() + a.k_norm.size());
    } else {
      const auto& a = L.mla;
      c.dense +=
          n(a.q) + n(a.q_a) + n(a.q_b) + n(a.kv_a) + n(a.o) + v(a.q_a_norm.size() + a.kv_a_norm.size());
      for (size_t h = 0; h < a.k_absorb.size(); ++h) c.dense += n(a.k_absorb[h]) + n(a.v_up[h]);
      if (a.has_indexer) {
        const auto& ix = a.indexer;
        c.dense +=
            n(ix.wq_b) + n(ix.wk) + v(ix.k_norm_w.size() + ix.k_norm_b.size() + ix.weights_proj.size());
      }
    }
    if (!L.moe) {
      c.dense += dense_mlp(L.dense_mlp);
      continue;
    }
    c.dense += v(L.experts.router.size() + L.experts.router_bias.size());
    if (L.experts.has_shared) c.dense += dense_mlp(L.experts.shared);
    for (const auto& e : L.experts.experts) {
      c.routed += mlp_n(e);
      c.per_expert = mlp_n(e);
      c.per_expert_bytes = e.gate.bytes() + e.up.bytes() + e.down.bytes();
      c.routed_bytes += c.per_expert_bytes;
    }
  }
  return c;
}

}  // namespace strata
