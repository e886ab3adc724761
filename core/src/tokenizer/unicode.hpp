// UTF-8 and Unicode helpers for the tokenizer: validation, lossy repair as Rust does it, character classes,
// normalization forms (utf8proc) and lowercasing.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata::tok {

// Decodes the code point at s[i] of valid UTF-8 and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Byte length of the character whose (valid) lead byte is b.
inline size_t utf8_char_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// Offset of the first byte that is not part of valid UTF-8, or std::string_view::npos when all of s is valid.
size_t find_invalid_utf8(std::string_view s);
// Rust's String::from_utf8_lossy: every maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Length of the longest prefix of `bytes` that does not end inside a truncated (so far valid, incomplete)
// character: what a streaming decoder may emit now.
size_t utf8_complete_prefix(std::string_view bytes);

bool is_white_space(char32_t c);  // Unicode White_Space (Rust char::is_whitespace, regex \s)
bool is_word_char(char32_t c);    // Unicode \w: letters, marks, decimal digits, connector punctuation
bool is_numeric(char32_t c);      // Rust char::is_numeric: general category Nd, Nl or No

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);
// Per-character full lowercase mapping (Rust char::to_lowercase; no context-dependent final sigma).
std::string lowercase(std::string_view s);

}  // namespace strata::tok
