// Tokenizer: tokenizer.json fixtures made by HF `tokenizers` encode and decode exactly as it does,
// StreamDecoder, thread safety, errors naming the field, and the `strata tokenize` command.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "strata/error.hpp"
#include "strata/tokenizer.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;
using nlohmann::json;

namespace {

json read_json(const fs::path& p) {
  return json::parse(read_text(p));
}

// tokenizer-bpe (Qwen2-style) and every folder of tokenizer-seq.
std::vector<fs::path> tokenizer_fixtures() {
  std::vector<fs::path> out{fixtures_dir() / "tokenizer-bpe"};
  std::vector<fs::path> seq;
  for (const auto& e : fs::directory_iterator(fixtures_dir() / "tokenizer-seq")) {
    if (fs::exists(e.path() / "tokenizer.json")) seq.push_back(e.path());
  }
  // Extra folders made by `tools/make_tokenizer_cases.py --fuzz N --out DIR` (differential fuzzing).
  if (const char* fuzz = std::getenv("STRATA_TOKENIZER_FUZZ_DIR"); fuzz != nullptr && *fuzz != '\0') {
    for (const auto& e : fs::directory_iterator(fuzz)) {
      if (fs::exists(e.path() / "tokenizer.json")) seq.push_back(e.path());
    }
  }
  std::sort(seq.begin(), seq.end());
  out.insert(out.end(), seq.begin(), seq.end());
  return out;
}

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

bool valid_utf8_no_replacement(const std::string& s) {
  return s.find("\xEF\xBF\xBD") == std::string::npos;
}

// A tokenizer.json of `fixture` with one field changed, written to dir.
fs::path edited(const TempDir& dir, const std::function<void(json&)>& edit) {
  json j = read_json(fixtures_dir() / "tokenizer-bpe" / "tokenizer.json");
  edit(j);
  const fs::path p = dir.path() / "tokenizer.json";
  write_text(p, j.dump());
  return p;
}

std::string error_of(const fs::path& p) {
  try {
    Tokenizer::from_file(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("every fixture case encodes to the ids of `tokenizers` and decodes back to its text") {
  for (const fs::path& dir : tokenizer_fixtures()) {
    CAPTURE(dir.filename().string());
    const auto tok = Tokenizer::from_file(dir / "tokenizer.json");
    const json cases = read_json(dir / "cases.json");
    REQUIRE(cases.size() >= 20);
    for (const json& c : cases) {
      const std::string text = c["text"];
      CAPTURE(text);
      const std::vector<int32_t> ids = ids_of(c["ids"]);
      CHECK(tok->encode(text) == ids);
      CHECK(tok->decode(ids) == c["decoded"].get<std::string>());
      if (c.contains("ids_special")) {
        const std::vector<int32_t> with_special = ids_of(c["ids_special"]);
        CHECK(tok->encode(text, true) == with_special);
        CHECK(tok->decode(with_special, true) == c["decoded_skip"].get<std::string>());
      } else {
        CHECK(tok->encode(text, true) == ids);  // no post-processor: add_special_tokens changes nothing
      }
    }
    if (fs::exists(dir / "decode_cases.json")) {
      for (const json& c : read_json(dir / "decode_cases.json")) {
        CAPTURE(c.dump());
        CHECK(tok->decode(ids_of(c["ids"]), c["skip_special_tokens"].get<bool>()) ==
              c["text"].get<std::string>());
      }
    }
  }
}

TEST_CASE("StreamDecoder pieces are whole characters and concatenate to decode()") {
  for (const fs::path& dir : tokenizer_fixtures()) {
    CAPTURE(dir.filename().string());
    const auto tok = Tokenizer::from_file(dir / "tokenizer.json");
    for (const json& c : read_json(dir / "cases.json")) {
      const std::vector<int32_t> ids = ids_of(c.contains("ids_special") ? c["ids_special"] : c["ids"]);
      for (bool skip : {false, true}) {
        CAPTURE(c["text"].get<std::string>());
        StreamDecoder sd(tok, skip);
        std::string all;
        for (int32_t id : ids) {
          const std::string piece = sd.push(id);
          // A complete text never produces U+FFFD mid-stream: pieces end on character boundaries.
          if (valid_utf8_no_replacement(tok->decode(ids, skip))) CHECK(valid_utf8_no_replacement(piece));
          all += piece;
        }
        all += sd.flush();
        CHECK(all == tok->decode(ids, skip));
      }
    }
    if (!fs::exists(dir / "decode_cases.json")) continue;
    for (const json& c : read_json(dir / "decode_cases.json")) {
      const std::vector<int32_t> ids = ids_of(c["ids"]);
      StreamDecoder sd(tok, c["skip_special_tokens"].get<bool>());
      std::string all;
      for (int32_t id : ids) all += sd.push(id);
      all += sd.flush();
      CHECK(all == c["text"].get<std::string>());
    }
  }
}

TEST_CASE("StreamDecoder holds a multi-byte character split across tokens until it completes") {
  const auto tok = Tokenizer::from_file(fixtures_dir() / "tokenizer-bpe" / "tokenizer.json");
  // In this vocabulary CJK characters and emoji are byte tokens: each character spans several ids.
  const std::string text = "日本語 😊!";
  const std::vector<int32_t> ids = tok->encode(text);
  REQUIRE(ids.size() > 8);
  StreamDecoder sd(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(sd.push(id));
  CHECK(sd.flush().empty());
  CHECK(pieces[0].empty());  // the first byte of 日 alone is held
  std::string all;
  size_t held = 0;
  for (const std::string& p : pieces) {
    all += p;
    held += p.empty();
  }
  CHECK(held >= 6);
  CHECK(all == text);
  CHECK(std::find(pieces.begin(), pieces.end(), "日") != pieces.end());
  CHECK(std::find(pieces.begin(), pieces.end(), "😊") != pieces.end());

  // An incomplete character left at the end is flushed as one U+FFFD, like decode().
  StreamDecoder cut(tok);
  CHECK(cut.push(ids[0]).empty());
  CHECK(cut.push(ids[1]).empty());
  CHECK(cut.flush() == "\xEF\xBF\xBD");
  CHECK(tok->decode(std::vector<int32_t>{ids[0], ids[1]}) == "\xEF\xBF\xBD");
  // An invalid sequence is not held back: it comes out as U+FFFD as soon as it is known to be invalid.
  StreamDecoder bad(tok);
  CHECK(bad.push(ids[0]).empty());
  CHECK(bad.push(tok->encode("a")[0]) ==
        "\xEF\xBF\xBD"
        "a");
}

TEST_CASE("vocabulary lookups, special tokens and token bytes") {
  const auto tok = Tokenizer::from_file(fixtures_dir() / "tokenizer-bpe" / "tokenizer.json");
  CHECK(tok->vocab_size() == 2000);
  CHECK(tok->token_id("<|im_end|>") == 2);
  CHECK(tok->token_id("Ġ") == 223);
  CHECK(tok->token_id("no such token") == -1);
  CHECK(tok->is_special(0));
  CHECK(tok->is_special(2));
  CHECK_FALSE(tok->is_special(223));
  CHECK_FALSE(tok->is_special(-1));
  CHECK(tok->token_bytes(223) == " ");
  CHECK(tok->token_bytes(201) == "\n");
  CHECK(tok->token_bytes(1) == "<|im_start|>");
  CHECK(tok->token_bytes(5000).empty());
  CHECK(tok->token_bytes(-3).empty());
  const std::vector<int32_t> chat = tok->encode("<|im_start|>user\nhi<|im_end|>");
  CHECK(tok->decode(chat, true) == "user\nhi");
  // Out-of-range ids are dropped when decoding, as `tokenizers` does.
  CHECK(tok->decode(std::vector<int32_t>{78, 99999, 336}) == tok->decode(std::vector<int32_t>{78, 336}));
}

TEST_CASE("encoding from several threads gives the same ids") {
  const auto tok = Tokenizer::from_file(fixtures_dir() / "tokenizer-seq" / "deepseek_v3" / "tokenizer.json");
  const json cases = read_json(fixtures_dir() / "tokenizer-seq" / "deepseek_v3" / "cases.json");
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const json& c : cases) {
          if (tok->encode(c["text"].get<std::string>()) != c["ids"].get<std::vector<int32_t>>())
            ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("tokenizer errors name the file, the field and what was expected") {
  TempDir tmp;
  CHECK(error_of(tmp.path() / "missing.json").find("[tokenizer] cannot open") != std::string::npos);
  CHECK(error_of(tmp.path()).find("is a folder (expected the path of a tokenizer.json file)") !=
        std::string::npos);

  write_text(tmp.path() / "bad.json", "{\"model\": {\"type\": \"BPE\", ");
  CHECK(error_of(tmp.path() / "bad.json").find("is not valid JSON") != std::string::npos);

  const std::string wordpiece = error_of(edited(tmp, [](json& j) { j["model"]["type"] = "WordPiece"; }));
  CHECK(wordpiece.find("model.type \"WordPiece\" is unsupported (expected BPE)") != std::string::npos);
  CHECK(wordpiece.find("tokenizer.json") != std::string::npos);

  CHECK(error_of(edited(tmp, [](json& j) {
          j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Metaspace";
        })).find("pre_tokenizer.pretokenizers[1].type \"Metaspace\" is unsupported") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["normalizer"] = {{"type", "BertNormalizer"}};
        })).find("normalizer.type \"BertNormalizer\" is unsupported") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["decoder"] = {{"type", "WordPiece"}};
        })).find("decoder.type \"WordPiece\" is unsupported") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["post_processor"] = {{"type", "Whatever"}};
        })).find("post_processor.type \"Whatever\" is unsupported") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["model"]["byte_fallback"] = true;
        })).find("model.byte_fallback") != std::string::npos);
  CHECK(error_of(
            edited(tmp,
                   [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }))
            .find("pre_tokenizer.pretokenizers[0].pattern: cannot compile the regex '(unclosed'") !=
        std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
        })).find("behavior \"Sideways\" is unsupported") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["model"]["merges"][0] = "nospace";
        })).find("model.merges[0] is \"nospace\"") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["model"]["merges"][0] = "Ġ zzz";
        })).find("\"zzz\" is not in model.vocab") != std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) { j.erase("model"); })).find("\"model\" is missing") !=
        std::string::npos);
  CHECK(error_of(edited(tmp, [](json& j) {
          j["added_tokens"][0]["id"] = "zero";
        })).find("added_tokens[0].id") != std::string::npos);

  const auto tok = Tokenizer::from_file(fixtures_dir() / "tokenizer-bpe" / "tokenizer.json");
  try {
    tok->encode("ok \xC3(");
    FAIL("invalid UTF-8 accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("not valid UTF-8 (byte 3 of 5)") != std::string::npos);
  }
}

TEST_CASE("strata tokenize encodes a JSON list of texts and decodes id lists") {
  const std::string bin = std::string("'") + STRATA_BIN + "'";
  for (const fs::path& dir : tokenizer_fixtures()) {
    CAPTURE(dir.filename().string());
    const json cases = read_json(dir / "cases.json");
    json texts = json::array(), want = json::array(), decoded = json::array();
    for (const json& c : cases) {
      texts.push_back(c["text"]);
      want.push_back(c["ids"]);
      decoded.push_back(c["decoded"]);
    }
    TempDir tmp;
    write_text(tmp.path() / "texts.json", texts.dump());
    write_text(tmp.path() / "ids.json", want.dump());
    const std::string tokenizer = "'" + (dir / "tokenizer.json").string() + "'";
    std::string out;
    REQUIRE(run_command(bin + " tokenize --tokenizer " + tokenizer + " --input '" +
                            (tmp.path() / "texts.json").string() + "'",
                        &out) == 0);
    CHECK(json::parse(out) == want);
    REQUIRE(run_command(bin + " tokenize --decode --tokenizer " + tokenizer + " --input '" +
                            (tmp.path() / "ids.json").string() + "'",
                        &out) == 0);
    CHECK(json::parse(out) == decoded);
  }

  TempDir tmp;
  const std::string tokenizer = "'" + (fixtures_dir() / "tokenizer-bpe" / "tokenizer.json").string() + "'";
  write_text(tmp.path() / "in.json", "[\"Hello, world!\"]");
  std::string out;
  CHECK(run_command(bin + " tokenize --tokenizer /nonexistent/tokenizer.json --input '" +
                        (tmp.path() / "in.json").string() + "'",
                    &out) == 1);
  CHECK(out.rfind("strata: [tokenizer] cannot open '/nonexistent/tokenizer.json'", 0) == 0);
  write_text(tmp.path() / "bad.json", "{\"not\": \"a list\"}");
  CHECK(run_command(bin + " tokenize --tokenizer " + tokenizer + " --input '" +
                        (tmp.path() / "bad.json").string() + "'",
                    &out) == 1);
  CHECK(out.find("strata: [tokenizer] --input") != std::string::npos);
  CHECK(out.find("(expected a JSON list of strings)") != std::string::npos);
  write_text(tmp.path() / "broken.json", "[\"unterminated");
  CHECK(run_command(bin + " tokenize --tokenizer " + tokenizer + " --input '" +
                        (tmp.path() / "broken.json").string() + "'",
                    &out) == 1);
  CHECK(out.find("is not valid JSON") != std::string::npos);
}
