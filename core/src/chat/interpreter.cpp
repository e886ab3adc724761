// Chat-template interpreter: statements, expressions, and the builtins of transformers' Jinja environment
// (Jinja2's filters and tests, Python str/dict/list methods, range/dict/namespace, raise_exception,
// strftime_now).
#include "interpreter.hpp"

#include <fmt/format.h>
#include <fmt/printf.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "strata/error.hpp"

namespace strata::chat {
namespace {

// ---- small helpers ----------------------------------------------------------------------------------------

std::string undef_attr_msg(const Value& obj, const std::string& name) {
  const std::string t = obj.is_none() ? "None" : type_name(obj) + " object";
  return fmt::format("'{}' has no attribute '{}'", t, name);
}

std::string undef_item_msg(const Value& obj, const Value& key) {
  const std::string t = obj.is_none() ? "None" : type_name(obj) + " object";
  if (key.is_string()) return fmt::format("'{}' has no attribute '{}'", t, key.s);
  return fmt::format("'{}' has no element {}", t, repr(key));
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

void need_defined(const Value& v) {
  if (v.is_undefined()) raise(v.s);
}

int64_t need_int(const Value& v, const char* what) {
  need_defined(v);
  if (v.type == Type::Int) return v.i;
  if (v.type == Type::Bool) return v.b ? 1 : 0;
  raise(fmt::format("{} must be an integer, not '{}'", what, type_name(v)));
}

double num(const Value& v) {
  return v.type == Type::Float ? v.f : v.type == Type::Int ? static_cast<double>(v.i) : (v.b ? 1.0 : 0.0);
}

std::string need_str(const Value& v, const char* what) {
  need_defined(v);
  if (!v.is_string()) raise(fmt::format("{} must be str, not {}", what, type_name(v)));
  return v.s;
}

// ASCII, Latin-1, Greek and Cyrillic case mapping (Python maps all of Unicode; chat templates only case-map
// role names and the like).
char32_t to_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
      (c >= 0x410 && c <= 0x42F))
    return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
char32_t to_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) ||
      (c >= 0x430 && c <= 0x44F))
    return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
bool is_lower_c(char32_t c) {
  return to_upper(c) != c;
}
bool is_upper_c(char32_t c) {
  return to_lower(c) != c;
}
bool is_cased(char32_t c) {
  return is_lower_c(c) || is_upper_c(c);
}

std::string map_case(const std::string& s, bool upper) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = upper ? to_upper(c) : to_lower(c);
  return utf8_encode(u);
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? to_upper(u[k]) : to_lower(u[k]);
  return utf8_encode(u);
}

std::string py_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (auto& c : u) {
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = is_cased(c);
  }
  return utf8_encode(u);
}

// Jinja's `title` filter: words start after -, whitespace, ( { [ <.
std::string jinja_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  bool start = true;
  for (auto& c : u) {
    const bool sep = c == '-' || is_py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
      continue;
    }
    c = start ? to_upper(c) : to_lower(c);
    start = false;
  }
  return utf8_encode(u);
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  const std::u32string u = utf8_decode(s);
  size_t start = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    if (!is_line_break(u[k])) continue;
    size_t end = k + 1;
    if (u[k] == '\r' && k + 1 < u.size() && u[k + 1] == '\n') end = k + 2;
    out.push_back(utf8_encode(std::u32string_view(u).substr(start, (keepends ? end : k) - start)));
    start = end;
    k = end - 1;
  }
  if (start < u.size()) out.push_back(utf8_encode(std::u32string_view(u).substr(start)));
  return out;
}

Value str_list(const std::vector<std::string>& v) {
  List l;
  for (const auto& s : v) l.push_back(Value::string(s));
  return Value::list_of(std::move(l));
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep == nullptr || sep->is_none()) {
    std::u32string u = utf8_decode(s);
    if (from_right) std::reverse(u.begin(), u.end());
    size_t k = 0;
    int64_t splits = 0;
    while (k < u.size()) {
      while (k < u.size() && is_py_space(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && splits >= maxsplit) {
        size_t e = u.size();
        while (e > k && is_py_space(u[e - 1])) --e;
        std::u32string w = u.substr(k, e - k);
        if (from_right) std::reverse(w.begin(), w.end());
        out.push_back(utf8_encode(w));
        break;
      }
      size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      std::u32string w = u.substr(k, e - k);
      if (from_right) std::reverse(w.begin(), w.end());
      out.push_back(utf8_encode(w));
      ++splits;
      k = e;
    }
    if (from_right) std::reverse(out.begin(), out.end());
    return out;
  }
  const std::string sp = need_str(*sep, "split separator");
  if (sp.empty()) raise("empty separator");
  if (!from_right) {
    size_t start = 0;
    int64_t splits = 0;
    for (;;) {
      const size_t k = (maxsplit >= 0 && splits >= maxsplit) ? std::string::npos : s.find(sp, start);
      if (k == std::string::npos) {
        out.push_back(s.substr(start));
        break;
      }
      out.push_back(s.substr(start, k - start));
      start = k + sp.size();
      ++splits;
    }
    return out;
  }
  size_t end = s.size();
  int64_t splits = 0;
  for (;;) {
    size_t k = std::string::npos;
    if (!(maxsplit >= 0 && splits >= maxsplit) && end >= sp.size()) k = s.rfind(sp, end - sp.size());
    if (k == std::string::npos) {
      out.push_back(s.substr(0, end));
      break;
    }
    out.push_back(s.substr(k + sp.size(), end - k - sp.size()));
    end = k;
    ++splits;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += rep;
        ++n;
      }
      if (k < u.size()) utf8_append(out, u[k]);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  for (;;) {
    const size_t k = (count >= 0 && n >= count) ? std::string::npos : s.find(old, start);
    if (k == std::string::npos) break;
    out.append(s, start, k - start);
    out += rep;
    start = k + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python slice index normalisation.
void slice_indices(int64_t len, const Value* start, const Value* stop, const Value* step, int64_t& b,
                   int64_t& e, int64_t& st) {
  auto get = [](const Value* v, int64_t dflt) {
    if (v == nullptr || v->is_none()) return std::pair<bool, int64_t>{false, dflt};
    return std::pair<bool, int64_t>{true, need_int(*v, "slice index")};
  };
  st = get(step, 1).second;
  if (st == 0) raise("slice step cannot be zero");
  auto [has_b, bv] = get(start, 0);
  auto [has_e, ev] = get(stop, 0);
  if (st > 0) {
    b = has_b ? (bv < 0 ? std::max<int64_t>(0, bv + len) : std::min(bv, len)) : 0;
    e = has_e ? (ev < 0 ? std::max<int64_t>(0, ev + len) : std::min(ev, len)) : len;
  } else {
    b = has_b ? (bv < 0 ? std::max<int64_t>(-1, bv + len) : std::min(bv, len - 1)) : len - 1;
    e = has_e ? (ev < 0 ? std::max<int64_t>(-1, ev + len) : std::min(ev, len - 1)) : -1;
  }
}

size_t py_len(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
      return 0;
    case Type::String:
      return utf8_decode(v.s).size();
    case Type::List:
      return v.list->size();
    case Type::Dict:
      return v.dict->items.size();
    default:
      raise(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

// iter(v) as a list (Undefined iterates as empty).
List iterate(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
      return {};
    case Type::List:
      return *v.list;
    case Type::Dict: {
      List out;
      for (const auto& [k, val] : v.dict->items) out.push_back(k);
      return out;
    }
    case Type::String: {
      List out;
      for (char32_t c : utf8_decode(v.s)) {
        std::string s;
        utf8_append(s, c);
        out.push_back(Value::string(std::move(s)));
      }
      return out;
    }
    default:
      raise(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.type) {
    case Type::Undefined:
      return false;
    case Type::String:
      if (!item.is_string())
        raise(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return container.s.find(item.s) != std::string::npos;
    case Type::List:
      for (const auto& e : *container.list)
        if (equals(e, item)) return true;
      return false;
    case Type::Dict:
      return container.dict->find(item) != nullptr;
    default:
      raise(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

Value pair(Value a, Value b) {
  return Value::list_of({std::move(a), std::move(b)}, true);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

bool add_overflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_add_overflow(a, b, r);
}
bool sub_overflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_sub_overflow(a, b, r);
}
bool mul_overflows(int64_t a, int64_t b, int64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

// int(x) of a finite float, truncated; Python's result has no bound, a template's is 64-bit.
int64_t float_to_int(double x) {
  if (!(std::fabs(x) < 9223372036854775808.0)) raise(fmt::format("int({}) is beyond 64-bit integers", x));
  return static_cast<int64_t>(x);
}

// Python's round-half-even rounding of the exact binary value to `digits` decimals.
double py_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits < -308) return std::copysign(0.0, x);  // 10^-digits is beyond double: every finite x rounds to 0
  if (digits < 0) {
    const double p = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(x / p) * p;
  }
  const std::string text = fmt::format("{:.{}f}", x, digits);  // up to 309 integer digits + 300 decimals
  return std::strtod(text.c_str(), nullptr);
}

// A %-conversion's spec as Python reads it: flags from "-+ #0", then a width, then "." and a precision.
struct PercentSpec {
  std::string flags;
  size_t width = 0;
  std::optional<size_t> precision;
  std::string printf_prefix() const {  // "%" + the same spec, for fmt::sprintf
    return "%" + flags + (width > 0 ? std::to_string(width) : "") +
           (precision ? "." + std::to_string(*precision) : "");
  }
};

// Widths and precisions beyond this are refused: a template (or a message it formats) must not make the
// interpreter allocate gigabytes of padding.
constexpr size_t kMaxFormatWidth = size_t{1} << 20;
// `'x' * n` and `[..] * n` stop at this many characters or elements, for the same reason.
constexpr uint64_t kMaxRepeat = uint64_t{1} << 26;

PercentSpec parse_percent_spec(const std::string& spec) {
  PercentSpec p;
  size_t k = 0;
  // (strchr also finds a string's terminator: a NUL in the template must not pass for a flag)
  // Each flag once: Python accepts "%0000005d", but printf parsers read the zeros after the first as width
  // digits (fmt refused 18 of them as "number is too big").
  for (; k < spec.size() && spec[k] != '\0' && std::strchr("-+ #0", spec[k]) != nullptr; ++k)
    if (p.flags.find(spec[k]) == std::string::npos) p.flags.push_back(spec[k]);
  auto number = [&](const char* what) {
    size_t v = 0;
    while (k < spec.size() && std::isdigit(static_cast<unsigned char>(spec[k]))) {
      v = v * 10 + static_cast<size_t>(spec[k++] - '0');
      if (v > kMaxFormatWidth)
        raise(fmt::format("format {} is too large (at most {})", what, kMaxFormatWidth));
    }
    return v;
  };
  p.width = number("width");
  if (k < spec.size() && spec[k] == '.') {
    ++k;
    p.precision = number("precision");
  }
  if (k != spec.size()) raise(fmt::format("unsupported format specification '%{}'", spec));
  return p;
}

// printf-style formatting: "%s" % args (the `format` filter and the % operator on strings).
// With a mapping on the right (`'...' % {}`) no positional conversions are expected and none are consumed.
std::string percent_format(const std::string& f, const List& args, bool mapping = false) {
  std::string out;
  size_t ai = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] != '%') {
      out.push_back(f[k]);
      continue;
    }
    if (++k >= f.size()) raise("incomplete format");
    std::string spec;
    while (k < f.size() && f[k] != '\0' && std::strchr("-+ #0123456789.", f[k]) != nullptr)
      spec.push_back(f[k++]);
    if (k >= f.size()) raise("incomplete format");
    const char conv = f[k];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (ai >= args.size()) raise("not enough arguments for format string");
    const Value& a = args[ai++];
    switch (conv) {
      case 's':
      case 'r': {
        const PercentSpec ps = parse_percent_spec(spec);
        std::u32string u = utf8_decode(conv == 's' ? to_str(a) : repr(a));
        const bool left = ps.flags.find('-') != std::string::npos;
        if (ps.precision) u = u.substr(0, *ps.precision);
        std::string pad(ps.width > u.size() ? ps.width - u.size() : 0, ' ');
        out += left ? utf8_encode(u) + pad : pad + utf8_encode(u);
        break;
      }
      case 'd':
      case 'i': {
        if (!a.is_number())
          raise(fmt::format("%{} format: a real number is required, not {}", conv, type_name(a)));
        const PercentSpec ps = parse_percent_spec(spec);
        if (a.type == Type::Float) {
          if (std::isnan(a.f)) raise("cannot convert float NaN to integer");
          if (std::isinf(a.f)) raise("cannot convert float infinity to integer");
          // Beyond int64 a double is an integer, and %.0f prints all of it.
          if (std::fabs(a.f) >= 9.2e18) {
            PercentSpec whole = ps;
            whole.precision.reset();
            out += fmt::sprintf(whole.printf_prefix() + ".0f", a.f);
            break;
          }
          out += fmt::sprintf(ps.printf_prefix() + "d", static_cast<long long>(a.f));
          break;
        }
        out +=
            fmt::sprintf(ps.printf_prefix() + "d", static_cast<long long>(a.type == Type::Int ? a.i : a.b));
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'g': {
        if (!a.is_number()) raise(fmt::format("must be real number, not {}", type_name(a)));
        out += fmt::sprintf(parse_percent_spec(spec).printf_prefix() + conv, num(a));
        break;
      }
      default:
        raise(fmt::format("unsupported format character '{}'", conv));
    }
  }
  if (ai < args.size() && !mapping) raise("not all arguments converted during string formatting");
  return out;
}

// str.format: {}, {0}, {name}, {{ }}, !r/!s conversions (format specs are not supported).
std::string brace_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    const char c = f[k];
    if (c == '{' && k + 1 < f.size() && f[k + 1] == '{') {
      out.push_back('{');
      ++k;
      continue;
    }
    if (c == '}' && k + 1 < f.size() && f[k + 1] == '}') {
      out.push_back('}');
      ++k;
      continue;
    }
    if (c == '}') raise("Single '}' encountered in format string");
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    const size_t e = f.find('}', k);
    if (e == std::string::npos) raise("Single '{' encountered in format string");
    std::string field = f.substr(k + 1, e - k - 1);
    k = e;
    char conv = 0;
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos) raise("format specifications in str.format are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_idx >= a.pos.size()) raise(fmt::format("Replacement index {} out of range", auto_idx));
      v = &a.pos[auto_idx++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t idx = field.size() > 18 ? SIZE_MAX : std::stoull(field);  // (19+ digits: beyond any list)
      if (idx >= a.pos.size()) raise(fmt::format("Replacement index {} out of range", field));
      v = &a.pos[idx];
    } else {
      for (const auto& [kk, vv] : a.kw)
        if (kk == field) v = &vv;
      if (v == nullptr) raise(fmt::format("KeyError: '{}'", field));
    }
    out += conv == 'r' ? repr(*v) : to_str(*v);
  }
  return out;
}

std::string time_format(const std::string& f) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  if (f.empty()) return "";
  std::vector<char> buf(256 + f.size() * 8);
  const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
  return std::string(buf.data(), n);
}

// ---- interpreter ------------------------------------------------------------------------------------------

struct Frame {
  std::unordered_map<std::string, Value> vars;
  Frame* parent = nullptr;
};

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& context) {
    Frame root;
    for (const auto& [k, v] : context) root.vars[k] = v;
    std::string out;
    try {
      exec(body, root, out);
    } catch (const TemplateError& e) {
      fail("chat_template", "line {}: {}", line_, e.what());
    }
    return out;
  }

 private:
  int line_ = 0;
  Value placeholder_;
  int depth_ = 0;
  // Loop iterations of one render, all loops together: 2-6 µs each, so a template (a model folder's, or one
  // looping over a request's data) spends about a second at most. Real templates loop over the messages and
  // tools: a 200k-token conversation has well under 100 000 messages.
  static constexpr int64_t kMaxLoopIterations = 250000;
  int64_t iterations_ = 0;

  // ---- statements ----

  Flow exec(const Body& body, Frame& f, std::string& out) {
    for (const auto& s : body) {
      const Flow fl = exec(*s, f, out);
      if (fl != Flow::Normal) return fl;
    }
    return Flow::Normal;
  }

  void assign(Frame& f, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      f.vars[targets[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      raise(fmt::format("cannot unpack {} values into {} variables", items.size(), targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) f.vars[targets[k]] = items[k];
  }

  Flow exec(const Stmt& s, Frame& f, std::string& out) {
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::Text:
        out += s.text;
        return Flow::Normal;
      case StmtKind::Output:
        out += to_str(eval(*s.expr, f));
        return Flow::Normal;
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches) {
          if (truthy(eval(*cond, f))) return exec(body, f, out);
        }
        return exec(s.else_body, f, out);
      case StmtKind::For:
        return exec_for(s, f, out);
      case StmtKind::Set:
        assign(f, s.targets, eval(*s.expr, f));
        return Flow::Normal;
      case StmtKind::SetAttr: {
        const Value v = eval(*s.expr, f);
        line_ = s.line;
        Value ns = lookup(s.targets[0], f);
        if (ns.type != Type::Namespace) raise("cannot assign attribute on non-namespace object");
        if (v.reaches_namespace()) raise(kNamespaceInNamespace);
        ns.dict->set(s.targets[1], v);
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        std::string text;
        exec(s.body, f, text);
        Value v = Value::string(std::move(text));
        if (s.expr) {
          placeholder_ = v;
          v = eval(*s.expr, f);
        }
        f.vars[s.targets[0]] = v;
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        std::string text;
        exec(s.body, f, text);
        placeholder_ = Value::string(std::move(text));
        out += to_str(eval(*s.expr, f));
        return Flow::Normal;
      }
      case StmtKind::Macro:
        f.vars[s.name] = make_macro(s, f);
        return Flow::Normal;
      case StmtKind::With: {
        Frame inner;
        inner.parent = &f;
        for (const auto& [k, e] : s.assigns) inner.vars[k] = eval(*e, f);
        return exec(s.body, inner, out);
      }
      case StmtKind::Generation:
        return exec(s.body, f, out);
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, Frame& f, std::string& out) {
    List items = iterate(eval(*s.expr, f));
    if (s.cond) {
      List kept;
      for (auto& it : items) {
        Frame tf;
        tf.parent = &f;
        assign(tf, s.targets, it);
        if (truthy(eval(*s.cond, tf))) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame ef;
      ef.parent = &f;
      return exec(s.else_body, ef, out) == Flow::Normal ? Flow::Normal : Flow::Normal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      if (++iterations_ > kMaxLoopIterations)
        raise(fmt::format("the template ran more than {} loop iterations", kMaxLoopIterations));
      Frame lf;
      lf.parent = &f;
      assign(lf, s.targets, items[static_cast<size_t>(k)]);
      Dict loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(n - k));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem",
               k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem",
               k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::function("cycle", [k](CallArgs& a) {
                 if (a.pos.empty()) raise("no items for cycling given");
                 return a.pos[static_cast<size_t>(k) % a.pos.size()];
               }));
      lf.vars["loop"] = Value::dict_of(std::move(loop));
      const Flow fl = exec(s.body, lf, out);
      if (fl == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, Frame& def_frame) {
    const Stmt* m = &s;
    Frame* scope = &def_frame;
    return Value::function(s.name, [this, m, scope](CallArgs& a) {
      if (++depth_ > 200) raise("maximum macro recursion depth exceeded");
      Frame mf;
      mf.parent = scope;
      List varargs;
      for (size_t k = 0; k < a.pos.size(); ++k) {
        if (k < m->params.size())
          mf.vars[m->params[k]] = a.pos[k];
        else
          varargs.push_back(a.pos[k]);
      }
      Dict kwargs;
      for (const auto& [k, v] : a.kw) {
        if (std::find(m->params.begin(), m->params.end(), k) != m->params.end())
          mf.vars[k] = v;
        else
          kwargs.set(k, v);
      }
      for (size_t k = 0; k < m->params.size(); ++k) {
        if (mf.vars.count(m->params[k]) != 0) continue;
        mf.vars[m->params[k]] =
            m->defaults[k] ? eval(*m->defaults[k], mf)
                           : Value::undefined(fmt::format("parameter '{}' was not provided", m->params[k]));
      }
      mf.vars["varargs"] = Value::list_of(std::move(varargs), true);
      mf.vars["kwargs"] = Value::dict_of(std::move(kwargs));
      const int saved = line_;
      std::string out;
      exec(m->body, mf, out);
      line_ = saved;
      --depth_;
      return Value::string(std::move(out));
    });
  }

  // ---- names ----

  Value lookup(const std::string& name, Frame& f) {
    for (Frame* p = &f; p != nullptr; p = p->parent) {
      auto it = p->vars.find(name);
      if (it != p->vars.end()) return it->second;
    }
    return global(name);
  }

  Value global(const std::string& name) {
    if (name == "range") return Value::function("range", builtin_range);
    if (name == "dict")
      return Value::function("dict", [](CallArgs& a) {
        Dict d;
        if (!a.pos.empty()) {
          if (a.pos[0].type != Type::Dict) raise("dict() positional argument must be a mapping");
          d = *a.pos[0].dict;
        }
        for (const auto& [k, v] : a.kw) d.set(k, v);
        return Value::dict_of(std::move(d));
      });
    if (name == "namespace")
      return Value::function("namespace", [](CallArgs& a) {
        Dict d;
        if (!a.pos.empty()) {
          if (a.pos[0].type != Type::Dict && a.pos[0].type != Type::Namespace)
            raise("namespace() positional argument must be a mapping");
          d = *a.pos[0].dict;
        }
        for (const auto& [k, v] : a.kw) d.set(k, v);
        return Value::namespace_of(std::move(d));
      });
    if (name == "raise_exception")
      return Value::function("raise_exception", [](CallArgs& a) -> Value {
        const Value* m = a.get(0, "message");
        raise(fmt::format("raise_exception: {}", m ? to_str(*m) : ""));
      });
    if (name == "strftime_now")
      return Value::function("strftime_now", [](CallArgs& a) {
        const Value* fmt_v = a.get(0, "format");
        if (fmt_v == nullptr) raise("strftime_now() missing required argument 'format'");
        return Value::string(time_format(need_str(*fmt_v, "strftime_now format")));
      });
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  static Value builtin_range(CallArgs& a) {
    if (!a.kw.empty()) raise("range() takes no keyword arguments");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = need_int(a.pos[0], "range() argument");
    } else if (a.pos.size() == 2 || a.pos.size() == 3) {
      start = need_int(a.pos[0], "range() argument");
      stop = need_int(a.pos[1], "range() argument");
      if (a.pos.size() == 3) step = need_int(a.pos[2], "range() argument");
    } else {
      raise("range expected 1 to 3 arguments");
    }
    if (step == 0) raise("range() arg 3 must not be zero");
    List out;
    for (int64_t v = start; step > 0 ? v < stop : v > stop;) {
      if (out.size() >= 100000)
        raise("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      out.push_back(Value::integer(v));
      if (__builtin_add_overflow(v, step, &v)) break;  // past int64: past stop too
    }
    return Value::list_of(std::move(out));
  }

  // ---- expressions ----

  Value eval(const Expr& e, Frame& f) {
    line_ = e.line;
    switch (e.kind) {
      case ExprKind::Literal:
        return e.value;
      case ExprKind::Name:
        return lookup(e.name, f);
      case ExprKind::Placeholder:
        return placeholder_;
      case ExprKind::ListLit:
      case ExprKind::TupleLit: {
        List items;
        for (const auto& x : e.args) items.push_back(eval(*x, f));
        return Value::list_of(std::move(items), e.kind == ExprKind::TupleLit);
      }
      case ExprKind::DictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], f);
          d.set(key, eval(*e.args[k + 1], f));
        }
        return Value::dict_of(std::move(d));
      }
      case ExprKind::Attr: {
        Value obj = eval(*e.a, f);
        line_ = e.line;
        return get_attr(obj, e.name);
      }
      case ExprKind::Item: {
        Value obj = eval(*e.a, f);
        Value key = eval(*e.b, f);
        line_ = e.line;
        return get_item(obj, key);
      }
      case ExprKind::Slice: {
        Value obj = eval(*e.a, f);
        Value parts[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k) {
          if (e.args[static_cast<size_t>(k)]) {
            parts[k] = eval(*e.args[static_cast<size_t>(k)], f);
            ptrs[k] = &parts[k];
          }
        }
        line_ = e.line;
        return slice(obj, ptrs[0], ptrs[1], ptrs[2]);
      }
      case ExprKind::Call: {
        Value callee = eval(*e.a, f);
        CallArgs a = args(e, f);
        line_ = e.line;
        return call(callee, a);
      }
      case ExprKind::Filter: {
        Value subject = eval(*e.a, f);
        CallArgs a = args(e, f);
        line_ = e.line;
        return filter(e.name, subject, a);
      }
      case ExprKind::Test: {
        Value subject = eval(*e.a, f);
        CallArgs a = args(e, f);
        line_ = e.line;
        const bool r = test(e.name, subject, a);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::Not:
        return Value::boolean(!truthy(eval(*e.a, f)));
      case ExprKind::Neg:
      case ExprKind::Pos: {
        Value v = eval(*e.a, f);
        line_ = e.line;
        need_defined(v);
        if (!v.is_number())
          raise(fmt::format("bad operand type for unary {}: '{}'", e.kind == ExprKind::Neg ? '-' : '+',
                            type_name(v)));
        if (e.kind == ExprKind::Pos) return v.type == Type::Bool ? Value::integer(v.b) : v;
        if (v.type == Type::Float) return Value::number(-v.f);
        const int64_t x = v.type == Type::Int ? v.i : static_cast<int64_t>(v.b);
        if (x == INT64_MIN) raise("integer overflow in unary - (template integers are 64-bit)");
        return Value::integer(-x);
      }
      case ExprKind::Binary: {
        Value l = eval(*e.a, f);
        Value r = eval(*e.b, f);
        line_ = e.line;
        return binary(e.name, l, r);
      }
      case ExprKind::Compare: {
        Value l = eval(*e.args[0], f);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], f);
          line_ = e.line;
          if (!compare_op(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case ExprKind::And: {
        Value l = eval(*e.a, f);
        return truthy(l) ? eval(*e.b, f) : l;
      }
      case ExprKind::Or: {
        Value l = eval(*e.a, f);
        return truthy(l) ? l : eval(*e.b, f);
      }
      case ExprKind::Cond: {
        if (truthy(eval(*e.b, f))) return eval(*e.a, f);
        if (e.c) return eval(*e.c, f);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was defined.",
            e.line));
      }
      case ExprKind::Concat: {
        std::string s;
        for (const auto& x : e.args) s += to_str(eval(*x, f));
        return Value::string(std::move(s));
      }
    }
    return Value::none();
  }

  CallArgs args(const Expr& e, Frame& f) {
    CallArgs a;
    for (const auto& x : e.args) a.pos.push_back(eval(*x, f));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, f));
    return a;
  }

  Value call(const Value& callee, CallArgs& a) {
    if (callee.is_undefined()) raise(callee.s);
    if (callee.type != Type::Function) raise(fmt::format("'{}' object is not callable", type_name(callee)));
    const int saved = line_;
    Value r = callee.fn->call(a);
    line_ = saved;
    return r;
  }

  bool compare_op(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "not in") return !contains(r, l);
    need_defined(l);
    need_defined(r);
    const int c = compare(l, r, op.c_str());
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  static Value binary(const std::string& op, const Value& l, const Value& r) {
    need_defined(l);
    need_defined(r);
    const bool nums = l.is_number() && r.is_number();
    const bool ints = nums && l.type != Type::Float && r.type != Type::Float;
    auto iv = [](const Value& v) { return v.type == Type::Int ? v.i : static_cast<int64_t>(v.b); };
    auto bad = [&]() -> Value {
      raise(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(l), type_name(r)));
    };
    // Python's integers have no bound; a template's are 64-bit, and leaving that range is an error rather
    // than a wrapped (undefined) result.
    auto checked = [&](int64_t a, int64_t b, bool (*f)(int64_t, int64_t, int64_t*)) {
      int64_t v = 0;
      if (f(a, b, &v)) raise(fmt::format("integer overflow in {} (template integers are 64-bit)", op));
      return Value::integer(v);
    };
    if (op == "+") {
      if (ints) return checked(iv(l), iv(r), add_overflows);
      if (nums) return Value::number(num(l) + num(r));
      if (l.is_string() && r.is_string()) return Value::string(l.s + r.s);
      if (l.type == Type::List && r.type == Type::List && l.tuple == r.tuple) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::list_of(std::move(out), l.tuple);
      }
      if (l.is_string()) raise(fmt::format("can only concatenate str (not \"{}\") to str", type_name(r)));
      if (l.type == Type::List)
        raise(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(l), type_name(r),
                          type_name(l)));
      return bad();
    }
    if (op == "-") {
      if (ints) return checked(iv(l), iv(r), sub_overflows);
      if (nums) return Value::number(num(l) - num(r));
      return bad();
    }
    if (op == "*") {
      if (ints) return checked(iv(l), iv(r), mul_overflows);
      if (nums) return Value::number(num(l) * num(r));
      const Value* seq = (l.is_string() || l.type == Type::List)   ? &l
                         : (r.is_string() || r.type == Type::List) ? &r
                                                                   : nullptr;
      const Value* cnt = seq == &l ? &r : &l;
      if (seq != nullptr && cnt->is_number() && cnt->type != Type::Float) {
        const int64_t n = std::max<int64_t>(0, iv(*cnt));
        const size_t len = seq->is_string() ? seq->s.size() : seq->list->size();
        if (len > 0 && static_cast<uint64_t>(n) > kMaxRepeat / len)
          raise(fmt::format("repeating a {} of {} {} times is beyond the interpreter's limit of {} elements",
                            type_name(*seq), len, n, kMaxRepeat));
        if (seq->is_string()) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(std::move(out));
        }
        List out;
        for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::list_of(std::move(out), seq->tuple);
      }
      return bad();
    }
    if (op == "/") {
      if (!nums) return bad();
      if (num(r) == 0) raise(ints ? "division by zero" : "float division by zero");
      return Value::number(num(l) / num(r));
    }
    if (op == "//") {
      if (!nums) return bad();
      if (ints) {
        if (iv(r) == 0) raise("integer division or modulo by zero");
        const int64_t a = iv(l), b = iv(r);
        if (b == -1) return checked(0, a, sub_overflows);
        int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
        return Value::integer(q);
      }
      if (num(r) == 0) raise("float floor division by zero");
      return Value::number(std::floor(num(l) / num(r)));
    }
    if (op == "%") {
      if (l.is_string()) {
        if (r.type == Type::Dict) return Value::string(percent_format(l.s, {}, true));
        List a = r.type == Type::List && r.tuple ? *r.list : List{r};
        return Value::string(percent_format(l.s, a));
      }
      if (!nums) return bad();
      if (ints) {
        if (iv(r) == 0) raise("integer division or modulo by zero");
        const int64_t a = iv(l), b = iv(r);
        if (b == -1) return Value::integer(0);
        int64_t m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) m += b;
        return Value::integer(m);
      }
      if (num(r) == 0) raise("float modulo");
      double m = std::fmod(num(l), num(r));
      if (m != 0 && ((m < 0) != (num(r) < 0))) m += num(r);
      if (m == 0) m = std::copysign(0.0, num(r));  // Python: a zero remainder takes the divisor's sign
      return Value::number(m);
    }
    if (op == "**") {
      if (!nums) return bad();
      if (ints && iv(r) >= 0) {  // by squaring, every step checked
        int64_t out = 1, base = iv(l), e = iv(r);
        bool over = false;
        while (e > 0 && !over) {
          if (e & 1) over = mul_overflows(out, base, &out);
          e >>= 1;
          if (e > 0 && !over) over = mul_overflows(base, base, &base);
        }
        if (over) raise("integer overflow in ** (template integers are 64-bit)");
        return Value::integer(out);
      }
      return Value::number(std::pow(num(l), num(r)));
    }
    return bad();
  }

  // ---- attribute / item access ----

  Value bound(const Value& self, const std::string& name) {
    switch (self.type) {
      case Type::String:
        return string_method(self, name);
      case Type::Dict: {
        static const char* kSafe[] = {"items", "keys", "values", "get", "copy"};
        static const char* kUnsafe[] = {"pop", "popitem", "update", "setdefault", "clear", "fromkeys"};
        for (const char* m : kSafe)
          if (name == m) return dict_method(self, name);
        for (const char* m : kUnsafe)
          if (name == m) return unsafe(self, name);
        return Value::undefined("");
      }
      case Type::List: {
        static const char* kUnsafe[] = {"append", "extend",  "insert", "pop",
                                        "remove", "reverse", "sort",   "clear"};
        for (const char* m : kUnsafe)
          if (name == m) return unsafe(self, name);
        if (name == "index" || name == "count" || name == "copy") return list_method(self, name);
        return Value::undefined("");
      }
      default:
        return Value::undefined("");
    }
  }

  Value get_attr(const Value& obj, const std::string& name) {
    need_defined(obj);
    if (obj.type == Type::Namespace) {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined(fmt::format("'Namespace object' has no attribute '{}'", name));
    }
    Value m = bound(obj, name);
    if (!m.is_undefined() || !m.s.empty()) return m;
    if (obj.type == Type::Dict) {
      const Value* v = obj.dict->find(name);
      if (v) return *v;
    }
    return Value::undefined(undef_attr_msg(obj, name));
  }

  Value get_item(const Value& obj, const Value& key) {
    need_defined(obj);
    switch (obj.type) {
      case Type::Dict: {
        const Value* v = obj.dict->find(key);
        if (v) return *v;
        break;
      }
      case Type::List:
      case Type::String:
        if (key.type == Type::Int || key.type == Type::Bool) {
          const int64_t n = static_cast<int64_t>(obj.type == Type::List ? obj.list->size() : py_len(obj));
          int64_t i = key.type == Type::Int ? key.i : key.b;
          if (i < 0) i += n;
          if (i >= 0 && i < n) {
            if (obj.type == Type::List) return (*obj.list)[static_cast<size_t>(i)];
            std::string s;
            utf8_append(s, utf8_decode(obj.s)[static_cast<size_t>(i)]);
            return Value::string(std::move(s));
          }
          return Value::undefined(undef_item_msg(obj, key));
        }
        break;
      case Type::Namespace:
        if (key.is_string()) return get_attr(obj, key.s);
        break;
      default:
        break;
    }
    if (key.is_string()) {
      Value m = bound(obj, key.s);
      if (!m.is_undefined() || !m.s.empty()) return m;
    }
    return Value::undefined(undef_item_msg(obj, key));
  }

  static Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
    need_defined(obj);
    if (obj.type == Type::List) {
      int64_t b, e, st;
      slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step, b, e, st);
      List out;
      for (int64_t k = b; st > 0 ? k < e : k > e; k += st) out.push_back((*obj.list)[static_cast<size_t>(k)]);
      return Value::list_of(std::move(out), obj.tuple);
    }
    if (obj.is_string()) {
      const std::u32string u = utf8_decode(obj.s);
      int64_t b, e, st;
      slice_indices(static_cast<int64_t>(u.size()), start, stop, step, b, e, st);
      std::u32string out;
      for (int64_t k = b; st > 0 ? k < e : k > e; k += st) out.push_back(u[static_cast<size_t>(k)]);
      return Value::string(utf8_encode(out));
    }
    // Jinja compiles slices to a plain Python subscript (no environment.getitem fallback to Undefined).
    raise(fmt::format("'{}' object is not subscriptable", type_name(obj)));
  }

  // ---- methods ----

  static Value string_method(const Value& self, const std::string& name) {
    const std::string s = self.s;
    auto fn = [&](std::function<Value(CallArgs&)> f) { return Value::function(name, std::move(f)); };
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return fn([s, name](CallArgs& a) {
        a.check(name, {"chars"});
        return Value::string(py_strip(s, name != "rstrip", name != "lstrip", a.get(0, "chars")));
      });
    if (name == "split" || name == "rsplit")
      return fn([s, name](CallArgs& a) {
        a.check(name, {"sep", "maxsplit"});
        const Value* ms = a.get(1, "maxsplit");
        return str_list(py_split(s, a.get(0, "sep"), ms ? need_int(*ms, "maxsplit") : -1, name == "rsplit"));
      });
    if (name == "splitlines")
      return fn([s](CallArgs& a) {
        const Value* ke = a.get(0, "keepends");
        return str_list(splitlines(s, ke && truthy(*ke)));
      });
    if (name == "startswith" || name == "endswith")
      return fn([s, name](CallArgs& a) {
        a.check(name, {"prefix", "start", "end"});
        if (a.pos.empty()) raise(fmt::format("{}() takes at least 1 argument (0 given)", name));
        const std::u32string u = utf8_decode(s);
        int64_t b = 0, e = static_cast<int64_t>(u.size()), st = 1;
        slice_indices(static_cast<int64_t>(u.size()), a.get(1, "start"), a.get(2, "end"), nullptr, b, e, st);
        const std::string sub = b < e ? utf8_encode(std::u32string_view(u).substr(static_cast<size_t>(b),
                                                                                  static_cast<size_t>(e - b)))
                                      : "";
        List cands = a.pos[0].type == Type::List && a.pos[0].tuple ? *a.pos[0].list : List{a.pos[0]};
        for (const auto& c : cands) {
          if (!c.is_string())
            raise(fmt::format("{} first arg must be str or a tuple of str, not {}", name, type_name(c)));
          if (b > static_cast<int64_t>(u.size())) continue;
          if (name == "startswith"
                  ? sub.compare(0, c.s.size(), c.s) == 0 && sub.size() >= c.s.size()
                  : sub.size() >= c.s.size() && sub.compare(sub.size() - c.s.size(), c.s.size(), c.s) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      });
    if (name == "replace")
      return fn([s](CallArgs& a) {
        a.check("replace", {"old", "new", "count"});
        if (a.pos.size() < 2) raise("replace() takes at least 2 arguments");
        const Value* c = a.get(2, "count");
        return Value::string(py_replace(s, need_str(a.pos[0], "replace() argument 1"),
                                        need_str(a.pos[1], "replace() argument 2"),
                                        c ? need_int(*c, "count") : -1));
      });
    if (name == "upper" || name == "lower")
      return fn([s, name](CallArgs&) { return Value::string(map_case(s, name == "upper")); });
    if (name == "title") return fn([s](CallArgs&) { return Value::string(py_title(s)); });
    if (name == "capitalize") return fn([s](CallArgs&) { return Value::string(py_capitalize(s)); });
    if (name == "swapcase")
      return fn([s](CallArgs&) {
        std::u32string u = utf8_decode(s);
        for (auto& c : u) c = is_upper_c(c) ? to_lower(c) : to_upper(c);
        return Value::string(utf8_encode(u));
      });
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
      return fn([s, name](CallArgs& a) {
        a.check(name, {"sub", "start", "end"});
        if (a.pos.empty()) raise(fmt::format("{}() takes at least 1 argument (0 given)", name));
        const std::u32string u = utf8_decode(s);
        const std::u32string sub = utf8_decode(need_str(a.pos[0], "substring"));
        int64_t b = 0, e = 0, st = 1;
        slice_indices(static_cast<int64_t>(u.size()), a.get(1, "start"), a.get(2, "end"), nullptr, b, e, st);
        const std::u32string hay =
            b < e ? u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b)) : std::u32string();
        if (name == "count") {
          if (sub.empty()) return Value::integer(static_cast<int64_t>(hay.size()) + 1);
          int64_t n = 0;
          for (size_t p = hay.find(sub); p != std::u32string::npos; p = hay.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        }
        const bool right = name == "rfind" || name == "rindex";
        const size_t p = right ? hay.rfind(sub) : hay.find(sub);
        if (p == std::u32string::npos || b > static_cast<int64_t>(u.size())) {
          if (name == "index" || name == "rindex") raise("substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(p) + b);
      });
    if (name == "format") return fn([s](CallArgs& a) { return Value::string(brace_format(s, a)); });
    if (name == "join")
      return fn([s](CallArgs& a) {
        if (a.pos.size() != 1) raise("join() takes exactly one argument");
        std::string out;
        bool first = true;
        for (const auto& v : iterate(a.pos[0])) {
          if (!v.is_string())
            raise(fmt::format("sequence item: expected str instance, {} found", type_name(v)));
          if (!first) out += s;
          first = false;
          out += v.s;
        }
        return Value::string(std::move(out));
      });
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
        name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper")
      return fn([s, name](CallArgs&) {
        const std::u32string u = utf8_decode(s);
        if (u.empty()) return Value::boolean(false);
        if (name == "islower" || name == "isupper") {
          bool any = false;
          for (char32_t c : u) {
            if (name == "islower" ? is_upper_c(c) : is_lower_c(c)) return Value::boolean(false);
            any = any || is_cased(c);
          }
          return Value::boolean(any);
        }
        for (char32_t c : u) {
          const bool digit = c >= '0' && c <= '9';
          const bool alpha =
              (c < 0x80 && std::isalpha(static_cast<int>(c))) || (c >= 0x80 && !is_py_space(c));
          bool ok = false;
          if (name == "isspace")
            ok = is_py_space(c);
          else if (name == "isalpha")
            ok = alpha;
          else if (name == "isalnum")
            ok = alpha || digit;
          else
            ok = digit;
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      });
    if (name == "zfill")
      return fn([s](CallArgs& a) {
        if (a.pos.size() != 1) raise("zfill() takes exactly one argument");
        const int64_t w = need_int(a.pos[0], "zfill width");
        const std::u32string u = utf8_decode(s);
        if (static_cast<int64_t>(u.size()) >= w) return Value::string(s);
        std::string pad(static_cast<size_t>(w - static_cast<int64_t>(u.size())), '0');
        if (!s.empty() && (s[0] == '-' || s[0] == '+'))
          return Value::string(s.substr(0, 1) + pad + s.substr(1));
        return Value::string(pad + s);
      });
    if (name == "center" || name == "ljust" || name == "rjust")
      return fn([s, name](CallArgs& a) {
        a.check(name, {"width", "fillchar"});
        if (a.pos.empty()) raise(fmt::format("{}() takes at least 1 argument (0 given)", name));
        const int64_t w = need_int(a.pos[0], "width");
        const Value* fc = a.get(1, "fillchar");
        const std::string fill = fc ? need_str(*fc, "fillchar") : " ";
        const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
        if (len >= w) return Value::string(s);
        const int64_t total = w - len;
        int64_t left = name == "ljust" ? 0 : name == "rjust" ? total : total / 2 + (total & w & 1);
        std::string out;
        for (int64_t k = 0; k < left; ++k) out += fill;
        out += s;
        for (int64_t k = 0; k < total - left; ++k) out += fill;
        return Value::string(std::move(out));
      });
    if (name == "partition" || name == "rpartition")
      return fn([s, name](CallArgs& a) {
        if (a.pos.size() != 1) raise(fmt::format("{}() takes exactly one argument", name));
        const std::string sep = need_str(a.pos[0], "separator");
        if (sep.empty()) raise("empty separator");
        const size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
        if (p == std::string::npos)
          return name == "partition"
                     ? Value::list_of({Value::string(s), Value::string(""), Value::string("")}, true)
                     : Value::list_of({Value::string(""), Value::string(""), Value::string(s)}, true);
        return Value::list_of(
            {Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))},
            true);
      });
    if (name == "removeprefix" || name == "removesuffix")
      return fn([s, name](CallArgs& a) {
        if (a.pos.size() != 1) raise(fmt::format("{}() takes exactly one argument", name));
        const std::string x = need_str(a.pos[0], name.c_str());
        if (name == "removeprefix" && s.compare(0, x.size(), x) == 0)
          return Value::string(s.substr(x.size()));
        if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
            s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value::string(s.substr(0, s.size() - x.size()));
        return Value::string(s);
      });
    return Value::undefined("");
  }

  static Value dict_method(const Value& self, const std::string& name) {
    auto d = self.dict;
    if (name == "items")
      return Value::function(name, [d](CallArgs&) {
        List out;
        for (const auto& [k, v] : d->items) out.push_back(pair(k, v));
        return Value::list_of(std::move(out));
      });
    if (name == "keys")
      return Value::function(name, [d](CallArgs&) {
        List out;
        for (const auto& [k, v] : d->items) out.push_back(k);
        return Value::list_of(std::move(out));
      });
    if (name == "values")
      return Value::function(name, [d](CallArgs&) {
        List out;
        for (const auto& [k, v] : d->items) out.push_back(v);
        return Value::list_of(std::move(out));
      });
    if (name == "get")
      return Value::function(name, [d](CallArgs& a) {
        if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty())
          raise("get() takes 1 or 2 positional arguments");
        const Value* v = d->find(a.pos[0]);
        if (v) return *v;
        return a.pos.size() == 2 ? a.pos[1] : Value::none();
      });
    return Value::function(name, [d](CallArgs&) { return Value::dict_of(*d); });  // copy
  }

  static Value list_method(const Value& self, const std::string& name) {
    auto l = self.list;
    const bool tup = self.tuple;
    if (name == "index")
      return Value::function(name, [l](CallArgs& a) {
        if (a.pos.empty()) raise("index() takes at least 1 argument");
        for (size_t k = 0; k < l->size(); ++k)
          if (equals((*l)[k], a.pos[0])) return Value::integer(static_cast<int64_t>(k));
        raise(fmt::format("{} is not in list", repr(a.pos[0])));
      });
    if (name == "count")
      return Value::function(name, [l](CallArgs& a) {
        if (a.pos.size() != 1) raise("count() takes exactly one argument");
        int64_t n = 0;
        for (const auto& v : *l) n += equals(v, a.pos[0]) ? 1 : 0;
        return Value::integer(n);
      });
    return Value::function(name, [l, tup](CallArgs&) { return Value::list_of(*l, tup); });
  }

  // ---- filters ----

  // obj.attr for `attribute=` arguments (dotted paths; integer parts index).
  Value attr_path(const Value& obj, const Value& path) {
    if (!path.is_string()) return get_item(obj, path);
    Value cur = obj;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.s.find('.', start);
      const std::string part =
          path.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!part.empty() && std::all_of(part.begin(), part.end(),
                                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        cur = part.size() > 18 ? Value::undefined(undef_item_msg(cur, Value::string(part)))  // beyond int64
                               : get_item(cur, Value::integer(std::stoll(part)));
      else
        cur = get_item(cur, Value::string(part));
      if (dot == std::string::npos) break;
      if (cur.is_undefined()) return cur;
      start = dot + 1;
    }
    return cur;
  }

  // Key for sort/unique/min/max: optional attribute, case-folded strings unless case_sensitive.
  Value sort_key(const Value& v, const Value* attribute, bool case_sensitive) {
    Value k = attribute && !attribute->is_none() ? attr_path(v, *attribute) : v;
    if (!case_sensitive && k.is_string()) return Value::string(map_case(k.s, false));
    return k;
  }

  static bool flag(const Value* v, bool dflt) { return v ? truthy(*v) : dflt; }

  Value filter(const std::string& name, const Value& v, CallArgs& a) {
    if (name == "default" || name == "d") {
      a.check(name, {"default_value", "boolean"});
      const Value* dv = a.get(0, "default_value");
      const bool boolean = flag(a.get(1, "boolean"), false);
      if (v.is_undefined() || (boolean && !truthy(v))) return dv ? *dv : Value::string("");
      return v;
    }
    if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(py_len(v)));
    if (name == "string") return Value::string(to_str(v));
    if (name == "safe") return Value::string(to_str(v));  // Markup(str(value))
    if (name == "trim") {
      a.check(name, {"chars"});
      return Value::string(py_strip(to_str(v), true, true, a.get(0, "chars")));
    }
    if (name == "lower" || name == "upper") return Value::string(map_case(to_str(v), name == "upper"));
    if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
    if (name == "title") return Value::string(jinja_title(to_str(v)));
    if (name == "e" || name == "escape") return Value::string(html_escape(to_str(v)));
    if (name == "tojson") {
      a.check(name, {"ensure_ascii", "indent", "separators", "sort_keys"});
      JsonOptions o;
      o.ensure_ascii = flag(a.get(0, "ensure_ascii"), false);
      const Value* ind = a.get(1, "indent");
      if (ind && !ind->is_none()) {
        o.has_indent = true;
        o.item_sep = ",";
        o.indent =
            ind->is_string()
                ? ind->s
                : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(*ind, "indent"))), ' ');
      }
      const Value* seps = a.get(2, "separators");
      if (seps && !seps->is_none()) {
        if (seps->type != Type::List || seps->list->size() != 2)
          raise("tojson separators must be a pair of strings");
        o.item_sep = need_str((*seps->list)[0], "item separator");
        o.key_sep = need_str((*seps->list)[1], "key separator");
      }
      o.sort_keys = flag(a.get(3, "sort_keys"), false);
      return Value::string(to_json(v, o));
    }
    if (name == "first" || name == "last") {
      List items = v.is_undefined() ? List{} : iterate(v);
      if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::list_of(iterate(v));
    if (name == "items") {
      if (v.is_undefined()) return Value::list_of({});
      if (v.type != Type::Dict) raise("Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, x] : v.dict->items) out.push_back(pair(k, x));
      return Value::list_of(std::move(out));
    }
    if (name == "join") {
      a.check(name, {"d", "attribute"});
      const Value* d = a.get(0, "d");
      const Value* attribute = a.get(1, "attribute");
      const std::string sep = d ? to_str(*d) : "";
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += to_str(attribute ? attr_path(x, *attribute) : x);
      }
      return Value::string(std::move(out));
    }
    if (name == "replace") {
      a.check(name, {"old", "new", "count"});
      if (a.pos.size() < 2) raise("replace filter takes at least 2 arguments");
      const Value* c = a.get(2, "count");
      return Value::string(py_replace(to_str(v), to_str(a.pos[0]), to_str(a.pos[1]),
                                      c && !c->is_none() ? need_int(*c, "count") : -1));
    }
    if (name == "int") {
      a.check(name, {"default", "base"});
      const Value* dflt = a.get(0, "default");
      const Value fallback = dflt ? *dflt : Value::integer(0);
      need_defined(v);  // int(Undefined) raises UndefinedError, which the filter does not catch
      if (v.type == Type::Int) return v;
      if (v.type == Type::Bool) return Value::integer(v.b);
      if (v.type == Type::Float) return std::isfinite(v.f) ? Value::integer(float_to_int(v.f)) : fallback;
      if (v.is_string()) {
        std::string t = py_strip(v.s, true, true, nullptr);
        t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
        const Value* base = a.get(1, "base");
        const int b = base ? static_cast<int>(need_int(*base, "base")) : 10;
        try {
          size_t used = 0;
          const long long x = std::stoll(t, &used, b);
          if (used == t.size()) return Value::integer(x);
        } catch (const std::exception&) {
        }
        double x = NAN;
        try {
          size_t used = 0;
          x = std::stod(t, &used);
          if (used != t.size()) x = NAN;
        } catch (const std::exception&) {
        }
        if (std::isfinite(x)) return Value::integer(float_to_int(x));
      }
      return fallback;
    }
    if (name == "float") {
      a.check(name, {"default"});
      const Value* dflt = a.get(0, "default");
      const Value fallback = dflt ? *dflt : Value::number(0.0);
      need_defined(v);
      if (v.is_number()) return Value::number(num(v));
      if (v.is_string()) {
        std::string t = py_strip(v.s, true, true, nullptr);
        t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
        try {
          size_t used = 0;
          const double x = std::stod(t, &used);
          if (used == t.size() && !t.empty()) return Value::number(x);
        } catch (const std::exception&) {
        }
      }
      return fallback;
    }
    if (name == "abs") {
      need_defined(v);
      if (v.type == Type::Float) return Value::number(std::fabs(v.f));
      if (v.type == Type::Int) {
        if (v.i == INT64_MIN) raise("integer overflow in abs (template integers are 64-bit)");
        return Value::integer(v.i < 0 ? -v.i : v.i);
      }
      if (v.type == Type::Bool) return Value::integer(v.b);
      raise(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
    }
    if (name == "round") {
      a.check(name, {"precision", "method"});
      const Value* p = a.get(0, "precision");
      const int64_t prec = p ? need_int(*p, "precision") : 0;
      const Value* m = a.get(1, "method");
      const std::string method = m ? need_str(*m, "round method") : "common";
      need_defined(v);
      if (!v.is_number()) raise(fmt::format("type {} doesn't define __round__ method", type_name(v)));
      if (method == "common") {
        if (v.type != Type::Float) return Value::integer(v.type == Type::Int ? v.i : v.b);
        return Value::number(py_round(v.f, prec));
      }
      if (method != "ceil" && method != "floor") raise("method must be common, ceil or floor");
      const double scale = std::pow(10.0, static_cast<double>(prec));
      const double x = num(v) * scale;
      return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.s);
        std::reverse(u.begin(), u.end());
        return Value::string(utf8_encode(u));
      }
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list_of(std::move(items));
    }
    if (name == "sort") {
      a.check(name, {"reverse", "case_sensitive", "attribute"});
      const bool rev = flag(a.get(0, "reverse"), false);
      const bool cs = flag(a.get(1, "case_sensitive"), false);
      const Value* attribute = a.get(2, "attribute");
      List items = iterate(v);
      std::vector<std::pair<Value, size_t>> keyed;
      for (size_t k = 0; k < items.size(); ++k) keyed.emplace_back(sort_key(items[k], attribute, cs), k);
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return rev ? compare(y.first, x.first, "<") < 0 : compare(x.first, y.first, "<") < 0;
      });
      List out;
      for (const auto& [k, idx] : keyed) out.push_back(items[idx]);
      return Value::list_of(std::move(out));
    }
    if (name == "unique") {
      a.check(name, {"case_sensitive", "attribute"});
      const bool cs = flag(a.get(0, "case_sensitive"), false);
      const Value* attribute = a.get(1, "attribute");
      List out, seen;
      for (const auto& x : iterate(v)) {
        Value k = sort_key(x, attribute, cs);
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
        seen.push_back(k);
        out.push_back(x);
      }
      return Value::list_of(std::move(out));
    }
    if (name == "min" || name == "max") {
      a.check(name, {"case_sensitive", "attribute"});
      const bool cs = flag(a.get(0, "case_sensitive"), false);
      const Value* attribute = a.get(1, "attribute");
      List items = iterate(v);
      if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
      size_t best = 0;
      for (size_t k = 1; k < items.size(); ++k) {
        const int c = compare(sort_key(items[k], attribute, cs), sort_key(items[best], attribute, cs), "<");
        if (name == "min" ? c < 0 : c > 0) best = k;
      }
      return items[best];
    }
    if (name == "sum") {
      a.check(name, {"attribute", "start"});
      const Value* attribute = a.get(0, "attribute");
      const Value* start = a.get(1, "start");
      Value acc = start ? *start : Value::integer(0);
      for (const auto& x : iterate(v)) acc = binary("+", acc, attribute ? attr_path(x, *attribute) : x);
      return acc;
    }
    if (name == "map") {
      List out;
      if (!truthy(v)) return Value::list_of({});  // Jinja: `if value: for item in value: ...`
      const Value* attribute = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "attribute") attribute = &x;
      if (attribute) {
        const Value* dflt = nullptr;
        for (const auto& [k, x] : a.kw)
          if (k == "default") dflt = &x;
        for (const auto& x : iterate(v)) {
          Value r = attr_path(x, *attribute);
          out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
        return Value::list_of(std::move(out));
      }
      if (a.pos.empty()) raise("map requires a filter name or attribute=");
      const std::string fname = need_str(a.pos[0], "map filter name");
      if (!known_filter(fname)) raise(fmt::format("no filter named '{}'", fname));
      CallArgs rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const auto& x : iterate(v)) {
        CallArgs c = rest;
        out.push_back(filter(fname, x, c));
      }
      return Value::list_of(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool want = name == "select" || name == "selectattr";
      if (!truthy(v)) return Value::list_of({});
      size_t k = 0;
      const Value* attribute = nullptr;
      if (attr) {
        if (a.pos.empty()) raise(fmt::format("{} requires an attribute name", name));
        attribute = &a.pos[k++];
      }
      std::string tname;
      if (k < a.pos.size()) tname = need_str(a.pos[k++], "test name");
      if (!tname.empty() && !known_test(tname)) raise(fmt::format("no test named '{}'", tname));
      CallArgs targs;
      targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k), a.pos.end());
      targs.kw = a.kw;
      List out;
      for (const auto& x : iterate(v)) {
        const Value subject = attribute ? attr_path(x, *attribute) : x;
        CallArgs c = targs;
        const bool r = tname.empty() ? truthy(subject) : test(tname, subject, c);
        if (r == want) out.push_back(x);
      }
      return Value::list_of(std::move(out));
    }
    if (name == "attr") {
      if (a.pos.size() != 1) raise("attr filter takes exactly one argument");
      return get_attr(v, need_str(a.pos[0], "attribute name"));
    }
    if (name == "batch") {
      a.check(name, {"linecount", "fill_with"});
      if (a.pos.empty()) raise("batch filter requires linecount");
      const int64_t n = need_int(a.pos[0], "linecount");
      if (n <= 0) raise("batch linecount must be positive");
      const Value* fill = a.get(1, "fill_with");
      List out, cur;
      for (const auto& x : iterate(v)) {
        cur.push_back(x);
        if (static_cast<int64_t>(cur.size()) == n) {
          out.push_back(Value::list_of(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (fill && !fill->is_none())
          while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
        out.push_back(Value::list_of(std::move(cur)));
      }
      return Value::list_of(std::move(out));
    }
    if (name == "dictsort") {
      a.check(name, {"case_sensitive", "by", "reverse"});
      if (v.type != Type::Dict) raise("You can only sort by either 'key' or 'value'");
      const bool cs = flag(a.get(0, "case_sensitive"), false);
      const Value* by = a.get(1, "by");
      const bool by_value = by && by->is_string() && by->s == "value";
      const bool rev = flag(a.get(2, "reverse"), false);
      List items;
      for (const auto& [k, x] : v.dict->items) items.push_back(pair(k, x));
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = sort_key((*x.list)[by_value ? 1 : 0], nullptr, cs),
              ky = sort_key((*y.list)[by_value ? 1 : 0], nullptr, cs);
        return rev ? compare(ky, kx, "<") < 0 : compare(kx, ky, "<") < 0;
      });
      return Value::list_of(std::move(items));
    }
    if (name == "indent") {
      a.check(name, {"width", "first", "blank"});
      const Value* w = a.get(0, "width");
      const std::string ind =
          w && w->is_string()
              ? w->s
              : std::string(static_cast<size_t>(w ? std::max<int64_t>(0, need_int(*w, "width")) : 4), ' ');
      const bool first = flag(a.get(1, "first"), false);
      const bool blank = flag(a.get(2, "blank"), false);
      if (!v.is_string())
        raise(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
      std::vector<std::string> lines = splitlines(v.s + "\n", false);
      std::string rv;
      if (blank) {
        for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
      } else {
        rv = lines.empty() ? "" : lines[0];
        for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
      }
      return Value::string(first ? ind + rv : rv);
    }
    if (name == "format") {
      const std::string f = to_str(v);
      if (!a.kw.empty()) raise("format filter with keyword arguments is not supported");
      return Value::string(percent_format(f, a.pos));
    }
    if (name == "center") {
      a.check(name, {"width"});
      const Value* w = a.get(0, "width");
      CallArgs c;
      c.pos.push_back(w ? *w : Value::integer(80));
      return call(string_method(Value::string(to_str(v)), "center"), c);
    }
    if (name == "wordcount") {
      int64_t n = 0;
      bool in_word = false;
      for (char32_t c : utf8_decode(to_str(v))) {
        // \w: letters and digits; Latin-1 symbols, punctuation, symbol blocks and emoji are not word
        // characters.
        const bool symbol = (c >= 0x80 && c <= 0xBF) || c == 0xD7 || c == 0xF7 ||
                            (c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) ||
                            (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xFF00 && c <= 0xFF0F) ||
                            (c >= 0x1F000 && c <= 0x1FAFF);
        const bool w =
            c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !is_py_space(c) && !symbol);
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::integer(n);
    }
    raise(fmt::format("no filter named '{}'", name));
  }

  // ---- tests ----

  bool test(const std::string& name, const Value& v, CallArgs& a) {
    auto arg = [&]() -> const Value& {
      if (a.pos.empty()) raise(fmt::format("test '{}' requires an argument", name));
      return a.pos[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.type == Type::Int;
    if (name == "float") return v.type == Type::Float;
    if (name == "boolean") return v.type == Type::Bool;
    if (name == "true") return v.type == Type::Bool && v.b;
    if (name == "false") return v.type == Type::Bool && !v.b;
    if (name == "mapping") return v.type == Type::Dict;
    if (name == "iterable")
      return v.type == Type::Undefined || v.type == Type::String || v.type == Type::List ||
             v.type == Type::Dict;
    if (name == "sequence")
      return v.type == Type::Undefined || v.type == Type::String || v.type == Type::List ||
             v.type == Type::Dict;
    if (name == "callable") return v.type == Type::Function;
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
    if (name == "ne" || name == "!=") return !equals(v, arg());
    if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, arg());
    if (name == "le" || name == "<=") return compare_op("<=", v, arg());
    if (name == "gt" || name == "greaterthan" || name == ">") return compare_op(">", v, arg());
    if (name == "ge" || name == ">=") return compare_op(">=", v, arg());
    if (name == "in") return contains(arg(), v);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.type != o.type) return false;
      if (v.type == Type::List) return v.list == o.list;
      if (v.type == Type::Dict || v.type == Type::Namespace) return v.dict == o.dict;
      return equals(v, o);
    }
    if (name == "odd" || name == "even")
      return equals(binary("%", v, Value::integer(2)), Value::integer(name == "odd"));
    if (name == "divisibleby") {
      const int64_t d = need_int(arg(), "divisibleby argument");
      if (d == 0) raise("integer division or modulo by zero");
      return need_int(v, "divisibleby value") % d == 0;
    }
    if (name == "lower" || name == "upper") {
      CallArgs none;
      return truthy(
          call(string_method(Value::string(to_str(v)), name == "lower" ? "islower" : "isupper"), none));
    }
    if (name == "escaped") return false;
    if (name == "filter") return known_filter(to_str(v));
    if (name == "test") return known_test(to_str(v));
    raise(fmt::format("no test named '{}'", name));
  }
};

}  // namespace

std::string render_template(const Body& body, const std::vector<std::pair<std::string, Value>>& context) {
  Interp in;
  return in.render(body, context);
}

}  // namespace strata::chat
