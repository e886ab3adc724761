// The nesting scan of JSON text (strata/json_text.hpp).
#include "strata/json_text.hpp"

#include <algorithm>

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

}  // namespace strata
