// The text stages of a tokenizer.json before the model: normalizers (string → string) and pre-tokenizers
// (pieces → finer pieces), built from their JSON with the semantics of the `tokenizers` library.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits; empty pieces never come out.
  virtual void apply(std::vector<std::string>& pieces) const = 0;
};

// `where` is the JSON path used in error messages ("normalizer", "pre_tokenizer.pretokenizers[1]").
// A JSON null gives nullptr (no stage); an unsupported "type" is a strata::Error naming the field and type.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);

// GPT-2's byte → printable character table (ByteLevel): the UTF-8 of the character standing for each byte,
// and the inverse (code point → byte, or -1).
const std::string& byte_level_char(unsigned char b);
int byte_level_byte(char32_t cp);

}  // namespace strata::tok
