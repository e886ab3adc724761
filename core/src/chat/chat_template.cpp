// ChatTemplate: a model's Jinja chat template, loaded from tokenizer_config.json and rendered the way
// transformers' apply_chat_template does (messages, tools, documents, add_generation_prompt, special tokens).
#include "strata/chat_template.hpp"

#include "ast.hpp"
#include "interpreter.hpp"
#include "strata/error.hpp"
#include "strata/json_text.hpp"
#include "value.hpp"

namespace strata {

struct ChatTemplate::Impl {
  std::string source;
  chat::Body body;
  std::optional<std::string> bos, eos;
  std::string bos_or_empty, eos_or_empty;
};

ChatTemplate::ChatTemplate(std::string source) : impl_(std::make_unique<Impl>()) {
  impl_->body = chat::parse_template(source);
  impl_->source = std::move(source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

void ChatTemplate::set_special_tokens(std::optional<std::string> bos_token,
                                      std::optional<std::string> eos_token) {
  impl_->bos = std::move(bos_token);
  impl_->eos = std::move(eos_token);
  impl_->bos_or_empty = impl_->bos.value_or("");
  impl_->eos_or_empty = impl_->eos.value_or("");
}

const std::string& ChatTemplate::bos_token() const {
  return impl_->bos_or_empty;
}
const std::string& ChatTemplate::eos_token() const {
  return impl_->eos_or_empty;
}

namespace {

// A special token as tokenizer_config.json writes it: a string, {"content": "..."} (AddedToken), or null.
std::optional<std::string> special_token(const nlohmann::ordered_json& cfg, const char* key,
                                         const std::filesystem::path& path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  fail("chat_template", "{}: '{}' must be a string or an object with a string \"content\", got {}",
       path.string(), key, it->dump());
}

template <class J>
std::string render_impl(const chat::Body& body, const std::optional<std::string>& bos,
                        const std::optional<std::string>& eos, const J& messages, bool add_generation_prompt,
                        const J& extra) {
  if (!messages.is_array())
    fail("chat_template", "messages must be a JSON array of {{\"role\", \"content\"}} objects, got {}",
         messages.type_name());
  if (!extra.is_object())
    fail("chat_template", "extra template variables must be a JSON object, got {}", extra.type_name());
  std::vector<std::pair<std::string, chat::Value>> ctx;
  ctx.emplace_back("messages", chat::from_json(messages));
  ctx.emplace_back("tools", chat::Value::none());
  ctx.emplace_back("documents", chat::Value::none());
  ctx.emplace_back("add_generation_prompt", chat::Value::boolean(add_generation_prompt));
  if (bos) ctx.emplace_back("bos_token", chat::Value::string(*bos));
  if (eos) ctx.emplace_back("eos_token", chat::Value::string(*eos));
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.key() == "messages" || it.key() == "add_generation_prompt")
      fail("chat_template", "extra variable '{}' would replace the render argument of that name", it.key());
    bool replaced = false;
    for (auto& [k, v] : ctx) {
      if (k == it.key()) {
        v = chat::from_json(it.value());
        replaced = true;
      }
    }
    if (!replaced) ctx.emplace_back(it.key(), chat::from_json(it.value()));
  }
  return chat::render_template(body, ctx);
}

}  // namespace

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& tokenizer_config_json) {
  const auto cfg = parse_json_file<nlohmann::ordered_json>(tokenizer_config_json, "chat_template");
  if (!cfg.is_object()) fail("chat_template", "{}: expected a JSON object", tokenizer_config_json.string());
  std::string source;
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) {
    const auto jinja = tokenizer_config_json.parent_path() / "chat_template.jinja";
    if (!std::filesystem::exists(jinja))
      fail("chat_template", "{} has no \"chat_template\" and there is no chat_template.jinja beside it",
           tokenizer_config_json.string());
    source = read_text_file(jinja, "chat_template");
  } else if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    std::string names;
    bool found = false;
    for (const auto& t : *it) {
      if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["name"].is_string() ||
          !t["template"].is_string())
        fail("chat_template",
             "{}: \"chat_template\" list entries must be {{\"name\": str, \"template\": str}}",
             tokenizer_config_json.string());
      const auto name = t["name"].get<std::string>();
      names += (names.empty() ? "" : ", ") + name;
      if (name == "default") {
        source = t["template"].get<std::string>();
        found = true;
      }
    }
    if (!found)
      fail("chat_template", "{}: \"chat_template\" has no template named \"default\" (it has: {})",
           tokenizer_config_json.string(), names);
  } else {
    fail("chat_template", "{}: \"chat_template\" must be a string or a list of {{name, template}}, got {}",
         tokenizer_config_json.string(), it->type_name());
  }
  ChatTemplate t(std::move(source));
  t.set_special_tokens(special_token(cfg, "bos_token", tokenizer_config_json),
                       special_token(cfg, "eos_token", tokenizer_config_json));
  return t;
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render_impl(impl_->body, impl_->bos, impl_->eos, messages, add_generation_prompt, extra);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  return render_impl(impl_->body, impl_->bos, impl_->eos, messages, add_generation_prompt, extra);
}

}  // namespace strata
