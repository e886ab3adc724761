// cpu_vnni: int4 weights times int8 activations on AVX-512 VNNI, BF16 weights times bf16 activations on
// AVX512_BF16 (not exact mode: opt-in, never chosen by auto); this file (vtable and score) has no ISA flags.
#include "cpu_plugin.hpp"
#include "kernels/bf16.hpp"
#include "kernels/q8.hpp"

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable = [] {
    strata_plugin_vtable v = strata_cpu::make_cpu_vtable<strata_cpu::VnniKernels>(
        "cpu_vnni", STRATA_VERSION,
        "AVX-512 VNNI: int4 weights x int8 activations (one scale per 64 columns); BF16 weights x bf16 "
        "activations where the CPU has AVX512_BF16; F32/F16 weights exact");
    // What this CPU will approximate: BF16 weights stay exact without AVX512_BF16 (Ice Lake).
    v.approximation =
        strata_cpu::cpu_has_avx512_bf16()
            ? "int8 activations (one scale per 64 columns) for int4 weights, bf16 activations for BF16 "
              "weights; expert outputs ~1.2 % RMS from exact mode (int4), ~0.3 % (BF16)"
            : "int8 activations (one scale per 64 columns) for int4 weights (BF16 weights stay exact: no "
              "AVX512_BF16 here); expert outputs ~1.2 % RMS from exact mode";
    return v;
  }();
  return &vtable;
}

// 90 where the CPU has AVX-512 F/BW/VL/DQ and VNNI (STRATA_CPU_VNNI_PROBE=off forces 0, for tests). The score
// only ranks it in `strata plugins`: auto never picks a plugin that is not exact.
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return strata_cpu::isa_score(
      "AVX-512 VNNI", "STRATA_CPU_VNNI_PROBE",
      [] {
        const bool ok = strata_cpu::cpu_has_avx512_fbwvldq() && __builtin_cpu_supports("avx512vnni");
        return ok ? nullptr : "this CPU lacks AVX-512 F/BW/VL/DQ with VNNI";
      },
      90);
}

}  // extern "C"
