// PCRE2 regular expressions for tokenizer.json patterns (see regex.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.hpp"

#include <pcre2.h>

#include "strata/error.hpp"
#include "unicode.hpp"

namespace strata::tok {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state shared by every pattern: match data (one pair suffices) and a JIT stack big enough
// for long runs of one character class.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (data == nullptr || context == nullptr) fail("tokenizer", "out of memory creating PCRE2 match data");
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  return state;
}

// Oniguruma (what `tokenizers` compiles patterns with) and PCRE2 disagree on some shorthand classes: PCRE2's
// \s also matches U+180E, its \w is \p{L}\p{N}_ rather than Unicode's word class, and Oniguruma's \h is a hex
// digit. Rewrites those escapes into explicit Unicode properties so that PCRE2 matches what onig matches.
std::string translate_onig(std::string_view p) {
  constexpr std::string_view kSpace = "\\p{White_Space}";
  constexpr std::string_view kWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
  constexpr std::string_view kHex = "0-9a-fA-F";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false, class_start = false, quoted = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (quoted) {  // \Q...\E: literal text
      if (c == '\\' && i + 1 < p.size() && p[i + 1] == 'E') quoted = false;
      out += c;
      continue;
    }
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      class_start = false;
      if (e == 'Q') quoted = true;
      if (e == 's') {
        out += kSpace;
      } else if (e == 'S') {
        out += "\\P{White_Space}";
      } else if (e == 'w') {
        out += in_class ? std::string(kWord) : "[" + std::string(kWord) + "]";
      } else if (e == 'W' && !in_class) {
        out += "[^" + std::string(kWord) + "]";
      } else if (e == 'h') {
        out += in_class ? std::string(kHex) : "[" + std::string(kHex) + "]";
      } else if (e == 'H' && !in_class) {
        out += "[^" + std::string(kHex) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
        const size_t end = p.find(":]", i + 2);
        if (end != std::string_view::npos) {
          out.append(p.substr(i, end + 2 - i));
          i = end + 1;
          class_start = false;
          continue;
        }
      }
      if (c == ']' && !class_start) in_class = false;
      class_start = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = true;  // a ']' right after '[' or '[^' is literal
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view where) : where_(where) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const std::string translated = translate_onig(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    fail("tokenizer",
         "{}: cannot compile the regex '{}': {} at offset {} (expected a PCRE2-compatible pattern)", where,
         pattern, pcre2_message(err), err_offset);
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = match_state();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= s.size()) {
    int rc = pcre2_match(code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
        rc == PCRE2_ERROR_HEAPLIMIT) {
      // Retry with the interpreter, which keeps its backtracking state on the heap.
      rc =
          pcre2_match(code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      fail("tokenizer", "{}: regex match failed on a {}-byte piece: {}", where_, s.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (b == e && have_last && last_match_end == e) {
      last_end += last_end < s.size() ? utf8_char_len(static_cast<unsigned char>(s[last_end])) : 1;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.emplace_back(b, e);
  }
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    const bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    if (u < 0x80 && !alnum && u != ' ' && u >= 0x20) out += '\\';  // a backslash before a symbol is literal
    out += c;
  }
  return out;
}

}  // namespace strata::tok
