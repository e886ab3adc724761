// strata convert: lossless int4 on grid-aligned experts (and the converted container runs like transformers),
// the container layout on every family, sharded output + resumption after an interruption, FP8 block-scaled
// input, and the errors a user meets.
#include <fcntl.h>
#include <sys/file.h>

#include <atomic>
#include <cmath>
#include <set>

#include "strata/convert.hpp"
#include "strata/error.hpp"
#include "strata/quant.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

const char* const kSideFiles[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                  "special_tokens_map.json"};

// A Hugging Face folder made from a fixture: config.json, its weights (model.safetensors, or `n_shards`
// shards with an index when a `shard_of` assignment is given) and tokenizer/generation files. The fixture's
// expected.safetensors stays behind (it is not part of the checkpoint).
struct InputDir {
  TempDir tmp;
  fs::path dir;
  explicit InputDir(const char* fixture) : dir(tmp.path() / "hf") {
    fs::create_directories(dir);
    fs::copy(fixtures_dir() / fixture / "config.json", dir / "config.json");
    fs::copy(fixtures_dir() / fixture / "model.safetensors", dir / "model.safetensors");
    add_side_files();
  }
  // Weights rewritten by `edit`, spread over shards by `shard_of` (nullptr: one model.safetensors, no index).
  InputDir(const char* fixture,
           const std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<std::byte>>&)>& edit,
           int n_shards = 1, const std::function<int(const std::string&)>& shard_of = nullptr)
      : dir(tmp.path() / "hf") {
    fs::create_directories(dir);
    fs::copy(fixtures_dir() / fixture / "config.json", dir / "config.json");
    SafetensorsFile f(fixtures_dir() / fixture / "model.safetensors");
    std::vector<TensorToWrite> ts;
    std::vector<std::vector<std::byte>> keep;
    for (const auto& [name, info] : f.tensors())
      ts.push_back({name, info.dtype, info.shape, std::span(f.data(info), info.nbytes)});
    if (edit) edit(ts, keep);
    write_shards(ts, n_shards, shard_of);
    add_side_files();
  }
  void write_shards(const std::vector<TensorToWrite>& ts, int n,
                    const std::function<int(const std::string&)>& shard_of) {
    if (n == 1 && !shard_of) {
      write_safetensors(dir / "model.safetensors", ts, {{"format", "pt"}});
      return;
    }
    nlohmann::json wm = nlohmann::json::object();
    for (int s = 0; s < n; ++s) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
      std::vector<TensorToWrite> part;
      for (const auto& t : ts) {
        if (shard_of(t.name) == s) {
          part.push_back(t);
          wm[t.name] = file;
        }
      }
      write_safetensors(dir / file, part, {{"format", "pt"}});
    }
    write_text(dir / "model.safetensors.index.json",
               nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump());
  }
  void add_side_files() {
    for (const char* f : kSideFiles)
      write_text(dir / f, fmt::format("{{\"file\": \"{}\", \"x\": [1, 2, 3]}}\n", f));
  }
  fs::path out(const char* name = "out") const { return tmp.path() / name; }
};

ConvertOptions options(const fs::path& in, const fs::path& out) {
  ConvertOptions o;
  o.in = in;
  o.out = out;
  o.stop_after_shards = 0;  // ignore the environment
  return o;
}

// Every tensor of a converted container: name → (file, info) through its index.
struct Container {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> tensors;
  nlohmann::json index;
  explicit Container(const fs::path& dir) {
    index = nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
    std::set<std::string> names;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it)
      names.insert(it->get<std::string>());
    uint64_t total = 0;
    for (const auto& n : names) {
      files.push_back(std::make_unique<SafetensorsFile>(dir / n));
      for (const auto& [tn, info] : files.back()->tensors()) {
        CHECK(index["weight_map"].value(tn, std::string()) == n);  // the index names the file that holds it
        tensors[tn] = {files.back().get(), &info};
        total += info.nbytes;
      }
    }
    CHECK(tensors.size() == index["weight_map"].size());
    CHECK(index["metadata"]["total_size"].get<uint64_t>() == total);
  }
  const TensorInfo& info(const std::string& n) const {
    auto it = tensors.find(n);
    REQUIRE_MESSAGE(it != tensors.end(), n);
    return *it->second.second;
  }
  const std::byte* data(const std::string& n) const {
    return tensors.at(n).first->data(*tensors.at(n).second);
  }
  const SafetensorsFile* file(const std::string& n) const { return tensors.at(n).first; }
};

std::vector<float> to_f32(const std::byte* p, DType t, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      std::memcpy(&v[i], p + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      v[i] = t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return v;
}

std::vector<float> dequant(const Container& c, const std::string& name, int64_t rows, int64_t cols,
                           WeightFormat f) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(c.info(name + ".qs").numel()));
  std::memcpy(scales.data(), c.data(name + ".qs"), scales.size() * 4);
  dequantize_q4(Matrix{f, rows, cols, c.data(name), scales.data()}, out.data());
  return out;
}

// Independent e4m3fn reference (not the library's table): decode by formula, encode by nearest value.
float e4m3_ref(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -mag : mag;
}
uint8_t e4m3_encode(float x) {
  // Codes 0x00..0x7e are increasing in value; round to nearest, ties to the even code.
  const float a = std::min(std::fabs(x), 448.0f);
  int best = 0;
  for (int c = 0; c <= 0x7e; ++c) {
    const float d = std::fabs(e4m3_ref(static_cast<uint8_t>(c)) - a),
                db = std::fabs(e4m3_ref(static_cast<uint8_t>(best)) - a);
    if (d < db || (d == db && c % 2 == 0 && best % 2 == 1)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}
uint16_t bf16_rne_ref(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xffff, upper = u >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) return static_cast<uint16_t>(upper + 1);
  return static_cast<uint16_t>(upper);
}

std::vector<float> run_logits(const std::shared_ptr<Model>& m, const std::vector<int32_t>& ids) {
  Session s(m);
  return s.forward(ids, true);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir)) m[e.path().filename().string()] = read_text(e.path());
  return m;
}

std::string bin() {
  return std::string("'") + STRATA_BIN + "'";
}

}  // namespace

TEST_CASE("e4m3 decoder and bf16 rounding") {
  CHECK(fp8_e4m3_to_f32(0x38) == 1.0f);
  CHECK(fp8_e4m3_to_f32(0x7e) == 448.0f);
  CHECK(fp8_e4m3_to_f32(0xfe) == -448.0f);
  CHECK(fp8_e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
  CHECK(fp8_e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));  // smallest normal
  CHECK(fp8_e4m3_to_f32(0x07) == 7 * std::ldexp(1.0f, -9));
  CHECK(fp8_e4m3_to_f32(0x40) == 2.0f);
  CHECK(fp8_e4m3_to_f32(0x80) == 0.0f);
  CHECK(std::signbit(fp8_e4m3_to_f32(0x80)));
  CHECK(std::isnan(fp8_e4m3_to_f32(0x7f)));
  CHECK(std::isnan(fp8_e4m3_to_f32(0xff)));
  for (int v = 0; v < 256; ++v) {
    const float a = fp8_e4m3_to_f32(static_cast<uint8_t>(v)), b = e4m3_ref(static_cast<uint8_t>(v));
    CHECK(((std::isnan(a) && std::isnan(b)) || a == b));
    if (!std::isnan(a)) CHECK(e4m3_encode(a) == v);
  }
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  CHECK(f32_to_bf16_rne(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_rne(bits(0x3f808000)) == 0x3f80);  // tie → even
  CHECK(f32_to_bf16_rne(bits(0x3f818000)) == 0x3f82);  // tie → even (up)
  CHECK(f32_to_bf16_rne(bits(0x3f808001)) == 0x3f81);
  CHECK(f32_to_bf16_rne(bits(0x7f7fffff)) == 0x7f80);  // rounds to infinity
  CHECK((f32_to_bf16_rne(std::nanf("")) & 0x7fc0) == 0x7fc0);
  CHECK(tensor_role("model.layers.3.mlp.experts.12.down_proj.weight", 2) == TensorRole::RoutedExpert);
  CHECK(tensor_role("model.layers.3.mlp.shared_experts.down_proj.weight", 2) == TensorRole::Dense2D);
  CHECK(tensor_role("model.layers.3.mlp.gate.weight", 2) == TensorRole::F32);
  CHECK(tensor_role("model.layers.3.mlp.gate.e_score_correction_bias", 1) == TensorRole::F32);
  CHECK(tensor_role("model.layers.3.self_attn.indexer.weights_proj.weight", 2) == TensorRole::F32);
  CHECK(tensor_role("model.layers.3.self_attn.q_proj.bias", 1) == TensorRole::F32);
  CHECK(tensor_role("model.layers.3.self_attn.kv_b_proj.weight", 2) == TensorRole::KeepFloat);
  CHECK(tensor_role("model.embed_tokens.weight", 2) == TensorRole::KeepFloat);
  CHECK(tensor_role("lm_head.weight", 2) == TensorRole::KeepFloat);
  CHECK(tensor_role("model.layers.3.self_attn.o_proj.weight_scale_inv", 2) == TensorRole::ScaleInv);
}

TEST_CASE("grid-aligned experts convert losslessly and the container runs like transformers") {
  // glm_moe_dsa-tiny-q4 from the shared fixtures, plus two held-out grid models of other shapes and families.
  for (const char* fixture : {"glm_moe_dsa-tiny-q4", "glm_moe_dsa-q4-alt", "qwen3_moe-q4-alt"}) {
    CAPTURE(fixture);
    InputDir in(fixture);
    const ConvertResult r = convert_checkpoint(options(in.dir, in.out()));
    CHECK(r.experts > 0);
    CHECK(r.output_shards == 1);
    const Container c(in.out());
    SafetensorsFile src(in.dir / "model.safetensors");
    int n = 0;
    for (const auto& name_info : src.tensors()) {
      const auto& name = name_info.first;  // (no binding: clang 14 cannot capture one)
      const auto& info = name_info.second;
      if (tensor_role(name, info.shape.size()) != TensorRole::RoutedExpert) continue;
      REQUIRE(info.dtype == DType::F32);
      const auto got = dequant(c, name, info.shape[0], info.shape[1], WeightFormat::Q4_G64);
      const auto want = to_f32(src.data(info), DType::F32, info.numel());
      // Bit for bit, except that int4 has no -0: the fixture's -0.0 weights come back as +0.0.
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool same_bits = std::memcmp(&got[i], &want[i], 4) == 0;
        if (!same_bits && !(got[i] == 0.0f && want[i] == 0.0f)) ++differ;
      }
      CHECK_MESSAGE(differ == 0, name);
      ++n;
    }
    CHECK(n == 3 * r.experts);

    const Expected ex = load_expected(fixtures_dir() / fixture);
    auto model = Model::load(in.out(), backends_named());
    REQUIRE(model->layers().back().experts.experts[0].gate.format == WeightFormat::Q4_G64);
    const auto logits = run_logits(model, ex.sequence);
    const float dev = max_abs_diff(logits, ex.logits);
    MESSAGE("converted " << std::string(fixture) << ": max |logit - transformers| = " << dev);
    CHECK(dev <= 1e-3f);
    Session s(model);
    const auto gen =
        generate_greedy(s, ex.prompt, static_cast<int64_t>(ex.sequence.size() - ex.prompt.size()));
    CHECK(gen == std::vector<int32_t>(ex.sequence.begin() + static_cast<std::ptrdiff_t>(ex.prompt.size()),
                                      ex.sequence.end()));
    // The same bits as quantizing the original at load.
    LoadOptions lo;
    lo.expert_quant = WeightFormat::Q4_G64;
    CHECK(run_logits(Model::load(fixtures_dir() / fixture, backends_named(), lo), ex.sequence) == logits);
  }
}

TEST_CASE("every family converts: expert layout, f32 norms and router, index, config, manifest, side files") {
  for (const char* fx : {"qwen3_moe-tiny", "deepseek_v3-tiny", "glm4_moe-tiny", "glm_moe_dsa-tiny"}) {
    for (const WeightFormat fmt : {WeightFormat::Q4_G64, WeightFormat::Q4_ROW}) {
      CAPTURE(fx);
      CAPTURE(weight_format_name(fmt));
      InputDir in(fx);
      ConvertOptions o = options(in.dir, in.out());
      o.experts = fmt;
      o.shard_bytes = 300 << 10;  // several output shards
      const ConvertResult r = convert_checkpoint(o);
      CHECK(r.output_shards > 1);
      CHECK(r.output_shards_reused == 0);
      CHECK(!fs::exists(in.out().string() + ".partial"));
      CHECK(fs::exists(in.out() / "strata-manifest.json"));
      CHECK(!fs::exists(in.out() / "convert-journal.json"));
      const Container c(in.out());
      SafetensorsFile src(in.dir / "model.safetensors");
      std::set<std::string> expert_keys;
      for (const auto& name_info : src.tensors()) {
        const auto& name = name_info.first;  // (no binding: clang 14 cannot capture one)
        const auto& info = name_info.second;
        CAPTURE(name);
        const TensorRole role = tensor_role(name, info.shape.size());
        if (role == TensorRole::RoutedExpert) {
          const int64_t rows = info.shape[0], cols = info.shape[1];
          const TensorInfo& q = c.info(name);
          CHECK(q.dtype == DType::U8);
          CHECK(q.shape == std::vector<int64_t>{rows, (cols + 1) / 2});
          const TensorInfo& qs = c.info(name + ".qs");
          CHECK(qs.dtype == DType::F32);
          CHECK(qs.shape == (fmt == WeightFormat::Q4_G64 ? std::vector<int64_t>{rows, (cols + 63) / 64}
                                                         : std::vector<int64_t>{rows}));
          // Same bytes as the reference quantizer.
          const auto w = to_f32(src.data(info), info.dtype, info.numel());
          const QuantizedMatrix ref = quantize_q4(w, rows, cols, fmt);
          CHECK(std::memcmp(c.data(name), ref.packed.data(), ref.packed.size()) == 0);
          CHECK(std::memcmp(c.data(name + ".qs"), ref.scales.data(), ref.scales.size() * 4) == 0);
          expert_keys.insert(name.substr(0, name.rfind('.', name.size() - std::strlen(".weight") - 1)));
          continue;
        }
        const TensorInfo& o2 = c.info(name);
        CHECK(o2.shape == info.shape);
        if (role == TensorRole::F32) {
          CHECK(o2.dtype == DType::F32);
          CHECK(to_f32(c.data(name), DType::F32, o2.numel()) ==
                to_f32(src.data(info), info.dtype, info.numel()));
        } else {
          CHECK(o2.dtype == info.dtype);  // --dense-format keep
          CHECK(std::memcmp(c.data(name), src.data(info), info.nbytes) == 0);
        }
      }
      REQUIRE(!expert_keys.empty());
      CHECK(static_cast<int64_t>(expert_keys.size()) == r.experts);
      // Each expert's six tensors lie back to back in one shard: gate, gate.qs, up, up.qs, down, down.qs.
      for (const auto& k : expert_keys) {
        CAPTURE(k);
        const std::vector<std::string> six = {k + ".gate_proj.weight", k + ".gate_proj.weight.qs",
                                              k + ".up_proj.weight",   k + ".up_proj.weight.qs",
                                              k + ".down_proj.weight", k + ".down_proj.weight.qs"};
        for (size_t i = 1; i < six.size(); ++i) {
          CHECK(c.file(six[i]) == c.file(six[0]));
          CHECK(c.info(six[i]).offset == c.info(six[i - 1]).offset + c.info(six[i - 1]).nbytes);
        }
      }
      const auto cfg = nlohmann::json::parse(read_text(in.out() / "config.json"));
      auto orig = nlohmann::json::parse(read_text(in.dir / "config.json"));
      CHECK(cfg["strata_container"] ==
            nlohmann::json{{"version", 1},
                           {"experts", fmt == WeightFormat::Q4_G64 ? "q4_g64" : "q4_row"},
                           {"dense", "keep"}});
      orig["strata_container"] = cfg["strata_container"];
      CHECK(cfg == orig);
      const auto man = nlohmann::json::parse(read_text(in.out() / "strata-manifest.json"));
      CHECK(man["strata_container"] == 1);
      CHECK(man["shards"].size() == r.output_shards);
      for (const char* f : kSideFiles) CHECK(read_text(in.out() / f) == read_text(in.dir / f));
      CHECK(r.copied_files.size() == std::size(kSideFiles));
      CHECK(!fs::exists(in.out() / "expected.safetensors"));
      // The container loads.
      auto model = Model::load(in.out(), backends_named());
      for (const auto& L : model->layers()) {
        if (L.moe) CHECK(L.experts.experts[0].gate.format == fmt);
      }
    }
  }
}

TEST_CASE("dense formats: bf16 rounds to nearest even, q4_g64 quantizes like the experts") {
  InputDir in("glm_moe_dsa-tiny-q4");  // F32 weights
  ConvertOptions o = options(in.dir, in.out("bf16"));
  o.dense = DenseFormat::BF16;
  convert_checkpoint(o);
  o.out = in.out("q4");
  o.dense = DenseFormat::Q4_G64;
  convert_checkpoint(o);
  const Container b(in.out("bf16")), q(in.out("q4"));
  SafetensorsFile src(in.dir / "model.safetensors");
  for (const auto& name_info : src.tensors()) {
    const auto& name = name_info.first;  // (no binding: clang 14 cannot capture one)
    const auto& info = name_info.second;
    CAPTURE(name);
    const TensorRole role = tensor_role(name, info.shape.size());
    const auto w = to_f32(src.data(info), info.dtype, info.numel());
    if (role == TensorRole::Dense2D) {
      REQUIRE(b.info(name).dtype == DType::BF16);
      bool same = true;
      for (int64_t i = 0; i < info.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, b.data(name) + 2 * i, 2);
        same = same && h == bf16_rne_ref(w[static_cast<size_t>(i)]);
      }
      CHECK(same);
      REQUIRE(q.info(name).dtype == DType::U8);
      const QuantizedMatrix ref = quantize_q4(w, info.shape[0], info.shape[1], WeightFormat::Q4_G64);
      CHECK(std::memcmp(q.data(name), ref.packed.data(), ref.packed.size()) == 0);
      CHECK(std::memcmp(q.data(name + ".qs"), ref.scales.data(), ref.scales.size() * 4) == 0);
    } else if (role == TensorRole::KeepFloat || role == TensorRole::F32) {
      CHECK(b.info(name).dtype == DType::F32);  // embedding, lm_head, kv_b_proj keep their dtype
      CHECK(q.info(name).dtype == DType::F32);
    }
  }
  // bf16 dense weights load and run.
  auto model = Model::load(in.out("bf16"), backends_named());
  const Expected ex = load_expected(fixtures_dir() / "glm_moe_dsa-tiny-q4");
  const auto l = run_logits(model, ex.sequence);
  REQUIRE(l.size() == ex.logits.size());
  CHECK(std::all_of(l.begin(), l.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("sharded output, interruption and resumption: same bytes, recorded shards skipped") {
  // Input in three shards: embeddings alone first (they fill exactly the first output shard), one expert
  // split across shards 1 and 2 (held until complete).
  const std::string split = "model.layers.1.mlp.experts.3.";
  auto shard_of = [&](const std::string& n) {
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight") return 0;
    if (n.starts_with(split)) return n.find("gate_proj") != std::string::npos ? 1 : 2;
    return n < "model.layers.1.mlp.experts.3" ? 1 : 2;
  };
  InputDir in("qwen3_moe-tiny", nullptr, 3, shard_of);
  ConvertOptions o = options(in.dir, in.out("whole"));
  o.shard_bytes = 256 << 10;
  const ConvertResult whole = convert_checkpoint(o);
  REQUIRE(whole.output_shards >= 4);
  CHECK(whole.input_shards == 3);
  {
    const Container c(in.out("whole"));
    for (const char* p :
         {"gate_proj.weight", "gate_proj.weight.qs", "up_proj.weight", "down_proj.weight.qs"}) {
      CHECK(c.file(split + p) == c.file(split + "gate_proj.weight"));
    }
  }

  const fs::path out = in.out("resumed"), partial = out.string() + ".partial";
  o.out = out;
  o.stop_after_shards = 2;
  CHECK_THROWS_WITH_AS(convert_checkpoint(o), doctest::Contains("stopped after 2 output shard(s)"), Error);
  CHECK(!fs::exists(out));
  REQUIRE(fs::exists(partial / "convert-journal.json"));
  CHECK(!fs::exists(partial / "strata-manifest.json"));
  const auto journal = nlohmann::json::parse(read_text(partial / "convert-journal.json"));
  REQUIRE(journal["done"].size() == 2);
  CHECK(journal["done"][0]["inputs"] == nlohmann::json::array({"model-00001-of-00003.safetensors"}));

  // Other arguments cannot resume it.
  ConvertOptions other = o;
  other.experts = WeightFormat::Q4_ROW;
  other.stop_after_shards = 0;
  CHECK_THROWS_WITH_AS(convert_checkpoint(other), doctest::Contains("cannot be resumed with these arguments"),
                       Error);
  CHECK(fs::exists(partial / "convert-journal.json"));

  // A recorded shard that was damaged afterwards is written again; intact ones are kept.
  o.stop_after_shards = 0;
  std::vector<std::string> progress;
  o.progress = [&](const ConvertProgress& p) {
    if (p.stage == ConvertProgress::Stage::ShardReused) progress.push_back("reused " + p.shard);
    if (p.stage == ConvertProgress::Stage::ShardWritten) progress.push_back("written " + p.shard);
  };
  const ConvertResult resumed = convert_checkpoint(o);
  CHECK(resumed.output_shards_reused == 2);
  CHECK(resumed.input_shards_skipped == 1);
  REQUIRE(progress.size() == whole.output_shards);
  CHECK(progress[0].starts_with("reused model-00001-of-"));
  CHECK(progress[2].starts_with("written model-00003-of-"));
  CHECK(!fs::exists(partial));
  const auto a = folder_bytes(in.out("whole")), b = folder_bytes(out);
  CHECK(a.size() == b.size());
  for (const auto& name_bytes : a) {
    const auto& name = name_bytes.first;  // (no binding: clang 14 cannot capture one)
    const auto& bytes = name_bytes.second;
    CAPTURE(name);
    REQUIRE(b.count(name) == 1);
    CHECK((bytes == b.at(name)));
  }

  // Interrupted again; then a recorded shard is truncated: it is redone, the other one kept.
  const fs::path out2 = in.out("damaged"), partial2 = out2.string() + ".partial";
  o.out = out2;
  o.progress = nullptr;
  o.stop_after_shards = 2;
  CHECK_THROWS_AS(convert_checkpoint(o), Error);
  const std::string first =
      nlohmann::json::parse(read_text(partial2 / "convert-journal.json"))["done"][0]["file"];
  fs::resize_file(partial2 / first, 1000);
  o.stop_after_shards = 0;
  const ConvertResult redone = convert_checkpoint(o);
  CHECK(redone.output_shards_reused == 1);
  CHECK(folder_bytes(out2) == a);
}

TEST_CASE("FP8 e4m3 with 128x128 block scales: dense to BF16, experts to int4, split experts held") {
  // Every 2-D weight but the embedding, lm_head and router becomes FP8 with a per-128×128-block scale_inv.
  std::map<std::string, std::vector<float>> dequantized;  // what the converter must see: fp8 × scale, in f32
  auto edit = [&](std::vector<TensorToWrite>& ts, std::vector<std::vector<std::byte>>& keep) {
    keep.reserve(ts.size() * 2 + 2);
    std::vector<TensorToWrite> added;
    for (auto& t : ts) {
      const TensorRole role = tensor_role(t.name, t.shape.size());
      if (t.shape.size() != 2 || t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight" ||
          role == TensorRole::F32) {
        continue;
      }
      const int64_t O = t.shape[0], I = t.shape[1], so = (O + 127) / 128, si = (I + 127) / 128;
      const auto w = to_f32(t.bytes.data(), t.dtype, O * I);
      std::vector<float> scale(static_cast<size_t>(so * si));
      for (int64_t bo = 0; bo < so; ++bo) {
        for (int64_t bi = 0; bi < si; ++bi) {
          float amax = 0;
          for (int64_t o = bo * 128; o < std::min(O, bo * 128 + 128); ++o)
            for (int64_t i = bi * 128; i < std::min(I, bi * 128 + 128); ++i)
              amax = std::max(amax, std::fabs(w[o * I + i]));
          scale[bo * si + bi] = amax > 0 ? amax / 448.0f : 1.0f;
        }
      }
      std::vector<std::byte> q(static_cast<size_t>(O * I));
      std::vector<float> deq(static_cast<size_t>(O * I));
      for (int64_t o = 0; o < O; ++o) {
        for (int64_t i = 0; i < I; ++i) {
          const float s = scale[(o / 128) * si + i / 128];
          const uint8_t c = e4m3_encode(w[o * I + i] / s);
          q[o * I + i] = static_cast<std::byte>(c);
          deq[o * I + i] = e4m3_ref(c) * s;
        }
      }
      dequantized[t.name] = deq;
      keep.push_back(std::move(q));
      t.dtype = DType::F8_E4M3;
      t.bytes = keep.back();
      keep.emplace_back(scale.size() * 4);
      std::memcpy(keep.back().data(), scale.data(), scale.size() * 4);
      added.push_back({t.name + "_scale_inv", DType::F32, {so, si}, keep.back()});
    }
    ts.insert(ts.end(), added.begin(), added.end());
  };
  // Two input shards: expert 5 of layer 2 split (gate in the first), one weight's scale in the other shard.
  auto shard_of = [](const std::string& n) {
    if (n.starts_with("model.layers.2.mlp.experts.5."))
      return n.find("gate_proj") != std::string::npos ? 0 : 1;
    if (n == "model.layers.1.self_attn.o_proj.weight_scale_inv") return 1;
    return n < "model.layers.2" ? 0 : 1;
  };
  InputDir in("deepseek_v3-tiny", edit, 2, shard_of);
  REQUIRE(dequantized.count("model.layers.1.self_attn.kv_b_proj.weight") == 1);
  const ConvertResult r = convert_checkpoint(options(in.dir, in.out()));
  CHECK(r.input_shards == 2);
  const Container c(in.out());
  for (const auto& name_t : c.tensors) CHECK_MESSAGE(!name_t.first.ends_with("_scale_inv"), name_t.first);
  int dense = 0, experts = 0;
  for (const auto& name_deq : dequantized) {
    const auto& name = name_deq.first;  // (no binding: clang 14 cannot capture one)
    const auto& deq = name_deq.second;
    CAPTURE(name);
    const TensorRole role = tensor_role(name, 2);
    const TensorInfo& o = c.info(name);
    if (role == TensorRole::RoutedExpert) {
      REQUIRE(o.dtype == DType::U8);
      const QuantizedMatrix ref =
          quantize_q4(deq, o.shape[0], static_cast<int64_t>(deq.size()) / o.shape[0], WeightFormat::Q4_G64);
      CHECK(std::memcmp(c.data(name), ref.packed.data(), ref.packed.size()) == 0);
      CHECK(std::memcmp(c.data(name + ".qs"), ref.scales.data(), ref.scales.size() * 4) == 0);
      ++experts;
    } else {
      REQUIRE(o.dtype == DType::BF16);
      bool same = true;
      for (size_t i = 0; i < deq.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, c.data(name) + 2 * i, 2);
        same = same && h == bf16_rne_ref(deq[i]);
      }
      CHECK(same);
      ++dense;
    }
  }
  CHECK(dense > 10);
  CHECK(experts == 3 * r.experts);
  const std::string e5 = "model.layers.2.mlp.experts.5.";
  CHECK(c.file(e5 + "gate_proj.weight") == c.file(e5 + "down_proj.weight.qs"));
  CHECK(c.info(e5 + "up_proj.weight").offset ==
        c.info(e5 + "gate_proj.weight.qs").offset + c.info(e5 + "gate_proj.weight.qs").nbytes);
  // It loads and runs (FP8 rounding changes the logits, so only sanity here).
  auto model = Model::load(in.out(), backends_named());
  const auto l = run_logits(model, {1, 2, 3, 4});
  CHECK(std::all_of(l.begin(), l.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("errors name what was wrong and what was expected") {
  SUBCASE("missing config.json") {
    InputDir in("qwen3_moe-tiny");
    fs::remove(in.dir / "config.json");
    CHECK_THROWS_WITH_AS(
        convert_checkpoint(options(in.dir, in.out())),
        doctest::Contains(("[convert] " + in.dir.string() + ": config.json is missing").c_str()), Error);
    CHECK(!fs::exists(in.out().string() + ".partial"));
  }
  SUBCASE("unknown model_type") {
    InputDir in("qwen3_moe-tiny");
    write_text(in.dir / "config.json", R"({"model_type": "gpt2", "hidden_size": 8})");
    CHECK_THROWS_WITH_AS(convert_checkpoint(options(in.dir, in.out())),
                         doctest::Contains("model_type 'gpt2' is not supported"), Error);
  }
  SUBCASE("missing shard named by the index") {
    InputDir in("qwen3_moe-tiny", nullptr, 2,
                [](const std::string& n) { return n < "model.layers.1" ? 0 : 1; });
    fs::remove(in.dir / "model-00002-of-00002.safetensors");
    CHECK_THROWS_WITH_AS(convert_checkpoint(options(in.dir, in.out())),
                         doctest::Contains("shard 'model-00002-of-00002.safetensors' named for tensor"),
                         Error);
    CHECK_THROWS_WITH_AS(convert_checkpoint(options(in.dir, in.out())), doctest::Contains("[convert]"),
                         Error);
    CHECK(!fs::exists(in.out().string() + ".partial"));
  }
  SUBCASE("unsupported dtype") {
    std::vector<std::byte> ints(64 * 4);
    InputDir in("qwen3_moe-tiny", [&](auto& ts, auto&) {
      ts.push_back({"model.layers.0.mlp.weird.weight", DType::I32, {8, 8}, ints});
    });
    CHECK_THROWS_WITH_AS(
        convert_checkpoint(options(in.dir, in.out())),
        doctest::Contains("model.safetensors: tensor 'model.layers.0.mlp.weird.weight' has dtype I32; "
                          "expected BF16, F16, F32, or F8_E4M3"),
        Error);
  }
  SUBCASE("FP8 without its scale_inv") {
    std::vector<std::byte> q(64 * 128, std::byte{0x38});
    InputDir in("qwen3_moe-tiny", [&](auto& ts, auto&) {
      for (auto& t : ts) {
        if (t.name == "model.layers.0.self_attn.k_proj.weight") {
          t.dtype = DType::F8_E4M3;
          t.bytes = q;
        }
      }
    });
    CHECK_THROWS_WITH_AS(
        convert_checkpoint(options(in.dir, in.out())),
        doctest::Contains("FP8 (F8_E4M3) weight 'model.layers.0.self_attn.k_proj.weight' [64, 128] has no "
                          "block-scale tensor 'model.layers.0.self_attn.k_proj.weight_scale_inv' "
                          "(expected F32 [1, 1]"),
        Error);
  }
  SUBCASE("an existing container needs --force; --force replaces it") {
    InputDir in("qwen3_moe-tiny");
    convert_checkpoint(options(in.dir, in.out()));
    CHECK_THROWS_WITH_AS(
        convert_checkpoint(options(in.dir, in.out())),
        doctest::Contains("is already a strata container (it has strata-manifest.json); pass --force"),
        Error);
    ConvertOptions o = options(in.dir, in.out());
    o.force = true;
    o.experts = WeightFormat::Q4_ROW;
    const ConvertResult r = convert_checkpoint(o);
    CHECK(r.replaced_existing);
    CHECK(nlohmann::json::parse(read_text(in.out() / "config.json"))["strata_container"]["experts"] ==
          "q4_row");
    for (const auto& e : fs::directory_iterator(in.tmp.path())) {
      CHECK(e.path().filename().string().find(".old-") == std::string::npos);
    }
  }
  SUBCASE("an existing folder that is not a container is never touched") {
    InputDir in("qwen3_moe-tiny");
    fs::create_directories(in.out());
    write_text(in.out() / "precious.txt", "keep me");
    for (bool force : {false, true}) {
      ConvertOptions o = options(in.dir, in.out());
      o.force = force;
      CHECK_THROWS_WITH_AS(convert_checkpoint(o), doctest::Contains("exists and is not a strata container"),
                           Error);
    }
    CHECK(read_text(in.out() / "precious.txt") == "keep me");
    CHECK(!fs::exists(in.out().string() + ".partial"));
  }
  SUBCASE("a stray .partial folder that is not ours") {
    InputDir in("qwen3_moe-tiny");
    fs::create_directories(in.out().string() + ".partial");
    write_text(fs::path(in.out().string() + ".partial") / "x", "x");
    CHECK_THROWS_WITH_AS(convert_checkpoint(options(in.dir, in.out())),
                         doctest::Contains("is not a strata conversion in progress"), Error);
  }
  SUBCASE("two conversions never share a .partial folder") {
    InputDir in("qwen3_moe-tiny");
    const fs::path partial = in.out().string() + ".partial";
    fs::create_directories(partial);
    const int fd = ::open(partial.c_str(), O_RDONLY | O_DIRECTORY);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK_THROWS_WITH_AS(convert_checkpoint(options(in.dir, in.out())),
                         doctest::Contains("is being written by another strata convert"), Error);
    ::close(fd);
    convert_checkpoint(options(in.dir, in.out()));
    CHECK(fs::exists(in.out() / "strata-manifest.json"));
  }
  SUBCASE("a cancel request (Ctrl-C) stops between tensors and the rerun resumes") {
    InputDir in("qwen3_moe-tiny");
    std::atomic<bool> cancel{false};
    ConvertOptions o = options(in.dir, in.out());
    o.shard_bytes = 256 << 10;
    o.cancel = &cancel;
    o.progress = [&](const ConvertProgress& p) {
      if (p.stage == ConvertProgress::Stage::ShardWritten) cancel = true;
    };
    CHECK_THROWS_WITH_AS(convert_checkpoint(o),
                         doctest::Contains("interrupted; 1 output shard(s) are recorded"), Error);
    CHECK(!fs::exists(in.out()));
    cancel = false;
    o.progress = nullptr;
    CHECK(convert_checkpoint(o).output_shards_reused == 1);
  }
  SUBCASE("names of formats") {
    CHECK_THROWS_WITH_AS(parse_dense_format("fp8"), doctest::Contains("expected keep, bf16 or q4_g64"),
                         Error);
    CHECK(parse_dense_format("bf16") == DenseFormat::BF16);
  }
}

TEST_CASE("strata convert on the command line: plain progress lines, resume, errors with exit 1") {
  InputDir in("glm_moe_dsa-tiny-q4");
  const std::string args =
      " convert --in '" + in.dir.string() + "' --out '" + in.out().string() + "' --shard-size-mb 1";
  std::string out;
  REQUIRE(run_command("STRATA_CONVERT_STOP_AFTER_SHARDS=1 " + bin() + args, &out) == 1);
  CHECK(out.find("[convert] shard 1/") != std::string::npos);
  CHECK(out.find("strata: [convert] stopped after 1 output shard(s)") != std::string::npos);
  CHECK(out.find('\r') == std::string::npos);  // not a terminal: no redrawn bar
  REQUIRE(run_command(bin() + args, &out) == 0);
  CHECK(out.find("kept from the interrupted run") != std::string::npos);
  CHECK(out.find("resumed: 1 output shard(s) kept") != std::string::npos);
  CHECK(out.find("peak RSS") != std::string::npos);
  CHECK(fs::exists(in.out() / "strata-manifest.json"));
  REQUIRE(run_command(bin() + args, &out) == 1);
  CHECK(out.find("strata: [convert] ") != std::string::npos);
  CHECK(out.find("pass --force") != std::string::npos);
  REQUIRE(run_command(bin() + args + " --format q4_k", &out) == 1);
  CHECK(out.find("strata: [convert] --format 'q4_k' is not supported (expected q4_g64 or q4_row)") !=
        std::string::npos);
  // A write failure (here: the file size limit, EFBIG) is reported with its errno text; nothing looks
  // finished.
  const std::string limited =
      " convert --in '" + in.dir.string() + "' --out '" + in.out("limited").string() + "'";
  REQUIRE(run_command("sh -c \"trap '' XFSZ; ulimit -f 256; exec " + bin() + limited + "\"", &out) == 1);
  CHECK(out.find("write failed after") != std::string::npos);
  CHECK(out.find("File too large") != std::string::npos);
  CHECK(!fs::exists(in.out("limited")));
  CHECK(!fs::exists(in.out("limited").string() + ".partial/strata-manifest.json"));
}
