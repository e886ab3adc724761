// cpu_avx512: the exact-mode CPU kernels built for AVX-512; this file (vtable and score) has no ISA flags.
#include "cpu_plugin.hpp"
#include "kernels/dot_block_avx512.hpp"

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable =
      strata_cpu::make_cpu_vtable<strata_cpu::ExactKernels<&strata_cpu::dot_block_avx512>>(
          "cpu_avx512", STRATA_VERSION, "AVX-512 F/BW/VL/DQ exact-mode kernels (f32/bf16/f16/int4, oneTBB)");
  return &vtable;
}

// 100 where the CPU has AVX-512 F/BW/VL/DQ (STRATA_CPU_AVX512_PROBE=off forces 0, for tests).
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return strata_cpu::isa_score(
      "AVX-512", "STRATA_CPU_AVX512_PROBE",
      [] { return strata_cpu::cpu_has_avx512_fbwvldq() ? nullptr : "this CPU lacks AVX-512 F/BW/VL/DQ"; },
      100);
}

}  // extern "C"
