// The nesting scan of JSON text, and reading a whole text file (strata/json_text.hpp).
#include "strata/json_text.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace strata {

int json_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (in_string) {
      if (c == '\\')
        ++k;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::string read_text_file(const std::filesystem::path& path, std::string_view component,
                           std::string_view hint) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(component, "cannot open '{}': {}{}", path.string(), std::strerror(errno), hint);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(component, "cannot read '{}': {}{}", path.string(), std::strerror(errno), hint);
  return text;
}

}  // namespace strata
