// Model assets (tokenizer, chat template, generation_config.json) and incremental generation with stop
// strings.
#include "strata/generation.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/json_text.hpp"

namespace strata {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
void add_ids(const json& v, std::vector<int32_t>& out) {
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  if (v.is_array()) {
    for (const auto& e : v) {
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
    }
  }
}
}  // namespace

ModelAssets ModelAssets::load(const fs::path& dir, const ModelSpec& spec) {
  ModelAssets a;
  a.context_length = spec.max_positions;
  if (fs::exists(dir / "tokenizer.json")) a.tokenizer = Tokenizer::from_file(dir / "tokenizer.json");
  // The template comes from tokenizer_config.json (which also names bos/eos and falls back to a
  // chat_template.jinja beside it); a folder with only chat_template.jinja still gets its template.
  const bool has_jinja = fs::exists(dir / "chat_template.jinja");
  if (fs::exists(dir / "tokenizer_config.json")) {
    const json tc = parse_json_file(dir / "tokenizer_config.json", "model");
    if ((tc.contains("chat_template") && !tc["chat_template"].is_null()) || has_jinja) {
      a.chat_template =
          std::make_shared<ChatTemplate>(ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json"));
    }
  } else if (has_jinja) {
    a.chat_template = std::make_shared<ChatTemplate>(read_text_file(dir / "chat_template.jinja", "model"));
  }
  if (fs::exists(dir / "generation_config.json")) {
    const json g = parse_json_file(dir / "generation_config.json", "model");
    if (g.contains("eos_token_id")) add_ids(g["eos_token_id"], a.eos_ids);
    if (g.contains("temperature") && g["temperature"].is_number())
      a.defaults.temperature = g["temperature"].get<float>();
    if (g.contains("top_p") && g["top_p"].is_number()) a.defaults.top_p = g["top_p"].get<float>();
    if (g.contains("top_k") && g["top_k"].is_number_integer()) a.defaults.top_k = g["top_k"].get<int32_t>();
    if (g.contains("do_sample") && g["do_sample"].is_boolean() && !g["do_sample"].get<bool>())
      a.defaults.temperature = 0;
  }
  if (a.eos_ids.empty()) {
    for (int64_t id : spec.eos_ids) a.eos_ids.push_back(static_cast<int32_t>(id));
  }
  if (a.eos_ids.empty() && a.tokenizer && a.chat_template && !a.chat_template->eos_token().empty()) {
    const int32_t id = a.tokenizer->token_id(a.chat_template->eos_token());
    if (id >= 0) a.eos_ids.push_back(id);
  }
  return a;
}

const Tokenizer& ModelAssets::require_tokenizer() const {
  if (!tokenizer)
    fail("model", "this model folder has no tokenizer.json (text in and out needs one; use --ids)");
  return *tokenizer;
}

Generation::Generation(std::shared_ptr<const Tokenizer> tok, const SamplingParams& sampling,
                       std::vector<int32_t> eos_ids, std::vector<std::string> stop_strings, int64_t max_new)
    : tok_(std::move(tok)), sampler_(sampling), eos_(std::move(eos_ids)), max_new_(max_new) {
  for (auto& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
  if (tok_) decoder_.emplace(tok_, true);
  if (max_new_ <= 0) finish_reason_ = "length";
}

int32_t Generation::step(std::span<const float> logits) {
  if (done()) return -1;
  const int32_t id = sampler_.sample(logits);
  if (std::find(eos_.begin(), eos_.end(), id) != eos_.end()) {
    finish_reason_ = "stop";
    if (decoder_) held_ += decoder_->flush();
    text_ += held_;
    pending_ += held_;
    held_.clear();
    return -1;
  }
  ids_.push_back(id);
  if (decoder_) held_ += decoder_->push(id);
  // The earliest stop string in the text ends it where it begins.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    held_.resize(cut);
    finish_reason_ = "stop";
  }
  if (!done() && static_cast<int64_t>(ids_.size()) >= max_new_) {
    finish_reason_ = "length";
    if (decoder_) held_ += decoder_->flush();
  }
  // Release everything that cannot be the start of a stop string (the whole text once finished).
  size_t keep = 0;
  if (!done()) {
    for (const auto& s : stops_) {
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
  }
  const std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  text_ += out;
  pending_ += out;
  return done() && finish_reason_ == "stop" ? -1 : id;
}

std::string Generation::take_text() {
  std::string t;
  t.swap(pending_);
  return t;
}

}  // namespace strata
