// cpu_avx2: the exact-mode CPU kernels built for AVX2 + FMA + F16C (x86-64-v3: Haswell and later, every
// Zen); this file (vtable and score) has no ISA flags.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu_plugin.hpp"
#include "kernels/dot_block_avx2.hpp"

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable =
      strata_cpu::make_cpu_vtable<strata_cpu::ExactKernels<&strata_cpu::dot_block_avx2>>(
          "cpu_avx2", STRATA_VERSION, "AVX2/FMA/F16C exact-mode kernels (f32/bf16/f16/int4, oneTBB)");
  return &vtable;
}

// 90 where the CPU has AVX2/FMA/F16C (STRATA_CPU_AVX2_PROBE=off forces 0, for tests): below cpu_avx512 (100),
// which is faster where both run; above cuda (50), which until the core keeps dense weights resident copies
// them over PCIe each call, and above cpu_generic (1).
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return strata_cpu::isa_score(
      "AVX2", "STRATA_CPU_AVX2_PROBE",
      [] {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c". The
        // AVX2 check already covers the OS saving the YMM registers.
        unsigned a = 0, b = 0, c = 0, d = 0;
        const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
        const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        return ok ? nullptr : "this CPU lacks AVX2/FMA/F16C";
#else
        return "not an x86-64 CPU";
#endif
      },
      90);
}

}  // extern "C"
