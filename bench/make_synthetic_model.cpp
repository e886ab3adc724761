// make_synthetic_model: writes a strata Q4_G64 container of a glm_moe_dsa model with GLM-5's layer shapes and
// random weights (fixed seed), streamed and atomic, as input for the end-to-end and tier benchmarks.
//
// The output is laid out exactly as `strata convert` lays out a container (docs/convert.md): config.json with
// a "strata_container" object, model-0000k-of-0000N.safetensors shards of about --shard-size-mb (an item —
// one tensor, or one routed expert's six tensors gate, gate.qs, up, up.qs, down, down.qs — is never split),
// model.safetensors.index.json, and strata-manifest.json written last; everything is built in DIR.partial and
// renamed to DIR at the end. convert's writer is not a public API (convert_checkpoint only takes a Hugging
// Face folder), so the few layout rules are repeated here.
//
// Weights: routed experts are written directly as Q4_G64 (random nibbles, positive random scales; nothing is
// quantized), dense 2-D weights as BF16, norms, router, correction bias and indexer weights_proj as F32 (the
// dtypes convert gives them). Scales keep activations finite: inputs of a projection see σ = 1/sqrt(fan_in),
// outputs that add into the residual stream another 1/sqrt(2·layers); the router's logits have unit spread
// so the sigmoid top-8 changes from token to token.
//
// Byte k of a tensor comes from random word k/8 of a counter-based generator seeded by (seed, tensor name);
// tensors are filled in parallel in chunks of kChunk bytes. The bytes do not depend on the thread count, the
// chunk size or the shard size.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/dtype.hpp"
#include "strata/error.hpp"
#include "strata/quant.hpp"
#include "strata/safetensors.hpp"

namespace {

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kComp = "synthetic";
constexpr const char* kManifest = "strata-manifest.json";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kMarker = ".make_synthetic_model";  // marks a DIR.partial this tool may remove
// Bytes of a tensor filled by one task: the unit of parallel work.
constexpr uint64_t kChunk = 1ull << 20;
// Bytes generated per batch; two batches are in memory (one being filled while the other is written).
constexpr uint64_t kBatch = 256ull << 20;

// GLM-5 (glm_moe_dsa) shapes: the transformers GlmMoeDsaConfig defaults recorded in
// docs/reference-semantics.md §4.
struct Shapes {
  int64_t vocab = 154880, hidden = 6144, intermediate = 12288, moe_intermediate = 2048;
  int64_t layers = 3, dense_layers = 1, experts = 256, top_k = 8, shared = 1;
  int64_t heads = 64, q_lora = 2048, kv_lora = 512, qk_nope = 192, qk_rope = 64, v_head = 256;
  int64_t index_heads = 32, index_head_dim = 128, index_topk = 2048;
};

// ---------------------------------------------------------------------------------------------------------------
// Random numbers

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// The splitmix64 finalizer (Steele, Lea & Flood): a bijection of 64-bit words with good avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Random word j of a tensor: splitmix64 used counter-based, mix64(seed + j·γ). No word depends on the one
// before, so blocks of words pipeline (a sequential generator such as xoshiro256** made 1.0 GB/s of BF16 and
// 2.9 GB/s of nibbles per core on the development VM; this makes 2.8 and 3.9).
inline uint64_t random_word(uint64_t seed, uint64_t j) {
  return mix64(seed + j * kGamma);
}

// ---------------------------------------------------------------------------------------------------------------
// The plan

enum class Fill {
  Bf16Uniform,  // BF16, uniform in [-a, a]
  F32Uniform,   // F32, uniform in [a, b)
  F32Const,     // F32, every value a
  Q4Nibbles,    // U8 packed int4, q uniform in -7..7 (0 twice as likely): symmetric, mean 0
  Q4Scales,     // F32 Q4_G64 scales, uniform in [a, b)
};

struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  Fill fill = Fill::F32Const;
  float a = 0, b = 0;
  uint64_t seed = 0;
};

struct Item {
  std::vector<Tensor> ts;  // one tensor, or a routed expert's six
  uint64_t bytes = 0;
  bool expert = false;
};

struct ShardPlan {
  std::string file;
  size_t first = 0, end = 0;  // items [first, end)
  std::string header;         // 8-byte length + JSON, padded to 8 bytes
  uint64_t data_bytes = 0, file_size = 0;
};

struct Plan {
  std::vector<Item> items;
  std::vector<ShardPlan> shards;
  uint64_t total_bytes = 0;
  int64_t tensors = 0, experts = 0;
  uint64_t expert_bytes = 0;     // one routed expert, Q4_G64
  uint64_t layer_bytes[2] = {};  // a dense layer, a MoE layer (routed experts included)
};

// The standard deviation of q when the nibble is uniform on 0..15 with 0 (q = -8) mapped to 8 (q = 0):
// E[q²] = 2 · (1² + … + 7²) / 16 = 17.5.
const float kQ4Std = std::sqrt(17.5f);

class Planner {
 public:
  Planner(const Shapes& s, uint64_t seed) : s_(s), seed_(seed) {}

  Item& item() { return plan_.items.emplace_back(); }
  void add(Item& it, std::string name, DType dt, std::vector<int64_t> shape, Fill f, float a, float b = 0) {
    Tensor t;
    t.name = std::move(name);
    t.dtype = dt;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.shape = std::move(shape);
    t.nbytes = static_cast<uint64_t>(n) * dtype_size(dt);
    t.fill = f;
    t.a = a;
    t.b = b;
    t.seed = mix64(seed_ ^ fnv1a(t.name));
    it.bytes += t.nbytes;
    it.ts.push_back(std::move(t));
  }
  // A BF16 [rows, cols] projection with σ = gain / sqrt(cols) (uniform: a = sqrt(3)·σ).
  void dense(const std::string& name, int64_t rows, int64_t cols, float gain = 1.0f) {
    add(item(), name, DType::BF16, {rows, cols}, Fill::Bf16Uniform, uniform_half_width(cols, gain));
  }
  void f32_const(const std::string& name, int64_t n, float v) {
    add(item(), name, DType::F32, {n}, Fill::F32Const, v);
  }
  // A Q4_G64 [rows, cols] matrix with σ ≈ gain / sqrt(cols): scales uniform in [0.5, 1.5)·σ/std(q).
  void q4(Item& it, const std::string& name, int64_t rows, int64_t cols, float gain) {
    const float s = gain / std::sqrt(static_cast<float>(cols)) / kQ4Std;
    add(it, name, DType::U8, {rows, q4_row_bytes(cols)}, Fill::Q4Nibbles, 0);
    add(it, name + ".qs", DType::F32, {rows, q4_scales_per_row(WeightFormat::Q4_G64, cols)}, Fill::Q4Scales,
        0.5f * s, 1.5f * s);
  }

  Plan make(uint64_t shard_bytes) {
    const Shapes& s = s_;
    const float out_gain = 1.0f / std::sqrt(2.0f * static_cast<float>(s.layers));
    const int64_t qk_head = s.qk_nope + s.qk_rope;
    dense("model.embed_tokens.weight", s.vocab, s.hidden);
    plan_.items.back().ts.back().a = 1.0f;  // embeddings: uniform [-1, 1] (the layer norms rescale them)
    for (int64_t l = 0; l < s.layers; ++l) {
      const size_t first_item = plan_.items.size();
      const std::string p = fmt::format("model.layers.{}.", l);
      f32_const(p + "input_layernorm.weight", s.hidden, 1.0f);
      f32_const(p + "post_attention_layernorm.weight", s.hidden, 1.0f);
      const std::string a = p + "self_attn.";
      dense(a + "q_a_proj.weight", s.q_lora, s.hidden);
      f32_const(a + "q_a_layernorm.weight", s.q_lora, 1.0f);
      dense(a + "q_b_proj.weight", s.heads * qk_head, s.q_lora);
      dense(a + "kv_a_proj_with_mqa.weight", s.kv_lora + s.qk_rope, s.hidden);
      f32_const(a + "kv_a_layernorm.weight", s.kv_lora, 1.0f);
      dense(a + "kv_b_proj.weight", s.heads * (s.qk_nope + s.v_head), s.kv_lora);
      dense(a + "o_proj.weight", s.hidden, s.heads * s.v_head, out_gain);
      const std::string ix = a + "indexer.";
      dense(ix + "wq_b.weight", s.index_heads * s.index_head_dim, s.q_lora);
      dense(ix + "wk.weight", s.index_head_dim, s.hidden);
      f32_const(ix + "k_norm.weight", s.index_head_dim, 1.0f);
      f32_const(ix + "k_norm.bias", s.index_head_dim, 0.0f);
      {
        const float w = uniform_half_width(s.hidden, 1.0f);
        add(item(), ix + "weights_proj.weight", DType::F32, {s.index_heads, s.hidden}, Fill::F32Uniform, -w,
            w);
      }
      const bool moe = l >= s.dense_layers;
      if (!moe) {
        dense(p + "mlp.gate_proj.weight", s.intermediate, s.hidden);
        dense(p + "mlp.up_proj.weight", s.intermediate, s.hidden);
        dense(p + "mlp.down_proj.weight", s.hidden, s.intermediate, out_gain);
      } else {
        // Router logits = W·x with x after RMSNorm (unit RMS): σ = 1/sqrt(hidden) gives logits of unit
        // spread, so the top-8 of sigmoid + bias differs between tokens. The correction bias is small next to
        // it.
        const float w = uniform_half_width(s.hidden, 1.0f);
        add(item(), p + "mlp.gate.weight", DType::F32, {s.experts, s.hidden}, Fill::F32Uniform, -w, w);
        add(item(), p + "mlp.gate.e_score_correction_bias", DType::F32, {s.experts}, Fill::F32Uniform, -0.05f,
            0.05f);
        const int64_t sh = s.moe_intermediate * s.shared;
        dense(p + "mlp.shared_experts.gate_proj.weight", sh, s.hidden);
        dense(p + "mlp.shared_experts.up_proj.weight", sh, s.hidden);
        dense(p + "mlp.shared_experts.down_proj.weight", s.hidden, sh, out_gain);
        for (int64_t e = 0; e < s.experts; ++e) {
          const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
          Item& it = item();
          it.expert = true;
          q4(it, x + "gate_proj.weight", s.moe_intermediate, s.hidden, 1.0f);
          q4(it, x + "up_proj.weight", s.moe_intermediate, s.hidden, 1.0f);
          q4(it, x + "down_proj.weight", s.hidden, s.moe_intermediate, out_gain);
          plan_.expert_bytes = it.bytes;
          ++plan_.experts;
        }
      }
      uint64_t lb = 0;
      for (size_t i = first_item; i < plan_.items.size(); ++i) lb += plan_.items[i].bytes;
      plan_.layer_bytes[moe ? 1 : 0] = lb;
    }
    f32_const("model.norm.weight", s.hidden, 1.0f);
    dense("lm_head.weight", s.vocab, s.hidden);
    pack(shard_bytes);
    return std::move(plan_);
  }

 private:
  static float uniform_half_width(int64_t fan_in, float gain) {
    return std::sqrt(3.0f) * gain / std::sqrt(static_cast<float>(fan_in));
  }

  // Output shards as convert packs them: greedy, never splitting an item.
  void pack(uint64_t shard_bytes) {
    std::vector<std::pair<size_t, size_t>> ranges;
    uint64_t cur = 0;
    size_t first = 0;
    for (size_t i = 0; i < plan_.items.size(); ++i) {
      if (i > first && cur + plan_.items[i].bytes > shard_bytes) {
        ranges.emplace_back(first, i);
        first = i;
        cur = 0;
      }
      cur += plan_.items[i].bytes;
    }
    ranges.emplace_back(first, plan_.items.size());
    for (size_t k = 0; k < ranges.size(); ++k) {
      ShardPlan sp;
      sp.file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, ranges.size());
      sp.first = ranges[k].first;
      sp.end = ranges[k].second;
      json h = json::object();
      h["__metadata__"] = {{"format", "pt"}};
      for (size_t i = sp.first; i < sp.end; ++i) {
        for (const Tensor& t : plan_.items[i].ts) {
          h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"data_offsets", {sp.data_bytes, sp.data_bytes + t.nbytes}}};
          sp.data_bytes += t.nbytes;
          ++plan_.tensors;
        }
      }
      std::string js = h.dump();
      while (js.size() % 8 != 0) js.push_back(' ');  // the data section starts 8-byte aligned, as convert's
      sp.header.assign(8, '\0');
      const uint64_t n = js.size();
      std::memcpy(sp.header.data(), &n, 8);
      sp.header += js;
      sp.file_size = sp.header.size() + sp.data_bytes;
      plan_.total_bytes += sp.data_bytes;
      plan_.shards.push_back(std::move(sp));
    }
  }

  Shapes s_;
  uint64_t seed_;
  Plan plan_;
};

// ---------------------------------------------------------------------------------------------------------------
// Filling

// Bytes [chunk·kChunk, chunk·kChunk + n) of tensor t: byte k of the tensor comes from random word k/8, so the
// bytes do not depend on how the tensor is cut. Sizes here are multiples of the element size, and kChunk is a
// multiple of the block.
void fill_chunk(const Tensor& t, uint64_t chunk, std::byte* dst, uint64_t n) {
  constexpr int kWords = 64;  // a block of 512 bytes: random words first, then a loop the compiler vectorizes
  uint64_t w[kWords];
  const uint64_t j0 = chunk * kChunk / 8;
  auto words = [&](uint64_t i) {
    for (int k = 0; k < kWords; ++k) w[k] = random_word(t.seed, j0 + i / 8 + static_cast<uint64_t>(k));
  };
  switch (t.fill) {
    case Fill::Q4Nibbles: {
      constexpr uint64_t kLow = 0x1111111111111111ull;
      for (uint64_t i = 0; i < n; i += sizeof w) {
        words(i);
        for (int k = 0; k < kWords; ++k) {
          uint64_t z = w[k] | (w[k] >> 1);
          z |= z >> 2;     // bit 0 of each nibble = OR of the nibble's 4 bits
          z = ~z & kLow;   // 1 where the nibble is 0 (q = -8)
          w[k] |= z << 3;  // → 8 (q = 0): q is symmetric in -7..7
        }
        std::memcpy(dst + i, w, std::min<uint64_t>(sizeof w, n - i));
      }
      return;
    }
    case Fill::Bf16Uniform: {
      const float scale = t.a / 32768.0f;
      uint16_t v[4 * kWords];
      for (uint64_t i = 0; i < n; i += sizeof v) {
        words(i);
        uint16_t u[4 * kWords];
        std::memcpy(u, w, sizeof u);
        for (int k = 0; k < 4 * kWords; ++k) {
          const float f = (static_cast<float>(static_cast<int32_t>(u[k]) - 32768) + 0.5f) * scale;
          uint32_t b;
          std::memcpy(&b, &f, 4);
          b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest even (values here are finite)
          v[k] = static_cast<uint16_t>(b >> 16);
        }
        std::memcpy(dst + i, v, std::min<uint64_t>(sizeof v, n - i));
      }
      return;
    }
    case Fill::F32Uniform:
    case Fill::Q4Scales: {
      const float lo = t.a, span = t.b - t.a;
      float v[2 * kWords];
      for (uint64_t i = 0; i < n; i += sizeof v) {
        words(i);
        uint32_t u[2 * kWords];
        std::memcpy(u, w, sizeof u);
        for (int k = 0; k < 2 * kWords; ++k)
          v[k] = lo + span * (static_cast<float>(u[k] >> 8) * (1.0f / 16777216.0f));
        std::memcpy(dst + i, v, std::min<uint64_t>(sizeof v, n - i));
      }
      return;
    }
    case Fill::F32Const: {
      for (uint64_t i = 0; i < n; i += 4) std::memcpy(dst + i, &t.a, 4);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Output

// Writes through O_DIRECT where the file system allows it: on the 2-core development VM buffered writes +
// fsync ran at 214 MB/s and O_DIRECT at 1.2 GB/s (dd, 2 GiB, 64 MiB blocks). Every write is a multiple of
// kAlign bytes from a kAlign-aligned buffer at a kAlign-aligned file offset; the file is padded to a whole
// block and truncated to its size at the end.
constexpr uint64_t kAlign = 4096;

class ShardWriter {
 public:
  explicit ShardWriter(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd_ < 0 && errno == EINVAL)
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(kComp, "{}: cannot create: {}", path_.string(), std::strerror(errno));
  }
  ~ShardWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // n bytes at the current end; p is kAlign-aligned and n a multiple of kAlign.
  void write(const std::byte* p, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, p + done, std::min<uint64_t>(n - done, 1ull << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && !buffered_) {  // O_DIRECT accepted at open but not for writes: buffered I/O
          buffered_ = true;
          (void)::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
          continue;
        }
        fail(kComp, "{}: write failed after {} bytes: {}", path_.string(), written_ + done,
             std::strerror(errno));
      }
      done += static_cast<uint64_t>(w);
    }
    written_ += n;
  }
  void finish(uint64_t size) {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0 || ::fsync(fd_) != 0)
      fail(kComp, "{}: cannot flush to disk: {}", path_.string(), std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(kComp, "{}: close failed: {}", path_.string(), std::strerror(errno));
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool buffered_ = false;
  uint64_t written_ = 0;
};

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

void write_text(const fs::path& p, const std::string& s) {
  write_file_atomic(p, std::as_bytes(std::span<const char>(s.data(), s.size())));
}

struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t n) : p(static_cast<std::byte*>(std::aligned_alloc(kAlign, n))) {
    if (p == nullptr) fail(kComp, "cannot allocate {} MiB", n >> 20);
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* p;
};

struct Timing {
  double fill_s = 0;  // generating (all threads)
  double wait_s = 0;  // waiting for the disk
};

// One shard: the header, then its tensors in order, generated in batches of about kBatch bytes (in parallel,
// chunk by chunk) while the previous batch is being written. A batch's bytes past its last whole kAlign block
// are carried to the front of the next one (the header is the first carry).
void write_shard(const Plan& plan, const ShardPlan& sp, const fs::path& path, AlignedBuffer* (&bufs)[2],
                 Timing& tm) {
  struct Task {
    const Tensor* t;
    uint64_t chunk, offset, n;  // offset in the batch buffer
  };
  ShardWriter out(path);
  std::future<void> pending;
  int cur = 0;
  std::vector<Task> tasks;
  STRATA_CHECK(sp.header.size() < kBatch);
  std::memcpy(bufs[0]->p, sp.header.data(), sp.header.size());
  uint64_t used = sp.header.size();  // bytes of the current buffer: carry, then tasks
  auto flush = [&](bool last) {
    std::byte* buf = bufs[cur]->p;
    const auto t0 = std::chrono::steady_clock::now();
    tbb::parallel_for(size_t{0}, tasks.size(), [&](size_t i) {
      const Task& k = tasks[i];
      fill_chunk(*k.t, k.chunk, buf + k.offset, k.n);
    });
    const auto t1 = std::chrono::steady_clock::now();
    if (pending.valid()) pending.get();  // the other buffer is free again
    tm.fill_s += std::chrono::duration<double>(t1 - t0).count();
    tm.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    uint64_t whole = used / kAlign * kAlign;
    if (last && whole < used) {  // the end of the file: pad to a whole block (truncated away in finish)
      std::memset(buf + used, 0, kAlign - (used - whole));
      whole += kAlign;
    }
    const uint64_t carry = last ? 0 : used - whole;
    std::memcpy(bufs[cur ^ 1]->p, buf + whole, carry);
    pending = std::async(std::launch::async, [&out, buf, whole] { out.write(buf, whole); });
    cur ^= 1;
    tasks.clear();
    used = carry;
  };
  for (size_t i = sp.first; i < sp.end; ++i) {
    for (const Tensor& t : plan.items[i].ts) {
      for (uint64_t c = 0; c * kChunk < t.nbytes; ++c) {
        const uint64_t n = std::min(kChunk, t.nbytes - c * kChunk);
        if (used + n > kBatch) flush(false);
        tasks.push_back({&t, c, used, n});
        used += n;
      }
    }
  }
  flush(true);
  const auto t0 = std::chrono::steady_clock::now();
  pending.get();
  out.finish(sp.file_size);
  tm.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

double cpu_seconds() {  // user + system time of the process, all threads
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::string gib(uint64_t b) {
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
}

int run(const Shapes& s, const fs::path& out_arg, uint64_t seed, uint64_t shard_bytes, bool force) {
  const auto t_start = std::chrono::steady_clock::now();
  fs::path out = fs::absolute(out_arg).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  const fs::path parent = out.parent_path(), partial = parent / (out.filename().string() + ".partial");
  if (!fs::is_directory(parent))
    fail(kComp, "{}: the folder that should hold --out does not exist", parent.string());
  auto check_out = [&] {
    if (!fs::exists(out)) return;
    if (!fs::is_directory(out) || !fs::exists(out / kManifest)) {
      fail(kComp, "{} exists and is not a strata container (no {}); refusing to write over it", out.string(),
           kManifest);
    }
    if (!force) fail(kComp, "{} is already a strata container; pass --force to replace it", out.string());
  };
  check_out();
  if (fs::exists(partial)) {
    // Ours (interrupted: the generator is deterministic, so it starts over) or empty: removed. Anything else
    // (a convert in progress, a user's folder) is left alone.
    const bool empty = fs::is_directory(partial) && fs::is_empty(partial);
    if (!empty && !fs::exists(partial / kMarker)) {
      fail(kComp, "{} exists and was not made by make_synthetic_model; remove it or choose another --out",
           partial.string());
    }
    fs::remove_all(partial);
  }
  fs::create_directories(partial);
  write_text(partial / kMarker, "make_synthetic_model work in progress\n");

  Planner planner(s, seed);
  const Plan plan = planner.make(shard_bytes);
  fmt::print(
      stderr,
      "glm_moe_dsa synthetic: {} layers ({} dense), {} experts of {}x{} (Q4_G64, {:.2f} MB each), vocab {}\n"
      "  per dense layer {:.1f} MB, per MoE layer {:.1f} MB (routed {:.1f} MB); total {} in {} shard(s)\n",
      s.layers, s.dense_layers, s.experts, s.moe_intermediate, s.hidden, plan.expert_bytes / 1e6, s.vocab,
      plan.layer_bytes[0] / 1e6, plan.layer_bytes[1] / 1e6,
      static_cast<double>(plan.expert_bytes * s.experts) / 1e6, gib(plan.total_bytes), plan.shards.size());

  // kBatch of data, plus the carry (< kAlign) and the padding of the last block.
  AlignedBuffer buf0(kBatch + 2 * kAlign), buf1(kBatch + 2 * kAlign);
  AlignedBuffer* bufs[2] = {&buf0, &buf1};
  Timing tm;
  uint64_t written = 0;
  const auto t_gen = std::chrono::steady_clock::now();
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    const ShardPlan& sp = plan.shards[k];
    const auto t0 = std::chrono::steady_clock::now();
    write_shard(plan, sp, partial / sp.file, bufs, tm);
    written += sp.file_size;
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_gen).count();
    fmt::print(stderr, "  [{}/{}] {} {} in {:.2f} s ({:.0f} MB/s; overall {:.0f} MB/s)\n", k + 1,
               plan.shards.size(), sp.file, gib(sp.file_size), sec, sp.file_size / 1e6 / sec,
               written / 1e6 / all);
  }
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_gen).count();

  // Publication, in convert's order: index, config.json, then the manifest, then the rename.
  {
    json wm = json::object();
    for (const auto& sp : plan.shards) {
      for (size_t i = sp.first; i < sp.end; ++i) {
        for (const Tensor& t : plan.items[i].ts) wm[t.name] = sp.file;
      }
    }
    const json index = {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", wm}};
    write_text(partial / kIndex, index.dump(2) + "\n");
  }
  const json synthetic = {{"generator", "bench/make_synthetic_model"},
                          {"seed", seed},
                          {"layers", s.layers},
                          {"dense_layers", s.dense_layers},
                          {"experts", s.experts},
                          {"vocab", s.vocab}};
  {
    std::vector<std::string> mlp_types, indexer_types;
    for (int64_t l = 0; l < s.layers; ++l) {
      mlp_types.push_back(l < s.dense_layers ? "dense" : "sparse");
      indexer_types.push_back("full");
    }
    ordered_json cfg = {{"architectures", {"GlmMoeDsaForCausalLM"}},
                        {"model_type", "glm_moe_dsa"},
                        {"dtype", "bfloat16"},
                        {"vocab_size", s.vocab},
                        {"hidden_size", s.hidden},
                        {"intermediate_size", s.intermediate},
                        {"moe_intermediate_size", s.moe_intermediate},
                        {"num_hidden_layers", s.layers},
                        {"first_k_dense_replace", s.dense_layers},
                        {"mlp_layer_types", mlp_types},
                        {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.heads},
                        {"head_dim", s.qk_rope},
                        {"q_lora_rank", s.q_lora},
                        {"kv_lora_rank", s.kv_lora},
                        {"qk_nope_head_dim", s.qk_nope},
                        {"qk_rope_head_dim", s.qk_rope},
                        {"qk_head_dim", s.qk_nope + s.qk_rope},
                        {"v_head_dim", s.v_head},
                        {"n_routed_experts", s.experts},
                        {"n_shared_experts", s.shared},
                        {"num_experts_per_tok", s.top_k},
                        {"n_group", 1},
                        {"topk_group", 1},
                        {"norm_topk_prob", true},
                        {"routed_scaling_factor", 2.5},
                        {"index_n_heads", s.index_heads},
                        {"index_head_dim", s.index_head_dim},
                        {"index_topk", s.index_topk},
                        {"indexer_types", indexer_types},
                        {"hidden_act", "silu"},
                        {"rms_norm_eps", 1e-5},
                        {"attention_bias", false},
                        {"max_position_embeddings", 202752},
                        {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
                        {"tie_word_embeddings", false},
                        {"strata_synthetic", synthetic},
                        {"strata_container", {{"version", 1}, {"experts", "q4_g64"}, {"dense", "bf16"}}}};
    write_text(partial / "config.json", cfg.dump(2) + "\n");
  }
  {
    json shards = json::array();
    for (const auto& sp : plan.shards) shards.push_back({{"file", sp.file}, {"size", sp.file_size}});
    const json manifest = {{"strata_container", 1},
                           {"created_by", "make_synthetic_model"},
                           {"model_type", "glm_moe_dsa"},
                           {"experts", "q4_g64"},
                           {"dense", "bf16"},
                           {"source", synthetic},
                           {"tensors", plan.tensors},
                           {"routed_experts", plan.experts},
                           {"total_size", plan.total_bytes},
                           {"shards", shards},
                           {"copied", json::array()}};
    fs::remove(partial / kMarker);
    write_text(partial / kManifest, manifest.dump(2) + "\n");  // last: marks the folder complete
  }
  fsync_path(partial);
  fs::path old;
  if (fs::exists(out)) {
    check_out();
    old = parent / fmt::format("{}.old-{}", out.filename().string(), ::getpid());
    if (::rename(out.c_str(), old.c_str()) != 0)
      fail(kComp, "cannot move the existing {} aside: {}", out.string(), std::strerror(errno));
  }
  if (::rename(partial.c_str(), out.c_str()) != 0) {
    const int e = errno;
    if (!old.empty()) (void)::rename(old.c_str(), out.c_str());
    fail(kComp, "cannot rename {} to {}: {}", partial.string(), out.string(), std::strerror(e));
  }
  fsync_path(parent);
  if (!old.empty()) fs::remove_all(old);

  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  uint64_t file_bytes = 0;
  for (const auto& sp : plan.shards) file_bytes += sp.file_size;
  fmt::print("wrote {}: {} tensors ({} routed experts), {} in {} shard(s)\n", out.string(), plan.tensors,
             plan.experts, gib(file_bytes), plan.shards.size());
  const double cpu_s = cpu_seconds();
  fmt::print(
      "time {:.2f} s ({:.2f} s writing shards): {:.0f} MB/s; filling {:.2f} s, waiting for the disk {:.2f} "
      "s; "
      "CPU time {:.2f} s ({:.0f} MB per CPU-second); peak RSS {:.0f} MiB\n",
      total_s, gen_s, file_bytes / 1e6 / gen_s, tm.fill_s, tm.wait_s, cpu_s, file_bytes / 1e6 / cpu_s,
      peak_rss_bytes() / 1048576.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "make_synthetic_model: a glm_moe_dsa strata container (Q4_G64 experts) with GLM-5 shapes and "
      "random weights"};
  Shapes s;
  std::string out;
  uint64_t seed = 20250101;
  int64_t shard_mb = 2048;
  int threads = 0;
  bool force = false;
  app.add_option("--out", out, "output folder (built in OUT.partial, renamed at the end)")->required();
  app.add_option("--layers", s.layers, "decoder layers")->capture_default_str();
  app.add_option("--dense-layers", s.dense_layers, "leading layers with a dense MLP (first_k_dense_replace)")
      ->capture_default_str();
  app.add_option("--experts", s.experts, "routed experts per MoE layer")->capture_default_str();
  app.add_option("--vocab", s.vocab, "vocabulary size")->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--shard-size-mb", shard_mb, "target size of an output shard, MiB")->capture_default_str();
  app.add_option("--threads", threads, "generating threads (0 = all)")->capture_default_str();
  app.add_flag("--force", force, "replace an existing container at --out");
  CLI11_PARSE(app, argc, argv);
  try {
    if (s.layers < 1) fail("cli", "--layers must be at least 1");
    if (s.dense_layers < 0 || s.dense_layers > s.layers)
      fail("cli", "--dense-layers must be in [0, --layers]");
    if (s.experts < s.top_k) fail("cli", "--experts must be at least the top-k ({})", s.top_k);
    if (s.vocab < 1) fail("cli", "--vocab must be at least 1");
    if (shard_mb < 1) fail("cli", "--shard-size-mb must be at least 1");
    std::optional<tbb::global_control> gc;
    if (threads > 0) gc.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
    return run(s, out, seed, static_cast<uint64_t>(shard_mb) << 20, force);
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: {}\n", e.what());
    return 1;
  }
}
