// cpu_generic: the portable reference backend; always loadable, the baseline every other plugin is checked
// against.
#include "cpu_plugin.hpp"

extern "C" {

STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static const strata_plugin_vtable vtable =
      strata_cpu::make_cpu_vtable<strata_cpu::ExactKernels<&strata_cpu::dot_block_generic>>(
          "cpu_generic", STRATA_VERSION, "portable reference kernels (f32/bf16/f16/int4, oneTBB)");
  return &vtable;
}

// Always runnable, lowest preference: any ISA-specific plugin that can run should win.
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return 1;
}

}  // extern "C"
