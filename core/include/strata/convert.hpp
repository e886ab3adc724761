// strata convert: a Hugging Face checkpoint → a strata int4 container (DESIGN §4-5), streamed, atomic and
// resumable. The container is a Hugging Face-shaped folder: config.json (with a "strata_container" object),
// model-0000k-of-0000n.safetensors + model.safetensors.index.json, the tokenizer files copied verbatim, and
// strata-manifest.json, written last: a folder without it is never a finished container.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "strata/backend.hpp"

namespace strata {

// How dense 2-D weights other than embedding, lm_head and kv_b_proj are written.
enum class DenseFormat { Keep, BF16, Q4_G64 };
std::string_view dense_format_name(DenseFormat f);      // "keep" | "bf16" | "q4_g64"
DenseFormat parse_dense_format(std::string_view name);  // errors name the accepted values

struct ConvertProgress {
  enum class Stage {
    Planned,       // inputs read and the output laid out; totals are set
    Tensor,        // an input tensor was converted (or a whole expert)
    ShardWritten,  // an output shard was written and recorded in the journal
    ShardReused,   // an output shard recorded by an interrupted run was found intact and kept
    Publishing,    // index, config, copied files, manifest, rename
    Done,
  };
  Stage stage = Stage::Planned;
  int64_t tensors_done = 0, tensors_total = 0;  // input tensors (scale_inv tensors included)
  uint64_t bytes_done = 0, bytes_total = 0;     // input bytes
  uint64_t bytes_done_this_run = 0;             // excludes what reused shards covered (for the rate)
  size_t shards_done = 0, shards_total = 0;     // output shards
  std::string shard;                            // ShardWritten / ShardReused: its file name
  uint64_t shard_bytes = 0;
  double seconds = 0;  // since the start of this run
};

struct ConvertOptions {
  std::filesystem::path in, out;
  WeightFormat experts = WeightFormat::Q4_G64;  // Q4_G64 or Q4_ROW
  DenseFormat dense = DenseFormat::Keep;
  uint64_t shard_bytes = 2048ull << 20;  // target size of an output shard
  bool force = false;                    // replace a finished container at `out`
  int threads = 0;                       // 0 = all hardware threads
  // Test hook: throw after writing this many output shards in this run (0 = never; -1 = read the environment
  // variable STRATA_CONVERT_STOP_AFTER_SHARDS, unset = never). Simulates an interruption.
  int stop_after_shards = -1;
  const std::atomic<bool>* cancel = nullptr;  // set (e.g. by a SIGINT handler) to stop between tensors
  std::function<void(const ConvertProgress&)> progress;  // called on the calling thread
};

struct ConvertResult {
  std::filesystem::path out;
  std::string model_type;
  int64_t tensors_in = 0;   // input tensors consumed (scale_inv included)
  int64_t tensors_out = 0;  // output tensors (a quantized weight counts twice: bytes and .qs)
  int64_t experts = 0;      // routed experts quantized
  size_t input_shards = 0;
  size_t input_shards_skipped = 0;  // resumed: every output they feed was already recorded and intact
  size_t output_shards = 0;
  size_t output_shards_reused = 0;       // resumed: recorded by an interrupted run, intact, not rewritten
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor bytes (bytes_out = index metadata.total_size)
  std::vector<std::string> copied_files;
  bool replaced_existing = false;  // --force replaced a finished container
  double seconds = 0;
  int64_t peak_rss_bytes = 0;  // getrusage ru_maxrss at the end
};

// Converts opts.in into the container opts.out (built in `<out>.partial` beside it, renamed into place at the
// end). Every error is a strata::Error with the [convert] prefix naming what was wrong and what was expected.
ConvertResult convert_checkpoint(const ConvertOptions& opts);

// FP8 e4m3 (the "fn" variant: bias 7, subnormals, no infinities, 0x7f / 0xff = NaN) → f32, exact.
float fp8_e4m3_to_f32(uint8_t v);
// f32 → bf16 bits, round to nearest even (NaN stays NaN).
uint16_t f32_to_bf16_rne(float f);

// What the converter does with one input tensor (exposed for tests and for `strata inspect`).
enum class TensorRole {
  RoutedExpert,  // model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight → int4
  F32,  // norms and other 1-D tensors, biases, the router, e_score_correction_bias, indexer weights_proj
  KeepFloat,  // embedding, lm_head, kv_b_proj: float dtype kept (FP8 → BF16)
  Dense2D,    // other 2-D weights: --dense-format
  Other,      // tensors of other ranks: kept as stored
  ScaleInv,   // <weight>_scale_inv: consumed by the FP8 weight it belongs to
};
TensorRole tensor_role(const std::string& name, size_t rank);

}  // namespace strata
