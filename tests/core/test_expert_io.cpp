// FileReader: random ranges read through both engines, buffered and O_DIRECT, equal the file's bytes; more
// reads than the queue depth; errors for reads past the end of a (truncated) file name file, offset, length.
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "strata/error.hpp"
#include "strata/expert_io.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

// doctest::Contains wants a doctest::String (it keeps a copy).
doctest::Contains contains(const std::string& s) {
  return doctest::Contains(s.c_str());
}

// A fresh folder inside `parent`, removed when the object dies. The tests use one under the build tree
// (beside the test executable) as well as TempDir's: /tmp may be a tmpfs, which refused O_DIRECT before
// Linux 6.6, and the direct path must be exercised on a real file system too.
class ScratchDir {
 public:
  explicit ScratchDir(const fs::path& parent) {
    std::string t = (parent / "strata-expert-io-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path_ = t;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

fs::path build_dir() {
  return fs::read_symlink("/proc/self/exe").parent_path();
}

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

std::vector<std::byte> write_random_file(const fs::path& p, size_t n, uint64_t seed) {
  auto bytes = random_bytes(n, seed);
  write_file_atomic(p, bytes);
  return bytes;
}

// Memory aligned to the O_DIRECT alignment, so tests choose aligned or deliberately misaligned destinations.
struct AlignedBytes {
  explicit AlignedBytes(size_t n)
      : size((n + 4095) / 4096 * 4096), p(static_cast<std::byte*>(std::aligned_alloc(4096, size))) {
    REQUIRE(p != nullptr);
    std::memset(p, 0xEE, size);
  }
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  size_t size;
  std::byte* p;
};

struct Range {
  uint64_t offset, length;
  size_t at;  // position in the destination buffer
};

// Random ranges of a file of `size` bytes: a third fully aligned (offset, length and destination: the direct
// path without a bounce buffer), the rest arbitrary, plus the file's first and last bytes.
std::vector<Range> random_ranges(uint64_t size, int n, uint64_t seed, size_t* buffer_bytes) {
  std::mt19937_64 rng(seed);
  std::vector<Range> out;
  size_t at = 0;
  auto add = [&](uint64_t off, uint64_t len, size_t misalign) {
    out.push_back({off, len, at + misalign});
    at += (misalign + len + 4095) / 4096 * 4096;
  };
  add(0, 1, 0);
  add(size - 1, 1, 3);
  add(size - 5000, 5000, 0);  // ends exactly at the (unaligned) end of the file
  for (int i = 0; i < n; ++i) {
    if (i % 3 == 0) {
      const uint64_t blocks = size / 4096;
      const uint64_t off = rng() % (blocks - 1) * 4096;
      const uint64_t len = std::min<uint64_t>(1 + rng() % 48, blocks - off / 4096) * 4096;
      add(off, len, 0);
    } else {
      const uint64_t off = rng() % size;
      const uint64_t len = 1 + rng() % std::min<uint64_t>(size - off, 200000);
      add(off, len, 1 + rng() % 4095);
    }
  }
  *buffer_bytes = at;
  return out;
}

std::string_view direct_name(DirectIo d) {
  return d == DirectIo::kOn ? "on" : d == DirectIo::kAuto ? "auto" : "off";
}

// Reads `ranges` of `file` (whose bytes are `expect`) through one reader and checks every byte. Returns false
// when the requested engine is not available here (the caller skips with a message).
bool read_and_compare(const fs::path& file, const std::vector<std::byte>& expect, IoEngine engine,
                      DirectIo direct, int queue_depth, bool use_poll) {
  ReaderOptions opt;
  opt.engine = engine;
  opt.direct = direct;
  opt.queue_depth = queue_depth;
  opt.pread_threads = 3;
  FileReader reader({file}, opt);
  if (engine == IoEngine::kIoUring && reader.engine_name() != "io_uring") return false;
  CAPTURE(reader.engine_name());
  CAPTURE(direct_name(direct));
  CAPTURE(file.string());
  if (direct == DirectIo::kOn && !reader.direct(0)) CHECK(!reader.direct_note(0).empty());
  if (direct != DirectIo::kOn) CHECK(!reader.direct(0));

  size_t buffer_bytes = 0;
  const auto ranges = random_ranges(expect.size(), 240, 7 + queue_depth, &buffer_bytes);
  AlignedBytes buf(buffer_bytes);
  std::map<uint64_t, size_t> by_ticket;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint64_t t = reader.submit(0, ranges[i].offset, ranges[i].length, buf.p + ranges[i].at);
    CHECK(by_ticket.emplace(t, i).second);
  }
  CHECK(reader.outstanding() == ranges.size());
  std::set<uint64_t> seen;
  while (reader.outstanding() > 0) {
    FileReader::Completion c;
    if (use_poll) {
      if (!reader.poll(&c)) {
        std::this_thread::yield();
        continue;
      }
    } else {
      c = reader.wait_any();
    }
    REQUIRE_MESSAGE(c.ok(), c.error);
    CHECK(seen.insert(c.ticket).second);
  }
  CHECK(seen.size() == ranges.size());
  FileReader::Completion none;
  CHECK(!reader.poll(&none));
  for (const auto& r : ranges) {
    CAPTURE(r.offset);
    CAPTURE(r.length);
    REQUIRE(std::memcmp(buf.p + r.at, expect.data() + r.offset, r.length) == 0);
  }
  return true;
}

}  // namespace

TEST_CASE("engines: pread always; io_uring when built and allowed, else a pread fallback that says why") {
  TempDir tmp;
  write_random_file(tmp.path() / "f", 4096, 1);
  FileReader pread_reader({tmp.path() / "f"}, {.engine = IoEngine::kPread});
  CHECK(pread_reader.engine_name() == "pread");
  CHECK(pread_reader.engine_note().empty());
  FileReader uring_reader({tmp.path() / "f"}, {.engine = IoEngine::kIoUring});
  MESSAGE("active engine for kIoUring: " << uring_reader.engine_name() << " "
                                         << std::string(uring_reader.engine_note()));
  if (uring_reader.engine_name() == "io_uring") {
    CHECK(uring_reader.engine_note().empty());
  } else {
    CHECK(uring_reader.engine_name() == "pread");
    CHECK(!uring_reader.engine_note().empty());
  }
  FileReader auto_reader({tmp.path() / "f"});
  CHECK(auto_reader.engine_name() == uring_reader.engine_name());
  CHECK(FileReader::direct_alignment() == 4096);
}

TEST_CASE("random ranges equal the file bytes: every engine, direct on and off, /tmp and the build tree") {
  TempDir tmp;
  ScratchDir build(build_dir());
  const size_t size = (6 << 20) + 123;  // not a multiple of the alignment: the last block is partial
  for (const fs::path& dir : {tmp.path(), build.path()}) {
    const fs::path file = dir / "experts.bin";
    const auto expect = write_random_file(file, size, 42);
    {
      FileReader probe({file}, {.direct = DirectIo::kOn});
      MESSAGE("O_DIRECT in " << dir.string() << ": "
                             << (probe.direct(0) ? "used" : std::string(probe.direct_note(0))));
    }
    for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
      for (DirectIo direct : {DirectIo::kOff, DirectIo::kOn, DirectIo::kAuto}) {
        const bool ran = read_and_compare(file, expect, engine, direct, 8, false);
        if (!ran) MESSAGE("io_uring is not available here; skipping its case (" << file.string() << ")");
      }
    }
  }
}

TEST_CASE("O_DIRECT on a tmpfs either works or falls back to buffered reads, and says so") {
  if (!fs::is_directory("/dev/shm")) {
    MESSAGE("no /dev/shm here; skipping");
    return;
  }
  ScratchDir shm("/dev/shm");
  const fs::path file = shm.path() / "experts.bin";
  const auto expect = write_random_file(file, (1 << 20) + 77, 5);
  {
    FileReader reader({file}, {.direct = DirectIo::kOn});
    MESSAGE("/dev/shm O_DIRECT: " << (reader.direct(0) ? "used" : std::string(reader.direct_note(0))));
    if (!reader.direct(0)) CHECK(reader.direct_note(0).find("O_DIRECT") != std::string_view::npos);
  }
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring})
    read_and_compare(file, expect, engine, DirectIo::kOn, 4, false);
}

TEST_CASE("a file system that refuses O_DIRECT: reads fall back to buffered and the reader says why") {
  // procfs refuses O_DIRECT opens with EINVAL, as tmpfs did before Linux 6.6.
  const fs::path p = "/proc/version";
  if (!fs::exists(p)) {
    MESSAGE("no /proc/version here; skipping");
    return;
  }
  const std::string text = read_text(p);
  REQUIRE(text.size() >= 5);
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
    FileReader reader({p}, {.direct = DirectIo::kOn, .engine = engine});
    if (reader.direct(0)) {
      MESSAGE("procfs accepted O_DIRECT here; skipping");
      return;
    }
    CHECK(reader.direct_note(0) == "the file system does not support O_DIRECT; reading it buffered");
    std::byte buf[5];
    reader.submit(0, 0, 5, buf);
    reader.wait_any().check();
    CHECK(std::memcmp(buf, text.data(), 5) == 0);
  }
}

TEST_CASE("far more reads than the queue depth, collected by poll and by wait_all") {
  TempDir tmp;
  const fs::path file = tmp.path() / "f";
  const auto expect = write_random_file(file, 1 << 20, 9);
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
    for (DirectIo direct : {DirectIo::kOff, DirectIo::kOn}) {
      // poll, queue depth 2: 243 reads queue inside the reader.
      if (!read_and_compare(file, expect, engine, direct, 2, true))
        MESSAGE("io_uring not available; skipped");

      FileReader reader({file}, {.queue_depth = 3, .direct = direct, .engine = engine});
      CAPTURE(reader.engine_name());
      std::vector<std::byte> dest(500 * 1000);
      for (int i = 0; i < 500; ++i) {
        CHECK(reader.submit(0, static_cast<uint64_t>(i) * 2000 + 17, 1000, dest.data() + i * 1000) ==
              static_cast<uint64_t>(i + 1));
      }
      CHECK(reader.outstanding() == 500);
      reader.wait_all();
      CHECK(reader.outstanding() == 0);
      for (int i = 0; i < 500; ++i)
        REQUIRE(std::memcmp(dest.data() + i * 1000, expect.data() + i * 2000 + 17, 1000) == 0);
    }
  }
}

TEST_CASE("several files; submit and wait interleaved like the scheduler; zero-length reads") {
  TempDir tmp;
  const auto a = write_random_file(tmp.path() / "a", 300000, 1);
  const auto b = write_random_file(tmp.path() / "b", 200000, 2);
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
    FileReader reader({tmp.path() / "a", tmp.path() / "b"}, {.queue_depth = 4, .engine = engine});
    CHECK(reader.file_count() == 2);
    CHECK(reader.path(1) == tmp.path() / "b");
    CHECK(reader.file_size(0) == 300000);
    std::vector<std::byte> dest(100 * 4000);
    std::map<uint64_t, int> ticket_to_read;
    int next = 0, finished = 0;
    while (finished < 100) {
      while (next < 100 && reader.outstanding() < 6) {
        const int f = next % 2;
        ticket_to_read[reader.submit(f, static_cast<uint64_t>(next) * 1000, 4000,
                                     dest.data() + next * 4000)] = next;
        ++next;
      }
      const auto c = reader.wait_any();
      c.check();
      const int i = ticket_to_read.at(c.ticket);
      const auto& src = i % 2 == 0 ? a : b;
      REQUIRE(std::memcmp(dest.data() + i * 4000, src.data() + i * 1000, 4000) == 0);
      ++finished;
    }
    const uint64_t t = reader.submit(1, 5, 0, nullptr);
    const auto c = reader.wait_any();
    CHECK(c.ticket == t);
    CHECK(c.ok());
  }
}

TEST_CASE("a read past the end of the file completes with an error naming file, offset and length") {
  TempDir tmp;
  ScratchDir build(build_dir());
  for (const fs::path& dir : {tmp.path(), build.path()}) {
    const fs::path file = dir / "short.bin";
    write_random_file(file, 10000, 3);
    for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
      for (DirectIo direct : {DirectIo::kOff, DirectIo::kOn}) {
        FileReader reader({file}, {.direct = direct, .engine = engine});
        CAPTURE(reader.engine_name());
        CAPTURE(direct_name(direct));
        std::vector<std::byte> dest(8192);
        const uint64_t bad = reader.submit(0, 9000, 2000, dest.data());
        const uint64_t beyond = reader.submit(0, 20000, 10, dest.data() + 4000);
        const uint64_t good = reader.submit(0, 4096, 4096, dest.data() + 4096);
        std::map<uint64_t, FileReader::Completion> got;
        for (int i = 0; i < 3; ++i) {
          auto c = reader.wait_any();
          got[c.ticket] = c;
        }
        CHECK(got[good].ok());
        const auto& e = got[bad];
        REQUIRE(!e.ok());
        CHECK(e.error.find(file.string()) != std::string::npos);
        CHECK(e.error.find("read of 2000 bytes at offset 9000") != std::string::npos);
        CHECK(e.error.find("unexpected end of file after 1000 of the 2000 bytes") != std::string::npos);
        CHECK(e.error.find("the file has 10000 bytes") != std::string::npos);
        CHECK_THROWS_WITH_AS(e.check(), contains("[expert_io] " + file.string()), Error);
        REQUIRE(!got[beyond].ok());
        CHECK(got[beyond].error.find("read of 10 bytes at offset 20000") != std::string::npos);
        CHECK(got[beyond].error.find("after 0 of the 10 bytes") != std::string::npos);

        // wait_all throws the first failure and counts the others, after every read has finished.
        reader.submit(0, 9999, 2, dest.data());
        reader.submit(0, 0, 100, dest.data() + 100);
        reader.submit(0, 10001, 1, dest.data() + 200);
        CHECK_THROWS_WITH_AS(reader.wait_all(), contains("(and 1 more reads failed)"), Error);
        CHECK(reader.outstanding() == 0);
      }
    }
  }
}

TEST_CASE("a file truncated after opening: the error names the file, the offset and its size now") {
  TempDir tmp;
  const fs::path file = tmp.path() / "truncated.bin";
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
    write_random_file(file, 1 << 20, 4);
    FileReader reader({file}, {.engine = engine});
    CHECK(reader.file_size(0) == (1 << 20));
    fs::resize_file(file, 100 * 1024);
    std::vector<std::byte> dest(65536);
    reader.submit(0, 512 * 1024, 65536, dest.data());
    CHECK_THROWS_WITH_AS(reader.wait_all(),
                         contains(file.string() + ": read of 65536 bytes at offset 524288 failed: "
                                                  "unexpected end of file after 0 of the 65536 bytes "
                                                  "(the file has 102400 bytes"),
                         Error);
  }
}

TEST_CASE("bad arguments and unopenable files are errors that say what was expected") {
  TempDir tmp;
  write_random_file(tmp.path() / "f", 100, 1);
  CHECK_THROWS_WITH_AS(FileReader({tmp.path() / "missing.bin"}),
                       contains((tmp.path() / "missing.bin").string() + ": cannot open for reading"), Error);
  CHECK_THROWS_WITH_AS(FileReader({tmp.path() / "f"}, {.queue_depth = 0}),
                       contains("queue_depth is 0; expected 1 to 4096"), Error);
  CHECK_THROWS_WITH_AS(FileReader({tmp.path() / "f"}, {.pread_threads = 0}),
                       contains("pread_threads is 0; expected at least 1"), Error);
  FileReader reader({tmp.path() / "f"});
  std::byte b[4];
  CHECK_THROWS_WITH_AS(reader.submit(1, 0, 4, b),
                       contains("submit: file index 1 is out of range (this reader has 1 files)"), Error);
  CHECK_THROWS_WITH_AS(reader.submit(0, 0, 4, nullptr), contains("has a null destination"), Error);
  CHECK_THROWS_WITH_AS(reader.wait_any(), contains("no read is outstanding"), Error);
  FileReader::Completion c;
  CHECK(!reader.poll(&c));
  CHECK_NOTHROW(reader.wait_all());
}

TEST_CASE("destroying a reader with reads queued and in flight waits for those in flight") {
  TempDir tmp;
  const fs::path file = tmp.path() / "f";
  write_random_file(file, 4 << 20, 11);
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kIoUring}) {
    for (DirectIo direct : {DirectIo::kOff, DirectIo::kOn}) {
      std::vector<std::byte> dest(4 << 20);
      {
        FileReader reader({file}, {.queue_depth = 4, .direct = direct, .engine = engine});
        for (int i = 0; i < 64; ++i)
          reader.submit(0, static_cast<uint64_t>(i) * 65536 + 1, 65535, dest.data() + i * 65536);
      }
      CHECK(true);  // no crash, no hang, no use of freed memory (run under ASan to see it)
    }
  }
}
