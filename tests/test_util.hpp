// Helpers shared by the test suites: fixture discovery, expected outputs, temporary folders, backends.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "strata/model.hpp"
#include "strata/registry.hpp"
#include "strata/safetensors.hpp"

namespace strata::test {
namespace fs = std::filesystem;

inline fs::path fixtures_dir() {
  return fs::path(STRATA_FIXTURES_DIR);
}

// Model fixture folders (those with expected.safetensors), sorted.
inline std::vector<fs::path> model_fixtures() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fixtures_dir())) {
    if (fs::exists(e.path() / "expected.safetensors") && fs::exists(e.path() / "config.json"))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Expected {
  std::vector<int32_t> prompt, sequence;
  std::vector<float> logits;  // [sequence.size(), vocab]
  int64_t vocab = 0;
};

inline Expected load_expected(const fs::path& dir) {
  SafetensorsFile f(dir / "expected.safetensors");
  Expected e;
  auto ints = [&](const char* name) {
    const TensorInfo* t = f.find(name);
    REQUIRE(t != nullptr);
    std::vector<int32_t> v(static_cast<size_t>(t->numel()));
    std::memcpy(v.data(), f.data(*t), t->nbytes);
    return v;
  };
  e.prompt = ints("prompt_ids");
  e.sequence = ints("sequence_ids");
  const TensorInfo* l = f.find("logits");
  REQUIRE(l != nullptr);
  e.vocab = l->shape[1];
  e.logits.resize(static_cast<size_t>(l->numel()));
  std::memcpy(e.logits.data(), f.data(*l), l->nbytes);
  return e;
}

// A fresh temporary folder, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "strata-test-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_text(const fs::path& p, const std::string& s) {
  std::ofstream o(p, std::ios::binary);
  o << s;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The registry over the build's real plugins folder only.
inline PluginRegistry& build_registry() {
  static PluginRegistry reg({fs::path(STRATA_PLUGIN_BUILD_DIR)});
  return reg;
}

// Backends with one named plugin for everything (or auto when name is empty).
inline Backends backends_named(const std::string& name = "", int threads = 0) {
  RuntimeConfig cfg;
  cfg.scheduler.threads = threads;
  if (!name.empty()) {
    cfg.backends.dense = {name};
    cfg.backends.experts = {name};
  }
  return choose_backends(build_registry(), cfg);
}

// Runs a CLI command, returning its exit code and combined output.
inline int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  output->clear();
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace strata::test
