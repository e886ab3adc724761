// Chat-template values: Python-compatible printing, JSON, equality, ordering, UTF-8 helpers.
#include "value.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "strata/error.hpp"

namespace strata::chat {

void raise(const std::string& message) {
  throw TemplateError(message);
}

const char* const kNamespaceInNamespace =
    "a namespace cannot hold another namespace (or itself), directly or inside a list or dict";

namespace {
int checked_nest(int inner) {
  if (inner + 1 > Value::kMaxNesting)
    raise(fmt::format("values nest deeper than {} levels of lists and dicts", Value::kMaxNesting));
  return inner + 1;
}
int dict_nest(Dict& d) {
  int inner = 0;
  for (const auto& [k, x] : d.items) {
    inner = std::max({inner, k.depth(), x.depth()});
    d.holds_ns = d.holds_ns || k.reaches_namespace() || x.reaches_namespace();
  }
  return checked_nest(inner);
}

}  // namespace

int Value::depth() const {
  if (type == Type::List) return nest;
  if ((type == Type::Dict || type == Type::Namespace) && dict) return dict->nest;
  return 0;
}

bool Value::reaches_namespace() const {
  if (type == Type::Namespace) return true;
  if (type == Type::List) return holds_ns;
  if (type == Type::Dict && dict) return dict->holds_ns;
  return false;
}

Value Value::list_of(List items, bool is_tuple) {
  int inner = 0;
  bool ns = false;
  for (const auto& x : items) {
    inner = std::max(inner, x.depth());
    ns = ns || x.reaches_namespace();
  }
  Value v = make(Type::List);
  v.nest = checked_nest(inner);
  v.holds_ns = ns;
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = is_tuple;
  return v;
}

Value Value::dict_of(Dict d) {
  Value v = make(Type::Dict);
  d.nest = dict_nest(d);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::namespace_of(Dict d) {
  Value v = make(Type::Namespace);
  d.nest = dict_nest(d);
  if (d.holds_ns) raise(kNamespaceInNamespace);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v = make(Type::Function);
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.type == Type::String && k.s == key) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value v) {
  nest = std::max(nest, checked_nest(std::max(key.depth(), v.depth())));
  holds_ns = holds_ns || key.reaches_namespace() || v.reaches_namespace();
  for (auto& [k, old] : items) {
    if (equals(k, key)) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t n, std::string_view name) const {
  if (n < pos.size()) return &pos[n];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

void CallArgs::check(std::string_view what, std::initializer_list<std::string_view> names) const {
  if (pos.size() > names.size())
    raise(fmt::format("{}() takes at most {} argument(s) ({} given)", what, names.size(), pos.size()));
  for (const auto& [k, v] : kw) {
    if (std::find(names.begin(), names.end(), k) == names.end())
      raise(fmt::format("{}() got an unexpected keyword argument '{}'", what, k));
  }
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
      return "Undefined";
    case Type::None:
      return "NoneType";
    case Type::Bool:
      return "bool";
    case Type::Int:
      return "int";
    case Type::Float:
      return "float";
    case Type::String:
      return "str";
    case Type::List:
      return v.tuple ? "tuple" : "list";
    case Type::Dict:
      return "dict";
    case Type::Namespace:
      return "Namespace";
    case Type::Function:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
    case Type::None:
      return false;
    case Type::Bool:
      return v.b;
    case Type::Int:
      return v.i != 0;
    case Type::Float:
      return v.f != 0.0;
    case Type::String:
      return !v.s.empty();
    case Type::List:
      return !v.list->empty();
    case Type::Dict:
      return !v.dict->items.empty();
    case Type::Namespace:
    case Type::Function:
      return true;
  }
  return false;
}

// ---- UTF-8 ------------------------------------------------------------------------------------------------

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      cp = c, n = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1F, n = 2;
    } else if ((c >> 4) == 0xE) {
      cp = c & 0x0F, n = 3;
    } else if ((c >> 3) == 0x1E) {
      cp = c & 0x07, n = 4;
    }
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {  // keep the raw byte (like Python's surrogateescape) so it round-trips
      out.push_back(0xDC00 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // an escaped raw byte
    out.push_back(static_cast<char>(c - 0xDC00));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_py_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, bool left, bool right, const Value* chars) {
  const bool ws = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!ws && !chars->is_string()) raise("strip arg must be None or str");
  const std::u32string set = ws ? std::u32string() : utf8_decode(chars->s);
  auto strip_it = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  const std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

// ---- printing ---------------------------------------------------------------------------------------------

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02" (shortest round-trip digits)
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int nd = static_cast<int>(digits.size());
  if (exp10 >= -4 && exp10 < 16) {
    std::string out;
    if (exp10 < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (exp10 + 1 >= nd) {
      out = digits + std::string(static_cast<size_t>(exp10 + 1 - nd), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp10 + 1)) + "." +
            digits.substr(static_cast<size_t>(exp10 + 1));
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (nd > 1) out += "." + digits.substr(1);
  out += exp10 < 0 ? "e-" : "e+";
  const int ae = std::abs(exp10);
  if (ae < 10) out += "0";
  out += std::to_string(ae);
  return sign + out;
}

static bool py_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x2064) || c == 0x3000 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF) ||
      (c >= 0xE000 && c <= 0xF8FF))
    return false;
  return true;
}

static std::string repr_string(const std::string& s) {
  const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      out += fmt::format("\\udc{:02x}", static_cast<unsigned>(c - 0xDC00));
    } else if (!py_printable(c)) {
      if (c < 0x100)
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      else if (c < 0x10000)
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else
        out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

static std::string repr_seq(const Value& v) {
  std::string out = v.tuple ? "(" : "[";
  for (size_t k = 0; k < v.list->size(); ++k) {
    if (k) out += ", ";
    out += repr((*v.list)[k]);
  }
  if (v.tuple && v.list->size() == 1) out += ",";
  out += v.tuple ? ")" : "]";
  return out;
}

static std::string repr_dict(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, val] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += repr(k) + ": " + repr(val);
  }
  return out + "}";
}

std::string repr(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
      return "Undefined";
    case Type::String:
      return repr_string(v.s);
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
      return "";
    case Type::None:
      return "None";
    case Type::Bool:
      return v.b ? "True" : "False";
    case Type::Int:
      return std::to_string(v.i);
    case Type::Float:
      return float_repr(v.f);
    case Type::String:
      return v.s;
    case Type::List:
      return repr_seq(v);
    case Type::Dict:
      return repr_dict(*v.dict);
    case Type::Namespace:
      return "<Namespace " + repr_dict(*v.dict) + ">";
    case Type::Function:
      return "<function " + v.fn->name + ">";
  }
  return "";
}

// ---- JSON -------------------------------------------------------------------------------------------------

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<unsigned>(0xD800 + (v >> 10)),
                           static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      }
    } else {
      utf8_append(out, c);
    }
  }
  out += '"';
}

static std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

static std::string json_key(const Value& k) {
  switch (k.type) {
    case Type::String:
      return k.s;
    case Type::Int:
      return std::to_string(k.i);
    case Type::Float:
      return json_float(k.f);
    case Type::Bool:
      return k.b ? "true" : "false";
    case Type::None:
      return "null";
    default:
      raise(fmt::format("keys must be str, int, float, bool or None, not {}", type_name(k)));
  }
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += opt.indent;
  };
  switch (v.type) {
    case Type::None:
      out += "null";
      return;
    case Type::Bool:
      out += v.b ? "true" : "false";
      return;
    case Type::Int:
      out += std::to_string(v.i);
      return;
    case Type::Float:
      out += json_float(v.f);
      return;
    case Type::String:
      json_string(out, v.s, opt.ensure_ascii);
      return;
    case Type::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_value(out, (*v.list)[k], opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += ']';
      return;
    }
    case Type::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, val] : v.dict->items) items.emplace_back(json_key(k), &val);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_string(out, items[k].first, opt.ensure_ascii);
        out += opt.key_sep;
        json_value(out, *items[k].second, opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      raise(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  return out;
}

// ---- comparison -------------------------------------------------------------------------------------------

static double as_double(const Value& v) {
  return v.type == Type::Float ? v.f : v.type == Type::Int ? static_cast<double>(v.i) : (v.b ? 1.0 : 0.0);
}

static int64_t as_int(const Value& v) {
  return v.type == Type::Int ? v.i : (v.b ? 1 : 0);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::Float && b.type != Type::Float) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::Undefined:
    case Type::None:
      return true;
    case Type::String:
      return a.s == b.s;
    case Type::List: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Type::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    case Type::Namespace:
      return a.dict == b.dict;
    case Type::Function:
      return a.fn == b.fn;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::Float && b.type != Type::Float) {
      const int64_t x = as_int(a), y = as_int(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type == Type::String && b.type == Type::String) {
    const int c = a.s.compare(b.s);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.type == Type::List && b.type == Type::List && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  raise(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

// ---- JSON input -------------------------------------------------------------------------------------------

template <class J>
static Value convert(const J& j, int level = 1) {
  // A request's JSON can nest as deep as its size allows; refuse before the recursion below can overflow.
  if (level > Value::kMaxNesting && (j.is_array() || j.is_object()))
    fail("chat_template", "a message or template variable nests deeper than {} levels of lists and objects",
         Value::kMaxNesting);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert(e, level + 1));
      return Value::list_of(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value::string(it.key()), convert(it.value(), level + 1));
      return Value::dict_of(std::move(d));
    }
    default:
      return Value::none();
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  return convert(j);
}
Value from_json(const nlohmann::json& j) {
  return convert(j);
}

}  // namespace strata::chat
