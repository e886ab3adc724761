// strata convert: the command-line face of strata::convert_checkpoint — option checks, progress on stderr (a
// redrawn bar on a terminal, one line per output shard otherwise), Ctrl-C as a clean stop, and the summary.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "commands.hpp"
#include "strata/convert.hpp"
#include "strata/error.hpp"
#include "strata/quant.hpp"

namespace strata::app {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_interrupt(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C kills at once (the journal keeps what is done)
  std::signal(SIGTERM, SIG_DFL);
}

std::string mb(uint64_t bytes) {
  const double v = static_cast<double>(bytes) / (1 << 20);
  return v >= 10240 ? fmt::format("{:.1f} GiB", v / 1024) : fmt::format("{:.1f} MiB", v);
}

std::string duration(double s) {
  if (s < 0 || s > 1e7) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// Progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(std::string in) : in_(std::move(in)), tty_(::isatty(STDERR_FILENO) == 1) {}

  void operator()(const ConvertProgress& p) {
    using S = ConvertProgress::Stage;
    switch (p.stage) {
      case S::Planned:
        line(fmt::format("[convert] {}: {} tensors, {} → {} output shard(s)", in_, p.tensors_total,
                         mb(p.bytes_total), p.shards_total));
        break;
      case S::Tensor:
        bar(p, false);
        break;
      case S::ShardReused:
        if (!tty_) {
          line(fmt::format("[convert] shard {}/{} {} kept from the interrupted run ({})", p.shards_done,
                           p.shards_total, p.shard, mb(p.shard_bytes)));
        } else {
          bar(p, true);
        }
        break;
      case S::ShardWritten:
        if (!tty_) {
          line(fmt::format("[convert] shard {}/{} {} written ({}); tensors {}/{}, {} of {}, {}, ETA {}",
                           p.shards_done, p.shards_total, p.shard, mb(p.shard_bytes), p.tensors_done,
                           p.tensors_total, mb(p.bytes_done), mb(p.bytes_total), rate(p), eta(p)));
        } else {
          bar(p, true);
        }
        break;
      case S::Publishing:
        if (tty_) bar(p, true);
        line("[convert] writing the index, config.json, copied files and the manifest");
        break;
      case S::Done:
        break;
    }
  }

  void finish() {
    if (tty_ && drawn_) std::fputs("\n", stderr), drawn_ = false;
  }

 private:
  static std::string rate(const ConvertProgress& p) {
    if (p.seconds <= 0) return "- MB/s";
    return fmt::format("{:.0f} MB/s", static_cast<double>(p.bytes_done_this_run) / 1e6 / p.seconds);
  }
  static std::string eta(const ConvertProgress& p) {
    if (p.bytes_done_this_run == 0 || p.seconds <= 0) return "?";
    const double r = static_cast<double>(p.bytes_done_this_run) / p.seconds;
    return duration(static_cast<double>(p.bytes_total - p.bytes_done) / r);
  }

  void line(const std::string& s) {
    if (tty_ && drawn_) std::fputs("\r\x1b[K", stderr), drawn_ = false;
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
  }

  void bar(const ConvertProgress& p, bool force) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 28;
    const double frac =
        p.bytes_total ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
    const int fill = static_cast<int>(frac * kWidth);
    std::string b(static_cast<size_t>(fill), '#');
    b.append(static_cast<size_t>(kWidth - fill), '.');
    std::fprintf(stderr, "\r[%s] %3.0f%%  %lld/%lld tensors  %s/%s  shard %zu/%zu  %s  ETA %s\x1b[K",
                 b.c_str(), frac * 100, static_cast<long long>(p.tensors_done),
                 static_cast<long long>(p.tensors_total), mb(p.bytes_done).c_str(), mb(p.bytes_total).c_str(),
                 p.shards_done, p.shards_total, rate(p).c_str(), eta(p).c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  std::string in_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace

int cmd_convert(const ConvertCliOptions& o) {
  ConvertOptions c;
  c.in = o.in;
  c.out = o.out;
  if (o.format == "q4_g64") {
    c.experts = WeightFormat::Q4_G64;
  } else if (o.format == "q4_row") {
    c.experts = WeightFormat::Q4_ROW;
  } else {
    fail("convert", "--format '{}' is not supported (expected q4_g64 or q4_row)", o.format);
  }
  c.dense = parse_dense_format(o.dense);
  if (o.shard_size_mb < 1 || o.shard_size_mb > (int64_t{1} << 24)) {
    fail("convert", "--shard-size-mb {} is out of range (expected 1 .. 16777216)", o.shard_size_mb);
  }
  c.shard_bytes = static_cast<uint64_t>(o.shard_size_mb) << 20;
  c.force = o.force;
  c.cancel = &g_interrupted;
  ProgressPrinter printer(o.in);
  c.progress = [&](const ConvertProgress& p) { printer(p); };

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  ConvertResult r;
  try {
    r = convert_checkpoint(c);
  } catch (...) {
    printer.finish();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    throw;
  }
  printer.finish();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  fmt::print("converted {} ({}) → {}\n", o.in, r.model_type, r.out.string());
  fmt::print("  experts {} ({} routed experts), dense {}\n", o.format, r.experts, o.dense);
  fmt::print("  {} tensors in {} input shard(s) → {} tensors in {} output shard(s), {} → {}\n", r.tensors_in,
             r.input_shards, r.tensors_out, r.output_shards, mb(r.bytes_in), mb(r.bytes_out));
  if (r.output_shards_reused > 0) {
    fmt::print("  resumed: {} output shard(s) kept from the interrupted run, {} input shard(s) skipped\n",
               r.output_shards_reused, r.input_shards_skipped);
  }
  if (r.replaced_existing) fmt::print("  replaced the previous container (--force)\n");
  fmt::print("  copied: {}\n", r.copied_files.empty() ? std::string("(nothing)")
                                                      : fmt::format("{}", fmt::join(r.copied_files, " ")));
  fmt::print("  {:.1f} s, peak RSS {}\n", r.seconds, mb(static_cast<uint64_t>(r.peak_rss_bytes)));
  return 0;
}

}  // namespace strata::app
