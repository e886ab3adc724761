// Fuzz target: one .safetensors file (header JSON, dtypes, shapes, offsets), then every tensor's bytes read.
#include "fuzz_util.hpp"
#include "strata/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = strata_fuzz::write_scratch("model.safetensors", data, size);
  strata_fuzz::expect_clean("safetensors", [&] {
    const strata::SafetensorsFile f(path);
    // A header the reader accepted must describe bytes inside the file: read the first and last byte of
    // every tensor (a bad offset faults here, past the mapping, or is caught by AddressSanitizer).
    unsigned sum = 0;
    for (const auto& [name, t] : f.tensors()) {
      strata_fuzz::require(t.nbytes == static_cast<uint64_t>(t.numel()) * strata::dtype_size(t.dtype),
                           "safetensors", "nbytes != numel × element size");
      if (t.nbytes == 0) continue;
      strata_fuzz::require(f.contains(f.data(t), t.nbytes), "safetensors", "tensor outside the mapping");
      sum += static_cast<unsigned>(f.data(t)[0]) + static_cast<unsigned>(f.data(t)[t.nbytes - 1]);
    }
    (void)sum;
  });
  return 0;
}
