// strata::Error — the exception for bad input and failed operations; messages carry a [component] prefix.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace strata {

class Error : public std::runtime_error {
 public:
  Error(std::string_view component, const std::string& message)
      : std::runtime_error(fmt::format("[{}] {}", component, message)) {}
};

template <class... Args>
[[noreturn]] void fail(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(component, fmt::format(f, std::forward<Args>(args)...));
}

// Broken invariants (bugs, not bad input) abort with file:line.
[[noreturn]] void invariant_failed(const char* expr, const char* file, int line);

}  // namespace strata

#define STRATA_CHECK(cond) \
  ((cond) ? static_cast<void>(0) : ::strata::invariant_failed(#cond, __FILE__, __LINE__))
