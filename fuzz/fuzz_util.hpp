// Helpers shared by the fuzz targets: the exception policy, scratch files, and fixture paths.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "strata/error.hpp"

namespace strata_fuzz {

// Bad input must come back as strata::Error, whose message names what was wrong. Any other exception
// (std::out_of_range, a JSON library type_error, bad_alloc from a size taken on trust) reaches the user as an
// unexplained message, so it counts as a finding: print it and abort, which the fuzzer records as a crash.
template <class F>
void expect_clean(const char* target, F&& body) {
  try {
    body();
  } catch (const strata::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: an exception other than strata::Error escaped: %s\n", target, e.what());
    std::abort();
  }
}

// The property checks of a target abort with a message naming the target and what differed.
inline void require(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: property failed: %s\n", target, what);
    std::abort();
  }
}

// A private scratch folder for targets whose entry point reads files (one per process, reused per input).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(base != nullptr ? base : "/tmp") /
                              ("strata-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

// The source tree (compiled in; STRATA_SOURCE_DIR in the environment overrides it), for the fixtures
// (tests/fixtures) and the bundled model (models/strata-nano) the targets load once.
inline std::filesystem::path source_dir() {
  if (const char* e = std::getenv("STRATA_SOURCE_DIR")) return e;
  return STRATA_FUZZ_SOURCE_DIR;
}

}  // namespace strata_fuzz
