// The bundled model (models/strata-nano): strata's tokenizer and greedy tokens equal what transformers and
// tokenizers produced for it on the GPU machine (tests/fixtures/strata-nano/expected.json, written by
// tools/train_bundled_model.py), mapped and streamed from disk; and `strata run` uses it without --model.
#include <doctest/doctest.h>

#include "strata/chat_template.hpp"
#include "strata/generation.hpp"
#include "strata/expert_store.hpp"
#include "strata/model.hpp"
#include "strata/tokenizer.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {
fs::path model_dir() { return fs::path(STRATA_SOURCE_DIR) / "models" / "strata-nano"; }
nlohmann::json expected() {
  return nlohmann::json::parse(read_text(fixtures_dir() / "strata-nano" / "expected.json"));
}
}  // namespace

TEST_CASE("bundled model: tokenizer ids and greedy continuations equal transformers'") {
  const auto ex = expected();
  const auto tokp = Tokenizer::from_file(model_dir() / "tokenizer.json");
  const Tokenizer& tok = *tokp;
  auto model = Model::load(model_dir(), backends_named());
  CHECK(model->spec().model_type == "glm_moe_dsa");
  StoreOptions streamed;
  streamed.ram_gb = 0.0;  // every routed expert read from disk through the minimum cache
  streamed.pin = "none";
  LoadOptions lo;
  lo.store = streamed;
  auto streamed_model = Model::load(model_dir(), backends_named(), lo);
  const int64_t n_new = ex["new_tokens"];
  for (const auto& p : ex["prompts"]) {
    const std::string name = p["name"];
    CAPTURE(name);
    const auto want_ids = p["ids"].get<std::vector<int32_t>>();
    CHECK(tok.encode(p["text"].get<std::string>(), true) == want_ids);
    const auto want = p["generated"].get<std::vector<int32_t>>();
    Session s(model);
    const auto got = generate_greedy(s, want_ids, n_new);
    CHECK(got == want);
    CHECK(tok.decode(got, false) == p["continuation"].get<std::string>());
    Session ss(streamed_model);
    CHECK(generate_greedy(ss, want_ids, n_new) == want);
  }
  // The long prompt is longer than index_topk (256): its decode uses the DSA indexer's sparse selection.
  CHECK(ex["prompts"].back()["ids"].size() > 256);
  CHECK(model->spec().index_topk == 256);
}

TEST_CASE("bundled model: the chat template renders the format it was trained on") {
  const ModelAssets a = ModelAssets::load(model_dir(), Model::load(model_dir(), backends_named())->spec());
  REQUIRE(a.chat_template);
  const auto ex = expected();
  for (const auto& p : ex["prompts"]) {
    if (p["name"] != "chat") continue;
    const std::string text = p["text"];
    // "[gMASK]<sop><|user|>\n...<|assistant|>\n" rendered by the training script's render_chat.
    const size_t u = text.find("<|user|>\n") + 9;
    const std::string user = text.substr(u, text.find("<|assistant|>") - u);
    const nlohmann::json msgs = nlohmann::json::array({{{"role", "user"}, {"content", user}}});
    CHECK(a.chat_template->render(msgs, true) == text);
  }
}

TEST_CASE("strata run without --model continues a Python prompt with the bundled model") {
  std::string out;
  const int rc =
      run_command(std::string(STRATA_BIN) + " run --prompt 'def fibonacci(n):' --max-new 32 --temperature 0", &out);
  REQUIRE(rc == 0);
  const auto ex = expected();
  for (const auto& p : ex["prompts"]) {
    if (p["name"] == "fibonacci") CHECK(out.find(p["continuation"].get<std::string>()) != std::string::npos);
  }
}
