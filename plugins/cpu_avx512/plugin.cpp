// cpu_avx512: the exact-mode CPU kernels built for AVX-512; this file (vtable and score) has no ISA flags.
#include <cstdlib>
#include <cstring>

#include "cpu_plugin.hpp"
#include "kernels/dot_block_avx512.hpp"

namespace {

// The probe runs on any x86-64 CPU: this translation unit is compiled without -mavx512*, so nothing here can
// raise SIGILL. STRATA_CPU_AVX512_PROBE=off forces the "not supported" answer (used by tests).
bool avx512_usable(std::string* why) {
  const char* force = std::getenv("STRATA_CPU_AVX512_PROBE");
  if (force != nullptr && std::strcmp(force, "off") == 0) {
    *why = "AVX-512 probe forced off by STRATA_CPU_AVX512_PROBE=off";
    return false;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!ok) *why = "this CPU lacks AVX-512 F/BW/VL/DQ";
  return ok;
#else
  *why = "not an x86-64 CPU";
  return false;
#endif
}

}  // namespace

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable = strata_cpu::make_cpu_vtable<&strata_cpu::dot_block_avx512>(
      "cpu_avx512", STRATA_VERSION, "AVX-512 F/BW/VL/DQ exact-mode kernels (f32/bf16/f16/int4, oneTBB)");
  return &vtable;
}

STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  std::string why;
  if (!avx512_usable(&why)) {
    strata_cpu::last_error_text() = why;
    return 0;
  }
  return 100;
}

}  // extern "C"
