// Fuzz target: the chat-template interpreter. Even first byte: the rest is a template source, rendered with a
// fixed conversation. Odd first byte: the rest is a messages array (JSON, as an HTTP client sends it),
// rendered by every real-model template of the fixtures and the bundled model's.
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "strata/chat_template.hpp"

namespace {

using ojson = nlohmann::ordered_json;

const std::vector<strata::ChatTemplate>& model_templates() {
  static const auto all = [] {
    std::vector<strata::ChatTemplate> v;
    const auto src = strata_fuzz::source_dir();
    for (const char* rel :
         {"tests/fixtures/chat_templates/qwen3.jinja", "tests/fixtures/chat_templates/deepseek_v3.jinja",
          "tests/fixtures/chat_templates/deepseek_r1.jinja",
          "tests/fixtures/chat_templates/deepseek_v3_1.jinja", "tests/fixtures/chat_templates/glm4_5.jinja",
          "tests/fixtures/chat_templates/glm4_6.jinja", "tests/fixtures/chat_templates/glm4_7.jinja",
          "tests/fixtures/chat_templates/kimi_k2_thinking.jinja", "models/strata-nano/chat_template.jinja"}) {
      std::ifstream in(src / rel);
      if (!in) {
        std::fprintf(stderr, "chat_template: cannot read %s\n", (src / rel).c_str());
        std::abort();
      }
      v.emplace_back(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
      v.back().set_special_tokens("<s>", "</s>");
    }
    return v;
  }();
  return all;
}

const ojson& fixed_messages() {
  static const ojson m = ojson::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello.", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": [{"type": "text", "text": "and?"}]}])");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool messages_mode = (data[0] & 1) != 0;
  const bool gen = (data[0] & 2) != 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!messages_mode) {
    strata_fuzz::expect_clean("chat_template", [&] {
      strata::ChatTemplate t(rest);
      t.set_special_tokens("<s>", "</s>");
      (void)t.render(fixed_messages(), gen, ojson{{"tools", ojson::array()}, {"enable_thinking", false}});
    });
    return 0;
  }
  const ojson messages = ojson::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded()) return 0;  // not JSON: the server answers 400 before any template runs
  for (const auto& t : model_templates())
    strata_fuzz::expect_clean("chat_template", [&] { (void)t.render(messages, gen); });
  return 0;
}
