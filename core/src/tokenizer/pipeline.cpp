// Normalizers and pre-tokenizers of tokenizer.json (see pipeline.hpp), following the `tokenizers` library:
// NormalizedString::split for the split behaviors, onig-style match iteration, the GPT-2 ByteLevel table.
#include "pipeline.hpp"

#include <algorithm>
#include <array>

#include "json_util.hpp"
#include "regex.hpp"
#include "unicode.hpp"

namespace strata::tok {
namespace {

using nlohmann::json;

// ---- byte-level table ----------------------------------------------------------------------------------

struct ByteLevelTable {
  std::array<std::string, 256> chars;
  std::array<int, 324> bytes;  // code points 0..323 → byte
  ByteLevelTable() {
    bytes.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(chars[b], cp);
      bytes[cp] = b;
    }
  }
};

const ByteLevelTable& table() {
  static const ByteLevelTable t;
  return t;
}

// ---- splitting (NormalizedString::split) ---------------------------------------------------------------

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct Span {
  size_t begin, end;
  bool flag;  // is_match before the behavior is applied, "remove" after
};

// Regex matches of s as (offsets, is_match) pieces covering all of s (Pattern::find_matches for a regex).
void regex_pieces(const Regex& re, std::string_view s, std::vector<Span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  re.find_all(s, matches);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
}

// Pieces of s by a character predicate (Pattern::find_matches for Fn(char) -> bool).
template <class Pred>
void char_pieces(Pred pred, std::string_view s, std::vector<Span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last_offset = 0, last_seen = 0, i = 0;
  while (i < s.size()) {
    const size_t b = i;
    const char32_t c = next_code_point(s, i);
    last_seen = i;
    if (pred(c)) {
      if (last_offset < b) out.push_back({last_offset, b, false});
      out.push_back({b, i, true});
      last_offset = i;
    }
  }
  if (last_seen > last_offset) out.push_back({last_offset, last_seen, false});
}

// Applies the split behavior to (offsets, is_match) pieces and appends the kept, non-empty slices of s.
void emit_split(std::string_view s, std::vector<Span>& m, Behavior behavior, std::vector<std::string>& out) {
  std::vector<Span> splits;
  splits.reserve(m.size());
  switch (behavior) {
    case Behavior::Isolated:
      for (const Span& p : m) splits.push_back({p.begin, p.end, false});
      break;
    case Behavior::Removed:
      splits = m;
      break;
    case Behavior::Contiguous: {
      bool previous_match = false;
      for (const Span& p : m) {
        if (p.flag == previous_match && !splits.empty()) {
          splits.back().end = p.end;
        } else {
          splits.push_back({p.begin, p.end, false});
        }
        previous_match = p.flag;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Span& p : m) {
        if (p.flag && !previous_match && !splits.empty()) {
          splits.back().end = p.end;
        } else {
          splits.push_back({p.begin, p.end, false});
        }
        previous_match = p.flag;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous_match = false;
      for (size_t k = m.size(); k-- > 0;) {
        const Span& p = m[k];
        if (p.flag && !previous_match && !splits.empty()) {
          splits.back().begin = p.begin;
        } else {
          splits.push_back({p.begin, p.end, false});
        }
        previous_match = p.flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const Span& p : splits) {
    if (!p.flag && p.end > p.begin) out.emplace_back(s.substr(p.begin, p.end - p.begin));
  }
}

// ---- normalizers ---------------------------------------------------------------------------------------

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm f) : form_(f) {}
  std::string apply(std::string s) const override { return normalize(s, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string apply(std::string s) const override { return lowercase(s); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!is_white_space(next_code_point(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_white_space(next_code_point(s, i))) break;
        e = start;
      }
    }
    return s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prefix_(std::move(p)) {}
  std::string apply(std::string s) const override { return s.empty() ? s : prefix_ + s; }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string_view pattern, std::string content, const std::string& where)
      : re_(pattern, where), content_(std::move(content)) {}
  std::string apply(std::string s) const override {
    std::vector<Span> m;
    regex_pieces(re_, s, m);
    std::string out;
    out.reserve(s.size());
    for (const Span& p : m) {
      if (p.flag) {
        out += content_;
      } else {
        out.append(s, p.begin, p.end - p.begin);
      }
    }
    return out;
  }

 private:
  Regex re_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string apply(std::string s) const override {
    for (const auto& p : parts_) s = p->apply(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// A {"String": s} or {"Regex": r} pattern as a regex source.
std::string pattern_source(const json& j, const std::string& where) {
  const json& p = require(j, "pattern", where);
  if (p.is_object()) {
    if (const json* s = field(p, "String"); s != nullptr && s->is_string())
      return Regex::escape(s->get<std::string>());
    if (const json* r = field(p, "Regex"); r != nullptr && r->is_string()) return r->get<std::string>();
  }
  fail("tokenizer", "{}.pattern is {} (expected {{\"String\": ...}} or {{\"Regex\": ...}})", where, p.dump());
}

// ---- pre-tokenizers ------------------------------------------------------------------------------------

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Regex, where + " (the GPT-2 regex)");
  }
  void apply(std::vector<std::string>& pieces) const override {
    std::vector<std::string> split;
    if (add_prefix_space_ || re_) {
      std::vector<Span> m;
      split.reserve(pieces.size());
      for (std::string& p : pieces) {
        if (add_prefix_space_ && !p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
        if (re_) {
          regex_pieces(*re_, p, m);
          emit_split(p, m, Behavior::Isolated, split);
        } else if (!p.empty()) {
          split.push_back(std::move(p));
        }
      }
    } else {
      split = std::move(pieces);
    }
    const ByteLevelTable& t = table();
    pieces.clear();
    pieces.reserve(split.size());
    for (const std::string& p : split) {
      std::string mapped;
      mapped.reserve(p.size() * 2);
      for (char c : p) mapped += t.chars[static_cast<unsigned char>(c)];
      pieces.push_back(std::move(mapped));
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string_view pattern, Behavior b, bool invert, const std::string& where)
      : re_(pattern, where + ".pattern"), behavior_(b), invert_(invert) {}
  void apply(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    std::vector<Span> m;
    for (const std::string& p : pieces) {
      regex_pieces(re_, p, m);
      if (invert_) {
        for (Span& s : m) s.flag = !s.flag;
      }
      emit_split(p, m, behavior_, out);
    }
    pieces = std::move(out);
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void apply(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    std::vector<Span> m;
    for (const std::string& p : pieces) {
      char_pieces(is_numeric, p, m);
      emit_split(p, m, individual_ ? Behavior::Isolated : Behavior::Contiguous, out);
    }
    pieces = std::move(out);
  }

 private:
  bool individual_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Behavior parse_behavior(const json& j, const std::string& where) {
  const std::string b = get_string(j, "behavior", where);
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "Removed") return Behavior::Removed;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer",
       "{}.behavior \"{}\" is unsupported (expected Isolated, Removed, MergedWithPrevious, "
       "MergedWithNext or Contiguous)",
       where, b);
}

const json& list_field(const json& j, const char* key, const std::string& where) {
  const json& l = require(j, key, where);
  if (!l.is_array()) fail("tokenizer", "{}.{} is a {} (expected a list)", where, key, json_kind(l));
  return l;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) {
  return table().chars[b];
}

int byte_level_byte(char32_t cp) {
  return cp < 324 ? table().bytes[cp] : -1;
}

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(get_bool(j, "strip_left", where, true),
                                             get_bool(j, "strip_right", where, true));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_string(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(pattern_source(j, where), get_string(j, "content", where),
                                               where + ".pattern");
  }
  if (type == "Sequence") {
    const json& list = list_field(j, "normalizers", where);
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string w = fmt::format("{}.normalizers[{}]", where, i);
      if (list[i].is_null()) fail("tokenizer", "{} is null (expected a normalizer object)", w);
      parts.push_back(parse_normalizer(list[i], w));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  fail("tokenizer",
       "{}.type \"{}\" is unsupported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, "
       "Replace, Sequence, or null)",
       where, type);
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", where, true),
                                                   get_bool(j, "use_regex", where, true), where);
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(pattern_source(j, where), parse_behavior(j, where),
                                               get_bool(j, "invert", where, false), where);
  }
  if (type == "Digits")
    return std::make_unique<DigitsPreTokenizer>(get_bool(j, "individual_digits", where, false));
  if (type == "Sequence") {
    const json& list = list_field(j, "pretokenizers", where);
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string w = fmt::format("{}.pretokenizers[{}]", where, i);
      if (list[i].is_null()) fail("tokenizer", "{} is null (expected a pre-tokenizer object)", w);
      parts.push_back(parse_pre_tokenizer(list[i], w));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  fail("tokenizer", "{}.type \"{}\" is unsupported (supported: ByteLevel, Split, Digits, Sequence, or null)",
       where, type);
}

}  // namespace strata::tok
