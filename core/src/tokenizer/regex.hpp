// PCRE2 (UTF + Unicode properties, JIT when available) regular expressions for tokenizer.json patterns,
// iterated the way `tokenizers` iterates its Oniguruma matches.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::tok {

class Regex {
 public:
  // `where` names the tokenizer.json field the pattern came from, for error messages.
  Regex(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches [begin, end) of valid UTF-8 `s`, left to right; an empty match right where the
  // previous match ended is skipped (one character forward), as the onig crate's find_iter does.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  // `literal` as a pattern that matches exactly it (what regex::escape does for Split/Replace String
  // patterns).
  static std::string escape(std::string_view literal);

 private:
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
  std::string where_;
};

}  // namespace strata::tok
