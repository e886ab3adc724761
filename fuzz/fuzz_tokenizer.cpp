// Fuzz target: the tokenizer on arbitrary text (encode) and arbitrary ids (decode, streaming decode), with
// the tokenizer.json fixtures of several real-model pipelines. Properties: ids in range; streaming decode, id
// by id, gives exactly decode(ids, skip_special_tokens = true).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "strata/tokenizer.hpp"

namespace {

const std::vector<std::shared_ptr<const strata::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    const auto src = strata_fuzz::source_dir();
    std::vector<std::shared_ptr<const strata::Tokenizer>> v;
    for (const char* rel : {"tests/fixtures/tokenizer-bpe/tokenizer.json",
                            "tests/fixtures/tokenizer-seq/deepseek_v3/tokenizer.json",
                            "tests/fixtures/tokenizer-seq/llama3_style/tokenizer.json",
                            "tests/fixtures/tokenizer-seq/split_behaviors/tokenizer.json",
                            "models/strata-nano/tokenizer.json", "tests/fixtures/chat-model/tokenizer.json"})
      v.push_back(strata::Tokenizer::from_file(src / rel));
    return v;
  }();
  return all;
}

void check_stream(const std::shared_ptr<const strata::Tokenizer>& tok, const std::vector<int32_t>& ids) {
  const std::string whole = tok->decode(ids, /*skip_special_tokens=*/true);
  strata::StreamDecoder sd(tok, /*skip_special_tokens=*/true);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  strata_fuzz::require(streamed == whole, "tokenizer", "streamed decode != decode(ids, skip_special_tokens)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto& toks = tokenizers();
  const auto& tok = toks[data[0] % toks.size()];
  const uint8_t flags = data[1];
  data += 2;
  size -= 2;
  strata_fuzz::expect_clean("tokenizer", [&] {
    std::vector<int32_t> ids;
    if ((flags & 1) == 0) {  // text → ids
      ids = tok->encode(std::string_view(reinterpret_cast<const char*>(data), size), (flags & 2) != 0);
      for (int32_t id : ids)
        strata_fuzz::require(id >= 0 && static_cast<size_t>(id) < tok->vocab_size(), "tokenizer",
                             "encode gave an id outside the vocabulary");
    } else {  // arbitrary ids, a few of them just outside the vocabulary on either side
      const auto span = static_cast<int64_t>(tok->vocab_size()) + 8;
      for (size_t i = 0; i + 2 <= size; i += 2) {
        uint16_t v;
        std::memcpy(&v, data + i, 2);
        ids.push_back(static_cast<int32_t>(static_cast<int64_t>(v) * 7919 % span) - 4);
      }
    }
    (void)tok->decode(ids, (flags & 4) != 0);
    bool in_range = true;
    for (int32_t id : ids) in_range = in_range && id >= 0 && static_cast<size_t>(id) < tok->vocab_size();
    if (in_range) check_stream(tok, ids);
  });
  return 0;
}
