// strata tokenize: text ↔ token ids with a tokenizer.json, batch in and out as JSON (an interface that
// external checks rely on: --input is a JSON list of strings, stdout a JSON list of id lists; --decode goes
// back).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "strata/error.hpp"
#include "strata/json_text.hpp"
#include "strata/tokenizer.hpp"

namespace strata::app {

int cmd_tokenize(const TokenizeOptions& o) {
  using nlohmann::json;
  std::string text;
  if (o.input == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    text = read_text_file(o.input, "tokenizer", " (--input: expected a JSON file)");
  }
  json input;
  try {
    input = parse_json_text(text, "tokenizer", "--input " + o.input);
  } catch (const json::exception& e) {
    fail("tokenizer", "--input '{}' is not valid JSON: {}", o.input, e.what());
  }
  const char* expected = o.decode ? "a JSON list of token id lists" : "a JSON list of strings";
  if (!input.is_array())
    fail("tokenizer", "--input '{}' is a JSON {} (expected {})", o.input, input.type_name(), expected);

  const auto tok = Tokenizer::from_file(o.tokenizer);
  json out = json::array();
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    if (o.decode) {
      if (!item.is_array())
        fail("tokenizer", "--input item {} is a {} (expected {})", i, item.type_name(), expected);
      std::vector<int32_t> ids;
      for (const json& id : item) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          fail("tokenizer", "--input item {} holds {} (expected non-negative integer token ids)", i,
               id.dump());
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
      out.push_back(tok->decode(ids, o.skip_special_tokens));
    } else {
      if (!item.is_string())
        fail("tokenizer", "--input item {} is a {} (expected {})", i, item.type_name(), expected);
      out.push_back(tok->encode(item.get<std::string>(), o.add_special_tokens));
    }
  }
  const std::string s = out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace strata::app
