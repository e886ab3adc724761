// JSON text from files and clients: a nesting check before parsing, the parse that applies it, and the one
// way strata reads a whole text file (with the error a user sees when it cannot).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "strata/error.hpp"

namespace strata {

// Model files and request bodies nest a few levels (tool schemas a dozen). The JSON library parses any depth,
// but copying, printing or converting a value recurses once per level, so a file or body of nested brackets
// overflowed the stack (fuzz/README.md). Deeper text is refused before it is parsed.
constexpr int kMaxJsonNesting = 128;

// The deepest nesting of arrays and objects in JSON text; brackets inside strings do not count. Malformed
// text is scanned as far as it goes (the parser reports what is wrong with it).
int json_nesting(std::string_view text);

// J::parse(text) after the nesting check; `what` names the file or body in the error. JSON syntax errors
// are the library's exceptions, for the caller to word.
template <class J = nlohmann::json>
J parse_json_text(std::string_view text, std::string_view component, std::string_view what) {
  if (json_nesting(text) > kMaxJsonNesting)
    fail(component, "{}: arrays and objects nest deeper than {} levels", what, kMaxJsonNesting);
  return J::parse(text);
}

// The whole file; one that cannot be opened or read is a strata::Error of `component`: "cannot open 'PATH':
// REASON" followed by `hint` (e.g. " (expected a Hugging Face tokenizer.json)").
std::string read_text_file(const std::filesystem::path& path, std::string_view component,
                           std::string_view hint = "");

// parse_json_text of a file's text: errors name the file, invalid JSON as "'PATH' is not valid JSON: ...".
template <class J = nlohmann::json>
J parse_json_file(const std::filesystem::path& path, std::string_view component, std::string_view hint = "") {
  const std::string text = read_text_file(path, component, hint);
  try {
    return parse_json_text<J>(text, component, path.string());
  } catch (const typename J::exception& e) {
    fail(component, "'{}' is not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace strata
