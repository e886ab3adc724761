// What a model folder brings besides weights (tokenizer, chat template, EOS, default sampling) and the
// incremental generation of one sequence with EOS, stop strings, max tokens and streaming-safe text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/chat_template.hpp"
#include "strata/model_spec.hpp"
#include "strata/sampling.hpp"
#include "strata/tokenizer.hpp"

namespace strata {

struct ModelAssets {
  std::shared_ptr<const Tokenizer> tokenizer;         // null when the folder has no tokenizer.json
  std::shared_ptr<const ChatTemplate> chat_template;  // null when tokenizer_config.json has none
  std::vector<int32_t> eos_ids;  // generation_config.json, else config.json, else the template's eos
  SamplingParams defaults;       // generation_config.json (temperature, top_k, top_p)
  int64_t context_length = 0;    // max_position_embeddings

  // Reads what is present; malformed files are errors naming the file and the field.
  static ModelAssets load(const std::filesystem::path& dir, const ModelSpec& spec);
  // The tokenizer, or an error saying the model folder has none.
  const Tokenizer& require_tokenizer() const;
};

// One sequence being generated. Feed it the logits of the last position; it samples, decides when to stop
// (EOS id, a stop string in the text, max_new), and releases text only when it can no longer be part of a
// stop string and is whole UTF-8. Not thread-safe.
class Generation {
 public:
  Generation(std::shared_ptr<const Tokenizer> tok, const SamplingParams& sampling,
             std::vector<int32_t> eos_ids, std::vector<std::string> stop_strings, int64_t max_new);

  // Samples the next id from logits and records it. Returns the id, or -1 once the generation is finished
  // (the EOS id itself is not part of the output).
  int32_t step(std::span<const float> logits);
  // Text that became final since the last call.
  std::string take_text();
  bool done() const { return !finish_reason_.empty(); }
  // "stop" (EOS or a stop string), "length" (max_new), "cancelled"; "" while running.
  const std::string& finish_reason() const { return finish_reason_; }
  void cancel() {
    if (finish_reason_.empty()) finish_reason_ = "cancelled";
  }
  const std::vector<int32_t>& ids() const { return ids_; }  // generated ids, without EOS
  const std::string& text() const { return text_; }         // all final text so far

 private:
  std::shared_ptr<const Tokenizer> tok_;
  Sampler sampler_;
  std::vector<int32_t> eos_;
  std::vector<std::string> stops_;
  int64_t max_new_;
  std::optional<StreamDecoder> decoder_;
  std::vector<int32_t> ids_;
  std::string held_;     // decoded but not yet released (may begin a stop string)
  std::string text_;     // released
  std::string pending_;  // released, not yet taken
  std::string finish_reason_;
};

}  // namespace strata
