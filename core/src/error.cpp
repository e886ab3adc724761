// Invariant failure reporting.
#include "strata/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace strata {
void invariant_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "strata: internal invariant violated: %s at %s:%d\n", expr, file, line);
  std::abort();
}
}  // namespace strata
