// strata::Tokenizer from tokenizer.json: added tokens matched in the raw (then normalized) text, normalizer,
// pre-tokenizer, BPE, post-processor template; ByteLevel decoding with lossy UTF-8; StreamDecoder.
#include "strata/tokenizer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "bpe.hpp"
#include "json_util.hpp"
#include "pipeline.hpp"
#include "strata/error.hpp"
#include "strata/json_text.hpp"
#include "unicode.hpp"

namespace strata {
namespace {

using nlohmann::json;
using namespace strata::tok;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

// Longest-match lookup of added tokens at a position (a byte trie); scanning positions left to right gives
// the leftmost-longest matches of the Aho-Corasick automaton `tokenizers` uses.
class AddedTrie {
 public:
  void insert(std::string_view s, int32_t index) {
    if (s.empty()) return;
    first_bytes_[static_cast<unsigned char>(s[0])] = true;
    uint32_t node = 0;
    for (char c : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, static_cast<uint32_t>(terminal_.size())).first;
        terminal_.push_back(-1);
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = index;  // the first of equal patterns wins
  }
  bool empty() const { return edges_.empty(); }
  // (length, index) of the longest token starting at s[p], or (0, -1).
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t p) const {
    if (!first_bytes_[static_cast<unsigned char>(s[p])]) return {0, -1};
    std::pair<size_t, int32_t> best{0, -1};
    uint32_t node = 0;
    for (size_t k = p; k < s.size(); ++k) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[k]));
      if (it == edges_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) best = {k + 1 - p, terminal_[node]};
    }
    return best;
  }

 private:
  std::unordered_map<uint64_t, uint32_t> edges_;
  std::vector<int32_t> terminal_{-1};  // node → token index (node 0 = root)
  bool first_bytes_[256] = {};
};

bool last_char_is_word(std::string_view s) {
  if (s.empty()) return false;
  size_t b = s.size() - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return is_word_char(next_code_point(s, b));
}

bool first_char_is_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return is_word_char(next_code_point(s, i));
}

// Start of the run of white space that ends s.
size_t trailing_space_start(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t i = b;
    if (!is_white_space(next_code_point(s, i))) break;
    e = b;
  }
  return e;
}

// Length of the run of white space that starts s.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_white_space(next_code_point(s, j))) break;
    i = j;
  }
  return i;
}

// The BOS/EOS template for a single sequence: ids before and after it.
struct Template {
  std::vector<int32_t> prefix, suffix;
};

std::vector<int32_t> special_ids(const json& st, const std::string& name, const std::string& where) {
  const json* e = field(st, name.c_str());
  if (e == nullptr) {
    fail("tokenizer", "{}.single names special token \"{}\", which {}.special_tokens lacks", where, name,
         where);
  }
  const json& ids = require(*e, "ids", fmt::format("{}.special_tokens[\"{}\"]", where, name));
  if (!ids.is_array()) fail("tokenizer", "{}.special_tokens[\"{}\"].ids is not a list", where, name);
  std::vector<int32_t> out;
  for (const json& i : ids)
    out.push_back(as_id(i, fmt::format("{}.special_tokens[\"{}\"].ids[]", where, name)));
  return out;
}

void parse_post_processor(const json& j, const std::string& where, Template& t) {
  if (j.is_null()) return;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = require(j, "processors", where);
    if (!list.is_array())
      fail("tokenizer", "{}.processors is a {} (expected a list)", where, json_kind(list));
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), t);
    return;
  }
  Template local;
  if (type == "TemplateProcessing") {
    const json& single = require(j, "single", where);
    if (!single.is_array())
      fail("tokenizer", "{}.single is a {} (expected a list)", where, json_kind(single));
    const json& st = require(j, "special_tokens", where);
    int sequences = 0;
    for (const json& item : single) {
      if (const json* s = field(item, "SpecialToken")) {
        const std::vector<int32_t> ids =
            special_ids(st, get_string(*s, "id", where + ".single[].SpecialToken"), where);
        auto& dst = sequences == 0 ? local.prefix : local.suffix;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else if (const json* q = field(item, "Sequence")) {
        const std::string id = get_string(*q, "id", where + ".single[].Sequence");
        if (id != "A")
          fail("tokenizer", "{}.single uses sequence \"{}\" (expected only \"A\" in a single template)",
               where, id);
        ++sequences;
      } else {
        fail("tokenizer", "{}.single has item {} (expected SpecialToken or Sequence)", where, item.dump());
      }
    }
    if (sequences != 1)
      fail("tokenizer", "{}.single has {} \"A\" sequences (expected exactly one)", where, sequences);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const json& p = require(j, k, where);
      if (!p.is_array() || p.size() != 2)
        fail("tokenizer", "{}.{} is {} (expected [token, id])", where, k, p.dump());
      (std::strcmp(k, "cls") == 0 ? local.prefix : local.suffix)
          .push_back(as_id(p[1], where + "." + k + "[1]"));
    }
  } else {
    fail("tokenizer",
         "{}.type \"{}\" is unsupported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
         "BertProcessing, Sequence, or null)",
         where, type);
  }
  t.prefix.insert(t.prefix.begin(), local.prefix.begin(), local.prefix.end());
  t.suffix.insert(t.suffix.end(), local.suffix.begin(), local.suffix.end());
}

void check_decoder(const json& j, const std::string& where) {
  if (j.is_null()) fail("tokenizer", "{} is null (unsupported: expected a ByteLevel decoder)", where);
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = require(j, "decoders", where);
    if (!list.is_array() || list.empty())
      fail("tokenizer", "{}.decoders is {} (expected a non-empty list)", where, list.dump());
    for (size_t i = 0; i < list.size(); ++i) check_decoder(list[i], fmt::format("{}.decoders[{}]", where, i));
    return;
  }
  fail("tokenizer", "{}.type \"{}\" is unsupported (supported: ByteLevel, or a Sequence of ByteLevel)", where,
       type);
}

// The bytes a token string decodes to under ByteLevel: every character mapped back to its byte, or the
// string's own UTF-8 when some character is outside the table (what the ByteLevel decoder does).
std::string byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const int b = byte_level_byte(next_code_point(token, i));
    if (b < 0) return std::string(token);
    out += static_cast<char>(b);
  }
  return out;
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const json& root) : model_(model_of(root)) {
    normalizer_ = parse_normalizer(root.value("normalizer", json()), "normalizer");
    pre_tokenizer_ = parse_pre_tokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer");
    parse_post_processor(root.value("post_processor", json()), "post_processor", template_);
    check_decoder(root.value("decoder", json()), "decoder");
    load_added_tokens(root.value("added_tokens", json::array()));

    // Every id's string and decoded bytes.
    int32_t max_id = model_.max_id();
    for (const AddedToken& a : added_) max_id = std::max(max_id, a.id);
    size_ = static_cast<size_t>(max_id + 1);
    std::vector<std::string> tokens(size_);
    has_token_.assign(size_, false);
    for (int32_t id = 0; id <= model_.max_id(); ++id) {
      if (const std::string* t = model_.id_to_token(id)) {
        tokens[static_cast<size_t>(id)] = *t;
        has_token_[static_cast<size_t>(id)] = true;
      }
    }
    // Added tokens take precedence when decoding an id; a normalized one decodes to its normalized content,
    // and is skipped as special when that string is the content of a special token (what `tokenizers` 0.23
    // does).
    for (const AddedToken& a : added_) {
      tokens[static_cast<size_t>(a.id)] =
          a.normalized && normalizer_ ? normalizer_->apply(a.content) : a.content;
      has_token_[static_cast<size_t>(a.id)] = true;
    }
    bytes_.resize(size_);
    special_.assign(size_, false);
    std::unordered_set<std::string> special_strings;
    for (const AddedToken& a : added_) {
      if (a.special) special_strings.insert(a.content);
    }
    for (size_t id = 0; id < size_; ++id) {
      if (!has_token_[id]) continue;
      bytes_[id] = byte_level_decode(tokens[id]);
      special_[id] = special_strings.count(tokens[id]) > 0;
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos) {
      fail("tokenizer", "the text to encode is not valid UTF-8 (byte {} of {}); expected UTF-8 text", bad,
           text.size());
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    split_added(text, raw_trie_, ids, [&](std::string_view segment) {
      const std::string normalized =
          normalizer_ ? normalizer_->apply(std::string(segment)) : std::string(segment);
      split_added(normalized, normalized_trie_, ids,
                  [&](std::string_view piece) { encode_plain(piece, ids); });
    });
    if (add_special_tokens && (!template_.prefix.empty() || !template_.suffix.empty())) {
      ids.insert(ids.begin(), template_.prefix.begin(), template_.prefix.end());
      ids.insert(ids.end(), template_.suffix.begin(), template_.suffix.end());
    }
    return ids;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= size_ || !has_token_[static_cast<size_t>(id)]) continue;
      if (skip_special_tokens && special_[static_cast<size_t>(id)]) continue;
      bytes += bytes_[static_cast<size_t>(id)];
    }
    return utf8_lossy(bytes);
  }

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= size_) return "";
    return bytes_[static_cast<size_t>(id)];
  }

  int32_t token_id(std::string_view token) const override {
    if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
    return model_.token_to_id(token);
  }

  bool is_special(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < size_ && special_[static_cast<size_t>(id)];
  }

  size_t vocab_size() const override { return size_; }

 private:
  static const json& model_of(const json& root) {
    if (!root.is_object()) fail("tokenizer", "the top level is a {} (expected an object)", json_kind(root));
    const json* model = field(root, "model");
    if (model == nullptr)
      fail("tokenizer", "\"model\" is missing (expected a BPE model object at the top level)");
    const json& m = *model;
    const std::string type = type_of(m, "model");
    if (type != "BPE" && !(type.empty() && field(m, "merges") != nullptr)) {
      fail("tokenizer", "model.type \"{}\" is unsupported (expected BPE)", type);
    }
    return m;
  }

  void load_added_tokens(const json& list) {
    if (!list.is_array()) fail("tokenizer", "added_tokens is a {} (expected a list)", json_kind(list));
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string w = fmt::format("added_tokens[{}]", i);
      const json& t = list[i];
      AddedToken a;
      a.id = as_id(require(t, "id", w), w + ".id");
      a.content = get_string(t, "content", w);
      if (find_invalid_utf8(a.content) != std::string_view::npos)
        fail("tokenizer", "{}.content is not valid UTF-8", w);
      a.special = get_bool(t, "special", w, false);
      a.single_word = get_bool(t, "single_word", w, false);
      a.lstrip = get_bool(t, "lstrip", w, false);
      a.rstrip = get_bool(t, "rstrip", w, false);
      a.normalized = get_bool(t, "normalized", w, !a.special);
      if (added_ids_.count(a.content) > 0) continue;  // a repeated content keeps its first entry
      added_ids_[a.content] = a.id;
      const auto index = static_cast<int32_t>(added_.size());
      if (a.normalized) {
        normalized_trie_.insert(normalizer_ ? normalizer_->apply(a.content) : a.content, index);
      } else {
        raw_trie_.insert(a.content, index);
      }
      added_.push_back(std::move(a));
    }
  }

  // Splits `s` on the added tokens of `trie` (AddedVocabulary::find_matches): matched tokens go to `ids`,
  // the text between them to `plain`.
  template <class F>
  void split_added(std::string_view s, const AddedTrie& trie, std::vector<int32_t>& ids, F&& plain) const {
    if (s.empty()) return;
    if (trie.empty()) {
      plain(s);
      return;
    }
    size_t start_offset = 0, p = 0;
    while (p < s.size()) {
      const auto [len, index] = trie.longest_at(s, p);
      if (len == 0) {
        ++p;
        continue;
      }
      size_t start = p, stop = p + len;
      p = stop;  // the automaton resumes after the match, whether or not it is used
      const AddedToken& a = added_[static_cast<size_t>(index)];
      if (a.single_word) {
        const bool start_space = start == 0 || !last_char_is_word(s.substr(0, start));
        const bool stop_space = stop == s.size() || !first_char_is_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (a.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
      if (a.rstrip) stop += leading_space_len(s.substr(stop));
      if (start > start_offset) plain(s.substr(start_offset, start - start_offset));
      ids.push_back(a.id);
      start_offset = stop;
    }
    if (start_offset < s.size()) plain(s.substr(start_offset));
  }

  void encode_plain(std::string_view s, std::vector<int32_t>& ids) const {
    if (s.empty()) return;
    if (!pre_tokenizer_) {
      model_.tokenize(s, ids);
      return;
    }
    std::vector<std::string> pieces{std::string(s)};
    pre_tokenizer_->apply(pieces);
    for (const std::string& p : pieces) model_.tokenize(p, ids);
  }

  BpeModel model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  Template template_;
  std::vector<AddedToken> added_;
  StringIdMap added_ids_;
  AddedTrie raw_trie_, normalized_trie_;
  size_t size_ = 0;
  std::vector<std::string> bytes_;  // id → decoded bytes
  std::vector<bool> has_token_, special_;
};

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  if (std::error_code ec; std::filesystem::is_directory(tokenizer_json, ec)) {
    fail("tokenizer", "'{}' is a folder (expected the path of a tokenizer.json file)",
         tokenizer_json.string());
  }
  const json root = parse_json_file(tokenizer_json, "tokenizer", " (expected a Hugging Face tokenizer.json)");
  try {
    return std::make_shared<BpeTokenizer>(root);
  } catch (const Error& e) {
    std::string_view msg = e.what();
    if (msg.starts_with("[tokenizer] ")) msg.remove_prefix(12);
    throw Error("tokenizer", fmt::format("{}: {}", tokenizer_json.string(), msg));
  } catch (const json::exception& e) {
    fail("tokenizer", "{}: unexpected JSON structure: {}", tokenizer_json.string(), e.what());
  }
}

// ---- StreamDecoder -------------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens)
    : tok_(std::move(tok)), skip_special_(skip_special_tokens) {
  if (!tok_) fail("tokenizer", "StreamDecoder needs a tokenizer (got null)");
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return "";
  pending_ += tok_->token_bytes(id);
  const size_t n = utf8_complete_prefix(pending_);
  if (n == 0) return "";
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace strata
