// The BPE model (see bpe.hpp); the merge loop mirrors tokenizers' Word::merge_all.
#include "bpe.hpp"

#include <algorithm>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "json_util.hpp"
#include "unicode.hpp"

namespace strata::tok {

using nlohmann::json;

// Words seen before → their ids. Cleared when it grows past its capacity (a plain bound on memory).
struct BpeModel::Cache {
  static constexpr size_t kCapacity = 100000;
  static constexpr size_t kMaxWordBytes = 256;
  mutable std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};

BpeModel::BpeModel(const json& model) : cache_(std::make_unique<Cache>()) {
  const std::string where = "model";
  if (const json* d = field(model, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      fail("tokenizer", "model.dropout is {} (only null or 0 is supported: encoding must be deterministic)",
           d->dump());
    }
  }
  if (get_bool(model, "byte_fallback", where, false)) {
    fail("tokenizer",
         "model.byte_fallback is true (unsupported: only byte-level BPE with byte_fallback false)");
  }
  fuse_unk_ = get_bool(model, "fuse_unk", where, false);
  ignore_merges_ = get_bool(model, "ignore_merges", where, false);
  if (const json* p = field(model, "continuing_subword_prefix"); p != nullptr && !p->is_null()) {
    prefix_ = get_string(model, "continuing_subword_prefix", where);
  }
  if (const json* s = field(model, "end_of_word_suffix"); s != nullptr && !s->is_null()) {
    suffix_ = get_string(model, "end_of_word_suffix", where);
  }

  const json& vocab = require(model, "vocab", where);
  if (!vocab.is_object())
    fail("tokenizer", "model.vocab is a {} (expected an object token → id)", json_kind(vocab));
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = as_id(it.value(), fmt::format("model.vocab[\"{}\"]", it.key()));
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    id_to_token_[static_cast<size_t>(id)] = tok;
    has_id_[static_cast<size_t>(id)] = true;
  }

  if (const json* u = field(model, "unk_token"); u != nullptr && !u->is_null()) {
    const std::string unk = get_string(model, "unk_token", where);
    const int32_t id = token_to_id(unk);
    if (id < 0)
      fail("tokenizer", "model.unk_token \"{}\" is not in model.vocab (expected a vocabulary token)", unk);
    unk_id_ = id;
  }

  const json& merges = require(model, "merges", where);
  if (!merges.is_array()) fail("tokenizer", "model.merges is a {} (expected a list)", json_kind(merges));
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) {
        fail("tokenizer", "model.merges[{}] is \"{}\" (expected two tokens separated by a space)", i, s);
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail("tokenizer", "model.merges[{}] is {} (expected \"a b\" or [\"a\", \"b\"])", i, m.dump());
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b);
    const std::string merged =
        a + (b.compare(0, prefix_.size(), prefix_) == 0 ? b.substr(prefix_.size()) : b);
    const int32_t im = token_to_id(merged);
    if (ia < 0 || ib < 0 || im < 0) {
      fail("tokenizer",
           "model.merges[{}] (\"{}\" + \"{}\"): \"{}\" is not in model.vocab (expected every merge "
           "and its result in the vocabulary)",
           i, a, b,
           ia < 0   ? a
           : ib < 0 ? b
                    : merged);
    }
    merges_[(static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib)] = {static_cast<int32_t>(i), im};
  }
}

BpeModel::~BpeModel() = default;

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)])
    return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= Cache::kMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mutex);
    if (auto it = cache_->map.find(word); it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_->mutex);
    if (cache_->map.size() >= Cache::kCapacity) cache_->map.clear();
    cache_->map.emplace(std::string(word),
                        std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(start), out.end()));
  }
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  };

  // Characters → initial symbols (unknown characters become unk_token, fused when fuse_unk, or are dropped).
  int32_t pending_unk = -1;
  std::string scratch;
  size_t i = 0;
  while (i < w.size()) {
    const size_t b = i;
    i += utf8_char_len(static_cast<unsigned char>(w[i]));
    std::string_view s = w.substr(b, i - b);
    if ((b > 0 && !prefix_.empty()) || (i == w.size() && !suffix_.empty())) {
      scratch.assign(b > 0 ? prefix_ : std::string());
      scratch.append(s);
      if (i == w.size()) scratch += suffix_;
      s = scratch;
    }
    const int32_t id = token_to_id(s);
    if (id >= 0) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(id);
    } else if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Merge {
    int32_t rank, pos, new_id;
    bool operator<(const Merge& o) const {  // priority_queue pops the greatest: lowest rank, then lowest pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = lookup(symbols[k].id, symbols[k + 1].id)) {
      queue.push({m->first, static_cast<int32_t>(k), m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.removed || cur.next == -1) continue;
    const auto next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    const auto* m = lookup(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = right.next;
    symbols[next_pos].removed = true;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* pm = lookup(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push({pm->first, cur.prev, pm->second});
      }
    }
    if (cur.next >= 0) {
      if (const auto* nm = lookup(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push({nm->first, top.pos, nm->second});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (!s.removed) out.push_back(s.id);
  }
}

}  // namespace strata::tok
