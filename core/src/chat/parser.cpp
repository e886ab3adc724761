// Chat-template lexer and parser: Jinja2's template syntax with transformers' settings (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False, loop controls), producing the tree in ast.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <set>

#include "ast.hpp"
#include "strata/error.hpp"

namespace strata::chat {
namespace {

[[noreturn]] void syntax_error(int line, const std::string& msg) {
  fail("chat_template", "line {}: {}", line, msg);
}

// Recursion depth of the parsers: nested brackets, unary operators and blocks each recurse, so a template of
// a few kilobytes could otherwise overflow the stack (Python's parser stops at its recursion limit too).
constexpr int kMaxParseDepth = 200;
struct Nesting {
  Nesting(int& depth, int line, const char* what) : d(depth) {
    if (++d > kMaxParseDepth)
      syntax_error(line, fmt::format("{}s nest deeper than {} levels", what, kMaxParseDepth));
  }
  ~Nesting() { --d; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  int& d;
};

// ---- lexer ------------------------------------------------------------------------------------------------

enum class Tok { Name, String, Int, Float, Op, End };

struct Token {
  Tok kind = Tok::End;
  std::string text;  // name, operator, or decoded string
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Piece {
  enum Kind { Text, Var, Block } kind = Text;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip_text(const std::string& s) {
  return py_strip(s, false, true, nullptr);
}

int count_nl(const std::string& s, size_t from, size_t to) {
  return static_cast<int>(std::count(s.begin() + static_cast<std::ptrdiff_t>(from),
                                     s.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
}

// Python's unicode-escape decoding of a string literal body (as Jinja's lexer does).
std::string unescape(const std::string& body, int line) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    const char c = body[k];
    if (c != '\\' || k + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++k];
    auto hex = [&](int n) -> char32_t {
      char32_t v = 0;
      for (int d = 0; d < n; ++d) {
        if (k + 1 >= body.size()) syntax_error(line, "truncated \\x/\\u escape in string literal");
        const char h = body[++k];
        v <<= 4;
        if (h >= '0' && h <= '9')
          v |= static_cast<char32_t>(h - '0');
        else if (h >= 'a' && h <= 'f')
          v |= static_cast<char32_t>(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
          v |= static_cast<char32_t>(h - 'A' + 10);
        else
          syntax_error(line, "invalid \\x/\\u escape in string literal");
      }
      return v;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
        utf8_append(out, hex(2));
        break;
      case 'u':
        utf8_append(out, hex(4));
        break;
      case 'U':
        utf8_append(out, hex(8));
        break;
      case 'N':
        syntax_error(line, "\\N{...} escapes in string literals are not supported");
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int d = 0; d < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++d)
            v = v * 8 + static_cast<char32_t>(body[++k] - '0');
          utf8_append(out, v);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_.push_back('\n');
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_.push_back(source[k]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();  // keep_trailing_newline=False
  }

  std::vector<Piece> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_), line_);
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const int text_line = line_;
      line_ += count_nl(src_, pos_, start);
      const char kind = src_[start + 1];
      size_t p = start + 2;
      char sign = 0;
      if (p < n && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      left_strip(text, sign, kind != '{');
      emit_text(text, text_line);
      if (kind == '#') {
        comment(p);
      } else {
        tag(kind, p, start);
      }
    }
    return std::move(out_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Piece> out_;
  const Token* prev_ = nullptr;

  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& t, int line) {
    if (t.empty()) return;
    Piece p;
    p.kind = Piece::Text;
    p.text = t;
    p.line = line;
    out_.push_back(std::move(p));
  }

  // `{%-` strips all whitespace before the tag; otherwise lstrip_blocks strips the spaces and tabs between
  // the start of the line and a block or comment tag (not `{{`, not `{%+`).
  void left_strip(std::string& text, char sign, bool block_like) const {
    if (sign == '-') {
      text = rstrip_text(text);
    } else if (sign != '+' && block_like) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && text.size() > l_pos &&
          std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(), is_ws))
        text.resize(l_pos);
    }
  }

  // After a block or comment end: `-%}` eats all whitespace, `+%}` nothing, `%}` one newline (trim_blocks).
  void right_strip(char sign, bool block_like) {
    const size_t before = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
    } else if (sign != '+' && block_like && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_nl(src_, before, pos_);
    line_starting_ = pos_ > before && src_[pos_ - 1] == '\n';
  }

  void comment(size_t p) {
    const size_t e = src_.find("#}", p);
    if (e == std::string::npos) syntax_error(line_, "unclosed comment: missing '#}'");
    char sign = 0;
    if (e > p && (src_[e - 1] == '-' || src_[e - 1] == '+')) sign = src_[e - 1];
    line_ += count_nl(src_, p, e);
    pos_ = e + 2;
    right_strip(sign, true);
  }

  void tag(char kind, size_t p, size_t start) {
    Piece piece;
    piece.kind = kind == '{' ? Piece::Var : Piece::Block;
    piece.line = line_;
    const size_t n = src_.size();
    int depth = 0;
    char end_sign = 0;
    prev_ = nullptr;
    for (;;) {
      while (p < n && is_ws(src_[p])) {
        if (src_[p] == '\n') ++line_;
        ++p;
      }
      if (p >= n)
        syntax_error(piece.line, kind == '{' ? "unclosed '{{': missing '}}'" : "unclosed '{%': missing '%}'");
      if (depth == 0) {
        const char* close = kind == '{' ? "}}" : "%}";
        if (src_.compare(p, 2, close) == 0) {
          p += 2;
          break;
        }
        if ((src_[p] == '-' || (src_[p] == '+' && kind == '%')) && src_.compare(p + 1, 2, close) == 0) {
          end_sign = src_[p];
          p += 3;
          break;
        }
      }
      p = token(p, piece.tokens, depth);
      prev_ = &piece.tokens.back();
    }
    pos_ = p;
    right_strip(end_sign, kind == '%');
    if (piece.kind == Piece::Block && piece.tokens.size() == 1 && piece.tokens[0].kind == Tok::Name &&
        piece.tokens[0].text == "raw") {
      raw(piece.line);
      return;
    }
    (void)start;
    out_.push_back(std::move(piece));
  }

  void raw(int line) {
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t k = pos_;
    for (;; ++k) {
      k = src_.find("{%", k);
      if (k == std::string::npos) syntax_error(line, "'{% raw %}' without '{% endraw %}'");
      size_t q = k + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, k - pos_);
      const int text_line = line_;
      left_strip(text, sign, true);
      emit_text(text, text_line);
      line_ += count_nl(src_, pos_, q + 2);
      pos_ = q + 2;
      right_strip(end_sign, true);
      return;
    }
  }

  size_t token(size_t p, std::vector<Token>& toks, int& depth) {
    Token t;
    t.line = line_;
    const char c = src_[p];
    const size_t n = src_.size();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < n && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      t.kind = Tok::Name;
      t.text = src_.substr(p, q - p);
      toks.push_back(std::move(t));
      return q;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(p, toks, t);
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < n && src_[q] != c) {
        if (src_[q] == '\\') ++q;
        ++q;
      }
      if (q >= n) syntax_error(t.line, "unterminated string literal");
      const std::string body = src_.substr(p + 1, q - p - 1);
      line_ += count_nl(body, 0, body.size());
      t.kind = Tok::String;
      t.text = unescape(body, t.line);
      toks.push_back(std::move(t));
      return q + 1;
    }
    static const std::array<const char*, 6> two = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(p, 2, op) == 0) {
        t.kind = Tok::Op;
        t.text = op;
        toks.push_back(std::move(t));
        return p + 2;
      }
    }
    if (c != '\0' && std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr) {  // (strchr finds the terminator too)
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') depth = std::max(0, depth - 1);
      t.kind = Tok::Op;
      t.text = std::string(1, c);
      toks.push_back(std::move(t));
      return p + 1;
    }
    syntax_error(t.line, fmt::format("unexpected character '{}' in expression", c));
  }

  size_t number(size_t p, std::vector<Token>& toks, Token& t) {
    const size_t n = src_.size();
    auto digits = [&](size_t q) {
      while (q < n &&
             (std::isdigit(static_cast<unsigned char>(src_[q])) ||
              (src_[q] == '_' && q + 1 < n && std::isdigit(static_cast<unsigned char>(src_[q + 1])))))
        ++q;
      return q;
    };
    size_t q = digits(p);
    bool is_float = false;
    const bool after_dot = prev_ != nullptr && prev_->kind == Tok::Op && prev_->text == ".";
    if (!after_dot) {
      if (q + 1 < n && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
        q = digits(q + 1);
        is_float = true;
      }
      if (q < n && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t r = q + 1;
        if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
        if (r < n && std::isdigit(static_cast<unsigned char>(src_[r]))) {
          q = digits(r);
          is_float = true;
        }
      }
    }
    std::string txt;
    for (size_t k = p; k < q; ++k)
      if (src_[k] != '_') txt.push_back(src_[k]);
    if (is_float) {
      t.kind = Tok::Float;
      t.f = std::strtod(txt.c_str(), nullptr);  // as Python's float(): 1e999 is inf, 1e-999 is 0.0
    } else {
      t.kind = Tok::Int;
      try {
        t.i = std::stoll(txt);
      } catch (const std::exception&) {
        syntax_error(t.line, fmt::format("integer literal {} is out of range", txt));
      }
    }
    t.text = txt;
    toks.push_back(std::move(t));
    return q;
  }
};

// ---- expression parser ------------------------------------------------------------------------------------

const std::set<std::string>& filter_names() {
  static const std::set<std::string> s = {
      "abs",     "attr",    "batch", "capitalize", "center", "count",      "d",    "default", "dictsort",
      "e",       "escape",  "first", "float",      "format", "indent",     "int",  "items",   "join",
      "last",    "length",  "list",  "lower",      "map",    "max",        "min",  "reject",  "rejectattr",
      "replace", "reverse", "round", "safe",       "select", "selectattr", "sort", "string",  "sum",
      "title",   "tojson",  "trim",  "unique",     "upper",  "wordcount"};
  return s;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> s = {
      "boolean",  "callable", "defined", "divisibleby", "eq",   "equalto",   "==",     "escaped",
      "even",     "false",    "filter",  "float",       "ge",   ">=",        "gt",     "greaterthan",
      ">",        "in",       "integer", "iterable",    "le",   "<=",        "lower",  "lt",
      "lessthan", "<",        "mapping", "ne",          "!=",   "none",      "number", "odd",
      "sameas",   "sequence", "string",  "test",        "true", "undefined", "upper"};
  return s;
}

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& toks, int line) : toks_(toks) {
    end_.kind = Tok::End;
    end_.line = toks.empty() ? line : toks.back().line;
  }

  const Token& cur() const { return pos_ < toks_.size() ? toks_[pos_] : end_; }
  const Token& peek(size_t k = 1) const { return pos_ + k < toks_.size() ? toks_[pos_ + k] : end_; }
  bool at_end() const { return pos_ >= toks_.size(); }
  void next() { ++pos_; }
  bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char* nm) const { return cur().kind == Tok::Name && cur().text == nm; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* nm) {
    if (!is_name(nm)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::End:
        return "end of tag";
      case Tok::String:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    syntax_error(cur().line, fmt::format("expected {}, got {}", expected, describe(cur())));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(fmt::format("'{}'", op));
  }
  std::string expect_name(const std::string& what) {
    if (cur().kind != Tok::Name) unexpected(what);
    std::string s = cur().text;
    next();
    return s;
  }
  void expect_end() {
    if (!at_end()) unexpected("end of tag");
  }

  ExprP make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  ExprP expression(bool with_cond = true) { return with_cond ? condexpr() : or_expr(); }

  // expr (, expr)* as a tuple when there is a comma (set values, for iterables, {{ a, b }}).
  ExprP tuple(bool with_cond = true) {
    const int line = cur().line;
    ExprP first = expression(with_cond);
    if (!is_op(",")) return first;
    ExprP t = make(ExprKind::TupleLit, line);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (at_end() || is_name("if") || is_op(")")) break;
      t->args.push_back(expression(with_cond));
    }
    return t;
  }

  ExprP condexpr() {
    const Nesting guard(depth_, cur().line, "expression");
    ExprP e = or_expr();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprP c = make(ExprKind::Cond, line);
      c->b = or_expr();
      if (skip_name("else")) c->c = condexpr();
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      ExprP n = make(ExprKind::Or, cur().line);
      next();
      n->a = std::move(e);
      n->b = and_expr();
      e = std::move(n);
    }
    return e;
  }

  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      ExprP n = make(ExprKind::And, cur().line);
      next();
      n->a = std::move(e);
      n->b = not_expr();
      e = std::move(n);
    }
    return e;
  }

  ExprP not_expr() {
    const Nesting guard(depth_, cur().line, "expression");
    if (is_name("not")) {
      ExprP n = make(ExprKind::Not, cur().line);
      next();
      n->a = not_expr();
      return n;
    }
    return compare();
  }

  ExprP compare() {
    const int line = cur().line;
    ExprP e = math1();
    ExprP cmp;
    for (;;) {
      std::string op;
      if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprP binary(ExprP l, const std::string& op, ExprP r, int line) {
    ExprP n = make(ExprKind::Binary, line);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(std::move(e), op, concat(), line);
    }
    return e;
  }

  ExprP concat() {
    const int line = cur().line;
    ExprP e = math2();
    if (!is_op("~")) return e;
    ExprP n = make(ExprKind::Concat, line);
    n->args.push_back(std::move(e));
    while (skip_op("~")) n->args.push_back(math2());
    return n;
  }

  ExprP math2() {
    ExprP e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(std::move(e), op, pow(), line);
    }
    return e;
  }

  ExprP pow() {
    ExprP e = unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary(std::move(e), "**", unary(true), line);
    }
    return e;
  }

  ExprP unary(bool with_filter) {
    const Nesting guard(depth_, cur().line, "expression");
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur().line);
      next();
      e->a = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprP primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.kind) {
      case Tok::Name: {
        ExprP e = make(ExprKind::Literal, line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::none();
        } else {
          e->kind = ExprKind::Name;
          e->name = t.text;
        }
        next();
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().kind == Tok::String) {
          s += cur().text;
          next();
        }
        ExprP e = make(ExprKind::Literal, line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Int: {
        ExprP e = make(ExprKind::Literal, line);
        e->value = Value::integer(t.i);
        next();
        return e;
      }
      case Tok::Float: {
        ExprP e = make(ExprKind::Literal, line);
        e->value = Value::number(t.f);
        next();
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          if (skip_op(")")) return make(ExprKind::TupleLit, line);
          ExprP first = expression();
          if (skip_op(")")) return first;
          ExprP tup = make(ExprKind::TupleLit, line);
          tup->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (is_op(")")) break;
            tup->args.push_back(expression());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          next();
          ExprP l = make(ExprKind::ListLit, line);
          while (!is_op("]")) {
            if (!l->args.empty()) expect_op(",");
            if (is_op("]")) break;
            l->args.push_back(expression());
          }
          next();
          return l;
        }
        if (t.text == "{") {
          next();
          ExprP d = make(ExprKind::DictLit, line);
          while (!is_op("}")) {
            if (!d->args.empty()) expect_op(",");
            if (is_op("}")) break;
            d->args.push_back(expression());
            expect_op(":");
            d->args.push_back(expression());
          }
          next();
          return d;
        }
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  ExprP postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        const int line = cur().line;
        next();
        if (cur().kind == Tok::Name) {
          ExprP a = make(ExprKind::Attr, line);
          a->name = cur().text;
          a->a = std::move(e);
          next();
          e = std::move(a);
        } else if (cur().kind == Tok::Int) {
          ExprP a = make(ExprKind::Item, line);
          a->a = std::move(e);
          a->b = make(ExprKind::Literal, line);
          a->b->value = Value::integer(cur().i);
          next();
          e = std::move(a);
        } else {
          unexpected("an attribute name after '.'");
        }
      } else if (is_op("[")) {
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP subscript(ExprP target) {
    const int line = cur().line;
    next();  // [
    ExprP parts[3];
    int colons = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        if (++colons > 2) unexpected("']'");
        next();
        continue;
      }
      if (parts[colons]) unexpected("':' or ']'");
      parts[colons] = expression();
    }
    next();  // ]
    if (colons == 0) {
      if (!parts[0]) syntax_error(line, "empty subscript '[]'");
      ExprP it = make(ExprKind::Item, line);
      it->a = std::move(target);
      it->b = std::move(parts[0]);
      return it;
    }
    ExprP sl = make(ExprKind::Slice, line);
    sl->a = std::move(target);
    for (auto& p : parts) sl->args.push_back(std::move(p));
    return sl;
  }

  void call_args(Expr& into) {
    expect_op("(");
    while (!is_op(")")) {
      if (!into.args.empty() || !into.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        syntax_error(cur().line, "'*args' / '**kwargs' in calls are not supported");
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        into.kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!into.kwargs.empty()) syntax_error(cur().line, "positional argument follows keyword argument");
        into.args.push_back(expression());
      }
    }
    next();
  }

  ExprP call(ExprP callee) {
    ExprP c = make(ExprKind::Call, cur().line);
    c->a = std::move(callee);
    call_args(*c);
    return c;
  }

  ExprP filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        next();
        e = filter(std::move(e));
      } else if (is_name("is")) {
        e = test(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // name [(args)] applied to `subject` (null for `{% filter %}` blocks: a placeholder is filled in).
  ExprP filter(ExprP subject) {
    const int line = cur().line;
    std::string nm = expect_name("a filter name");
    if (!known_filter(nm)) syntax_error(line, fmt::format("no filter named '{}'", nm));
    ExprP f = make(ExprKind::Filter, line);
    f->name = nm;
    f->a = subject ? std::move(subject) : make(ExprKind::Placeholder, line);
    if (is_op("(")) call_args(*f);
    return f;
  }

  ExprP test(ExprP subject) {
    const int line = cur().line;
    next();  // is
    ExprP t = make(ExprKind::Test, line);
    t->negated = skip_name("not");
    std::string nm;
    if (cur().kind == Tok::Name) {
      nm = cur().text;
      next();
    } else if (cur().kind == Tok::Op && known_test(cur().text)) {
      nm = cur().text;
      next();
    } else {
      unexpected("a test name after 'is'");
    }
    if (!known_test(nm)) syntax_error(line, fmt::format("no test named '{}'", nm));
    t->name = nm;
    t->a = std::move(subject);
    if (is_op("(")) {
      call_args(*t);
    } else if ((cur().kind == Tok::Name || cur().kind == Tok::String || cur().kind == Tok::Int ||
                cur().kind == Tok::Float || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) syntax_error(cur().line, "you cannot chain multiple tests with 'is'");
      t->args.push_back(postfix(primary()));
    }
    return t;
  }

 private:
  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  Token end_;
};

// ---- statement parser -------------------------------------------------------------------------------------

const char* const kSupportedTags =
    "if/elif/else/endif, for/else/endfor, set/endset, macro/endmacro, filter/endfilter, with/endwith, "
    "raw/endraw, "
    "break, continue, generation/endgeneration";

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse() {
    std::string end;
    Body b = body({}, &end, 0);
    return b;
  }

 private:
  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  int depth_ = 0;

  static std::string tag_name(const Piece& p) {
    if (p.tokens.empty() || p.tokens[0].kind != Tok::Name)
      syntax_error(p.line, "expected a tag name after '{%'");
    return p.tokens[0].text;
  }

  // Parses statements until a block tag whose name is in `ends` (left unconsumed: its name goes to *end).
  Body body(const std::vector<std::string>& ends, std::string* end, int open_line,
            const char* open = nullptr) {
    Body out;
    while (pos_ < pieces_.size()) {
      Piece& p = pieces_[pos_];
      if (p.kind == Piece::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = p.line;
        s->text = std::move(p.text);
        out.push_back(std::move(s));
        ++pos_;
        continue;
      }
      if (p.kind == Piece::Var) {
        ExprParser ep(p.tokens, p.line);
        if (ep.at_end()) syntax_error(p.line, "empty expression '{{ }}'");
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = p.line;
        s->expr = ep.tuple();
        ep.expect_end();
        out.push_back(std::move(s));
        ++pos_;
        continue;
      }
      const std::string name = tag_name(p);
      if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
        *end = name;
        return out;
      }
      out.push_back(statement(p, name));
    }
    if (open != nullptr)
      syntax_error(open_line, fmt::format("'{{% {} %}}' is never closed (expected {})", open,
                                          fmt::format("'{{% {} %}}'", ends.back())));
    *end = "";
    return out;
  }

  std::unique_ptr<Stmt> statement(Piece& p, const std::string& name) {
    const Nesting guard(depth_, p.line, "block");
    ExprParser ep(p.tokens, p.line);
    ep.next();  // tag name
    auto s = std::make_unique<Stmt>();
    s->line = p.line;
    const int line = p.line;
    ++pos_;
    std::string end;
    if (name == "if") {
      s->kind = StmtKind::If;
      ExprP cond = ep.expression();
      ep.expect_end();
      for (;;) {
        Body b = body({"elif", "else", "endif"}, &end, line, "if");
        s->branches.emplace_back(std::move(cond), std::move(b));
        Piece& tp = pieces_[pos_++];
        ExprParser tep(tp.tokens, tp.line);
        tep.next();
        if (end == "elif") {
          cond = tep.expression();
          tep.expect_end();
          continue;
        }
        tep.expect_end();
        if (end == "else") {
          s->else_body = body({"endif"}, &end, line, "if");
          ExprParser eep(pieces_[pos_].tokens, pieces_[pos_].line);
          eep.next();
          eep.expect_end();
          ++pos_;
        }
        break;
      }
    } else if (name == "for") {
      s->kind = StmtKind::For;
      do {
        if (ep.is_op("(")) syntax_error(line, "parenthesized for-loop targets are not supported");
        s->targets.push_back(ep.expect_name("a loop variable name"));
      } while (ep.skip_op(","));
      if (!ep.skip_name("in")) ep.unexpected("'in'");
      s->expr = ep.tuple(false);
      if (ep.skip_name("if")) s->cond = ep.expression();
      if (ep.is_name("recursive")) syntax_error(line, "recursive for loops are not supported");
      ep.expect_end();
      s->body = body({"else", "endfor"}, &end, line, "for");
      close(end == "else" ? "else" : "endfor");
      if (end == "else") {
        s->else_body = body({"endfor"}, &end, line, "for");
        close("endfor");
      }
    } else if (name == "set") {
      std::string target = ep.expect_name("a variable name");
      if (ep.skip_op(".")) {
        s->kind = StmtKind::SetAttr;
        s->targets = {target, ep.expect_name("an attribute name")};
        ep.expect_op("=");
        s->expr = ep.tuple();
      } else {
        s->targets.push_back(target);
        while (ep.skip_op(",")) s->targets.push_back(ep.expect_name("a variable name"));
        if (ep.skip_op("=")) {
          s->kind = StmtKind::Set;
          s->expr = ep.tuple();
        } else {
          if (s->targets.size() != 1) ep.unexpected("'='");
          s->kind = StmtKind::SetBlock;
          if (ep.skip_op("|")) s->expr = filter_chain(ep);
          ep.expect_end();
          s->body = body({"endset"}, &end, line, "set");
          close("endset");
          return s;
        }
      }
      ep.expect_end();
    } else if (name == "macro") {
      s->kind = StmtKind::Macro;
      s->name = ep.expect_name("a macro name");
      ep.expect_op("(");
      while (!ep.is_op(")")) {
        if (!s->params.empty()) ep.expect_op(",");
        if (ep.is_op(")")) break;
        s->params.push_back(ep.expect_name("a parameter name"));
        s->defaults.push_back(ep.skip_op("=") ? ep.expression() : nullptr);
      }
      ep.next();
      ep.expect_end();
      s->body = body({"endmacro"}, &end, line, "macro");
      close("endmacro");
    } else if (name == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->expr = filter_chain(ep);
      ep.expect_end();
      s->body = body({"endfilter"}, &end, line, "filter");
      close("endfilter");
    } else if (name == "with") {
      s->kind = StmtKind::With;
      while (!ep.at_end()) {
        if (!s->assigns.empty()) ep.expect_op(",");
        std::string var = ep.expect_name("a variable name");
        ep.expect_op("=");
        s->assigns.emplace_back(std::move(var), ep.expression());
      }
      s->body = body({"endwith"}, &end, line, "with");
      close("endwith");
    } else if (name == "generation") {
      s->kind = StmtKind::Generation;
      ep.expect_end();
      s->body = body({"endgeneration"}, &end, line, "generation");
      close("endgeneration");
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::Break : StmtKind::Continue;
      ep.expect_end();
    } else if (name == "elif" || name == "else" || name.rfind("end", 0) == 0) {
      syntax_error(line, fmt::format("unexpected '{{% {} %}}' (no open block it could close)", name));
    } else if (name == "include" || name == "import" || name == "from" || name == "extends" ||
               name == "block" || name == "call" || name == "do" || name == "autoescape" || name == "trans" ||
               name == "print") {
      syntax_error(line,
                   fmt::format("unsupported tag '{{% {} %}}' (supported tags: {})", name, kSupportedTags));
    } else {
      syntax_error(line, fmt::format("unknown tag '{{% {} %}}' (supported tags: {})", name, kSupportedTags));
    }
    return s;
  }

  // Consumes the closing tag the body parser stopped at (it must have no arguments).
  void close(const char* name) {
    if (pos_ >= pieces_.size()) return;
    Piece& p = pieces_[pos_];
    ExprParser ep(p.tokens, p.line);
    ep.next();
    (void)name;
    ep.expect_end();
    ++pos_;
  }

  static ExprP filter_chain(ExprParser& ep) {
    ExprP f = ep.filter(nullptr);
    while (ep.skip_op("|")) f = ep.filter(std::move(f));
    return f;
  }
};

}  // namespace

bool known_filter(const std::string& name) {
  return filter_names().count(name) != 0;
}
bool known_test(const std::string& name) {
  return test_names().count(name) != 0;
}

Body parse_template(const std::string& source) {
  Lexer lex(source);
  Parser parser(lex.run());
  return parser.parse();
}

}  // namespace strata::chat
