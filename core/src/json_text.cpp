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
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))  // (opens fine, then fails to read with EISDIR)
    fail(component, "cannot open '{}': it is a directory{}", path.string(), hint);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(component, "cannot open '{}': {}{}", path.string(), std::strerror(errno), hint);
  try {
    // A read error surfaces as std::ios_base::failure from the stream buffer, not as the stream's bad bit.
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    fail(component, "cannot read '{}': {}{}", path.string(), e.what(), hint);
  }
}

}  // namespace strata
