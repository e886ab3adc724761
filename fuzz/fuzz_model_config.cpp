// Fuzz target: a model folder's config.json (every family's keys, text_config wrappers, rope scaling).
#include "fuzz_util.hpp"
#include "strata/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata_fuzz::write_scratch("config.json", data, size);
  strata_fuzz::expect_clean("model_config", [&] {
    const strata::ModelSpec spec = strata::load_model_spec(strata_fuzz::scratch_dir());
    (void)spec.attention_scale();
    (void)spec.kv_floats_per_token_per_layer();
    (void)strata::family_name(spec.family);
  });
  return 0;
}
