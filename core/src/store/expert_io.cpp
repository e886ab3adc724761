// FileReader: the io_uring and pread engines, O_DIRECT with aligned bounce buffers, and read errors that name
// the file, the offset and the length.
#include "strata/expert_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#if STRATA_HAVE_LIBURING
#include <liburing.h>
#endif

#include "strata/error.hpp"

namespace strata {
namespace fs = std::filesystem;
using Completion = FileReader::Completion;

namespace {

constexpr std::string_view kComp = "expert_io";
// One pread(2) moves at most about 2 GiB (the kernel's MAX_RW_COUNT) and an io_uring read's length is 32-bit,
// so longer reads are issued in chunks of 1 GiB (a multiple of the O_DIRECT alignment).
constexpr uint64_t kMaxChunk = 1ull << 30;
constexpr int kMaxQueueDepth = 4096;

struct OpenFile {
  fs::path path;
  int fd = -1;         // buffered descriptor
  int direct_fd = -1;  // O_DIRECT descriptor, -1 when direct reads are off or refused for this file
  uint64_t size = 0;   // at open
  std::string direct_note;
};

struct FreeAligned {
  void operator()(std::byte* p) const { std::free(p); }
};

// One submitted read and how far it has come. The bytes land in `target[0, want)`, which holds the file from
// `phys_offset`: that is `dest` itself, or for an unaligned O_DIRECT read a bounce buffer holding the aligned
// superset of the requested range. The read is complete once `need` bytes of it have arrived (the padding of
// a bounce buffer past the end of the file never arrives).
struct ReadOp {
  uint64_t ticket = 0;
  const OpenFile* file = nullptr;
  uint64_t offset = 0, length = 0;  // as submitted
  std::byte* dest = nullptr;

  bool use_direct = false;
  std::unique_ptr<std::byte, FreeAligned> bounce;
  std::byte* target = nullptr;
  uint64_t phys_offset = 0, want = 0, need = 0, got = 0;
  std::string error;
};

std::string what_read(const ReadOp& op) {
  return fmt::format("{}: read of {} bytes at offset {}{}", op.file->path.string(), op.length, op.offset,
                     op.use_direct ? " (O_DIRECT)" : "");
}

// Lays out the physical read. Returns false (with op.error set) when the bounce buffer cannot be allocated.
bool prepare(ReadOp& op) {
  const uint64_t a = FileReader::direct_alignment();
  op.use_direct = op.file->direct_fd >= 0;
  const bool aligned =
      op.offset % a == 0 && op.length % a == 0 && reinterpret_cast<uintptr_t>(op.dest) % a == 0;
  if (op.use_direct && !aligned) {
    op.phys_offset = op.offset / a * a;
    op.want = (op.offset + op.length + a - 1) / a * a - op.phys_offset;
    op.bounce.reset(static_cast<std::byte*>(std::aligned_alloc(a, op.want)));
    if (!op.bounce) {
      op.error =
          fmt::format("{} failed: cannot allocate a {} byte O_DIRECT bounce buffer", what_read(op), op.want);
      return false;
    }
    op.target = op.bounce.get();
  } else {
    op.phys_offset = op.offset;
    op.want = op.length;
    op.target = op.dest;
  }
  op.need = op.offset + op.length - op.phys_offset;
  return true;
}

// The next read call of an op: descriptor, memory, file offset, length.
struct Call {
  int fd;
  std::byte* buf;
  uint64_t offset;
  uint64_t len;
};

Call next_call(const ReadOp& op) {
  return {op.use_direct ? op.file->direct_fd : op.file->fd, op.target + op.got, op.phys_offset + op.got,
          std::min(op.want - op.got, kMaxChunk)};
}

enum class Step { kAgain, kDone };

// Accounts for the result of one read call: bytes read, or -errno. Done means finished or failed (op.error).
Step advance(ReadOp& op, int64_t res) {
  if (res == -EINTR || res == -EAGAIN) return Step::kAgain;
  if (res == -EINVAL && op.use_direct) {
    // The file system took the O_DIRECT open but refuses this read (a larger logical block than our
    // alignment, say): finish it buffered.
    op.use_direct = false;
    return Step::kAgain;
  }
  if (res < 0) {
    op.error =
        fmt::format("{} failed: {} (errno {})", what_read(op), std::strerror(static_cast<int>(-res)), -res);
    return Step::kDone;
  }
  op.got += static_cast<uint64_t>(res);
  if (op.got >= op.need) return Step::kDone;
  if (res == 0) {
    struct stat st {};
    const uint64_t now = ::fstat(op.file->fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : op.file->size;
    const uint64_t end = op.phys_offset + op.got;
    const uint64_t have = end > op.offset ? end - op.offset : 0;
    op.error = fmt::format(
        "{} failed: unexpected end of file after {} of the {} bytes (the file has {} bytes; a read needs "
        "offset + length <= the file size)",
        what_read(op), have, op.length, now);
    return Step::kDone;
  }
  // A partial read: continue with the rest. O_DIRECT can continue only from an aligned position; a short
  // unaligned direct read happens at the end of the file, and the buffered continuation then reports the end
  // of file precisely.
  if (op.use_direct && op.got % FileReader::direct_alignment() != 0) op.use_direct = false;
  return Step::kAgain;
}

// Copies a successful bounce-buffered read out and frees the buffer.
void finish(ReadOp& op) {
  if (op.error.empty() && op.bounce)
    std::memcpy(op.dest, op.target + (op.offset - op.phys_offset), op.length);
  op.bounce.reset();
}

Completion completion_of(ReadOp& op) {
  return Completion{op.ticket, std::move(op.error)};
}

// An engine issues ReadOps and hands back their completions. Called by the reader's owner thread only.
class ReadEngine {
 public:
  virtual ~ReadEngine() = default;
  virtual void start(std::unique_ptr<ReadOp> op) = 0;  // issue now or queue
  virtual bool poll(Completion* out) = 0;              // a finished read, without blocking
  virtual Completion wait() = 0;                       // the next finished read; something is outstanding
};

// Worker threads that take ops from a FIFO and read them with pread(2). Each thread has one read in flight,
// so the thread count bounds the reads in flight.
class PreadEngine final : public ReadEngine {
 public:
  explicit PreadEngine(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~PreadEngine() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      pending_.clear();  // never started: their memory is never touched
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();  // reads in flight finish first
  }
  void start(std::unique_ptr<ReadOp> op) override {
    {
      std::lock_guard lk(mu_);
      pending_.push_back(std::move(op));
    }
    work_cv_.notify_one();
  }
  bool poll(Completion* out) override {
    std::lock_guard lk(mu_);
    if (done_.empty()) return false;
    *out = std::move(done_.front());
    done_.pop_front();
    return true;
  }
  Completion wait() override {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return !done_.empty(); });
    Completion c = std::move(done_.front());
    done_.pop_front();
    return c;
  }

 private:
  void run() {
    for (;;) {
      std::unique_ptr<ReadOp> op;
      {
        std::unique_lock lk(mu_);
        work_cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
        if (stop_) return;
        op = std::move(pending_.front());
        pending_.pop_front();
      }
      execute(*op);
      {
        std::lock_guard lk(mu_);
        done_.push_back(completion_of(*op));
      }
      done_cv_.notify_one();
    }
  }
  static void execute(ReadOp& op) {
    if (!prepare(op)) return;
    for (;;) {
      const Call c = next_call(op);
      const ssize_t n = ::pread(c.fd, c.buf, c.len, static_cast<off_t>(c.offset));
      if (advance(op, n < 0 ? -errno : n) == Step::kDone) break;
    }
    finish(op);
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::unique_ptr<ReadOp>> pending_;  // submitted, not yet taken by a worker
  std::deque<Completion> done_;
  bool stop_ = false;
};

#if STRATA_HAVE_LIBURING
// One io_uring with `depth` submission entries; each op in flight owns exactly one entry (a partial read is
// resubmitted from its completion), so the submission queue never overflows and the completion queue (twice
// the size) never drops. Everything runs on the owner thread; completions are reaped in poll and wait.
class UringEngine final : public ReadEngine {
 public:
  // nullptr with *why set when this kernel refuses io_uring or lacks IORING_OP_READ (Linux < 5.6).
  static std::unique_ptr<UringEngine> create(unsigned depth, std::string* why) {
    std::unique_ptr<UringEngine> e(new UringEngine(depth));
    const int r = io_uring_queue_init(depth, &e->ring_, 0);
    if (r < 0) {
      *why = fmt::format("io_uring_queue_init failed: {}", std::strerror(-r));
      return nullptr;
    }
    e->ring_ready_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&e->ring_);
    const bool has_read = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ);
    if (probe != nullptr) io_uring_free_probe(probe);
    if (!has_read) {
      *why = "this kernel's io_uring has no IORING_OP_READ (needs Linux 5.6 or later)";
      return nullptr;
    }
    return e;
  }
  ~UringEngine() override {
    pending_.clear();  // never issued: their memory is never touched
    // Each op in flight has exactly one read in the ring: wait for it and drop the op without continuing a
    // partial read or copying out of a bounce buffer.
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0) break;  // cannot happen with reads in flight; leaking the ops beats hanging
      delete static_cast<ReadOp*>(io_uring_cqe_get_data(cqe));
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }
  void start(std::unique_ptr<ReadOp> op) override {
    pending_.push_back(std::move(op));
    issue();
  }
  bool poll(Completion* out) override {
    reap_ready();
    if (done_.empty()) return false;
    *out = std::move(done_.front());
    done_.pop_front();
    return true;
  }
  Completion wait() override {
    while (done_.empty()) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0)
        fail(kComp, "io_uring_wait_cqe failed: {} (with {} reads in flight)", std::strerror(-r), in_flight_);
      handle(cqe);
      reap_ready();
    }
    Completion c = std::move(done_.front());
    done_.pop_front();
    return c;
  }

 private:
  explicit UringEngine(unsigned depth) : depth_(depth) {}

  // Issues queued ops while there is room in the ring.
  void issue() {
    bool queued = false;
    while (in_flight_ < depth_ && !pending_.empty()) {
      std::unique_ptr<ReadOp> op = std::move(pending_.front());
      pending_.pop_front();
      if (!prepare(*op)) {
        done_.push_back(completion_of(*op));
        continue;
      }
      queue_read(*op.release());  // owned by the ring until its completion is handled
      ++in_flight_;
      queued = true;
    }
    if (queued) submit();
  }
  void queue_read(ReadOp& op) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_CHECK(sqe != nullptr);  // one entry per op in flight and at most depth_ ops in flight
    const Call c = next_call(op);
    io_uring_prep_read(sqe, c.fd, c.buf, static_cast<unsigned>(c.len), c.offset);
    io_uring_sqe_set_data(sqe, &op);
  }
  void submit() {
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0) return;
      if (r != -EINTR && r != -EAGAIN) fail(kComp, "io_uring_submit failed: {}", std::strerror(-r));
    }
  }
  // Handles every completion already there, then refills the ring.
  void reap_ready() {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) handle(cqe);
    issue();
  }
  void handle(io_uring_cqe* cqe) {
    auto* op = static_cast<ReadOp*>(io_uring_cqe_get_data(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (advance(*op, res) == Step::kAgain) {
      queue_read(*op);  // the rest of a partial read, in the entry this op already counts for
      submit();
      return;
    }
    --in_flight_;
    std::unique_ptr<ReadOp> owned(op);
    finish(*owned);
    done_.push_back(completion_of(*owned));
  }

  io_uring ring_{};
  bool ring_ready_ = false;
  unsigned depth_;
  unsigned in_flight_ = 0;
  std::deque<std::unique_ptr<ReadOp>> pending_;  // submitted, waiting for room in the ring
  std::deque<Completion> done_;
};
#endif

}  // namespace

struct FileReader::Impl {
  std::vector<OpenFile> files;
  std::unique_ptr<ReadEngine> engine;
  std::string engine_name, engine_note;
  std::deque<Completion> immediate;  // zero-length reads: complete at submit
  uint64_t next_ticket = 1;
  size_t outstanding = 0;

  ~Impl() {
    engine.reset();  // waits for reads in flight before their descriptors close
    for (auto& f : files) {
      if (f.fd >= 0) ::close(f.fd);
      if (f.direct_fd >= 0) ::close(f.direct_fd);
    }
  }
  const OpenFile& file(int i, const char* what) const {
    if (i < 0 || static_cast<size_t>(i) >= files.size())
      fail(kComp, "{}: file index {} is out of range (this reader has {} files)", what, i, files.size());
    return files[static_cast<size_t>(i)];
  }
};

void FileReader::Completion::check() const {
  if (!ok()) throw Error(kComp, error);
}

FileReader::FileReader(std::vector<fs::path> paths, ReaderOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.queue_depth < 1 || options.queue_depth > kMaxQueueDepth)
    fail(kComp, "queue_depth is {}; expected 1 to {}", options.queue_depth, kMaxQueueDepth);
  if (options.pread_threads < 1)
    fail(kComp, "pread_threads is {}; expected at least 1", options.pread_threads);

  impl_->files.reserve(paths.size());
  for (auto& p : paths) {
    OpenFile& f = impl_->files.emplace_back();
    f.path = std::move(p);
    f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) fail(kComp, "{}: cannot open for reading: {}", f.path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) fail(kComp, "{}: cannot stat: {}", f.path.string(), std::strerror(errno));
    f.size = static_cast<uint64_t>(st.st_size);
    if (options.direct == DirectIo::kOn) {
      f.direct_fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (f.direct_fd < 0) {
        // EINVAL: the file system has no O_DIRECT (tmpfs before Linux 6.6, some FUSE and network file
        // systems).
        f.direct_note = errno == EINVAL ? "the file system does not support O_DIRECT; reading it buffered"
                                        : fmt::format("O_DIRECT open failed ({}); reading it buffered",
                                                      std::strerror(errno));
      }
    }
  }

  // Engine: io_uring unless pread was asked for or io_uring does not work here.
  std::string why;
  if (options.engine != IoEngine::kPread) {
#if STRATA_HAVE_LIBURING
    impl_->engine = UringEngine::create(static_cast<unsigned>(options.queue_depth), &why);
    if (impl_->engine) impl_->engine_name = "io_uring";
#else
    why = "strata was built without liburing (install liburing-dev and reconfigure)";
#endif
  }
  if (!impl_->engine) {
    impl_->engine = std::make_unique<PreadEngine>(std::min(options.pread_threads, options.queue_depth));
    impl_->engine_name = "pread";
    impl_->engine_note = why;
  }
}

FileReader::~FileReader() = default;

uint64_t FileReader::submit(int file_index, uint64_t offset, uint64_t length, std::byte* dest) {
  const OpenFile& f = impl_->file(file_index, "submit");
  if (length > 0 && dest == nullptr)
    fail(kComp, "{}: read of {} bytes at offset {} has a null destination", f.path.string(), length, offset);
  if (length > UINT64_MAX - offset) {
    fail(kComp, "{}: read of {} bytes at offset {} runs past the largest file offset", f.path.string(),
         length, offset);
  }
  const uint64_t ticket = impl_->next_ticket++;
  ++impl_->outstanding;
  if (length == 0) {
    impl_->immediate.push_back(Completion{ticket, {}});
    return ticket;
  }
  auto op = std::make_unique<ReadOp>();
  op->ticket = ticket;
  op->file = &f;
  op->offset = offset;
  op->length = length;
  op->dest = dest;
  impl_->engine->start(std::move(op));
  return ticket;
}

FileReader::Completion FileReader::wait_any() {
  if (impl_->outstanding == 0) fail(kComp, "wait_any: no read is outstanding (submit one first)");
  Completion c;
  if (!impl_->immediate.empty()) {
    c = std::move(impl_->immediate.front());
    impl_->immediate.pop_front();
  } else {
    c = impl_->engine->wait();
  }
  --impl_->outstanding;
  return c;
}

bool FileReader::poll(Completion* out) {
  if (impl_->outstanding == 0) return false;
  if (!impl_->immediate.empty()) {
    *out = std::move(impl_->immediate.front());
    impl_->immediate.pop_front();
  } else if (!impl_->engine->poll(out)) {
    return false;
  }
  --impl_->outstanding;
  return true;
}

void FileReader::wait_all() {
  std::string first;
  size_t failed = 0;
  while (impl_->outstanding > 0) {
    Completion c = wait_any();
    if (!c.ok() && failed++ == 0) first = std::move(c.error);
  }
  if (failed == 1) throw Error(kComp, first);
  if (failed > 1) throw Error(kComp, fmt::format("{} (and {} more reads failed)", first, failed - 1));
}

size_t FileReader::outstanding() const {
  return impl_->outstanding;
}
std::string_view FileReader::engine_name() const {
  return impl_->engine_name;
}
std::string_view FileReader::engine_note() const {
  return impl_->engine_note;
}
bool FileReader::direct(int file_index) const {
  return impl_->file(file_index, "direct").direct_fd >= 0;
}
std::string_view FileReader::direct_note(int file_index) const {
  return impl_->file(file_index, "direct_note").direct_note;
}
size_t FileReader::file_count() const {
  return impl_->files.size();
}
const fs::path& FileReader::path(int file_index) const {
  return impl_->file(file_index, "path").path;
}
uint64_t FileReader::file_size(int file_index) const {
  return impl_->file(file_index, "file_size").size;
}

}  // namespace strata
