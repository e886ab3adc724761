// A plugin built against an older ABI 1 header: its vtable ends where the field STRATA_TEST_VTABLE_END of
// today's header begins (the bytes after it are garbage here). Built twice (tests/CMakeLists.txt):
//   old_vtable: ends at upload_matrix, the header before the device slots (and strata_matrix.resident); its
//     strata_matrix layout differs, so the registry must refuse it;
//   pre_approximation: ends at the appended `approximation`; the registry must load it and read it as exact.
#include <cstddef>
#include <cstring>

#include "strata/plugin_abi.h"

namespace {
const char* last_error() {
  return "";
}
strata_status create(const strata_backend_options*, strata_backend** out) {
  *out = reinterpret_cast<strata_backend*>(&out);  // any non-NULL handle; never dereferenced
  return STRATA_OK;
}
void destroy(strata_backend*) {}
int32_t supports(strata_backend*, int32_t) {
  return 0;
}

union Storage {
  strata_plugin_vtable v;
  unsigned char bytes[sizeof(strata_plugin_vtable)];
};
}  // namespace

extern "C" {
STRATA_PLUGIN_EXPORT const strata_plugin_vtable* strata_plugin_init(void) {
  static Storage s = [] {
    Storage t;
    std::memset(t.bytes, 0xAB, sizeof t.bytes);
    std::memset(t.bytes, 0, offsetof(strata_plugin_vtable, STRATA_TEST_VTABLE_END));
    t.v.abi_version = STRATA_PLUGIN_ABI_VERSION;
    t.v.struct_size = offsetof(strata_plugin_vtable, STRATA_TEST_VTABLE_END);
    t.v.name = STRATA_TEST_PLUGIN_NAME;
    t.v.version = "0";
    t.v.last_error = &last_error;
    t.v.create = &create;
    t.v.destroy = &destroy;
    t.v.supports_matmul = &supports;
    t.v.supports_expert_group = &supports;
    return t;
  }();
  return &s.v;
}
STRATA_PLUGIN_EXPORT uint32_t strata_plugin_score(void) {
  return 1;
}
}
