// safetensors checkpoints: a validated, memory-mapped reader (one file or a sharded set) and an atomic
// writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/dtype.hpp"

namespace strata {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
  std::string shape_str() const;  // "[512, 128]"
};

// A read-only mapping of one .safetensors file. The header is checked completely at open: JSON shape, known
// dtypes, offsets inside the file, sizes equal to numel × element size, no overlapping tensors. Every error
// names the file (and the tensor). Thread-safe for concurrent reads after construction.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // Pointer to the tensor's bytes inside the mapping (valid for the life of this object).
  const std::byte* data(const TensorInfo& t) const { return data_ + t.offset; }
  // Whether [p, p + n) lies inside this file's mapping, and the file offset of p (when it does).
  bool contains(const void* p, size_t n) const {
    const auto* b = static_cast<const std::byte*>(map_);
    const auto* q = static_cast<const std::byte*>(p);
    return q >= b && q + n <= b + map_size_;
  }
  uint64_t file_offset(const void* p) const {
    return static_cast<uint64_t>(static_cast<const std::byte*>(p) - static_cast<const std::byte*>(map_));
  }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const std::byte* data_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor located in one of the files of a checkpoint.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  const std::byte* data() const { return file->data(*info); }
};

// All .safetensors of a model directory: model.safetensors.index.json when present (every shard it names must
// exist and hold the tensors the index says), else every *.safetensors file in the directory.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::filesystem::path& dir);
  std::optional<TensorRef> find(const std::string& name) const;
  size_t size() const { return index_.size(); }
  const std::map<std::string, TensorRef>& all() const { return index_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> index_;
};

// A tensor to write: name, dtype, shape and its bytes (numel × element size).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

// Writes a .safetensors file atomically: a temporary file beside the target, fsync, rename. A failure leaves
// any previous file at `path` untouched.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes bytes to `path` atomically (temporary + fsync + rename).
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);

}  // namespace strata
