// Session: the forward pass of every family (GQA or absorbed MLA attention, optional DSA indexer, dense MLP
// or routed experts) over a per-sequence KV cache. Prefill and decode share every kernel and reduction order,
// so a position's logits are bitwise the same whichever way it was fed.
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "ops.hpp"
#include "strata/error.hpp"
#include "strata/model.hpp"

namespace strata {

namespace {
using Vec = std::vector<float>;

// Fixed eps of the MLA low-rank norms and of the indexer's LayerNorm (transformers builds them without the
// config's rms_norm_eps).
constexpr double kMlaNormEps = 1e-6;
constexpr float kIndexerNormEps = 1e-6f;

void to_f32_row(const Matrix& m, int64_t row, float* out) {
  const int64_t n = m.cols;
  switch (m.format) {
    case WeightFormat::F32:
      std::memcpy(out, static_cast<const float*>(m.data) + row * n, static_cast<size_t>(n) * 4);
      return;
    case WeightFormat::BF16: {
      const auto* p = static_cast<const uint16_t*>(m.data) + row * n;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case WeightFormat::F16: {
      const auto* p = static_cast<const uint16_t*>(m.data) + row * n;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("model", "embedding rows in {} are not supported", weight_format_name(m.format));
  }
}

struct LayerCache {
  Vec k, v;          // GQA: [pos, n_kv_heads * head_dim] each
  Vec latent, rope;  // MLA: [pos, kv_lora_rank] normed latent, [pos, qk_rope] roped key
  Vec index_k;       // DSA: [pos, index_head_dim]
};

// Selected key positions per query row (ascending). Empty vector = all causal keys.
using Selection = std::vector<std::vector<int32_t>>;

}  // namespace

// A session's MoE output rows (routed experts, then the shared expert), kept across layers and registered
// with the expert store's GPU tier, whose device then writes its rows here directly (no staging copy in the
// take: ~40 µs per decode layer on the H200). Page-aligned so registration pins nothing else. Only for
// passes of up to kMaxBytes of outputs (decode, short prompts): a long prompt's pass uses a transient buffer,
// so a session never keeps more than this pinned.
class MoeOutput {
 public:
  static constexpr size_t kMaxBytes = size_t{16} << 20;
  MoeOutput() = default;
  MoeOutput(const MoeOutput&) = delete;
  MoeOutput& operator=(const MoeOutput&) = delete;
  ~MoeOutput() { release(); }

  float* get(ExpertStore& store, size_t floats) {
    if (floats <= floats_ && &store == store_) return data_;
    const size_t want = std::min(std::max(floats, 2 * floats_), kMaxBytes / sizeof(float));
    release();
    const size_t bytes = (want * sizeof(float) + 4095) / 4096 * 4096;
    data_ = static_cast<float*>(std::aligned_alloc(4096, bytes));
    if (data_ == nullptr) fail("model", "out of memory allocating {} bytes for MoE outputs", bytes);
    floats_ = bytes / sizeof(float);
    store_ = &store;
    registered_ = store.register_output(data_, bytes);
    return data_;
  }

 private:
  void release() noexcept {
    if (registered_) store_->unregister_output(data_);
    std::free(data_);
    data_ = nullptr;
    floats_ = 0;
    registered_ = false;
  }
  ExpertStore* store_ = nullptr;
  float* data_ = nullptr;
  size_t floats_ = 0;
  bool registered_ = false;
};

struct Session::Impl {
  Impl(const Model& m, int threads)
      : model(m),
        spec(m.spec()),
        rope(m.spec().rope),
        arena(threads > 0 ? threads : tbb::task_arena::automatic) {
    caches.resize(static_cast<size_t>(spec.n_layers));
  }

  const Model& model;
  const ModelSpec& spec;
  ops::Rope rope;
  tbb::task_arena arena;
  std::vector<LayerCache> caches;
  mutable MoeOutput moe_out;
  Session::IndexerMode indexer_mode = Session::IndexerMode::kNormal;

  const Backend& dense() const { return *model.backends().dense; }

  void matmul(const Matrix& w, const Vec& x, int64_t rows, Vec& y) const {
    y.resize(static_cast<size_t>(rows * w.rows));
    dense().matmul(w, x.data(), rows, y.data());
  }

  void rope_tables(int64_t n_past, int64_t T, Vec& cos, Vec& sin) const {
    const int64_t half = rope.dim() / 2;
    cos.resize(static_cast<size_t>(T * half));
    sin.resize(static_cast<size_t>(T * half));
    for (int64_t t = 0; t < T; ++t) rope.angles(n_past + t, cos.data() + t * half, sin.data() + t * half);
  }

  // Runs the MLP `e` on every row of x through the backend's fused expert path.
  void mlp_all_rows(const Backend& b, const ExpertMatrices& e, const Vec& x, int64_t T, Vec& out) const {
    std::vector<int32_t> rows(static_cast<size_t>(T));
    std::iota(rows.begin(), rows.end(), 0);
    out.assign(static_cast<size_t>(T * spec.hidden), 0.0f);
    ExpertTask task{&e, rows, out.data()};
    b.expert_group(x.data(), T, spec.hidden, std::span<const ExpertTask>(&task, 1));
  }

  // ---- attention
  // -------------------------------------------------------------------------------------------

  void gqa(const LayerWeights& L, LayerCache& c, const Vec& h, int64_t n_past, int64_t T, Vec& out) const {
    const GqaWeights& a = L.gqa;
    const int64_t hd = spec.head_dim, nh = spec.n_heads, nkv = spec.n_kv_heads;
    const int64_t qd = nh * hd, kd = nkv * hd;
    Vec q, k, v;
    matmul(a.q, h, T, q);
    matmul(a.k, h, T, k);
    matmul(a.v, h, T, v);
    Vec cos, sin;
    rope_tables(n_past, T, cos, sin);
    const int64_t half = rope.dim() / 2;
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      float* qt = q.data() + t * qd;
      float* kt = k.data() + t * kd;
      float* vt = v.data() + t * kd;
      if (!a.q_bias.empty()) {
        for (int64_t i = 0; i < qd; ++i) qt[i] += a.q_bias[i];
        for (int64_t i = 0; i < kd; ++i) kt[i] += a.k_bias[i];
        for (int64_t i = 0; i < kd; ++i) vt[i] += a.v_bias[i];
      }
      for (int64_t hh = 0; hh < nh; ++hh) {
        float* x = qt + hh * hd;
        if (!a.q_norm.empty()) ops::rms_norm(x, a.q_norm.data(), hd, spec.rms_eps, x);
        ops::rope_half(x, rope.dim(), cos.data() + t * half, sin.data() + t * half);
      }
      for (int64_t hh = 0; hh < nkv; ++hh) {
        float* x = kt + hh * hd;
        if (!a.k_norm.empty()) ops::rms_norm(x, a.k_norm.data(), hd, spec.rms_eps, x);
        ops::rope_half(x, rope.dim(), cos.data() + t * half, sin.data() + t * half);
      }
    });
    c.k.insert(c.k.end(), k.begin(), k.end());
    c.v.insert(c.v.end(), v.begin(), v.end());
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    const int64_t group = nh / nkv;
    Vec attn(static_cast<size_t>(T * qd));
    tbb::parallel_for(int64_t{0}, T * nh, [&](int64_t th) {
      const int64_t t = th / nh, hh = th % nh, kvh = hh / group;
      const int64_t n_keys = n_past + t + 1;
      const float* qv = q.data() + t * qd + hh * hd;
      Vec p(static_cast<size_t>(n_keys));
      for (int64_t j = 0; j < n_keys; ++j) p[j] = ops::dot(qv, c.k.data() + j * kd + kvh * hd, hd) * scale;
      ops::softmax(p.data(), n_keys);
      float* o = attn.data() + t * qd + hh * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vj = c.v.data() + j * kd + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += p[j] * vj[d];
      }
    });
    matmul(a.o, attn, T, out);
  }

  // DSA lightning indexer: fills sel[t] with the index_topk highest-scoring causal keys of query t
  // (ascending), or leaves it empty when every causal key is selected.
  void indexer(const IndexerWeights& ix, LayerCache& c, const Vec& h, const Vec& q_resid, const Vec& cos,
               const Vec& sin, int64_t n_past, int64_t T, Selection& sel) const {
    const int64_t nih = spec.index_n_heads, dih = spec.index_head_dim, R = rope.dim(), half = R / 2;
    Vec q, k;
    matmul(ix.wq_b, q_resid, T, q);
    matmul(ix.wk, h, T, k);
    Vec w(static_cast<size_t>(T * nih));
    const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nih)));
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      Vec scratch(static_cast<size_t>(R));
      for (int64_t hh = 0; hh < nih; ++hh) {
        ops::rope_interleave(q.data() + (t * nih + hh) * dih, R, cos.data() + t * half, sin.data() + t * half,
                             scratch.data());
      }
      float* kt = k.data() + t * dih;
      ops::layer_norm(kt, ix.k_norm_w.data(), ix.k_norm_b.data(), dih, kIndexerNormEps, kt);
      ops::rope_interleave(kt, R, cos.data() + t * half, sin.data() + t * half, scratch.data());
      for (int64_t hh = 0; hh < nih; ++hh) {
        w[t * nih + hh] =
            ops::dot(ix.weights_proj.data() + hh * spec.hidden, h.data() + t * spec.hidden, spec.hidden) *
            head_scale;
      }
    });
    c.index_k.insert(c.index_k.end(), k.begin(), k.end());
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dih)));
    sel.assign(static_cast<size_t>(T), {});
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      const int64_t n_keys = n_past + t + 1;
      if (indexer_mode == Session::IndexerMode::kSelectAll) {
        sel[t].resize(static_cast<size_t>(n_keys));
        std::iota(sel[t].begin(), sel[t].end(), 0);
        return;
      }
      if (n_keys <= spec.index_topk) return;  // every causal key is selected
      Vec score(static_cast<size_t>(n_keys));
      for (int64_t j = 0; j < n_keys; ++j) {
        float s = 0;
        for (int64_t hh = 0; hh < nih; ++hh) {
          const float d = ops::dot(q.data() + (t * nih + hh) * dih, c.index_k.data() + j * dih, dih) * scale;
          s += w[t * nih + hh] * std::max(d, 0.0f);
        }
        score[j] = s;
      }
      std::vector<int32_t> idx(static_cast<size_t>(n_keys));
      std::iota(idx.begin(), idx.end(), 0);
      // Highest scores first; equal scores keep the lower position.
      std::partial_sort(idx.begin(), idx.begin() + spec.index_topk, idx.end(), [&](int32_t a, int32_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a < b;
      });
      idx.resize(static_cast<size_t>(spec.index_topk));
      std::sort(idx.begin(), idx.end());
      sel[t] = std::move(idx);
    });
  }

  void mla(const LayerWeights& L, LayerCache& c, const Vec& h, int64_t n_past, int64_t T, Selection& sel,
           bool reuse_selection, Vec& out) const {
    const MlaWeights& a = L.mla;
    const int64_t nh = spec.n_heads, nope = spec.qk_nope_dim, R = spec.qk_rope_dim, r = spec.kv_lora_rank;
    const int64_t qk_head = nope + R, half = R / 2;
    Vec q, q_resid;
    if (spec.q_lora_rank > 0) {
      Vec qa;
      matmul(a.q_a, h, T, qa);
      q_resid.resize(qa.size());
      for (int64_t t = 0; t < T; ++t) {
        ops::rms_norm(qa.data() + t * spec.q_lora_rank, a.q_a_norm.data(), spec.q_lora_rank, kMlaNormEps,
                      q_resid.data() + t * spec.q_lora_rank);
      }
      matmul(a.q_b, q_resid, T, q);
    } else {
      matmul(a.q, h, T, q);
    }
    Vec kva;
    matmul(a.kv_a, h, T, kva);
    Vec cos, sin;
    rope_tables(n_past, T, cos, sin);
    Vec latent(static_cast<size_t>(T * r)), krope(static_cast<size_t>(T * R));
    // q_nope per head gathered as [nh][T, nope] for the absorption matmuls; q_rope roped in place.
    std::vector<Vec> q_nope(static_cast<size_t>(nh), Vec(static_cast<size_t>(T * nope)));
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      Vec scratch(static_cast<size_t>(R));
      const float* kv_t = kva.data() + t * (r + R);
      ops::rms_norm(kv_t, a.kv_a_norm.data(), r, kMlaNormEps, latent.data() + t * r);
      float* kr = krope.data() + t * R;
      std::copy(kv_t + r, kv_t + r + R, kr);
      const float* ct = cos.data() + t * half;
      const float* st = sin.data() + t * half;
      auto apply = [&](float* x) {
        if (spec.rope.interleave)
          ops::rope_interleave(x, R, ct, st, scratch.data());
        else
          ops::rope_half(x, R, ct, st);
      };
      apply(kr);
      for (int64_t hh = 0; hh < nh; ++hh) {
        float* qh = q.data() + t * nh * qk_head + hh * qk_head;
        std::copy(qh, qh + nope, q_nope[hh].data() + t * nope);
        apply(qh + nope);
      }
    });
    c.latent.insert(c.latent.end(), latent.begin(), latent.end());
    c.rope.insert(c.rope.end(), krope.begin(), krope.end());

    if (L.mla.has_indexer && indexer_mode != Session::IndexerMode::kOff) {
      indexer(a.indexer, c, h, q_resid, cos, sin, n_past, T, sel);
    } else if (!reuse_selection || indexer_mode == Session::IndexerMode::kOff) {
      sel.assign(static_cast<size_t>(T), {});
    }

    // Absorb W_k into the query: q_abs[h] = W_k^h^T · q_nope[h]  ([T, r] per head).
    std::vector<Vec> q_abs(static_cast<size_t>(nh));
    for (int64_t hh = 0; hh < nh; ++hh) matmul(a.k_absorb[hh], q_nope[hh], T, q_abs[hh]);

    const float scale = static_cast<float>(spec.attention_scale());
    std::vector<Vec> ctx(static_cast<size_t>(nh), Vec(static_cast<size_t>(T * r)));
    tbb::parallel_for(int64_t{0}, T * nh, [&](int64_t th) {
      const int64_t t = th / nh, hh = th % nh;
      const int64_t n_causal = n_past + t + 1;
      const std::vector<int32_t>& chosen = sel[t];
      const int64_t n_keys = chosen.empty() ? n_causal : static_cast<int64_t>(chosen.size());
      const float* qa = q_abs[hh].data() + t * r;
      const float* qr = q.data() + t * nh * qk_head + hh * qk_head + nope;
      Vec p(static_cast<size_t>(n_keys));
      for (int64_t i = 0; i < n_keys; ++i) {
        const int64_t j = chosen.empty() ? i : chosen[i];
        const float s_nope = ops::dot(qa, c.latent.data() + j * r, r);
        const float s_rope = ops::dot(qr, c.rope.data() + j * R, R);
        p[i] = (s_nope + s_rope) * scale;
      }
      ops::softmax(p.data(), n_keys);
      float* o = ctx[hh].data() + t * r;
      std::fill(o, o + r, 0.0f);
      for (int64_t i = 0; i < n_keys; ++i) {
        const int64_t j = chosen.empty() ? i : chosen[i];
        const float* cj = c.latent.data() + j * r;
        for (int64_t d = 0; d < r; ++d) o[d] += p[i] * cj[d];
      }
    });
    // Per head: value = W_v^h · ctx, written into [T, nh * v_head].
    const int64_t vd = spec.v_head_dim;
    Vec attn(static_cast<size_t>(T * nh * vd));
    Vec vh;
    for (int64_t hh = 0; hh < nh; ++hh) {
      matmul(a.v_up[hh], ctx[hh], T, vh);
      for (int64_t t = 0; t < T; ++t) std::copy_n(vh.data() + t * vd, vd, attn.data() + (t * nh + hh) * vd);
    }
    matmul(a.o, attn, T, out);
  }

  // ---- feed-forward
  // ----------------------------------------------------------------------------------------

  struct Route {
    std::vector<int32_t> expert;  // [T, k]
    std::vector<float> weight;    // [T, k]
  };

  Route route(const MoeWeights& m, const Vec& h, int64_t T) const {
    const int64_t E = spec.n_experts, K = spec.top_k, H = spec.hidden;
    Route rt;
    rt.expert.resize(static_cast<size_t>(T * K));
    rt.weight.resize(static_cast<size_t>(T * K));
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      Vec logits(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) logits[e] = ops::dot(m.router.data() + e * H, h.data() + t * H, H);
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      int32_t* ex = rt.expert.data() + t * K;
      float* wt = rt.weight.data() + t * K;
      if (spec.router == RouterKind::SoftmaxTopK) {
        ops::softmax(logits.data(), E);
        std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
          return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
        });
        float sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          ex[k] = order[k];
          wt[k] = logits[order[k]];
          sum += wt[k];
        }
        if (spec.norm_topk_prob) {
          for (int64_t k = 0; k < K; ++k) wt[k] /= sum;
        }
        return;
      }
      // Sigmoid router with correction bias for the choice and group-limited top-k.
      Vec score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        score[e] = ops::sigmoid(logits[e]);
        choice[e] = score[e] + m.router_bias[e];
      }
      const int64_t G = spec.n_group, per = E / G;
      std::vector<bool> allowed(static_cast<size_t>(E), true);
      if (G > 1) {
        Vec gscore(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) {
          float b1 = -INFINITY, b2 = -INFINITY;
          for (int64_t e = g * per; e < (g + 1) * per; ++e) {
            if (choice[e] > b1) {
              b2 = b1;
              b1 = choice[e];
            } else if (choice[e] > b2) {
              b2 = choice[e];
            }
          }
          gscore[g] = per >= 2 ? b1 + b2 : b1;
        }
        std::vector<int32_t> gorder(static_cast<size_t>(G));
        std::iota(gorder.begin(), gorder.end(), 0);
        std::partial_sort(
            gorder.begin(), gorder.begin() + spec.topk_group, gorder.end(),
            [&](int32_t a, int32_t b) { return gscore[a] != gscore[b] ? gscore[a] > gscore[b] : a < b; });
        std::vector<bool> gkeep(static_cast<size_t>(G), false);
        for (int64_t i = 0; i < spec.topk_group; ++i) gkeep[gorder[i]] = true;
        for (int64_t e = 0; e < E; ++e) allowed[e] = gkeep[e / per];
      }
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
        if (allowed[a] != allowed[b]) return static_cast<bool>(allowed[a]);
        return choice[a] != choice[b] ? choice[a] > choice[b] : a < b;
      });
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        ex[k] = order[k];
        wt[k] = score[order[k]];
        sum += wt[k];
      }
      const float scaling = static_cast<float>(spec.routed_scaling);
      for (int64_t k = 0; k < K; ++k) {
        if (spec.norm_topk_prob) wt[k] /= (sum + 1e-20f);
        wt[k] *= scaling;
      }
    });
    return rt;
  }

  void moe(int64_t layer, const LayerWeights& L, const Vec& h, int64_t T, Vec& out) const {
    const MoeWeights& m = L.experts;
    const int64_t K = spec.top_k, H = spec.hidden, E = spec.n_experts;
    const Route rt = route(m, h, T);
    // Rows per expert in token order; slot_row[t*K + k] = the row of out_buf holding that (token, slot)
    // result.
    std::vector<std::vector<int32_t>> rows(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) rows[rt.expert[t * K + k]].push_back(static_cast<int32_t>(t));
    }
    std::vector<int64_t> base(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) base[e + 1] = base[e] + static_cast<int64_t>(rows[e].size());
    // The routed rows (every one written by its expert), then with the tiers the shared expert's on the GPU.
    Vec local;
    float* buf = nullptr;
    Vec shared;
    const float* shared_rows = nullptr;
    auto run_shared = [&] {
      if (!m.has_shared) return;
      mlp_all_rows(dense(), m.shared, h, T, shared);
      shared_rows = shared.data();
    };
    if (ExpertStore* store = model.expert_store()) {
      // The tiers: GPU groups, CPU rows and disk reads at the same time, the shared expert alongside.
      const size_t floats = static_cast<size_t>((base[E] + T) * H);
      if (floats * sizeof(float) <= MoeOutput::kMaxBytes) {
        buf = moe_out.get(*store, floats);
      } else {
        local.resize(floats);
        buf = local.data();
      }
      std::vector<ExpertStore::Work> work;
      for (int64_t e = 0; e < E; ++e) {
        if (rows[e].empty()) continue;
        work.push_back({static_cast<int32_t>(e), rows[e], buf + base[e] * H});
      }
      if (m.has_shared && store->shared_on_gpu(layer)) {
        float* gpu_shared = buf + base[E] * H;
        store->run_layer(layer, h.data(), T, work, {}, gpu_shared);
        shared_rows = gpu_shared;
      } else {
        store->run_layer(layer, h.data(), T, work, run_shared);
      }
    } else {
      local.resize(static_cast<size_t>(base[E] * H));
      buf = local.data();
      std::vector<ExpertTask> tasks;
      for (int64_t e = 0; e < E; ++e) {
        if (rows[e].empty()) continue;
        tasks.push_back(ExpertTask{&m.experts[e], rows[e], buf + base[e] * H});
      }
      // All routed experts of a layer share one format; the first chosen backend that runs it takes the group.
      const Backend& b = model.backends().expert_backend_for(m.experts[0].gate.format);
      b.expert_group(h.data(), T, H, tasks);
      run_shared();
    }
    // Combine in routing-slot order (DESIGN §6): deterministic whatever finished first.
    std::vector<int64_t> cursor(base.begin(), base.end() - 1);
    std::vector<int64_t> slot_row(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) slot_row[t * K + k] = cursor[rt.expert[t * K + k]]++;
    }
    out.assign(static_cast<size_t>(T * H), 0.0f);
    tbb::parallel_for(int64_t{0}, T, [&](int64_t t) {
      float* o = out.data() + t * H;
      for (int64_t k = 0; k < K; ++k) {
        const float w = rt.weight[t * K + k];
        const float* y = buf + slot_row[t * K + k] * H;
        for (int64_t i = 0; i < H; ++i) o[i] += w * y[i];
      }
    });
    if (shared_rows != nullptr) {
      for (size_t i = 0; i < out.size(); ++i) out[i] += shared_rows[i];
    }
  }

  void truncate(int64_t n) {
    auto cut = [n](Vec& v, int64_t per) {
      if (static_cast<int64_t>(v.size()) > n * per) v.resize(static_cast<size_t>(n * per));
    };
    for (auto& c : caches) {
      cut(c.k, spec.n_kv_heads * spec.head_dim);
      cut(c.v, spec.n_kv_heads * spec.head_dim);
      cut(c.latent, spec.kv_lora_rank);
      cut(c.rope, spec.qk_rope_dim);
      cut(c.index_k, spec.index_head_dim);
    }
  }

  // ---- the whole pass
  // --------------------------------------------------------------------------------------

  // One sequence's share of a forward pass: its ids, where they start, and (DSA) its key selection, which a
  // "shared" indexer layer reuses from the layer before.
  struct Segment {
    Impl* impl;
    std::span<const int32_t> ids;
    int64_t n_past;
    int64_t row0;  // first row of this segment in the stacked activations
    Selection sel;
  };

  // The forward pass over several sequences at once: attention per sequence (each with its own cache), every
  // other op on the stacked rows, so the experts of all sequences are read once per layer (batch union). Each
  // row's result is bitwise the same as running its sequence alone (per-row kernels, per-row combine order).
  // Returns per segment its logits: all rows when all_logits, else the last row.
  std::vector<Vec> forward(std::vector<Segment>& segs, bool all_logits) const {
    const int64_t H = spec.hidden;
    int64_t T = 0;
    for (auto& sg : segs) {
      sg.row0 = T;
      T += static_cast<int64_t>(sg.ids.size());
    }
    Vec x(static_cast<size_t>(T * H));
    for (const auto& sg : segs) {
      for (size_t t = 0; t < sg.ids.size(); ++t) {
        if (sg.ids[t] < 0 || sg.ids[t] >= spec.vocab) {
          fail("session", "token id {} at input position {} is outside the vocabulary [0, {})", sg.ids[t], t,
               spec.vocab);
        }
        to_f32_row(model.embedding(), sg.ids[t], x.data() + (sg.row0 + static_cast<int64_t>(t)) * H);
      }
    }
    Vec h(x.size()), y(x.size()), part_in, part_out;
    auto norm_rows = [&](const Vec& in, const std::vector<float>& w, Vec& o, int64_t rows) {
      tbb::parallel_for(int64_t{0}, rows, [&](int64_t t) {
        ops::rms_norm(in.data() + t * H, w.data(), H, spec.rms_eps, o.data() + t * H);
      });
    };
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      const LayerWeights& L = model.layers()[static_cast<size_t>(l)];
      norm_rows(x, L.input_norm, h, T);
      for (auto& sg : segs) {
        const auto n = static_cast<int64_t>(sg.ids.size());
        LayerCache& c = sg.impl->caches[static_cast<size_t>(l)];
        part_in.assign(h.begin() + sg.row0 * H, h.begin() + (sg.row0 + n) * H);
        if (spec.attention == AttentionKind::GQA) {
          sg.impl->gqa(L, c, part_in, sg.n_past, n, part_out);
        } else {
          const bool reuse = spec.dsa && !L.mla.has_indexer;
          sg.impl->mla(L, c, part_in, sg.n_past, n, sg.sel, reuse, part_out);
        }
        std::copy(part_out.begin(), part_out.end(), y.begin() + sg.row0 * H);
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
      norm_rows(x, L.post_norm, h, T);
      if (L.moe) {
        moe(l, L, h, T, y);
      } else {
        mlp_all_rows(dense(), L.dense_mlp, h, T, y);
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
    // Final norm and lm_head on the rows whose logits are wanted, all segments in one matmul.
    std::vector<int64_t> rows;
    for (const auto& sg : segs) {
      const auto n = static_cast<int64_t>(sg.ids.size());
      for (int64_t t = all_logits ? 0 : n - 1; t < n; ++t) rows.push_back(sg.row0 + t);
    }
    Vec last(rows.size() * static_cast<size_t>(H));
    for (size_t r = 0; r < rows.size(); ++r) {
      ops::rms_norm(x.data() + rows[r] * H, model.final_norm().data(), H, spec.rms_eps, last.data() + r * H);
    }
    Vec logits;
    matmul(model.lm_head(), last, static_cast<int64_t>(rows.size()), logits);
    std::vector<Vec> out;
    size_t r = 0;
    const auto V = static_cast<size_t>(spec.vocab);
    for (const auto& sg : segs) {
      const size_t n = all_logits ? sg.ids.size() : 1;
      out.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(r * V),
                       logits.begin() + static_cast<std::ptrdiff_t>((r + n) * V));
      r += n;
    }
    return out;
  }
};

Session::Session(std::shared_ptr<const Model> model, int n_threads)
    : model_(std::move(model)), impl_(std::make_unique<Impl>(*model_, n_threads)) {}

Session::~Session() = default;

void Session::reset() {
  impl_->caches.assign(impl_->caches.size(), {});
  n_past_ = 0;
}

size_t Session::kv_bytes() const {
  size_t n = 0;
  for (const auto& c : impl_->caches)
    n += (c.k.size() + c.v.size() + c.latent.size() + c.rope.size() + c.index_k.size());
  return n * sizeof(float);
}

std::vector<float> Session::forward(std::span<const int32_t> ids, bool all_logits) {
  if (ids.empty()) fail("session", "forward needs at least one token");
  impl_->indexer_mode = indexer_mode_;
  std::vector<Impl::Segment> segs{{impl_.get(), ids, n_past_, 0, {}}};
  std::vector<std::vector<float>> out;
  try {
    impl_->arena.execute([&] { out = impl_->forward(segs, all_logits); });
  } catch (...) {
    impl_->truncate(n_past_);  // a failed pass leaves the cache as it was before it
    throw;
  }
  n_past_ += static_cast<int64_t>(ids.size());
  return std::move(out.front());
}

std::vector<std::vector<float>> forward_batch(std::span<Session* const> sessions,
                                              std::span<const std::span<const int32_t>> ids,
                                              bool all_logits) {
  if (sessions.empty()) return {};
  if (sessions.size() != ids.size())
    fail("session", "forward_batch: {} sessions but {} id lists", sessions.size(), ids.size());
  const Model* model = sessions[0]->model_.get();
  std::vector<Session::Impl::Segment> segs;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (sessions[i]->model_.get() != model) fail("session", "forward_batch: sessions of different models");
    if (ids[i].empty()) fail("session", "forward_batch: session {} has no tokens", i);
    for (size_t j = 0; j < i; ++j) {
      if (sessions[j] == sessions[i]) fail("session", "forward_batch: session {} appears twice", i);
    }
    sessions[i]->impl_->indexer_mode = sessions[i]->indexer_mode_;
    segs.push_back({sessions[i]->impl_.get(), ids[i], sessions[i]->n_past_, 0, {}});
  }
  std::vector<std::vector<float>> out;
  try {
    sessions[0]->impl_->arena.execute([&] { out = sessions[0]->impl_->forward(segs, all_logits); });
  } catch (...) {
    for (auto* s : sessions) s->impl_->truncate(s->n_past_);
    throw;
  }
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->n_past_ += static_cast<int64_t>(ids[i].size());
  return out;
}

std::vector<int32_t> generate_greedy(Session& session, std::span<const int32_t> prompt, int64_t max_new) {
  std::vector<int32_t> out;
  if (max_new <= 0) return out;
  std::vector<float> logits = session.forward(prompt, false);
  for (int64_t i = 0; i < max_new; ++i) {
    // First maximum wins, as torch.argmax.
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 == max_new) break;
    logits = session.forward(std::span<const int32_t>(&out.back(), 1), false);
  }
  return out;
}

}  // namespace strata
