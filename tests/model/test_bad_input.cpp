// Bad checkpoints: each gives an error naming the file, the tensor and what was expected.
#include "strata/error.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

// A copy of a fixture whose model.safetensors is rewritten through `edit` (tensor list in, tensor list out).
struct EditedCopy {
  TempDir tmp;
  explicit EditedCopy(
      const char* fixture,
      const std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<std::byte>>&)>& edit) {
    const fs::path src = fixtures_dir() / fixture;
    fs::copy(src / "config.json", tmp.path() / "config.json");
    SafetensorsFile f(src / "model.safetensors");
    std::vector<TensorToWrite> ts;
    std::vector<std::vector<std::byte>> keep;
    for (const auto& [name, info] : f.tensors()) {
      ts.push_back({name, info.dtype, info.shape, std::span(f.data(info), info.nbytes)});
    }
    edit(ts, keep);
    write_safetensors(tmp.path() / "model.safetensors", ts);
  }
  const fs::path& path() const { return tmp.path(); }
};

void load(const fs::path& dir) {
  (void)Model::load(dir, backends_named());
}

}  // namespace

TEST_CASE("missing config.json and unknown model_type") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(load(tmp.path()), doctest::Contains("config.json: missing"), Error);
  CHECK_THROWS_WITH_AS(load(tmp.path() / "nope"), doctest::Contains("not a model directory"), Error);
  fs::copy(fixtures_dir() / "qwen3_moe-tiny" / "model.safetensors", tmp.path() / "model.safetensors");
  write_text(tmp.path() / "config.json", R"({"model_type": "gpt2", "hidden_size": 8})");
  CHECK_THROWS_WITH_AS(load(tmp.path()),
                       doctest::Contains("model_type 'gpt2' is not supported (expected qwen3_moe"), Error);
}

TEST_CASE("truncated safetensors names the file and the tensor") {
  TempDir tmp;
  fs::copy(fixtures_dir() / "qwen3_moe-tiny" / "config.json", tmp.path() / "config.json");
  const std::string bytes = read_text(fixtures_dir() / "qwen3_moe-tiny" / "model.safetensors");
  write_text(tmp.path() / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_WITH_AS(load(tmp.path()), doctest::Contains("model.safetensors: tensor '"), Error);
  CHECK_THROWS_WITH_AS(load(tmp.path()), doctest::Contains("truncated file?"), Error);
  fs::remove(tmp.path() / "model.safetensors");
  CHECK_THROWS_WITH_AS(load(tmp.path()), doctest::Contains("no *.safetensors files"), Error);
}

TEST_CASE("a missing tensor is named with the shape that was expected") {
  EditedCopy c("qwen3_moe-tiny", [](auto& ts, auto&) {
    std::erase_if(
        ts, [](const TensorToWrite& t) { return t.name == "model.layers.1.mlp.experts.7.up_proj.weight"; });
  });
  CHECK_THROWS_WITH_AS(
      load(c.path()),
      doctest::Contains("missing tensor 'model.layers.1.mlp.experts.7.up_proj.weight' (expected shape "
                        "[64, 128] for model_type qwen3_moe)"),
      Error);
}

TEST_CASE("a mis-shaped tensor is named with both shapes") {
  EditedCopy c("deepseek_v3-tiny", [](auto& ts, auto&) {
    for (auto& t : ts) {
      if (t.name == "model.layers.2.self_attn.kv_b_proj.weight") t.shape = {128, 128};
    }
  });
  CHECK_THROWS_WITH_AS(
      load(c.path()),
      doctest::Contains("tensor 'model.layers.2.self_attn.kv_b_proj.weight' has shape [128, 128], "
                        "expected [256, 64]"),
      Error);
}

TEST_CASE("a tensor of the wrong dtype is named") {
  EditedCopy c("qwen3_moe-tiny", [](auto& ts, auto& keep) {
    for (auto& t : ts) {
      if (t.name == "model.layers.0.self_attn.o_proj.weight") {
        keep.emplace_back(t.bytes.size() * 2);
        t.dtype = DType::I32;
        t.bytes = std::span<const std::byte>(keep.back());
      }
    }
  });
  CHECK_THROWS_WITH_AS(
      load(c.path()),
      doctest::Contains("tensor 'model.layers.0.self_attn.o_proj.weight' has dtype I32, expected F32, "
                        "BF16 or F16"),
      Error);
}

TEST_CASE("tied embeddings: lm_head may be absent when tie_word_embeddings is true") {
  EditedCopy c("qwen3_moe-tiny", [](auto& ts, auto&) {
    std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "lm_head.weight"; });
  });
  CHECK_THROWS_WITH_AS(load(c.path()), doctest::Contains("missing tensor 'lm_head.weight'"), Error);
  auto cfg = nlohmann::json::parse(read_text(c.path() / "config.json"));
  cfg["tie_word_embeddings"] = true;
  write_text(c.path() / "config.json", cfg.dump());
  auto m = Model::load(c.path(), backends_named());
  CHECK(m->lm_head().data == m->embedding().data);
  Session s(m);
  std::vector<int32_t> ids = {1, 2, 3};
  CHECK(s.forward(ids, false).size() == 512);
}
