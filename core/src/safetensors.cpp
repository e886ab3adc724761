// safetensors reader (mmap, full header validation) and atomic writer.
#include "strata/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "strata/error.hpp"
#include "strata/json_text.hpp"

namespace strata {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr std::string_view kComp = "safetensors";
// The format caps the header at 100 MB; a larger length field means a corrupt or foreign file.
constexpr uint64_t kMaxHeader = 100ull << 20;
}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(kComp, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(kComp, "{}: cannot stat: {}", path.string(), std::strerror(e));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(kComp, "{}: file is {} bytes, too short for a safetensors header (truncated?)", path.string(),
         file_size);
  }
  map_size_ = file_size;
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(kComp, "{}: mmap failed: {}", path.string(), std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const std::byte*>(map_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes, 8);  // little-endian per the format; strata targets little-endian hosts
    if (header_len > kMaxHeader || header_len > file_size - 8) {
      fail(kComp, "{}: header length {} exceeds the file ({} bytes) — truncated or not a safetensors file",
           path.string(), header_len, file_size);
    }
    const auto* hbeg = reinterpret_cast<const char*>(bytes + 8);
    json header;
    try {
      header = parse_json_text(std::string_view(hbeg, header_len), kComp, path.string() + " header");
    } catch (const json::exception& e) {
      fail(kComp, "{}: header is not valid JSON: {}", path.string(), e.what());
    }
    if (!header.is_object()) fail(kComp, "{}: header must be a JSON object", path.string());
    data_ = bytes + 8 + header_len;
    const uint64_t data_size = file_size - 8 - header_len;

    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") {
        if (!it->is_object()) fail(kComp, "{}: __metadata__ must be an object of strings", path.string());
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) fail(kComp, "{}: __metadata__.{} must be a string", path.string(), m.key());
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const json& v = *it;
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
        fail(kComp, "{}: tensor '{}': entry needs dtype, shape and data_offsets", path.string(), name);
      }
      TensorInfo t;
      t.name = name;
      if (!v["dtype"].is_string())
        fail(kComp, "{}: tensor '{}': dtype must be a string", path.string(), name);
      const auto dt = dtype_from_name(v["dtype"].get<std::string>());
      if (!dt) {
        fail(kComp,
             "{}: tensor '{}': unsupported dtype '{}' (expected F32, F16, BF16, F64, I64, I32, I16, I8, U8, "
             "BOOL or F8_E4M3)",
             path.string(), name, v["dtype"].get<std::string>());
      }
      t.dtype = *dt;
      if (!v["shape"].is_array()) fail(kComp, "{}: tensor '{}': shape must be an array", path.string(), name);
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) {
          fail(kComp, "{}: tensor '{}': shape must hold non-negative integers", path.string(), name);
        }
        t.shape.push_back(d.get<int64_t>());
      }
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned()) {
        fail(kComp, "{}: tensor '{}': data_offsets must be two non-negative integers", path.string(), name);
      }
      const auto b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e)
        fail(kComp, "{}: tensor '{}': data_offsets [{}, {}] are reversed", path.string(), name, b, e);
      if (e > data_size) {
        fail(kComp,
             "{}: tensor '{}': data ends at byte {} but the file holds only {} data bytes (truncated file?)",
             path.string(), name, e, data_size);
      }
      const uint64_t expect = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype);
      if (e - b != expect) {
        fail(kComp, "{}: tensor '{}': {} {} needs {} bytes but data_offsets span {}", path.string(), name,
             dtype_name(t.dtype), t.shape_str(), expect, e - b);
      }
      t.offset = b;
      t.nbytes = e - b;
      spans.emplace_back(b, e);
      tensors_.emplace(name, std::move(t));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      if (spans[i].first < spans[i - 1].second && spans[i].first != spans[i].second) {
        fail(kComp, "{}: tensors overlap in the data section (bytes {}..{} and {}..{})", path.string(),
             spans[i - 1].first, spans[i - 1].second, spans[i].first, spans[i].second);
      }
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

SafetensorsSet::SafetensorsSet(const fs::path& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail(kComp, "{}: not a directory", dir.string());
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    const json idx = parse_json_file(index_path, kComp);
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      fail(kComp, "{}: expected an object with a 'weight_map' object", index_path.string());
    }
    std::map<std::string, const SafetensorsFile*> by_shard;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string())
        fail(kComp, "{}: weight_map['{}'] must be a file name", index_path.string(), it.key());
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) {
        fail(kComp, "{}: weight_map['{}'] = '{}' is not a plain file name", index_path.string(), it.key(),
             shard);
      }
      auto s = by_shard.find(shard);
      if (s == by_shard.end()) {
        const fs::path p = dir / shard;
        if (!fs::exists(p)) {
          fail(kComp, "{}: shard '{}' named for tensor '{}' is missing", index_path.string(), shard,
               it.key());
        }
        files_.push_back(std::make_unique<SafetensorsFile>(p));
        s = by_shard.emplace(shard, files_.back().get()).first;
      }
      const TensorInfo* info = s->second->find(it.key());
      if (info == nullptr) {
        fail(kComp, "{}: tensor '{}' is listed in {} but not present in that shard", (dir / shard).string(),
             it.key(), index_path.filename().string());
      }
      index_[it.key()] = TensorRef{s->second, info};
    }
    return;
  }
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  if (shards.empty())
    fail(kComp, "{}: no *.safetensors files (and no model.safetensors.index.json)", dir.string());
  for (const auto& p : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (const auto& [name, info] : files_.back()->tensors()) {
      auto [it, inserted] = index_.emplace(name, TensorRef{files_.back().get(), &info});
      if (!inserted) {
        fail(kComp, "tensor '{}' appears in both {} and {}", name, it->second.file->path().string(),
             p.string());
      }
    }
  }
}

std::optional<TensorRef> SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    fail("io", "{}: cannot create a temporary file in {}: {}", path.string(), dir.string(),
         std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmpl.c_str());
      fail("io", "{}: write failed: {}", path.string(), std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    fail("io", "{}: cannot flush: {}", path.string(), std::strerror(e));
  }
  ::close(fd);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmpl.c_str());
    fail("io", "{}: cannot rename the finished file into place: {}", path.string(), std::strerror(e));
  }
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const uint64_t n = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
    if (n != t.bytes.size()) {
      fail(kComp, "{}: tensor '{}' has {} bytes but {} {} needs {}", path.string(), t.name, t.bytes.size(),
           dtype_name(t.dtype), fmt::format("[{}]", fmt::join(t.shape, ", ")), n);
    }
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
  std::vector<std::byte> out(8 + h.size() + offset);
  const uint64_t hl = h.size();
  std::memcpy(out.data(), &hl, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  size_t pos = 8 + h.size();
  for (const auto& t : tensors) {
    std::memcpy(out.data() + pos, t.bytes.data(), t.bytes.size());
    pos += t.bytes.size();
  }
  write_file_atomic(path, out);
}

}  // namespace strata
