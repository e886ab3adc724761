// Plugin discovery and validation on Boost.DLL, and backend choice from the YAML config.
#include "strata/registry.hpp"

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <utility>

#include "strata/error.hpp"
#include "strata/plugin_abi.h"

namespace strata {
namespace fs = std::filesystem;
namespace dll = boost::dll;

std::vector<fs::path> plugin_search_path(const std::vector<fs::path>& extra) {
  std::vector<fs::path> out;
  auto add = [&](const fs::path& p) {
    if (p.empty()) return;
    std::error_code ec;
    fs::path canon = fs::weakly_canonical(p, ec);
    if (ec) canon = p;
    if (std::find(out.begin(), out.end(), canon) == out.end()) out.push_back(canon);
  };
  boost::system::error_code bec;
  const auto exe = dll::program_location(bec);
  if (!bec) {
    const fs::path exe_dir = fs::path(exe.parent_path().string());
    add(exe_dir / "plugins");
    add(exe_dir / ".." / "lib" / "strata" / "plugins");
  }
#ifdef STRATA_BUILD_PLUGIN_DIR
  add(STRATA_BUILD_PLUGIN_DIR);
#endif
  if (const char* env = std::getenv("STRATA_PLUGIN_PATH")) {
    std::string s(env);
    size_t start = 0;
    while (start <= s.size()) {
      const size_t end = s.find(':', start);
      add(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  for (const auto& p : extra) add(p);
  return out;
}

PluginRegistry::PluginRegistry(const std::vector<fs::path>& search_path) : search_path_(search_path) {
  for (const auto& dir : search_path_) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string fname = e.path().filename().string();
      if (e.is_regular_file() && fname.rfind("libstrata_", 0) == 0 && e.path().extension() == ".so") {
        files.push_back(e.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load(f);
  }
}

void PluginRegistry::load(const fs::path& file) {
  PluginRecord rec;
  rec.file = file;
  rec.name = file.stem().string().substr(std::string("libstrata_").size());
  auto reject = [&](std::string why) {
    rec.usable = false;
    rec.reason = std::move(why);
    plugins_.push_back(std::move(rec));
  };
  std::shared_ptr<dll::shared_library> lib;
  try {
    lib = std::make_shared<dll::shared_library>(boost::dll::fs::path(file.string()),
                                                dll::load_mode::rtld_now | dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return reject(fmt::format("cannot be loaded: {}", e.what()));
  }
  if (!lib->has(STRATA_PLUGIN_INIT_SYMBOL)) return reject("missing symbol strata_plugin_init");
  if (!lib->has(STRATA_PLUGIN_SCORE_SYMBOL)) return reject("missing symbol strata_plugin_score");
  auto& init = lib->get<const strata_plugin_vtable*()>(STRATA_PLUGIN_INIT_SYMBOL);
  auto& score = lib->get<uint32_t()>(STRATA_PLUGIN_SCORE_SYMBOL);
  const strata_plugin_vtable* vt = init();
  if (vt == nullptr) return reject("strata_plugin_init returned NULL");
  if (vt->abi_version != STRATA_PLUGIN_ABI_VERSION) {
    return reject(
        fmt::format("ABI version {} (this strata expects {})", vt->abi_version, STRATA_PLUGIN_ABI_VERSION));
  }
  if (vt->struct_size < STRATA_PLUGIN_VTABLE_MIN_SIZE) {
    return reject(fmt::format("vtable of {} bytes is smaller than the {} this strata needs", vt->struct_size,
                              STRATA_PLUGIN_VTABLE_MIN_SIZE));
  }
  if (vt->name == nullptr || vt->create == nullptr || vt->destroy == nullptr || vt->last_error == nullptr) {
    return reject("vtable lacks name, create, destroy or last_error");
  }
  rec.name = vt->name;
  rec.version = vt->version != nullptr ? vt->version : "";
  rec.description = vt->description != nullptr ? vt->description : "";
  rec.vtable = vt;
  if (STRATA_PLUGIN_HAS_SLOT(vt, approximation)) {
    rec.approximation = vt->approximation;
    if (rec.approximation.empty()) rec.approximation = "not exact mode (the plugin gives no details)";
  }
  for (const auto& p : plugins_) {
    if (p.usable && p.name == rec.name)
      return reject(fmt::format("shadowed by {} (same name)", p.file.string()));
  }
  rec.score = score();
  if (rec.score == 0) {
    const char* why = vt->last_error();
    return reject(
        fmt::format("score 0: {}", (why != nullptr && *why != '\0') ? why : "cannot run on this machine"));
  }
  rec.usable = true;
  rec.library = lib;
  plugins_.push_back(std::move(rec));
}

const PluginRecord* PluginRegistry::find(const std::string& name) const {
  for (const auto& p : plugins_) {
    if (p.usable && p.name == name) return &p;
  }
  return nullptr;
}

std::vector<const PluginRecord*> PluginRegistry::ranked(bool exact_only) const {
  std::vector<const PluginRecord*> out;
  for (const auto& p : plugins_) {
    if (p.usable && !(exact_only && !p.approximation.empty())) out.push_back(&p);
  }
  std::stable_sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->score > b->score; });
  return out;
}

std::shared_ptr<Backend> PluginRegistry::create(const PluginRecord& plugin, int n_threads) const {
  STRATA_CHECK(plugin.usable);
  return std::make_shared<Backend>(plugin.library, plugin.vtable, n_threads);
}

const Backend& Backends::expert_backend_for(WeightFormat f) const {
  for (const auto& b : experts) {
    if (b->supports_expert_group(f)) return *b;
  }
  std::string names;
  for (const auto& b : experts) names += (names.empty() ? "" : ", ") + std::string(b->name());
  fail("backends", "no chosen expert backend ({}) supports {} experts", names, weight_format_name(f));
}

Backends choose_backends(const PluginRegistry& registry, const RuntimeConfig& config) {
  auto describe_missing = [&](const std::string& name) {
    for (const auto& p : registry.plugins()) {
      if (p.name == name) return fmt::format("plugin '{}' was rejected: {}", name, p.reason);
    }
    std::string dirs;
    for (const auto& d : registry.search_path()) dirs += (dirs.empty() ? "" : ", ") + d.string();
    return fmt::format("plugin '{}' was not found (searched: {})", name, dirs.empty() ? "nothing" : dirs);
  };
  std::string dirs;
  for (const auto& d : registry.search_path()) dirs += (dirs.empty() ? "" : ", ") + d.string();
  if (registry.ranked().empty()) {
    fail("backends", "no usable backend plugin found (searched: {}); set STRATA_PLUGIN_PATH or plugins.path",
         dirs.empty() ? "nothing" : dirs);
  }
  // auto means exact mode: a plugin that approximates (DESIGN §6, "opt-in, named") runs only where named.
  const auto ranked = registry.ranked(/*exact_only=*/true);
  auto auto_plugins = [&](const char* key) {
    if (ranked.empty()) {
      fail("backends", "{}: auto found no plugin in exact mode (searched: {}); name a plugin instead", key,
           dirs.empty() ? "nothing" : dirs);
    }
    return ranked;
  };
  Backends out;
  const int threads = config.scheduler.threads;
  std::map<std::string, std::shared_ptr<Backend>> made;
  auto make = [&](const PluginRecord* p) {
    auto it = made.find(p->name);
    if (it != made.end()) return it->second;
    auto b = registry.create(*p, threads);
    made[p->name] = b;
    return b;
  };
  // A plugin that is here but says it cannot run on this machine (score 0: an ISA this CPU lacks, no GPU or
  // driver) is passed over in a preference list when another entry can run, and said so (skipped); a name
  // that is nowhere, or a plugin that failed to load (a broken install), is an error.
  auto cannot_run = [&](const std::string& name) {
    return std::any_of(registry.plugins().begin(), registry.plugins().end(), [&](const PluginRecord& r) {
      return r.name == name && !r.usable && r.reason.rfind("score 0", 0) == 0;
    });
  };
  // A preference list (backends.dense, backends.experts): its plugins that run here, in order ("auto": the
  // exact-mode plugins by score); with first_only, up to the first entry that runs. Entries that cannot run
  // here are passed over and said so (skipped); none left is an error, which for a list of one says how to
  // make it fall back. by_auto: the first plugin chosen came from "auto".
  bool by_auto = false;
  auto resolve = [&](const char* key, const std::vector<std::string>& list, bool first_only) {
    by_auto = false;
    std::vector<const PluginRecord*> chosen;
    std::vector<std::string> rejected;
    for (const auto& name : list) {
      if (name == "auto") {
        const auto& a = auto_plugins(key);
        if (chosen.empty()) by_auto = true;
        chosen.insert(chosen.end(), a.begin(), a.end());
      } else if (const PluginRecord* p = registry.find(name)) {
        chosen.push_back(p);
      } else if (cannot_run(name)) {
        rejected.push_back(describe_missing(name));
        continue;
      } else {
        fail("backends", "{}: {}", key, describe_missing(name));
      }
      if (first_only) break;
    }
    if (chosen.empty()) {
      if (list.empty()) fail("backends", "{}: an empty list (name a plugin, or auto)", key);
      if (rejected.size() == 1) {
        fail("backends",
             "{}: {} (to fall back on machines where it cannot run, list another after it: {}: "
             "[{}, auto])",
             key, rejected.front(), key, list.front());
      }
      fail("backends", "{}: none of the listed plugins can run here: {}", key, fmt::join(rejected, "; "));
    }
    for (auto& r : rejected) out.skipped.push_back(fmt::format("{}: skipped {}", key, r));
    return chosen;
  };
  out.dense = make(resolve("backends.dense", config.backends.dense, true).front());
  out.dense_reason = by_auto ? "auto: highest score" : "configured";
  for (const auto* p : config.backends.experts.empty()
                           ? auto_plugins("backends.experts")
                           : resolve("backends.experts", config.backends.experts, false)) {
    auto b = make(p);
    if (std::find(out.experts.begin(), out.experts.end(), b) == out.experts.end()) out.experts.push_back(b);
  }
  // Each chosen plugin that is not exact mode, once, with the roles it was chosen for.
  std::vector<std::pair<const PluginRecord*, std::vector<std::string>>> lossy;
  auto note = [&](const std::shared_ptr<Backend>& b, const char* role) {
    const PluginRecord* p = registry.find(std::string(b->name()));
    if (p == nullptr || p->approximation.empty()) return;
    auto it = std::find_if(lossy.begin(), lossy.end(), [&](const auto& e) { return e.first == p; });
    if (it == lossy.end()) it = lossy.insert(lossy.end(), {p, {}});
    if (std::find(it->second.begin(), it->second.end(), role) == it->second.end()) it->second.push_back(role);
  };
  note(out.dense, "dense");
  for (const auto& e : out.experts) note(e, "experts");
  for (const auto& [p, roles] : lossy) {
    out.approximations.push_back(fmt::format("plugin {} (chosen for {}) is not exact mode (opt-in): {}",
                                             p->name, fmt::join(roles, " + "), p->approximation));
  }
  return out;
}

}  // namespace strata
