// Fuzz target: the YAML runtime configuration (backends, budgets, plugin paths) from arbitrary text.
#include <string>

#include "fuzz_util.hpp"
#include "strata/runtime_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  strata_fuzz::expect_clean("runtime_config", [&] { (void)strata::parse_runtime_config(text, "fuzz.yaml"); });
  return 0;
}
