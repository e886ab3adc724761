// Chat-template interpreter: renders a parsed template over a context of variables, with Jinja2's semantics
// (scoping, Undefined, loops, macros) and the filters, tests, methods and globals transformers' environment
// has.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ast.hpp"
#include "value.hpp"

namespace strata::chat {

// Renders `body` with the given top-level variables. Errors are strata::Error("chat_template", "line N:
// ...").
std::string render_template(const Body& body, const std::vector<std::pair<std::string, Value>>& context);

}  // namespace strata::chat
