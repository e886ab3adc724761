// Test plugin that reports a future ABI version: the registry must reject it, not call into it.
#include "strata/plugin_abi.h"

extern "C" {
STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static strata_plugin_vtable v{};
  v.abi_version = STRATA_PLUGIN_ABI_VERSION + 998;
  v.struct_size = sizeof v;
  v.name = "bad_abi";
  v.version = "0";
  return &v;
}
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return 1000;
}
}
