// strata convert: Hugging Face checkpoint → strata int4 container, streamed, atomic and resumable
// (docs/convert.md).
//
// The whole output is planned from the input headers before a byte is converted: every input tensor becomes
// an item (a routed expert's three matrices are one item), items are ordered by where their last piece lies
// in the input (input shard, then data offset), and packed greedily into output shards of about
// --shard-size-mb. The plan is deterministic, so an interrupted run is resumed by re-planning and skipping
// the output shards the journal records as written and intact; the result is byte-identical to an
// uninterrupted run.
#include "strata/convert.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "strata/error.hpp"
#include "strata/json_text.hpp"
#include "strata/model_spec.hpp"
#include "strata/quant.hpp"
#include "strata/safetensors.hpp"

namespace strata {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr std::string_view kComp = "convert";
constexpr int kContainerVersion = 1;
constexpr int kJournalVersion = 1;
constexpr const char* kJournal = "convert-journal.json";
constexpr const char* kManifest = "strata-manifest.json";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kScaleSuffix = "_scale_inv";
constexpr int64_t kFp8Block = 128;

// ---------------------------------------------------------------------------------------------------------------
// Scalars

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
      const int sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 7;
      float mag;
      if (exp == 0xf && mant == 7) {
        mag = std::numeric_limits<float>::quiet_NaN();
      } else if (exp == 0) {
        mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 · 2^(1-7)
      } else {
        mag = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
      }
      t[static_cast<size_t>(v)] = sign ? -mag : mag;
    }
    return t;
  }();
  return table;
}

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

void write_text_atomic(const fs::path& p, const std::string& s) {
  write_file_atomic(p, std::span(reinterpret_cast<const std::byte*>(s.data()), s.size()));
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems do not allow it
  (void)::fsync(fd);
  ::close(fd);
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

// Drops the pages of an input range from this process's resident set (they stay in the page cache). The
// mapping is private and read-only, so nothing is lost; a later read faults them back in.
void release_pages(const std::byte* p, uint64_t n) {
  if (n == 0) return;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t beg = a & ~(page - 1), end = (a + n + page - 1) & ~(page - 1);
  (void)::madvise(reinterpret_cast<void*>(beg), end - beg, MADV_DONTNEED);
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor roles

// "…mlp.experts.<E>.{gate,up,down}_proj.weight" → (expert key "…mlp.experts.<E>", projection 0/1/2).
std::optional<std::pair<std::string, int>> parse_expert(const std::string& name) {
  static constexpr std::string_view kMid = ".mlp.experts.";
  const size_t at = name.rfind(kMid);
  if (at == std::string::npos) return std::nullopt;
  size_t p = at + kMid.size();
  const size_t digits = p;
  while (p < name.size() && name[p] >= '0' && name[p] <= '9') ++p;
  if (p == digits || p >= name.size() || name[p] != '.') return std::nullopt;
  const std::string_view rest = std::string_view(name).substr(p + 1);
  int proj = -1;
  if (rest == "gate_proj.weight")
    proj = 0;
  else if (rest == "up_proj.weight")
    proj = 1;
  else if (rest == "down_proj.weight")
    proj = 2;
  else
    return std::nullopt;
  return std::make_pair(name.substr(0, p), proj);
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// ---------------------------------------------------------------------------------------------------------------
// The plan

enum class OutKind { Copy, F32, BF16, Q4 };

struct Source {
  TensorRef ref;
  std::optional<TensorRef> scale;  // FP8 block scales
  size_t shard = 0;                // input shard index of the weight
};

struct Conv {
  Source src;
  OutKind kind = OutKind::Copy;
  WeightFormat q4 = WeightFormat::Q4_G64;
  std::string name;
  int64_t rows = 0, cols = 0;  // the source seen as a matrix (1-D: one row)
};

struct OutTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};

struct Item {
  std::vector<Conv> convs;  // one, or gate/up/down of a routed expert
  std::vector<OutTensor> outs;
  std::pair<size_t, uint64_t> home{0, 0};  // (input shard, offset) of its last piece
  size_t home_shard = 0;
  bool expert = false;
  int64_t in_tensors = 0;
  uint64_t in_bytes = 0;
  uint64_t out_bytes = 0;
  uint64_t work_bytes = 0;  // out_bytes + f32 intermediates while converting
};

struct ShardPlan {
  std::string file;
  size_t first = 0, end = 0;  // items [first, end)
  std::string header;         // 8-byte length prefix + JSON header, padded
  uint64_t data_bytes = 0;
  uint64_t file_size = 0;
  std::set<size_t> inputs;  // home input shards of its items
};

struct Plan {
  std::string model_type;
  std::vector<const SafetensorsFile*> files;  // input shards, in order
  std::vector<Item> items;
  std::vector<ShardPlan> shards;
  int64_t tensors_in = 0, tensors_out = 0, experts = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  std::string fingerprint;
};

void out_tensors_of(const Conv& c, std::vector<OutTensor>& outs) {
  const TensorInfo& t = *c.src.ref.info;
  switch (c.kind) {
    case OutKind::Copy:
      outs.push_back({c.name, t.dtype, t.shape, t.nbytes});
      return;
    case OutKind::F32:
      outs.push_back({c.name, DType::F32, t.shape, static_cast<uint64_t>(t.numel()) * 4});
      return;
    case OutKind::BF16:
      outs.push_back({c.name, DType::BF16, t.shape, static_cast<uint64_t>(t.numel()) * 2});
      return;
    case OutKind::Q4: {
      const int64_t rb = q4_row_bytes(c.cols), ng = q4_scales_per_row(c.q4, c.cols);
      outs.push_back({c.name, DType::U8, {c.rows, rb}, static_cast<uint64_t>(c.rows * rb)});
      std::vector<int64_t> qs_shape =
          c.q4 == WeightFormat::Q4_G64 ? std::vector<int64_t>{c.rows, ng} : std::vector<int64_t>{c.rows};
      outs.push_back(
          {c.name + ".qs", DType::F32, std::move(qs_shape), static_cast<uint64_t>(c.rows * ng) * 4});
      return;
    }
  }
}

std::string header_of(const std::vector<const OutTensor*>& ts) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const OutTensor* t : ts) {
    h[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                  {"shape", t->shape},
                  {"data_offsets", {off, off + t->nbytes}}};
    off += t->nbytes;
  }
  std::string s = h.dump();
  while (s.size() % 8 != 0) s.push_back(' ');  // as write_safetensors: the data section starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = s.size();
  std::memcpy(out.data(), &n, 8);
  return out + s;
}

Plan make_plan(const ConvertOptions& o, const SafetensorsSet& set, const ModelSpec& spec) {
  Plan plan;
  plan.model_type = spec.model_type;
  std::set<const SafetensorsFile*> uniq;
  for (const auto& [name, ref] : set.all()) uniq.insert(ref.file);
  plan.files.assign(uniq.begin(), uniq.end());
  std::sort(plan.files.begin(), plan.files.end(), [](const SafetensorsFile* a, const SafetensorsFile* b) {
    return a->path().filename() < b->path().filename();
  });
  std::map<const SafetensorsFile*, size_t> shard_of;
  for (size_t i = 0; i < plan.files.size(); ++i) shard_of[plan.files[i]] = i;
  auto pos_of = [&](const TensorRef& r) { return std::make_pair(shard_of.at(r.file), r.info->offset); };
  auto where = [](const TensorRef& r) { return r.file->path().string(); };

  // FP8 block scales: each belongs to the weight named without the suffix.
  for (const auto& [name, ref] : set.all()) {
    if (!name.ends_with(kScaleSuffix)) continue;
    const std::string wname = name.substr(0, name.size() - std::strlen(kScaleSuffix));
    const auto w = set.find(wname);
    if (!w) {
      fail(kComp, "{}: block-scale tensor '{}' has no weight '{}' in the checkpoint", where(ref), name,
           wname);
    }
    if (w->info->dtype != DType::F8_E4M3) {
      fail(kComp, "{}: tensor '{}' is {} but has a block scale '{}' (only F8_E4M3 weights take _scale_inv)",
           where(*w), wname, dtype_name(w->info->dtype), name);
    }
  }

  std::map<std::string, std::array<std::optional<Conv>, 3>> experts;
  std::vector<Item> items;
  for (const auto& [name, ref] : set.all()) {
    const TensorInfo& t = *ref.info;
    const TensorRole role = tensor_role(name, t.shape.size());
    if (role == TensorRole::ScaleInv) continue;
    Source src{ref, std::nullopt, shard_of.at(ref.file)};
    if (t.dtype == DType::F8_E4M3) {
      const std::string sname = name + kScaleSuffix;
      const auto sc = set.find(sname);
      if (t.shape.size() != 2) {
        fail(kComp,
             "{}: FP8 tensor '{}' has shape {}; F8_E4M3 is supported only for 2-D weights with 128x128 "
             "block scales",
             where(ref), name, t.shape_str());
      }
      const int64_t so = (t.shape[0] + kFp8Block - 1) / kFp8Block,
                    si = (t.shape[1] + kFp8Block - 1) / kFp8Block;
      if (!sc) {
        fail(kComp,
             "{}: FP8 (F8_E4M3) weight '{}' {} has no block-scale tensor '{}' (expected F32 [{}, {}], "
             "as DeepSeek-V3 / GLM-5 FP8 checkpoints ship)",
             where(ref), name, t.shape_str(), sname, so, si);
      }
      if (!is_float(sc->info->dtype) || sc->info->shape != std::vector<int64_t>{so, si}) {
        fail(kComp, "{}: block scale '{}' is {} {}, expected F32 [{}, {}] for the FP8 weight {}", where(*sc),
             sname, dtype_name(sc->info->dtype), sc->info->shape_str(), so, si, t.shape_str());
      }
      src.scale = *sc;
    } else if (!is_float(t.dtype)) {
      fail(kComp,
           "{}: tensor '{}' has dtype {}; expected BF16, F16, F32, or F8_E4M3 with a '{}{}' block scale",
           where(ref), name, dtype_name(t.dtype), name, kScaleSuffix);
    }
    Conv c;
    c.src = src;
    c.name = name;
    c.rows = t.shape.empty() ? 1 : t.shape[0];
    c.cols = c.rows == 0 ? 0 : t.numel() / c.rows;
    const bool fp8 = t.dtype == DType::F8_E4M3;
    switch (role) {
      case TensorRole::RoutedExpert: {
        if (t.shape.size() != 2) {
          fail(kComp, "{}: routed expert weight '{}' has shape {}, expected a 2-D matrix", where(ref), name,
               t.shape_str());
        }
        const auto e = parse_expert(name);
        const bool down = e->second == 2;
        const std::vector<int64_t> want = down ? std::vector<int64_t>{spec.hidden, spec.moe_intermediate}
                                               : std::vector<int64_t>{spec.moe_intermediate, spec.hidden};
        if (t.shape != want) {
          fail(kComp,
               "{}: routed expert weight '{}' has shape {}, expected {} (config.json hidden_size {}, "
               "moe_intermediate_size {})",
               where(ref), name, t.shape_str(), shape_str(want), spec.hidden, spec.moe_intermediate);
        }
        c.kind = OutKind::Q4;
        c.q4 = o.experts;
        experts[e->first][static_cast<size_t>(e->second)] = std::move(c);
        continue;
      }
      case TensorRole::F32:
        c.kind = t.dtype == DType::F32 ? OutKind::Copy : OutKind::F32;
        break;
      case TensorRole::KeepFloat:
        c.kind = fp8 ? OutKind::BF16 : OutKind::Copy;
        break;
      case TensorRole::Dense2D:
        switch (o.dense) {
          case DenseFormat::Keep:
            c.kind = fp8 ? OutKind::BF16 : OutKind::Copy;
            break;
          case DenseFormat::BF16:
            c.kind = t.dtype == DType::BF16 ? OutKind::Copy : OutKind::BF16;
            break;
          case DenseFormat::Q4_G64:
            c.kind = OutKind::Q4;
            c.q4 = WeightFormat::Q4_G64;
            break;
        }
        break;
      case TensorRole::Other:
        c.kind = OutKind::Copy;
        break;
      case TensorRole::ScaleInv:
        break;
    }
    Item it;
    it.convs.push_back(std::move(c));
    items.push_back(std::move(it));
  }
  for (auto& [key, parts] : experts) {
    static constexpr const char* kProj[] = {"gate_proj", "up_proj", "down_proj"};
    Item it;
    it.expert = true;
    for (size_t p = 0; p < 3; ++p) {
      if (!parts[p]) {
        std::string have;
        for (size_t q = 0; q < 3; ++q) {
          if (parts[q]) have += (have.empty() ? "" : ", ") + std::string(kProj[q]);
        }
        fail(kComp,
             "{}: routed expert '{}' has {} but no '{}.{}.weight' (each expert needs gate_proj, up_proj and "
             "down_proj)",
             set.dir().string(), key, have, key, kProj[p]);
      }
      it.convs.push_back(std::move(*parts[p]));
    }
    items.push_back(std::move(it));
  }

  // Sizes, home positions, order.
  for (auto& it : items) {
    for (const Conv& c : it.convs) {
      it.home = std::max(it.home, pos_of(c.src.ref));
      it.in_tensors += 1;
      it.in_bytes += c.src.ref.info->nbytes;
      if (c.src.scale) {
        it.home = std::max(it.home, pos_of(*c.src.scale));
        it.in_tensors += 1;
        it.in_bytes += c.src.scale->info->nbytes;
      }
      const size_t before = it.outs.size();
      out_tensors_of(c, it.outs);
      for (size_t k = before; k < it.outs.size(); ++k) it.out_bytes += it.outs[k].nbytes;
      if (c.kind == OutKind::Q4 || c.src.scale) it.work_bytes += static_cast<uint64_t>(c.rows * c.cols) * 4;
    }
    it.home_shard = it.home.first;
    it.work_bytes += it.out_bytes;
    if (it.expert) ++plan.experts;
    plan.tensors_in += it.in_tensors;
    plan.bytes_in += it.in_bytes;
    plan.tensors_out += static_cast<int64_t>(it.outs.size());
    plan.bytes_out += it.out_bytes;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.home < b.home; });
  plan.items = std::move(items);
  if (plan.items.empty()) fail(kComp, "{}: the checkpoint holds no tensors to convert", set.dir().string());

  // Output shards: greedy, never splitting an item (so an expert's six tensors always share one shard).
  std::vector<std::pair<size_t, size_t>> ranges;
  uint64_t cur = 0;
  size_t first = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (i > first && cur + plan.items[i].out_bytes > o.shard_bytes) {
      ranges.emplace_back(first, i);
      first = i;
      cur = 0;
    }
    cur += plan.items[i].out_bytes;
  }
  ranges.emplace_back(first, plan.items.size());
  uint64_t fp = fnv1a(fmt::format("strata-convert-plan-v{}", kJournalVersion));
  for (size_t k = 0; k < ranges.size(); ++k) {
    ShardPlan sp;
    sp.file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, ranges.size());
    sp.first = ranges[k].first;
    sp.end = ranges[k].second;
    std::vector<const OutTensor*> ts;
    for (size_t i = sp.first; i < sp.end; ++i) {
      sp.inputs.insert(plan.items[i].home_shard);
      sp.data_bytes += plan.items[i].out_bytes;
      for (const auto& t : plan.items[i].outs) ts.push_back(&t);
    }
    sp.header = header_of(ts);
    sp.file_size = sp.header.size() + sp.data_bytes;
    fp = fnv1a(sp.file, fnv1a(sp.header, fp));
    plan.shards.push_back(std::move(sp));
  }
  plan.fingerprint = hex64(fp);
  return plan;
}

// ---------------------------------------------------------------------------------------------------------------
// Conversion of one item

// Rows [r0, r1) of the source as f32 (exact for F32/BF16/F16; FP8 gets value × block scale in f32).
void source_rows_f32(const Conv& c, const std::vector<float>& scales, int64_t r0, int64_t r1, float* out) {
  const TensorInfo& t = *c.src.ref.info;
  const std::byte* p = c.src.ref.data();
  const int64_t cols = c.cols;
  const int64_t b = r0 * cols, e = r1 * cols;
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(out, p + b * 4, static_cast<size_t>(e - b) * 4);
      return;
    case DType::BF16:
      for (int64_t i = b; i < e; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i - b] = bf16_to_f32(h);
      }
      return;
    case DType::F16:
      for (int64_t i = b; i < e; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i - b] = f16_to_f32(h);
      }
      return;
    case DType::F8_E4M3: {
      const auto& tab = e4m3_table();
      const int64_t sc = (cols + kFp8Block - 1) / kFp8Block;
      const auto* q = reinterpret_cast<const uint8_t*>(p);
      for (int64_t r = r0; r < r1; ++r) {
        const float* srow = scales.data() + (r / kFp8Block) * sc;
        float* dst = out + (r - r0) * cols;
        const uint8_t* src = q + r * cols;
        for (int64_t i = 0; i < cols; ++i) dst[i] = tab[src[i]] * srow[i / kFp8Block];
      }
      return;
    }
    default:
      STRATA_CHECK(false);
  }
}

std::vector<float> scales_f32(const Conv& c) {
  std::vector<float> s;
  if (!c.src.scale) return s;
  const TensorInfo& t = *c.src.scale->info;
  s.resize(static_cast<size_t>(t.numel()));
  const std::byte* p = c.src.scale->data();
  for (size_t i = 0; i < s.size(); ++i) {
    if (t.dtype == DType::F32) {
      std::memcpy(&s[i], p + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      s[i] = t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return s;
}

constexpr int64_t kRowChunkElems = 1 << 20;

int64_t rows_per_chunk(int64_t cols) {
  return std::max<int64_t>(1, kRowChunkElems / std::max<int64_t>(cols, 1));
}

// Converted bytes of one Conv: one buffer per output tensor (none for Copy).
std::vector<std::vector<std::byte>> convert_one(const Conv& c) {
  std::vector<std::vector<std::byte>> out;
  if (c.kind == OutKind::Copy) return out;
  const std::vector<float> scales = scales_f32(c);
  const int64_t rows = c.rows, cols = c.cols, chunk = rows_per_chunk(cols);
  const int64_t n_chunks = (rows + chunk - 1) / chunk;
  if (c.kind == OutKind::F32 || c.kind == OutKind::BF16) {
    const size_t esz = c.kind == OutKind::F32 ? 4 : 2;
    out.emplace_back(static_cast<size_t>(rows * cols) * esz);
    std::byte* dst = out[0].data();
    tbb::parallel_for(int64_t{0}, n_chunks, [&](int64_t k) {
      const int64_t r0 = k * chunk, r1 = std::min(rows, r0 + chunk);
      if (c.kind == OutKind::F32) {
        source_rows_f32(c, scales, r0, r1, reinterpret_cast<float*>(dst) + r0 * cols);  // buffer is 4-aligned
        return;
      }
      std::vector<float> tmp(static_cast<size_t>((r1 - r0) * cols));
      source_rows_f32(c, scales, r0, r1, tmp.data());
      for (size_t i = 0; i < tmp.size(); ++i) {
        const uint16_t h = f32_to_bf16_rne(tmp[i]);
        std::memcpy(dst + (static_cast<size_t>(r0 * cols) + i) * 2, &h, 2);
      }
    });
    return out;
  }
  // Q4: quantize_q4 works row by row, so quantizing row blocks in parallel gives the same bytes as one call.
  const int64_t rb = q4_row_bytes(cols), ng = q4_scales_per_row(c.q4, cols);
  out.emplace_back(static_cast<size_t>(rows * rb));
  out.emplace_back(static_cast<size_t>(rows * ng) * 4);
  tbb::parallel_for(int64_t{0}, n_chunks, [&](int64_t k) {
    const int64_t r0 = k * chunk, r1 = std::min(rows, r0 + chunk);
    std::vector<float> tmp(static_cast<size_t>((r1 - r0) * cols));
    source_rows_f32(c, scales, r0, r1, tmp.data());
    const QuantizedMatrix q = quantize_q4(tmp, r1 - r0, cols, c.q4);
    std::memcpy(out[0].data() + r0 * rb, q.packed.data(), q.packed.size());
    std::memcpy(out[1].data() + r0 * ng * 4, q.scales.data(), q.scales.size() * 4);
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Output files

// A file written through a temporary beside it, fsynced and renamed into place on commit(); removed
// otherwise.
class ShardFile {
 public:
  explicit ShardFile(fs::path path) : path_(std::move(path)) {
    std::string name(1, '.');
    name += path_.filename().string();
    name += ".tmp.XXXXXX";
    tmp_ = (path_.parent_path() / name).string();
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) fail(kComp, "{}: cannot create a temporary file: {}", path_.string(), std::strerror(errno));
    buf_.resize(8 << 20);
  }
  ~ShardFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  void write(const void* p, size_t n) {
    if (n >= buf_.size() / 2) {
      flush();
      raw(static_cast<const std::byte*>(p), n);
      return;
    }
    if (used_ + n > buf_.size()) flush();
    std::memcpy(buf_.data() + used_, p, n);
    used_ += n;
  }
  uint64_t written() const { return written_ + used_; }

  void commit() {
    flush();
    if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) {
      fail(kComp, "{}: cannot flush to disk: {}", path_.string(), std::strerror(errno));
    }
    if (::close(fd_) != 0) {
      const int e = errno;
      fd_ = -1;
      ::unlink(tmp_.c_str());
      fail(kComp, "{}: close failed: {}", path_.string(), std::strerror(e));
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp_.c_str());
      fail(kComp, "{}: cannot rename the finished shard into place: {}", path_.string(), std::strerror(e));
    }
  }

 private:
  void flush() {
    raw(buf_.data(), used_);
    used_ = 0;
  }
  void raw(const std::byte* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, p + done, n - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail(kComp, "{}: write failed after {} bytes: {}", path_.string(), written_ + done,
             std::strerror(errno));
      }
      done += static_cast<size_t>(w);
    }
    written_ += n;
  }

  fs::path path_;
  std::string tmp_;
  int fd_ = -1;
  std::vector<std::byte> buf_;
  size_t used_ = 0;
  uint64_t written_ = 0;
};

// An exclusive lock (flock) on a folder for the life of the object.
class DirLock {
 public:
  explicit DirLock(const fs::path& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) fail(kComp, "{}: cannot open: {}", dir.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd_);
      if (e == EWOULDBLOCK)
        fail(kComp, "{} is being written by another strata convert; wait for it to finish", dir.string());
      fail(kComp, "{}: cannot lock: {}", dir.string(), std::strerror(e));
    }
  }
  ~DirLock() { ::close(fd_); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

bool is_temp_name(const std::string& n) {
  return n.size() > 1 && n[0] == '.' && n.find(".tmp.") != std::string::npos;
}

// Files of the input folder copied verbatim: everything but the weights (safetensors, their index, other
// weight formats), config.json (rewritten), hidden files, and folders.
bool copied_verbatim(const std::string& n) {
  if (n.empty() || n[0] == '.') return false;
  if (n == "config.json" || n == kIndex || n == kManifest || n == kJournal) return false;
  static constexpr const char* kWeights[] = {
      ".safetensors",           ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".bin.index.json",
      ".safetensors.index.json"};
  for (const char* e : kWeights) {
    if (n.ends_with(e)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// The run

struct Paths {
  fs::path in, out, partial, parent;
};

json input_identity(const Plan& plan, const fs::path& in) {
  json files = json::array();
  for (const SafetensorsFile* f : plan.files) {
    struct stat st {};
    if (::stat(f->path().c_str(), &st) != 0)
      fail(kComp, "{}: cannot stat: {}", f->path().string(), std::strerror(errno));
    const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    files.push_back({{"name", f->path().filename().string()},
                     {"size", static_cast<uint64_t>(st.st_size)},
                     {"mtime_ns", mtime_ns}});
  }
  return {{"dir", in.string()},
          {"files", files},
          {"config_fnv1a64", hex64(fnv1a(read_text_file(in / "config.json", kComp)))}};
}

json args_of(const ConvertOptions& o) {
  return {{"experts", o.experts == WeightFormat::Q4_G64 ? "q4_g64" : "q4_row"},
          {"dense", std::string(dense_format_name(o.dense))},
          {"shard_bytes", o.shard_bytes}};
}

std::string differences(const json& was, const json& now) {
  std::string d;
  if (was.value("args", json()) != now["args"])
    d += fmt::format("arguments were {}, now {}; ", was.value("args", json()).dump(), now["args"].dump());
  if (was.value("input", json()) != now["input"]) {
    d += fmt::format("input was {} ({}), now {}; ", was.value("input", json()).value("dir", std::string("?")),
                     "its shards or config.json differ", now["input"]["dir"].get<std::string>());
  }
  if (was.value("plan", json()) != now["plan"] && d.empty())
    d += "the planned output differs (another strata version?); ";
  if (was.value("version", 0) != kJournalVersion) d += "journal version differs; ";
  if (!d.empty()) d.resize(d.size() - 2);
  return d;
}

void check_out_dir(const Paths& p, bool force) {
  if (!fs::exists(p.out)) return;
  if (!fs::is_directory(p.out))
    fail(kComp, "{} exists and is not a directory; choose another --out", p.out.string());
  if (fs::exists(p.out / kManifest)) {
    if (!force) {
      fail(kComp, "{} is already a strata container (it has {}); pass --force to replace it", p.out.string(),
           kManifest);
    }
    return;
  }
  fail(kComp,
       "{} exists and is not a strata container (no {}); refusing to write over it — remove it or choose "
       "another --out",
       p.out.string(), kManifest);
}

ConvertResult run(const ConvertOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  if (o.experts != WeightFormat::Q4_G64 && o.experts != WeightFormat::Q4_ROW) {
    fail(kComp, "expert format {} is not an int4 format (expected q4_g64 or q4_row)",
         weight_format_name(o.experts));
  }
  if (o.shard_bytes == 0) fail(kComp, "the shard size must be at least 1 MB");
  if (o.in.empty() || o.out.empty())
    fail(kComp, "both the input folder (--in) and the output folder (--out) are needed");

  Paths p;
  p.in = fs::absolute(o.in).lexically_normal();
  p.out = fs::absolute(o.out).lexically_normal();
  if (!p.in.has_filename()) p.in = p.in.parent_path();
  if (!p.out.has_filename()) p.out = p.out.parent_path();
  p.parent = p.out.parent_path();
  p.partial = p.parent / (p.out.filename().string() + ".partial");

  if (!fs::is_directory(p.in))
    fail(kComp, "{}: input is not a directory (expected a Hugging Face model folder)", p.in.string());
  if (!fs::exists(p.in / "config.json")) {
    fail(kComp,
         "{}: config.json is missing — expected a Hugging Face model folder (config.json + *.safetensors)",
         p.in.string());
  }
  if (fs::exists(p.in / kManifest)) {
    fail(kComp, "{}: the input is already a strata container ({}); convert takes a Hugging Face checkpoint",
         p.in.string(), kManifest);
  }
  if (fs::exists(p.out) && fs::equivalent(p.in, p.out))
    fail(kComp, "--out {} is the input folder", p.out.string());
  if (!fs::is_directory(p.parent))
    fail(kComp, "{}: the folder that should hold --out does not exist", p.parent.string());
  check_out_dir(p, o.force);

  const ModelSpec spec = load_model_spec(p.in);
  const SafetensorsSet set(p.in);
  const Plan plan = make_plan(o, set, spec);

  ConvertResult res;
  res.out = p.out;
  res.model_type = plan.model_type;
  res.tensors_in = plan.tensors_in;
  res.tensors_out = plan.tensors_out;
  res.experts = plan.experts;
  res.input_shards = plan.files.size();
  res.output_shards = plan.shards.size();
  res.bytes_in = plan.bytes_in;
  res.bytes_out = plan.bytes_out;

  json journal = {{"version", kJournalVersion},
                  {"tool", "strata convert"},
                  {"args", args_of(o)},
                  {"input", input_identity(plan, p.in)},
                  {"plan", {{"shards", plan.shards.size()}, {"fingerprint", plan.fingerprint}}},
                  {"done", json::array()}};
  const fs::path jpath = p.partial / kJournal;

  // The partial folder: resume it, or start it. It is locked first, so two conversions never share it.
  std::map<std::string, uint64_t> recorded;
  const bool existed = fs::exists(p.partial);
  if (existed && !fs::is_directory(p.partial))
    fail(kComp, "{} exists and is not a directory; remove it", p.partial.string());
  if (existed && !fs::exists(jpath)) {
    for (const auto& e : fs::directory_iterator(p.partial)) {
      if (!is_temp_name(e.path().filename().string())) {
        fail(
            kComp,
            "{} exists and is not a strata conversion in progress (no {}); remove it or choose another --out",
            p.partial.string(), kJournal);
      }
    }
  }
  fs::create_directories(p.partial);
  const DirLock lock(p.partial);
  if (existed && fs::exists(jpath)) {
    json was;
    try {
      was = parse_json_text(read_text_file(jpath, kComp), kComp, jpath.string());
    } catch (const json::exception& e) {
      fail(kComp,
           "{}: the journal of the interrupted conversion is not valid JSON ({}); remove {} to start over",
           jpath.string(), e.what(), p.partial.string());
    }
    const std::string diff = differences(was, journal);
    if (!diff.empty()) {
      if (!o.force) {
        fail(kComp,
             "{} holds an interrupted conversion that cannot be resumed with these arguments: {}. Rerun it "
             "with the same arguments and input, or pass --force (or remove the folder) to start over",
             p.partial.string(), diff);
      }
      for (const auto& e : fs::directory_iterator(p.partial))
        fs::remove_all(e.path());  // --force: start over
    } else {
      for (const auto& d : was.value("done", json::array())) {
        recorded[d.value("file", std::string())] = d.value("size", uint64_t{0});
      }
    }
  }
  for (const auto& e : fs::directory_iterator(p.partial)) {
    if (is_temp_name(e.path().filename().string())) fs::remove(e.path());  // leftovers of a killed writer
  }

  // Which shards the interrupted run left intact.
  std::vector<bool> reuse(plan.shards.size(), false);
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    const ShardPlan& sp = plan.shards[k];
    auto r = recorded.find(sp.file);
    std::error_code ec;
    const fs::path f = p.partial / sp.file;
    if (r != recorded.end() && r->second == sp.file_size && fs::file_size(f, ec) == sp.file_size && !ec) {
      reuse[k] = true;
      journal["done"].push_back({{"file", sp.file}, {"size", sp.file_size}});
    }
  }
  write_text_atomic(jpath, journal.dump(1));
  {
    std::vector<size_t> homed(plan.files.size(), 0), homed_reused(plan.files.size(), 0);
    for (size_t k = 0; k < plan.shards.size(); ++k) {
      for (size_t i = plan.shards[k].first; i < plan.shards[k].end; ++i) {
        ++homed[plan.items[i].home_shard];
        if (reuse[k]) ++homed_reused[plan.items[i].home_shard];
      }
    }
    for (size_t s = 0; s < plan.files.size(); ++s) {
      if (homed[s] > 0 && homed[s] == homed_reused[s]) ++res.input_shards_skipped;
    }
  }

  ConvertProgress pr;
  pr.tensors_total = plan.tensors_in;
  pr.bytes_total = plan.bytes_in;
  pr.shards_total = plan.shards.size();
  auto report = [&](ConvertProgress::Stage st) {
    if (!o.progress) return;
    pr.stage = st;
    pr.seconds = seconds();
    o.progress(pr);
  };
  report(ConvertProgress::Stage::Planned);

  int stop_after = o.stop_after_shards;
  if (stop_after < 0) {
    const char* env = std::getenv("STRATA_CONVERT_STOP_AFTER_SHARDS");
    stop_after = env != nullptr ? std::atoi(env) : 0;
  }
  const uint64_t batch_budget = std::clamp<uint64_t>(o.shard_bytes, 256ull << 20, 1ull << 30);
  std::optional<tbb::global_control> threads;
  if (o.threads > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(o.threads));
  size_t written_this_run = 0;

  for (size_t k = 0; k < plan.shards.size(); ++k) {
    const ShardPlan& sp = plan.shards[k];
    pr.shard = sp.file;
    pr.shard_bytes = sp.file_size;
    if (reuse[k]) {
      for (size_t i = sp.first; i < sp.end; ++i) {
        pr.tensors_done += plan.items[i].in_tensors;
        pr.bytes_done += plan.items[i].in_bytes;
      }
      ++pr.shards_done;
      ++res.output_shards_reused;
      report(ConvertProgress::Stage::ShardReused);
      continue;
    }
    ShardFile file(p.partial / sp.file);
    file.write(sp.header.data(), sp.header.size());
    for (size_t b = sp.first; b < sp.end;) {
      // A batch: consecutive items converted in parallel, then written in order.
      size_t e = b;
      uint64_t mem = 0;
      while (e < sp.end && (e == b || mem + plan.items[e].work_bytes <= batch_budget))
        mem += plan.items[e++].work_bytes;
      if (o.cancel != nullptr && o.cancel->load()) {
        fail(kComp, "interrupted; {} output shard(s) are recorded in {} — rerun the same command to resume",
             pr.shards_done, p.partial.string());
      }
      std::vector<std::vector<std::vector<std::vector<std::byte>>>> bufs(e - b);
      tbb::parallel_for(b, e, [&](size_t i) {
        const Item& it = plan.items[i];
        bufs[i - b].resize(it.convs.size());
        for (size_t c = 0; c < it.convs.size(); ++c) bufs[i - b][c] = convert_one(it.convs[c]);
      });
      for (size_t i = b; i < e; ++i) {
        const Item& it = plan.items[i];
        for (size_t c = 0; c < it.convs.size(); ++c) {
          const Conv& cv = it.convs[c];
          auto& out = bufs[i - b][c];
          if (cv.kind == OutKind::Copy) {
            file.write(cv.src.ref.data(), cv.src.ref.info->nbytes);
          } else {
            for (auto& v : out) file.write(v.data(), v.size());
          }
          std::vector<std::vector<std::byte>>().swap(out);
          release_pages(cv.src.ref.data(), cv.src.ref.info->nbytes);
          if (cv.src.scale) release_pages(cv.src.scale->data(), cv.src.scale->info->nbytes);
        }
        pr.tensors_done += it.in_tensors;
        pr.bytes_done += it.in_bytes;
        pr.bytes_done_this_run += it.in_bytes;
        report(ConvertProgress::Stage::Tensor);
      }
      b = e;
    }
    STRATA_CHECK(file.written() == sp.file_size);
    file.commit();
    fsync_dir(p.partial);
    {
      json inputs = json::array();
      for (size_t s : sp.inputs) inputs.push_back(plan.files[s]->path().filename().string());
      size_t n_tensors = 0;
      for (size_t i = sp.first; i < sp.end; ++i) n_tensors += plan.items[i].outs.size();
      journal["done"].push_back(
          {{"file", sp.file}, {"size", sp.file_size}, {"inputs", inputs}, {"tensors", n_tensors}});
    }
    write_text_atomic(jpath, journal.dump(1));
    ++pr.shards_done;
    ++written_this_run;
    report(ConvertProgress::Stage::ShardWritten);
    if (stop_after > 0 && written_this_run >= static_cast<size_t>(stop_after) && k + 1 < plan.shards.size()) {
      fail(kComp,
           "stopped after {} output shard(s) (STRATA_CONVERT_STOP_AFTER_SHARDS); {} is left for resumption",
           written_this_run, p.partial.string());
    }
  }

  // Publication: index, copied files, config.json, then the manifest, then the rename.
  report(ConvertProgress::Stage::Publishing);
  {
    json wm = json::object();
    for (const auto& sp : plan.shards) {
      for (size_t i = sp.first; i < sp.end; ++i) {
        for (const auto& t : plan.items[i].outs) wm[t.name] = sp.file;
      }
    }
    const json index = {{"metadata", {{"total_size", plan.bytes_out}}}, {"weight_map", wm}};
    write_text_atomic(p.partial / kIndex, index.dump(2) + "\n");
  }
  json copied = json::array();
  {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(p.in)) {
      if (e.is_regular_file() && copied_verbatim(e.path().filename().string())) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::error_code ec;
      fs::copy_file(f, p.partial / f.filename(), fs::copy_options::overwrite_existing, ec);
      if (ec) fail(kComp, "{}: cannot copy to {}: {}", f.string(), p.partial.string(), ec.message());
      res.copied_files.push_back(f.filename().string());
      copied.push_back({{"file", f.filename().string()}, {"size", fs::file_size(f)}});
    }
  }
  const std::string experts_name = o.experts == WeightFormat::Q4_G64 ? "q4_g64" : "q4_row";
  {
    ordered_json cfg = parse_json_file<ordered_json>(p.in / "config.json", kComp);
    cfg["strata_container"] = {{"version", kContainerVersion},
                               {"experts", experts_name},
                               {"dense", std::string(dense_format_name(o.dense))}};
    write_text_atomic(p.partial / "config.json", cfg.dump(2) + "\n");
  }
  {
    json shards = json::array();
    for (const auto& sp : plan.shards) shards.push_back({{"file", sp.file}, {"size", sp.file_size}});
    const json manifest = {
        {"strata_container", kContainerVersion},
        {"created_by", "strata convert"},
        {"model_type", plan.model_type},
        {"experts", experts_name},
        {"dense", std::string(dense_format_name(o.dense))},
        {"source", {{"dir", p.in.string()}, {"tensors", plan.tensors_in}, {"bytes", plan.bytes_in}}},
        {"tensors", plan.tensors_out},
        {"routed_experts", plan.experts},
        {"total_size", plan.bytes_out},
        {"shards", shards},
        {"copied", copied}};
    write_text_atomic(p.partial / kManifest, manifest.dump(2) + "\n");  // last: marks the folder complete
  }
  fsync_dir(p.partial);

  // Into place. With --force an existing container is moved aside first and removed once the new one is in.
  fs::path old;
  if (fs::exists(p.out)) {
    check_out_dir(p, o.force);
    old = p.parent / fmt::format("{}.old-{}", p.out.filename().string(), ::getpid());
    if (::rename(p.out.c_str(), old.c_str()) != 0) {
      fail(kComp, "cannot move the existing {} aside to {}: {}", p.out.string(), old.string(),
           std::strerror(errno));
    }
    res.replaced_existing = true;
  }
  if (::rename(p.partial.c_str(), p.out.c_str()) != 0) {
    const int e = errno;
    if (!old.empty()) (void)::rename(old.c_str(), p.out.c_str());
    fail(kComp, "cannot rename {} to {}: {}", p.partial.string(), p.out.string(), std::strerror(e));
  }
  fsync_dir(p.parent);
  std::error_code ec;
  fs::remove(p.out / kJournal, ec);
  if (!old.empty()) fs::remove_all(old, ec);

  res.seconds = seconds();
  res.peak_rss_bytes = peak_rss_bytes();
  report(ConvertProgress::Stage::Done);
  return res;
}

}  // namespace

std::string_view dense_format_name(DenseFormat f) {
  switch (f) {
    case DenseFormat::Keep:
      return "keep";
    case DenseFormat::BF16:
      return "bf16";
    case DenseFormat::Q4_G64:
      return "q4_g64";
  }
  return "?";
}

DenseFormat parse_dense_format(std::string_view name) {
  if (name == "keep") return DenseFormat::Keep;
  if (name == "bf16") return DenseFormat::BF16;
  if (name == "q4_g64") return DenseFormat::Q4_G64;
  fail(kComp, "unknown dense format '{}' (expected keep, bf16 or q4_g64)", name);
}

float fp8_e4m3_to_f32(uint8_t v) {
  return e4m3_table()[v];
}

uint16_t f32_to_bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TensorRole tensor_role(const std::string& name, size_t rank) {
  if (name.ends_with(kScaleSuffix)) return TensorRole::ScaleInv;
  if (parse_expert(name)) return TensorRole::RoutedExpert;
  if (rank <= 1) return TensorRole::F32;
  if (name.ends_with(".bias") || name.ends_with(".mlp.gate.weight") ||
      name.ends_with("e_score_correction_bias") || name.ends_with("indexer.weights_proj.weight")) {
    return TensorRole::F32;
  }
  if (name.ends_with("embed_tokens.weight") || name == "lm_head.weight" ||
      name.ends_with(".lm_head.weight") || name.ends_with("shared_head.head.weight") ||
      name.find("kv_b_proj") != std::string::npos) {
    return TensorRole::KeepFloat;
  }
  return rank == 2 ? TensorRole::Dense2D : TensorRole::Other;
}

ConvertResult convert_checkpoint(const ConvertOptions& opts) {
  try {
    return run(opts);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("[convert]")) throw;
    throw Error(kComp, e.what());
  } catch (const fs::filesystem_error& e) {
    throw Error(kComp, e.what());
  } catch (const std::bad_alloc&) {
    throw Error(kComp, "out of memory (try a smaller --shard-size-mb)");
  }
}

}  // namespace strata
