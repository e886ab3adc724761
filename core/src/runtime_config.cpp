// YAML runtime configuration parsing with strict key and type checks (yaml-cpp).
#include "strata/runtime_config.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>

#include "strata/error.hpp"
#include "strata/json_text.hpp"

namespace strata {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kComp = "config";

struct Ctx {
  std::string file;
  std::string where(const YAML::Node& n) const {
    const auto m = n.Mark();
    return m.line >= 0 ? fmt::format("{}:{}", file, m.line + 1) : file;
  }
};

void check_keys(const Ctx& c, const YAML::Node& map, const std::string& section,
                const std::set<std::string>& allowed) {
  if (!map.IsMap()) fail(kComp, "{}: '{}' must be a mapping", c.where(map), section);
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      fail(kComp, "{}: a key of '{}' is a {}; expected a plain name", c.where(kv.first),
           section.empty() ? "the top level" : section, kv.first.IsSequence() ? "list" : "mapping");
    const std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(kComp, "{}: unknown key '{}{}' (expected one of: {})", c.where(kv.first),
           section.empty() ? "" : section + ".", key, list);
    }
  }
}

std::string as_string(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(kComp, "{}: '{}' must be a string", c.where(n), key);
  return n.as<std::string>();
}

bool as_bool(const Ctx& c, const YAML::Node& n, const std::string& key) {
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v))
    fail(kComp, "{}: '{}' must be true or false", c.where(n), key);
  return v;
}

double as_number(const Ctx& c, const YAML::Node& n, const std::string& key) {
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v))
    fail(kComp, "{}: '{}' must be a number", c.where(n), key);
  return v;
}

std::optional<double> as_auto_number(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar() && n.Scalar() == "auto") return std::nullopt;
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v) || v < 0) {
    fail(kComp, "{}: '{}' must be 'auto' or a non-negative number of GB", c.where(n), key);
  }
  return v;
}

std::vector<std::string> as_string_list(const Ctx& c, const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    out.push_back(n.as<std::string>());
  } else if (n.IsSequence()) {
    for (const auto& e : n) out.push_back(as_string(c, e, key + "[]"));
  } else {
    fail(kComp, "{}: '{}' must be a string or a list of strings", c.where(n), key);
  }
  return out;
}

}  // namespace

RuntimeConfig parse_runtime_config(const std::string& text, const fs::path& origin) {
  Ctx c{origin.string()};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(kComp, "{}:{}: malformed YAML: {}", c.file, e.mark.line + 1, e.msg);
  }
  RuntimeConfig cfg;
  cfg.source = origin;
  if (root.IsNull()) return cfg;
  check_keys(c, root, "", {"plugins", "backends", "memory", "disk", "scheduler"});
  const fs::path base = origin.has_parent_path() ? origin.parent_path() : fs::path(".");
  if (auto p = root["plugins"]) {
    check_keys(c, p, "plugins", {"path"});
    if (auto path = p["path"]) {
      for (const auto& s : as_string_list(c, path, "plugins.path")) {
        fs::path dir(s);
        cfg.plugins.path.push_back(dir.is_absolute() ? dir : base / dir);
      }
    }
  }
  if (auto b = root["backends"]) {
    check_keys(c, b, "backends", {"dense", "experts"});
    if (auto d = b["dense"]) {
      cfg.backends.dense = as_string_list(c, d, "backends.dense");
      if (cfg.backends.dense.empty())
        fail(kComp, "{}: 'backends.dense' is an empty list (name a plugin, or auto)", c.where(d));
    }
    if (auto e = b["experts"]) {
      cfg.backends.experts = as_string_list(c, e, "backends.experts");
      if (cfg.backends.experts.size() == 1 && cfg.backends.experts[0] == "auto") cfg.backends.experts.clear();
    }
  }
  if (auto m = root["memory"]) {
    check_keys(c, m, "memory", {"vram_gb", "ram_gb", "reserve_gb", "pin"});
    if (auto v = m["vram_gb"]) cfg.memory.vram_gb = as_auto_number(c, v, "memory.vram_gb");
    if (auto v = m["ram_gb"]) cfg.memory.ram_gb = as_auto_number(c, v, "memory.ram_gb");
    if (auto v = m["reserve_gb"]) {
      cfg.memory.reserve_gb = as_number(c, v, "memory.reserve_gb");
      if (cfg.memory.reserve_gb < 0) fail(kComp, "{}: 'memory.reserve_gb' must be >= 0", c.where(v));
    }
    if (auto v = m["pin"]) cfg.memory.pin = as_string(c, v, "memory.pin");
  }
  if (auto d = root["disk"]) {
    check_keys(c, d, "disk", {"direct_io", "queue_depth", "engine"});
    if (auto v = d["direct_io"]) {
      const std::string t = v.IsScalar() ? v.Scalar() : "";
      if (t == "auto") {
        cfg.disk.direct_io = "auto";
      } else {
        cfg.disk.direct_io = as_bool(c, v, "disk.direct_io") ? "true" : "false";
      }
    }
    if (auto v = d["queue_depth"]) {
      const double q = as_number(c, v, "disk.queue_depth");
      if (q < 1 || q > 4096 || q != std::floor(q)) {
        fail(kComp, "{}: 'disk.queue_depth' must be an integer from 1 to 4096", c.where(v));
      }
      cfg.disk.queue_depth = static_cast<int>(q);
    }
    if (auto v = d["engine"]) {
      cfg.disk.engine = as_string(c, v, "disk.engine");
      if (cfg.disk.engine != "auto" && cfg.disk.engine != "io_uring" && cfg.disk.engine != "pread") {
        fail(kComp, "{}: 'disk.engine' must be auto, io_uring or pread (got '{}')", c.where(v),
             cfg.disk.engine);
      }
    }
  }
  if (auto s = root["scheduler"]) {
    check_keys(c, s, "scheduler", {"threads", "overlap", "prefetch"});
    if (auto t = s["threads"]) {
      const double v = as_number(c, t, "scheduler.threads");
      if (v < 0 || v > 65536 ||
          v != std::floor(v)) {  // range first: the cast of a larger double is undefined
        fail(kComp, "{}: 'scheduler.threads' must be a non-negative integer (0 = all cores) up to 65536",
             c.where(t));
      }
      cfg.scheduler.threads = static_cast<int>(v);
    }
    if (auto o = s["overlap"]) cfg.scheduler.overlap = as_bool(c, o, "scheduler.overlap");
    if (auto o = s["prefetch"]) cfg.scheduler.prefetch = as_bool(c, o, "scheduler.prefetch");
  }
  return cfg;
}

RuntimeConfig load_runtime_config(const fs::path& file) {
  return parse_runtime_config(read_text_file(file, kComp, " (expected the YAML runtime config)"), file);
}

}  // namespace strata
