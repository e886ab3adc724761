// FileReader: asynchronous positional reads into caller memory (io_uring or a pread thread pool, optional
// O_DIRECT), for streaming expert weights from disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// O_DIRECT for the files of a FileReader.
enum class DirectIo {
  kOff,   // buffered reads through the page cache
  kOn,    // O_DIRECT where the file system accepts it; a file whose O_DIRECT open fails is read buffered
          // (FileReader::direct(i) says which; FileReader::direct_note(i) says why)
  kAuto,  // currently the same as kOff: whether O_DIRECT wins depends on what the page cache holds and on the
          // device, which a short read at construction cannot measure reliably; callers pick kOn or kOff.
};

// How the reads are issued. (Not `Engine`: strata::Engine is the inference engine.)
enum class IoEngine {
  kAuto,     // io_uring when it works here, else pread
  kIoUring,  // io_uring; falls back to pread when strata was built without liburing or the kernel refuses
             // io_uring (ENOSYS, EPERM under seccomp or kernel.io_uring_disabled); see engine_name()
  kPread,    // a small pool of threads calling pread(2)
};

struct ReaderOptions {
  int queue_depth = 32;  // reads in flight at most (io_uring submission entries / pread jobs); 1..4096
  DirectIo direct = DirectIo::kOff;
  IoEngine engine = IoEngine::kAuto;
  int pread_threads = 4;  // pread engine: threads (capped at queue_depth); >= 1
};

// Reads byte ranges of a fixed list of files into caller memory, asynchronously.
//
// Threading: one thread owns the reader and makes every call (submit, poll, wait_any, wait_all, the
// destructor); the reader is not safe for concurrent calls. The pread engine reads on its own threads.
//
// Queueing: submit() never blocks. At most queue_depth reads are in flight; further ones wait in a FIFO
// inside the reader and are issued as earlier ones complete (the io_uring engine issues them during submit,
// poll and wait_any calls; the pread engine's threads take them as they free up).
//
// Errors: a read that fails (errno, end of file before `length` bytes) completes with Completion::error set
// to a message naming the file path, the offset and the length; poll and wait_any return it (they never throw
// for a read error), Completion::check() turns it into a strata::Error, and wait_all() throws it. Bad
// arguments to submit (unknown file index, null destination) and unopenable files at construction throw
// strata::Error.
//
// Lifetimes: `dest` must stay valid until its ticket has been returned by poll/wait_any, consumed by
// wait_all, or the reader is destroyed. The destructor drops reads not yet issued (their memory is never
// touched) and waits for the ones in flight.
//
// O_DIRECT: the device needs the file offset, the length and the memory address aligned to
// direct_alignment(). A read with all three aligned goes straight into `dest`; any other range is read as the
// aligned superset into an internal aligned bounce buffer and the requested bytes are copied out, so every
// (offset, length, dest) works and aligned ones avoid the copy.
class FileReader {
 public:
  struct Completion {
    uint64_t ticket = 0;
    std::string error;  // empty: all `length` bytes are in `dest`; else what failed (file, offset, length)
    bool ok() const { return error.empty(); }
    void check() const;  // throws strata::Error with `error` when the read failed
  };

  // Opens every file read-only once (and a second descriptor with O_DIRECT when direct is kOn). Throws
  // strata::Error naming the file when one cannot be opened, or naming the option when options are invalid.
  FileReader(std::vector<std::filesystem::path> paths, ReaderOptions options = {});
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // Queues a read of `length` bytes at `offset` of file `file_index` into `dest`; returns its ticket (1, 2,
  // 3, ... in submission order). A zero-length read completes at once.
  uint64_t submit(int file_index, uint64_t offset, uint64_t length, std::byte* dest);

  // The next finished read, blocking until there is one. Completions come in finishing order, not ticket
  // order. Throws strata::Error when nothing is outstanding (it would wait forever).
  Completion wait_any();
  // A finished read if there is one (true, *out set), without blocking.
  bool poll(Completion* out);
  // Waits for every outstanding read, consuming their completions, then throws the first error (with a count
  // of further failures) if any read failed.
  void wait_all();

  size_t outstanding() const;  // submitted reads whose completion has not been returned yet

  std::string_view engine_name() const;  // "io_uring" or "pread": the engine actually in use
  std::string_view engine_note() const;  // why the requested engine is not in use ("" when it is)
  bool direct(int file_index) const;     // reads of this file use O_DIRECT
  std::string_view direct_note(int file_index) const;  // why kOn fell back to buffered for it ("" if not)
  size_t file_count() const;
  const std::filesystem::path& path(int file_index) const;
  uint64_t file_size(int file_index) const;  // at open

  // Offset, length and address alignment for reads straight into caller memory with O_DIRECT. 4096 covers
  // the logical block size of NVMe and SATA drives with 4 KiB sectors as well as 512-byte ones.
  static size_t direct_alignment() { return 4096; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
