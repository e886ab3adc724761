// Chat templates: renders a model's own Jinja `chat_template` (tokenizer_config.json) with a small
// interpreter for the subset real templates use.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace strata {

class ChatTemplate {
 public:
  // Parses the template source; unsupported constructs are errors naming the construct and its line.
  explicit ChatTemplate(std::string source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // From tokenizer_config.json: its "chat_template" (a string, or a list of {name, template} where "default"
  // is taken), with bos_token / eos_token made available to the template as the model defines them.
  // Without a "chat_template" key, chat_template.jinja beside the file is used (newer transformers save it
  // so).
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& tokenizer_config_json);
  // Sets the special tokens the template sees (an empty optional leaves the variable undefined, as
  // transformers does for a token the tokenizer does not have).
  void set_special_tokens(std::optional<std::string> bos_token, std::optional<std::string> eos_token);

  // messages: [{"role": ..., "content": ...}, ...] (content may also be a list of
  // {"type":"text","text":...}). The context also holds add_generation_prompt, bos_token, eos_token, and
  // every key of `extra` (e.g. tools, enable_thinking). Runtime errors (raise_exception, type errors) name
  // the template line.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with insertion-ordered objects: nlohmann::json sorts object keys, so a template that prints a
  // dict
  // (`tool | tojson`) sees them sorted; ordered_json keeps the caller's order, as Python dicts do.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
