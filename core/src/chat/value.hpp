// Chat-template values: the Python objects a Jinja template sees (None, bool, int, float, str, list, dict,
// namespace, callables, Undefined) with Python's str()/repr(), json.dumps, equality, ordering and truthiness.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::chat {

// A runtime error inside the template (the interpreter adds the template line).
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& m) : std::runtime_error(m) {}
};
[[noreturn]] void raise(const std::string& message);

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Callable;

enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

struct Value {
  Type type = Type::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                 // String; for Undefined: the error an access would raise
  std::shared_ptr<List> list;    // List (tuple=true for Python tuples: repr "(a, b)")
  std::shared_ptr<Dict> dict;    // Dict and Namespace (a namespace's dict is mutable through `set ns.x`)
  std::shared_ptr<Callable> fn;  // Function
  bool tuple = false;
  int nest = 0;  // List: levels of lists and dicts inside, itself included (dicts keep theirs in Dict::nest)

  // Values nest at most this deep (Python stops near 1000 with RecursionError). Without the bound a request's
  // JSON or a template loop could build a value whose printing, comparison or destruction overflows the
  // stack.
  static constexpr int kMaxNesting = 512;
  int depth() const;               // 0 for scalars, else the nesting levels of this list, dict or namespace
  bool holds_ns = false;           // List: a namespace is inside (dicts keep theirs in Dict::holds_ns)
  bool reaches_namespace() const;  // a namespace is this value or inside it

  static Value undefined(std::string why) {
    Value v;
    v.s = std::move(why);
    return v;
  }
  static Value none() { return make(Type::None); }
  static Value boolean(bool x) {
    Value v = make(Type::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Type::Int);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = make(Type::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(Type::String);
    v.s = std::move(x);
    return v;
  }
  static Value list_of(List items, bool is_tuple = false);
  static Value dict_of(Dict d);
  static Value namespace_of(Dict d);
  static Value function(std::string name, std::function<Value(struct CallArgs&)> fn);

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool is_mapping() const { return type == Type::Dict; }

 private:
  static Value make(Type t) {
    Value v;
    v.type = t;
    return v;
  }
};

extern const char* const
    kNamespaceInNamespace;  // the error of namespace(...) and `set ns.x` (jinja2 allows it)

// An insertion-ordered dict (Python 3.7+ semantics); keys are values (almost always strings).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  int nest = 1;  // levels, itself included; raised by set(), never lowered (a bound, not an exact depth)
  // A namespace is inside (set() keeps it; never cleared). Namespaces are the only mutable values and may not
  // hold one another (kNamespaceInNamespace), so no value contains itself (a cycle of shared pointers would
  // never be freed) and a list's depth, fixed when it is built, is off by at most one namespace's contents.
  bool holds_ns = false;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value v);
  void set(const std::string& key, Value v) { set(Value::string(key), std::move(v)); }
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional-or-keyword lookup for builtins: the n-th positional or the keyword `name`, or nullptr.
  const Value* get(size_t n, std::string_view name) const;
  // Fails when more positional or other keyword arguments were given than `names` allows.
  void check(std::string_view what, std::initializer_list<std::string_view> names) const;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Python's type name ("str", "dict", ...) as used in error messages.
std::string type_name(const Value& v);

// Python truthiness (Undefined is falsy).
bool truthy(const Value& v);
// str(v) as Jinja prints it ({{ v }}): Undefined prints as "".
std::string to_str(const Value& v);
// repr(v) (used inside containers).
std::string repr(const Value& v);
// float.__repr__.
std::string float_repr(double x);

struct JsonOptions {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;  // the indent unit when has_indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
// json.dumps(v, ...) with Python's formatting.
std::string to_json(const Value& v, const JsonOptions& opt);

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <, raising TypeError-like errors for unorderable types; returns -1, 0, 1.
int compare(const Value& a, const Value& b, const char* op);

// Conversion from JSON documents (insertion order preserved for ordered_json).
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

// UTF-8 helpers (Python indexes strings by code point).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool is_py_space(char32_t c);  // str.isspace()
std::string py_strip(std::string_view s, bool left, bool right, const Value* chars);

}  // namespace strata::chat
