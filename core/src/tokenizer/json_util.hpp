// Typed access to tokenizer.json fields with errors that name the field and what was expected.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "strata/error.hpp"

namespace strata::tok {

inline const char* json_kind(const nlohmann::json& j) {
  return j.type_name();
}

// j[key] when present (and not null when allow_null is false), else nullptr.
inline const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

inline const nlohmann::json& require(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json* f = field(j, key);
  if (f == nullptr) fail("tokenizer", "{}.{} is missing (expected it in tokenizer.json)", where, key);
  return *f;
}

inline std::string get_string(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& f = require(j, key, where);
  if (!f.is_string()) fail("tokenizer", "{}.{} is a {} (expected a string)", where, key, json_kind(f));
  return f.get<std::string>();
}

inline bool get_bool(const nlohmann::json& j, const char* key, const std::string& where, bool dflt) {
  const nlohmann::json* f = field(j, key);
  if (f == nullptr || f->is_null()) return dflt;
  if (!f->is_boolean())
    fail("tokenizer", "{}.{} is a {} (expected true or false)", where, key, json_kind(*f));
  return f->get<bool>();
}

inline int32_t as_id(const nlohmann::json& f, const std::string& what) {
  if (!f.is_number_integer() || f.get<int64_t>() < 0 || f.get<int64_t>() > INT32_MAX) {
    fail("tokenizer", "{} is {} (expected a non-negative integer token id)", what, f.dump());
  }
  return static_cast<int32_t>(f.get<int64_t>());
}

// The "type" of a component object, or "" when the object has none.
inline std::string type_of(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    fail("tokenizer", "{} is a {} (expected an object with a \"type\")", where, json_kind(j));
  const nlohmann::json* t = field(j, "type");
  if (t == nullptr) return "";
  if (!t->is_string()) fail("tokenizer", "{}.type is a {} (expected a string)", where, json_kind(*t));
  return t->get<std::string>();
}

}  // namespace strata::tok
