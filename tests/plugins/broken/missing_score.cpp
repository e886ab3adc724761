// Test plugin without strata_plugin_score: the registry must reject it for the missing symbol.
#include "strata/plugin_abi.h"

extern "C" {
STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  return nullptr;
}
}
