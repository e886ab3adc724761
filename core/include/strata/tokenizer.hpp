// Tokenizer from a Hugging Face tokenizer.json (byte-level BPE), and a streaming detokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// A byte-level BPE tokenizer as the `tokenizers` library defines it: normalizer (NFC), pre-tokenizer split
// regex (PCRE2, Unicode properties) + ByteLevel, BPE merges, added/special tokens matched before splitting,
// ByteLevel decoder. Unsupported tokenizer.json features are errors naming the feature. Immutable and
// thread-safe after construction.
class Tokenizer {
 public:
  static std::shared_ptr<const Tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  virtual ~Tokenizer() = default;

  // Text → ids. Added tokens (special or not) that appear literally in the text map to their ids;
  // add_special_tokens applies the post-processor's BOS/EOS template when tokenizer.json has one.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const = 0;
  // Ids → text (invalid UTF-8 from a partial sequence is replaced by U+FFFD, as `tokenizers` does).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const = 0;
  // The raw bytes a single id stands for (after the ByteLevel mapping is undone); "" for out-of-range ids.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Id of a token string as written in the vocabulary or added tokens ("<|im_end|>"), or -1.
  virtual int32_t token_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual size_t vocab_size() const = 0;  // including added tokens
};

// Turns generated ids into text as they arrive, never emitting half a UTF-8 character: bytes of an incomplete
// character are held until it completes (or flushed as U+FFFD at the end).
class StreamDecoder {
 public:
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens = true);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace strata
