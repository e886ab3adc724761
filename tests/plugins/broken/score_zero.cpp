// Test plugin that cannot run on this machine (score 0) and says why through last_error.
#include "strata/plugin_abi.h"

namespace {
const char* last_error() {
  return "needs the imaginary XYZ-9000 accelerator";
}
strata_status create(const strata_backend_options*, strata_backend**) {
  return STRATA_ERR_UNSUPPORTED;
}
void destroy(strata_backend*) {}
}  // namespace

extern "C" {
STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static strata_plugin_vtable v{};
  v.abi_version = STRATA_PLUGIN_ABI_VERSION;
  v.struct_size = sizeof v;
  v.name = "score_zero";
  v.version = "0";
  v.last_error = &last_error;
  v.create = &create;
  v.destroy = &destroy;
  return &v;
}
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return 0;
}
}
