// ExpertStore: the tier plan (VRAM / RAM / LRU cache / disk), pinned copies and VRAM uploads, the per-layer
// flow graph (GPU groups issued asynchronously, CPU rows, disk reads feeding CPU rows as they land), routing
// statistics and re-placement between turns.
#include "strata/expert_store.hpp"

#include <fmt/format.h>
#include <tbb/flow_graph.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <thread>
#include <unordered_map>

#include <unistd.h>

#include "strata/error.hpp"
#include "strata/model.hpp"
#include "strata/runtime_config.hpp"
#include "strata/safetensors.hpp"

namespace strata {
namespace fs = std::filesystem;

namespace {
constexpr std::string_view kComp = "store";
constexpr uint64_t kPage = 4096;
constexpr uint64_t kNoPiece = ~uint64_t{0};
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// The store's own thread for issuing GPU groups while the layer's thread starts its CPU rows: an issue costs
// 0.1-0.2 ms of host time (planning, staging, launches), and a CPU job handed to sleeping TBB workers instead
// starts only when one wakes up (tens of µs on a VM), so with the issue on this thread the layer's thread can
// go straight into the CPU rows. One job at a time.
class IssueThread {
 public:
  IssueThread() : thread_([this] { loop(); }) {}
  ~IssueThread() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  IssueThread(const IssueThread&) = delete;
  IssueThread& operator=(const IssueThread&) = delete;

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = std::move(fn);
      busy_ = true;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  // Waits for the posted job; rethrows what it threw. Nothing posted: returns at once. Polls for up to 20 µs
  // first: the job (an issue) has usually ended while the caller computed its CPU rows, and a futex sleep and
  // wake-up on a busy host costs tens of µs.
  void wait() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (busy_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || job_; });
      if (stop_) return;
      std::function<void()> fn = std::move(job_);
      job_ = nullptr;
      l.unlock();
      std::exception_ptr e;
      try {
        fn();
      } catch (...) {
        e = std::current_exception();
      }
      l.lock();
      error_ = e;
      busy_ = false;
      done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void()> job_;
  std::atomic<bool> busy_{false};  // written under mu_; read without it by wait's poll
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

// Sizes in the unit that reads best.
std::string human(double b) {
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  if (b >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}
std::string human(uint64_t b) {
  return human(static_cast<double>(b));
}

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, AlignedFree>;
Buffer alloc_pages(uint64_t bytes) {
  void* p = std::aligned_alloc(kPage, round_up(std::max<uint64_t>(bytes, 1), kPage));
  if (p == nullptr) fail(kComp, "out of memory allocating {} for expert weights", human(bytes));
  return Buffer(static_cast<std::byte*>(p));
}

}  // namespace

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kVram:
      return "vram";
    case Tier::kRam:
      return "ram";
    case Tier::kCache:
      return "cache";
    case Tier::kDisk:
      return "disk";
  }
  return "?";
}

namespace {
// Every counter of a and b combined by op (sum or difference).
template <class Op>
StoreTelemetry combine(const StoreTelemetry& a, const StoreTelemetry& b, Op op) {
  StoreTelemetry d;
  d.layers = op(a.layers, b.layers);
  d.vram_hits = op(a.vram_hits, b.vram_hits);
  d.ram_hits = op(a.ram_hits, b.ram_hits);
  d.cache_hits = op(a.cache_hits, b.cache_hits);
  d.disk_reads = op(a.disk_reads, b.disk_reads);
  d.disk_bytes = op(a.disk_bytes, b.disk_bytes);
  d.gpu_fallbacks = op(a.gpu_fallbacks, b.gpu_fallbacks);
  d.prefetch_reads = op(a.prefetch_reads, b.prefetch_reads);
  d.prefetch_hits = op(a.prefetch_hits, b.prefetch_hits);
  d.gpu_issue_s = op(a.gpu_issue_s, b.gpu_issue_s);
  d.cpu_rows_s = op(a.cpu_rows_s, b.cpu_rows_s);
  d.disk_wait_s = op(a.disk_wait_s, b.disk_wait_s);
  d.take_s = op(a.take_s, b.take_s);
  d.layer_s = op(a.layer_s, b.layer_s);
  d.cpu_start_s = op(a.cpu_start_s, b.cpu_start_s);
  d.cpu_end_s = op(a.cpu_end_s, b.cpu_end_s);
  d.gpu_done_s = op(a.gpu_done_s, b.gpu_done_s);
  d.gpu_issued_s = op(a.gpu_issued_s, b.gpu_issued_s);
  return d;
}
}  // namespace

StoreTelemetry StoreTelemetry::operator-(const StoreTelemetry& o) const {
  return combine(*this, o, [](auto x, auto y) { return x - y; });
}

StoreTelemetry StoreTelemetry::operator+(const StoreTelemetry& o) const {
  return combine(*this, o, [](auto x, auto y) { return x + y; });
}

StoreOptions StoreOptions::from(const RuntimeConfig& c) {
  StoreOptions o;
  o.ram_gb = c.memory.ram_gb;
  o.vram_gb = c.memory.vram_gb;
  o.reserve_gb = c.memory.reserve_gb;
  o.pin = c.memory.pin;
  o.overlap = c.scheduler.overlap;
  o.prefetch = c.scheduler.prefetch;
  o.reader.queue_depth = c.disk.queue_depth;
  o.reader.direct = c.disk.direct_io == "true"    ? DirectIo::kOn
                    : c.disk.direct_io == "false" ? DirectIo::kOff
                                                  : DirectIo::kAuto;
  o.reader.engine = c.disk.engine == "io_uring" ? IoEngine::kIoUring
                    : c.disk.engine == "pread"  ? IoEngine::kPread
                                                : IoEngine::kAuto;
  return o;
}

// ---- per-expert bookkeeping ---------------------------------------------------------------------------

// A contiguous byte range of the checkpoint holding one or more of an expert's pieces (data or scales of
// gate, up, down). It is read page-aligned into a buffer at `dst` so every piece keeps the alignment it has
// in the mapping.
struct Run {
  int file = 0;
  uint64_t offset = 0, length = 0;            // the pieces' bytes in the file
  uint64_t read_offset = 0, read_length = 0;  // page-aligned superset actually read (clamped to the file)
  uint64_t dst = 0;                           // where read_offset lands in the buffer
};

struct ExpertStore::Entry {
  ExpertMatrices host;  // as bound at load (mapping or memory made at load)
  ExpertMatrices vram;  // host with resident copies attached (kVram)
  std::vector<ResidentMatrix> resident;
  Buffer pinned;  // kRam by copy
  ExpertMatrices pinned_view;
  std::vector<Run> runs;      // empty: not streamable (memory made at load)
  uint64_t buffer_bytes = 0;  // a buffer holding every run
  // Where each piece (data, scales of gate, up, down) lands in such a buffer; kNoPiece for absent scales.
  std::array<uint64_t, 6> piece_pos{};
  Tier tier = Tier::kRam;
  int32_t slot = -1;  // kCache: its slot
};

struct ExpertStore::Slot {
  Buffer mem;
  int64_t key = -1;  // layer * experts + expert, -1 = free
  ExpertMatrices view;
  uint64_t last_use = 0;
  int pins = 0;  // in use by the layer being run
};

struct ExpertStore::Impl {
  const Model& model;
  const SafetensorsSet& tensors;
  StoreOptions options;
  int64_t layers = 0, experts = 0, hidden = 0;
  std::vector<Entry> entries;  // [layer * experts + expert]; layers without experts stay empty
  // Shared experts copied to the GPU tier (per layer; empty = on the dense backend): with a GPU tier they
  // join the GPU group instead of competing with the CPU rows for the cores.
  std::vector<ExpertMatrices> shared_vram;
  std::vector<std::vector<ResidentMatrix>> shared_res;
  std::vector<Slot> slots;
  std::unique_ptr<FileReader> reader;
  std::vector<const SafetensorsFile*> files;
  const Backend* cpu = nullptr;
  const Backend* gpu = nullptr;
  uint64_t clock = 0, turn = 1;
  std::mutex mu;
  StoreTelemetry tel;
  bool save_warned = false;
  bool gpu_warned = false;
  std::unique_ptr<IssueThread> issuer;  // made at the first overlapped layer with both GPU and CPU work
  // Router look-ahead prefetch: reads of the next layer's likely experts, in flight between run_layer calls.
  struct Prefetch {
    int64_t key = 0;
    int32_t slot = -1;
    int runs_left = 0;
    bool failed = false;
  };
  std::vector<Prefetch> pf;
  std::unordered_map<uint64_t, size_t> pf_ticket;  // ticket → index in pf
  std::vector<char> pf_landed;                     // [key]: prefetched, landed, not yet routed to

  // A prefetch read finished: when its expert is complete it becomes a cache entry (unpinned, so it may be
  // evicted like any other). A failed prefetch is dropped: the expert stays on disk and a real miss reads it
  // (and reports the error) if it is routed to.
  void pf_land(const FileReader::Completion& c) {
    Prefetch& p = pf[pf_ticket.at(c.ticket)];
    if (!c.ok()) p.failed = true;
    if (--p.runs_left > 0) return;
    Slot& sl = slots[static_cast<size_t>(p.slot)];
    sl.pins = 0;
    if (p.failed) return;
    Entry& en = entries[static_cast<size_t>(p.key)];
    sl.view = view_in(en, sl.mem.get());
    sl.key = p.key;
    en.tier = Tier::kCache;
    en.slot = p.slot;
    tel.disk_bytes += en.buffer_bytes;
    pf_landed[static_cast<size_t>(p.key)] = 1;
  }
  // Waits for every prefetch read (the previous layer's) to land.
  void pf_drain() {
    while (!pf_ticket.empty() && reader->outstanding() > 0) pf_land(reader->wait_any());
    pf.clear();
    pf_ticket.clear();
  }
  void pf_forget() {  // after a failure: the reads were drained; nothing landed is trusted
    for (const Prefetch& p : pf) {
      if (p.runs_left > 0) slots[static_cast<size_t>(p.slot)].key = -1;
    }
    pf.clear();
    pf_ticket.clear();
  }

  Impl(const Model& m, const SafetensorsSet& t, const StoreOptions& o) : model(m), tensors(t), options(o) {}

  Entry& entry(int64_t l, int64_t e) { return entries[static_cast<size_t>(l * experts + e)]; }

  // Which file holds [p, p + n), and where; -1 when p is not in a mapping (memory made at load).
  int locate(const void* p, size_t n, uint64_t* off) const {
    for (size_t i = 0; i < files.size(); ++i) {
      if (files[i]->contains(p, n)) {
        *off = files[i]->file_offset(p);
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  // The runs of an expert: its six pieces sorted by file offset and merged when at most a page apart (a
  // converted container stores them back to back: one run). Empty when any piece is not in a mapping.
  void plan_runs(Entry& en) {
    struct Piece {
      int file = -1;
      uint64_t off = 0, len = 0;
    };
    std::array<Piece, 6> pieces;  // data, scales of gate, up, down (file -1: absent)
    std::vector<Piece> present;
    int k = 0;
    for (const Matrix* m : {&en.host.gate, &en.host.up, &en.host.down}) {
      const size_t sb = scale_bytes(*m);
      for (auto [p, n] : {std::pair<const void*, size_t>{m->data, m->bytes() - sb},
                          std::pair<const void*, size_t>{m->scales, sb}}) {
        Piece& pc = pieces[static_cast<size_t>(k++)];
        if (p == nullptr || n == 0) continue;
        pc.len = n;
        pc.file = locate(p, n, &pc.off);
        if (pc.file < 0) return;  // not streamable
        present.push_back(pc);
      }
    }
    std::sort(present.begin(), present.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.file, a.off) < std::tie(b.file, b.off);
    });
    std::vector<Run> runs;
    for (const auto& pc : present) {
      if (!runs.empty() && runs.back().file == pc.file &&
          pc.off <= runs.back().offset + runs.back().length + kPage) {
        Run& r = runs.back();
        r.length = std::max(r.offset + r.length, pc.off + pc.len) - r.offset;
      } else {
        runs.push_back(Run{pc.file, pc.off, pc.len, 0, 0, 0});
      }
    }
    uint64_t cursor = 0;
    for (Run& r : runs) {
      r.read_offset = r.offset / kPage * kPage;
      const uint64_t end = std::min(round_up(r.offset + r.length, kPage), reader->file_size(r.file));
      r.read_length = end - r.read_offset;
      r.dst = cursor;
      cursor += round_up(r.read_length, kPage);
    }
    // Each piece's place in a buffer, computed once (view_in runs for every expert read).
    for (size_t i = 0; i < pieces.size(); ++i) {
      en.piece_pos[i] = kNoPiece;
      if (pieces[i].file < 0) continue;
      for (const Run& r : runs) {
        if (r.file == pieces[i].file && pieces[i].off >= r.offset &&
            pieces[i].off + pieces[i].len <= r.offset + r.length) {
          en.piece_pos[i] = r.dst + (pieces[i].off - r.read_offset);
        }
      }
    }
    en.runs = std::move(runs);
    en.buffer_bytes = cursor;
  }

  static size_t scale_bytes(const Matrix& m) {
    if (m.scales == nullptr) return 0;
    return static_cast<size_t>(m.rows * q4_scales_per_row(m.format, m.cols)) * sizeof(float);
  }

  // The expert's matrices rebased into a buffer laid out by its runs.
  static ExpertMatrices view_in(const Entry& en, const std::byte* buf) {
    ExpertMatrices v = en.host;
    size_t k = 0;
    for (Matrix* m : {&v.gate, &v.up, &v.down}) {
      m->data = buf + en.piece_pos[k++];
      const uint64_t sp = en.piece_pos[k++];
      m->scales = sp == kNoPiece ? nullptr : reinterpret_cast<const float*>(buf + sp);
      m->resident = nullptr;
    }
    return v;
  }

  // Device copies of `from`'s three matrices; `host` is what a CPU recompute and the returned view point at.
  ExpertMatrices upload_copy(const ExpertMatrices& from, const ExpertMatrices& host,
                             std::vector<ResidentMatrix>& res) {
    ExpertMatrices v = host;
    const Matrix* src[3] = {&from.gate, &from.up, &from.down};
    Matrix* dst[3] = {&v.gate, &v.up, &v.down};
    res.clear();
    try {
      for (int i = 0; i < 3; ++i) {
        res.push_back(gpu->upload(*src[i]));
        dst[i]->resident = res.back().matrix().resident;
      }
    } catch (...) {
      res.clear();
      throw;
    }
    return v;
  }

  // Uploads an expert to the GPU backend. A streamable expert is read through the reader into a temporary
  // buffer first, so the mapping's pages are never touched (they would count as resident memory).
  void upload(Entry& en) {
    Buffer tmp;
    ExpertMatrices staged = en.host;
    if (!en.runs.empty()) {
      tmp = alloc_pages(en.buffer_bytes);
      read_now(en, tmp.get());
      staged = view_in(en, tmp.get());
    }
    en.vram = upload_copy(staged, en.host, en.resident);
  }

  // Reads every run of an expert into buf (blocking; for load-time pinning and re-placement).
  void read_now(const Entry& en, std::byte* buf) {
    pf_drain();  // wait_all below would swallow their completions
    for (const Run& r : en.runs) reader->submit(r.file, r.read_offset, r.read_length, buf + r.dst);
    reader->wait_all();
    tel.disk_bytes += en.buffer_bytes;
  }
};

// ---- planning -----------------------------------------------------------------------------------------

ExpertStore::ExpertStore(const Model& model, const SafetensorsSet& tensors, const StoreOptions& options)
    : impl_(std::make_unique<Impl>(model, tensors, options)) {
  Impl& s = *impl_;
  const ModelSpec& spec = model.spec();
  s.layers = spec.n_layers;
  s.experts = spec.n_experts;
  s.hidden = spec.hidden;
  for (const auto& f : tensors.files()) s.files.push_back(f.get());
  std::vector<fs::path> paths;
  for (const auto* f : s.files) paths.push_back(f->path());
  s.reader = std::make_unique<FileReader>(paths, options.reader);

  // Backends: routed rows on the CPU go to the first chosen expert backend without device memory (else the
  // dense backend); a chosen expert backend with device memory and async groups is the GPU tier.
  const Backends& b = model.backends();
  WeightFormat fmt0 = WeightFormat::F32;
  for (const auto& L : model.layers()) {
    if (L.moe && !L.experts.experts.empty()) {
      fmt0 = L.experts.experts[0].gate.format;
      break;
    }
  }
  for (const auto& e : b.experts) {
    if (!e->has_device_memory() && e->supports_expert_group(fmt0)) {
      s.cpu = e.get();
      break;
    }
  }
  if (s.cpu == nullptr) s.cpu = b.dense.get();
  if (s.cpu->has_device_memory()) {
    plan_.warnings.push_back(
        fmt::format("no CPU backend among the chosen ones: experts outside VRAM run on {} "
                    "from host memory, and a failed GPU group is retried there",
                    s.cpu->name()));
  }
  for (const auto& e : b.experts) {
    if (e->has_device_memory() && e->has_async() && e.get() != s.cpu) {
      s.gpu = e.get();
      break;
    }
  }

  // Entries and their runs.
  s.entries.resize(static_cast<size_t>(s.layers * s.experts));
  std::vector<std::pair<int64_t, int64_t>> all;  // (layer, expert) of MoE layers
  uint64_t routed_bytes = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerWeights& L = model.layers()[static_cast<size_t>(l)];
    if (!L.moe) continue;
    for (int64_t e = 0; e < s.experts; ++e) {
      Entry& en = s.entry(l, e);
      en.host = L.experts.experts[static_cast<size_t>(e)];
      s.plan_runs(en);
      const uint64_t eb = en.host.gate.bytes() + en.host.up.bytes() + en.host.down.bytes();
      plan_.expert_bytes = std::max(plan_.expert_bytes, eb);
      plan_.slot_bytes = std::max(plan_.slot_bytes, en.buffer_bytes);
      routed_bytes += eb;
      all.emplace_back(l, e);
    }
  }
  plan_.experts = static_cast<int64_t>(all.size());
  const auto pc = model.param_counts();
  plan_.dense_bytes = pc.dense_bytes;
  plan_.mem_available = mem_available();

  // Routing statistics.
  const std::string fp = model_fingerprint(model.dir(), tensors);
  stats_ = RoutingStats(std::max<int64_t>(s.layers, 1), std::max<int64_t>(s.experts, 1), fp);
  bool have_stats = false;
  if (options.pin != "none") {
    fs::path path = options.pin;
    if (options.pin == "auto") {
      // Beside the model; where that folder is read-only (an installed model), in the user's cache.
      path = model.dir() / "strata-routing.stats";
      if (::access(model.dir().c_str(), W_OK) != 0) {
        const char* xdg = std::getenv("XDG_CACHE_HOME");
        const char* home = std::getenv("HOME");
        const fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
        std::error_code ec;
        fs::create_directories(cache / "strata", ec);
        path = cache / "strata" / (fp + ".routing.stats");
      }
    }
    plan_.stats_path = path.string();
    if (fs::exists(path)) {
      try {
        stats_ = load_routing_stats(path, fp, stats_.layers, stats_.experts);
        have_stats = true;
        s.turn = stats_.turns + 1;
      } catch (const Error& e) {
        // A file named in the config must be right; the automatic one beside the model is just replaced
        // (the model's config or weights changed since it was written).
        if (options.pin != "auto") throw;
        plan_.warnings.push_back(
            fmt::format("{}; starting new statistics (the file is replaced at the end of "
                        "this turn)",
                        e.what()));
      }
    }
  }
  // Ranked order: the statistics, else a spread (expert 0 of every layer, then expert 1, ...).
  std::vector<std::pair<int64_t, int64_t>> order;
  if (have_stats) {
    for (auto [l, e] : stats_.ranked()) {
      if (model.layers()[static_cast<size_t>(l)].moe) order.emplace_back(l, e);
    }
  } else {
    order = all;
    std::stable_sort(order.begin(), order.end(), [](auto a, auto b) { return a.second < b.second; });
  }

  // RAM budget.
  const uint64_t avail = plan_.mem_available;
  const auto reserve = static_cast<uint64_t>(options.reserve_gb * kGiB);
  if (avail > 0 && plan_.dense_bytes > avail) {
    fail(kComp,
         "the model's dense part (attention, embeddings, shared experts) needs {} but only {} of memory is "
         "available; it must stay in RAM — free memory or use a smaller model",
         human(plan_.dense_bytes), human(avail));
  }
  const uint64_t room = avail > plan_.dense_bytes ? avail - plan_.dense_bytes : 0;
  if (options.ram_gb) {
    plan_.ram_budget = static_cast<uint64_t>(*options.ram_gb * kGiB);
    if (avail > 0 && plan_.ram_budget > room) {
      plan_.warnings.push_back(
          fmt::format("memory.ram_gb {} is more than this machine has for experts ({} available − {} dense); "
                      "clamped to {}",
                      *options.ram_gb, human(avail), human(plan_.dense_bytes), human(room)));
      plan_.ram_budget = room;
    }
  } else {
    plan_.ram_budget = avail == 0 ? routed_bytes : (room > reserve ? room - reserve : 0);
  }

  // VRAM tier: hottest first, while the budget lasts.
  if (s.gpu != nullptr && !all.empty()) {
    const MemoryInfo mi = s.gpu->memory_info();
    uint64_t budget = mi.free > reserve ? mi.free - reserve : 0;
    if (options.vram_gb) {
      const auto want = static_cast<uint64_t>(*options.vram_gb * kGiB);
      if (want > budget) {
        plan_.warnings.push_back(
            fmt::format("memory.vram_gb {} is more than {} can hold ({} free − {} reserve); "
                        "clamped to {}",
                        *options.vram_gb, s.gpu->name(), human(mi.free), human(reserve), human(budget)));
      } else {
        budget = want;
      }
    }
    plan_.vram_budget = budget;
    plan_.gpu = std::string(s.gpu->name());
    uint64_t used = 0;
    // Shared experts first: every token uses them.
    s.shared_vram.resize(static_cast<size_t>(s.layers));
    s.shared_res.resize(static_cast<size_t>(s.layers));
    for (int64_t l = 0; l < s.layers; ++l) {
      const LayerWeights& L = model.layers()[static_cast<size_t>(l)];
      if (!L.moe || !L.experts.has_shared) continue;
      const ExpertMatrices& sh = L.experts.shared;
      const uint64_t sb = sh.gate.bytes() + sh.up.bytes() + sh.down.bytes();
      if (used + sb > budget || !s.gpu->supports_expert_group(sh.gate.format)) continue;
      try {
        s.shared_vram[static_cast<size_t>(l)] = s.upload_copy(sh, sh, s.shared_res[static_cast<size_t>(l)]);
        used += sb;
        ++plan_.shared_vram;
      } catch (const Error& err) {
        plan_.warnings.push_back(
            fmt::format("shared expert of layer {} stays on the CPU: {}", l, err.what()));
      }
    }
    for (auto [l, e] : order) {
      Entry& en = s.entry(l, e);
      const uint64_t eb = en.host.gate.bytes() + en.host.up.bytes() + en.host.down.bytes();
      if (used + eb > budget) break;
      if (!s.gpu->supports_expert_group(en.host.gate.format)) break;
      try {
        s.upload(en);
      } catch (const Error& err) {
        plan_.warnings.push_back(
            fmt::format("VRAM upload stopped after {} experts: {}", plan_.vram, err.what()));
        break;
      }
      en.tier = Tier::kVram;
      used += eb;
      ++plan_.vram;
    }
  }

  // RAM tiers for the rest: all mapped when they fit; else pinned copies (hottest, half the budget when
  // there are statistics) and an LRU cache of slots, the rest streamed from disk.
  uint64_t rest_bytes = 0;
  bool all_streamable = true;
  for (auto [l, e] : all) {
    Entry& en = s.entry(l, e);
    if (en.tier == Tier::kVram) continue;
    rest_bytes += en.host.gate.bytes() + en.host.up.bytes() + en.host.down.bytes();
    if (en.runs.empty()) all_streamable = false;
  }
  if (rest_bytes <= plan_.ram_budget || !all_streamable) {
    if (rest_bytes > plan_.ram_budget) {
      plan_.warnings.push_back(
          "the routed experts were transformed at load (e.g. --quant), so they live in RAM and cannot be "
          "streamed "
          "from disk; convert the checkpoint (strata convert) to stream them");
    }
    plan_.mapped = true;
    for (auto [l, e] : all) {
      Entry& en = s.entry(l, e);
      if (en.tier != Tier::kVram) {
        en.tier = Tier::kRam;
        ++plan_.ram;
      }
    }
  } else {
    const uint64_t slot = std::max<uint64_t>(plan_.slot_bytes, kPage);
    for (auto [l, e] : all) {
      Entry& en = s.entry(l, e);
      if (en.tier != Tier::kVram) en.tier = Tier::kDisk;
    }
    uint64_t pin_budget = have_stats ? plan_.ram_budget / 2 : 0;
    for (auto [l, e] : order) {
      Entry& en = s.entry(l, e);
      if (en.tier == Tier::kVram) continue;
      if (slot > pin_budget) break;
      en.pinned = alloc_pages(slot);  // every pinned buffer can hold any expert (re-placement reuses them)
      s.read_now(en, en.pinned.get());
      en.pinned_view = s.view_in(en, en.pinned.get());
      en.tier = Tier::kRam;
      pin_budget -= slot;
      ++plan_.ram;
    }
    uint64_t pinned_bytes = 0;
    for (auto [l, e] : all) pinned_bytes += s.entry(l, e).pinned ? slot : 0;
    const uint64_t cache_bytes = plan_.ram_budget > pinned_bytes ? plan_.ram_budget - pinned_bytes : 0;
    // At least a few slots so reads and CPU rows overlap even in pure streaming (budget < one expert).
    const int64_t n_slots = std::max<int64_t>(static_cast<int64_t>(cache_bytes / slot), 4);
    s.slots.resize(static_cast<size_t>(n_slots));
    for (auto& sl : s.slots) sl.mem = alloc_pages(slot);
    plan_.cache_slots = n_slots;
    for (auto [l, e] : all) plan_.streamed += s.entry(l, e).tier == Tier::kDisk ? 1 : 0;
  }
}

ExpertStore::~ExpertStore() = default;

Tier ExpertStore::tier_of(int64_t layer, int64_t expert) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->entries[static_cast<size_t>(layer * impl_->experts + expert)].tier;
}

StoreTelemetry ExpertStore::telemetry() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tel;
}

void ExpertStore::set_overlap(bool overlap) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->options.overlap = overlap;
}

std::string ExpertStore::plan_text() const {
  const StorePlan& p = plan_;
  std::string t;
  const uint64_t eb = p.expert_bytes;
  t += fmt::format("expert plan: {} routed experts of {} each ({} in all); dense part {}\n", p.experts,
                   human(eb), human(eb * static_cast<uint64_t>(p.experts)), human(p.dense_bytes));
  if (!p.gpu.empty()) {
    t +=
        fmt::format("  vram ({}): {} experts, {} (budget {}){}\n", p.gpu, p.vram, human(eb * p.vram),
                    human(p.vram_budget),
                    p.shared_vram > 0 ? fmt::format("; the shared experts of {} layers", p.shared_vram) : "");
  }
  if (p.mapped) {
    t += fmt::format("  ram: {} experts used from the mapped checkpoint, {} (budget {})\n", p.ram,
                     human(eb * p.ram), human(p.ram_budget));
  } else {
    t += fmt::format(
        "  ram: {} pinned experts; cache: {} slots of {} ({}); disk: {} experts streamed "
        "(reads: {}, queue depth {})\n",
        p.ram, p.cache_slots, human(p.slot_bytes), human(p.slot_bytes * p.cache_slots), p.streamed,
        impl_->reader->engine_name(), impl_->options.reader.queue_depth);
  }
  // The expected bottleneck, with routing spread evenly over the experts: bytes per token from each tier.
  const double n = static_cast<double>(std::max<int64_t>(p.experts, 1));
  const double k = static_cast<double>(impl_->model.spec().top_k);
  const double moe_layers = n / static_cast<double>(std::max<int64_t>(impl_->experts, 1));
  const double per_tok = k * moe_layers * static_cast<double>(eb);
  const double cached = p.mapped ? 0.0 : static_cast<double>(p.cache_slots);
  const double disk_share = p.mapped ? 0.0 : std::max(0.0, static_cast<double>(p.streamed) - cached) / n;
  const double vram_share = static_cast<double>(p.vram) / n;
  std::string neck = "RAM bandwidth (CPU expert rows)";
  if (disk_share > 0.0) {
    neck = fmt::format("disk: about {} per token from disk at even routing", human(per_tok * disk_share));
  } else if (vram_share >= 0.999) {
    neck = "GPU (every expert in VRAM)";
  }
  t += fmt::format("  per token: {} of expert weights ({:.0f}% from VRAM); expected bottleneck: {}",
                   human(per_tok), 100.0 * vram_share, neck);
  if (!p.stats_path.empty()) t += fmt::format("\n  routing statistics: {}", p.stats_path);
  for (const auto& w : p.warnings) t += "\n  warning: " + w;
  return t;
}

// ---- the per-layer run --------------------------------------------------------------------------------

// Router look-ahead: the next MoE layer's router applied to this layer's input predicts its experts (votes
// over the rows); the most voted ones that are on disk are read into free cache slots now, so their reads
// overlap this layer's CPU rows and the next layer's attention. Only cache state changes, never a result.
void ExpertStore::issue_prefetch(int64_t layer, const float* x, int64_t T) {
  Impl& s = *impl_;
  int64_t next = layer + 1;
  while (next < s.layers && !s.model.layers()[static_cast<size_t>(next)].moe) ++next;
  if (next >= s.layers || s.slots.empty()) return;
  const MoeWeights& m = s.model.layers()[static_cast<size_t>(next)].experts;
  const int64_t E = s.experts, H = s.hidden, K = s.model.spec().top_k;
  const bool sigmoid = !m.router_bias.empty();
  uint64_t moe_layers = 0;
  for (const auto& L : s.model.layers()) moe_layers += L.moe ? 1 : 0;
  std::vector<int64_t> votes(static_cast<size_t>(E), 0);
  std::vector<float> score(static_cast<size_t>(E));
  std::vector<int64_t> idx(static_cast<size_t>(E));
  // Vote with at most 8 rows (evenly spaced) so prefill does not pay E × H per row.
  const int64_t step = std::max<int64_t>(1, (T + 7) / 8);
  for (int64_t t = 0; t < T; t += step) {
    const float* xr = x + t * H;
    for (int64_t e = 0; e < E; ++e) {
      const float* w = m.router.data() + e * H;
      float acc = 0;
      for (int64_t i = 0; i < H; ++i) acc += w[i] * xr[i];
      score[static_cast<size_t>(e)] =
          sigmoid ? 1.0f / (1.0f + std::exp(-acc)) + m.router_bias[static_cast<size_t>(e)] : acc;
    }
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t a, int64_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)] ||
             (score[static_cast<size_t>(a)] == score[static_cast<size_t>(b)] && a < b);
    });
    for (int64_t k = 0; k < K; ++k) ++votes[static_cast<size_t>(idx[static_cast<size_t>(k)])];
  }
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return votes[a] > votes[b]; });
  // At most half the cache, and only slots nobody uses.
  const auto limit = static_cast<int64_t>(s.slots.size() / 2);
  if (s.pf_landed.empty()) s.pf_landed.assign(static_cast<size_t>(s.layers * s.experts), 0);
  int64_t issued = 0;
  for (int64_t e : idx) {
    if (issued >= limit || votes[static_cast<size_t>(e)] == 0) break;
    const int64_t key = next * E + e;
    Entry& en = s.entries[static_cast<size_t>(key)];
    if (en.tier != Tier::kDisk || en.runs.empty()) continue;
    // A guess may only displace an expert that no layer of the last token used (else prefetch trades a sure
    // hit for a maybe).
    int32_t best = -1;
    for (size_t i = 0; i < s.slots.size(); ++i) {
      const Slot& sl = s.slots[i];
      if (sl.pins > 0 || (sl.key >= 0 && s.clock - sl.last_use < moe_layers)) continue;
      if (best < 0 || sl.last_use < s.slots[static_cast<size_t>(best)].last_use)
        best = static_cast<int32_t>(i);
    }
    if (best < 0) break;
    Slot& slot = s.slots[static_cast<size_t>(best)];
    slot.pins = 1;
    if (slot.key >= 0) {
      Entry& old = s.entries[static_cast<size_t>(slot.key)];
      old.tier = Tier::kDisk;
      old.slot = -1;
      s.pf_landed[static_cast<size_t>(slot.key)] = 0;
      slot.key = -1;
    }
    slot.last_use = s.clock;
    s.pf.push_back({key, best, static_cast<int>(en.runs.size()), false});
    for (const Run& r : en.runs) {
      const uint64_t t = s.reader->submit(r.file, r.read_offset, r.read_length, slot.mem.get() + r.dst);
      s.pf_ticket[t] = s.pf.size() - 1;
    }
    ++s.tel.prefetch_reads;
    ++issued;
  }
}

bool ExpertStore::shared_on_gpu(int64_t layer) const {
  const Impl& s = *impl_;
  return layer >= 0 && static_cast<size_t>(layer) < s.shared_vram.size() &&
         s.shared_vram[static_cast<size_t>(layer)].gate.resident != nullptr;
}

bool ExpertStore::register_output(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->gpu != nullptr && impl_->gpu->register_host(p, bytes);
}

void ExpertStore::unregister_output(void* p) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->gpu != nullptr) impl_->gpu->unregister_host(p);
}

void ExpertStore::run_layer(int64_t layer, const float* x, int64_t T, std::span<const Work> work,
                            const std::function<void()>& alongside, float* shared_out) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  const auto t_layer = std::chrono::steady_clock::now();
  const int64_t H = s.hidden;
  ++s.tel.layers;
  ++s.clock;
  if (!s.pf.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      s.pf_drain();
    } catch (...) {
      s.pf_forget();
      throw;
    }
    s.tel.disk_wait_s += seconds_since(t0);
  }

  struct Job {
    std::vector<ExpertTask> tasks;
    std::vector<int32_t> slots;  // slots to unpin when done
  };
  std::vector<ExpertTask> gpu_tasks, ram_tasks;
  std::vector<const ExpertMatrices*> gpu_host;  // the host views of gpu_tasks' experts (CPU recompute)
  std::vector<int32_t> hit_slots;
  std::vector<const Work*> misses;
  std::vector<int32_t> all_rows;
  const bool shared_gpu = shared_out != nullptr && shared_on_gpu(layer);
  if (shared_out != nullptr && !shared_gpu)
    fail(kComp, "run_layer: layer {} has no shared expert on the GPU", layer);
  if (shared_gpu) {
    all_rows.resize(static_cast<size_t>(T));
    std::iota(all_rows.begin(), all_rows.end(), 0);
    gpu_tasks.push_back({&s.shared_vram[static_cast<size_t>(layer)], all_rows, shared_out});
    gpu_host.push_back(&s.model.layers()[static_cast<size_t>(layer)].experts.shared);
  }
  if (layer < 0 || layer >= s.layers || !s.model.layers()[static_cast<size_t>(layer)].moe) {
    fail(kComp, "run_layer: layer {} has no routed experts", layer);
  }
  std::vector<bool> seen(static_cast<size_t>(s.experts), false);
  for (const Work& w : work) {
    if (w.expert < 0 || w.expert >= s.experts || seen[static_cast<size_t>(w.expert)]) {
      fail(kComp, "run_layer: expert {} of layer {} is out of range or listed twice", w.expert, layer);
    }
    seen[static_cast<size_t>(w.expert)] = true;
    if (!w.rows.empty() && s.entry(layer, w.expert).tier == Tier::kDisk &&
        s.entry(layer, w.expert).runs.empty()) {
      fail(kComp, "internal: expert {} of layer {} is on disk but has no file ranges", w.expert, layer);
    }
  }
  for (const Work& w : work) {
    if (w.rows.empty()) continue;
    Entry& en = s.entry(layer, w.expert);
    stats_.record(layer, w.expert, w.rows.size(), s.turn);
    if (!s.pf_landed.empty()) {
      char& mark = s.pf_landed[static_cast<size_t>(layer * s.experts + w.expert)];
      if (mark) ++s.tel.prefetch_hits;
      mark = 0;
    }
    switch (en.tier) {
      case Tier::kVram:
        gpu_tasks.push_back({&en.vram, w.rows, w.out});
        gpu_host.push_back(&en.host);
        ++s.tel.vram_hits;
        break;
      case Tier::kRam:
        ram_tasks.push_back({en.pinned ? &en.pinned_view : &en.host, w.rows, w.out});
        ++s.tel.ram_hits;
        break;
      case Tier::kCache: {
        Slot& sl = s.slots[static_cast<size_t>(en.slot)];
        ++sl.pins;
        sl.last_use = s.clock;
        hit_slots.push_back(en.slot);
        ram_tasks.push_back({&sl.view, w.rows, w.out});
        ++s.tel.cache_hits;
        break;
      }
      case Tier::kDisk:
        misses.push_back(&w);
        break;
    }
  }

  // CPU rows: a flow-graph node that runs any number of groups at once; each job unpins its slots when done.
  std::exception_ptr cpu_error;
  std::mutex err_mu, pin_mu;
  double cpu_s = 0, cpu_start = -1, cpu_end = -1, gpu_done = -1;
  auto note_start = [&](std::chrono::steady_clock::time_point t0) {
    std::lock_guard<std::mutex> l(pin_mu);
    if (cpu_start < 0) cpu_start = std::chrono::duration<double>(t0 - t_layer).count();
  };
  // A CPU job's end, wherever it ran: its time, the layer's last CPU moment, its slots unpinned.
  auto job_done = [&](const Job& job, std::chrono::steady_clock::time_point t0) {
    std::lock_guard<std::mutex> l(pin_mu);
    cpu_s += seconds_since(t0);
    cpu_end = std::max(cpu_end, seconds_since(t_layer));
    for (int32_t sl : job.slots) --s.slots[static_cast<size_t>(sl)].pins;
  };
  tbb::flow::graph g;
  tbb::flow::function_node<Job> cpu_rows(g, tbb::flow::unlimited, [&](const Job& job) {
    const auto t0 = std::chrono::steady_clock::now();
    note_start(t0);
    try {
      s.cpu->expert_group(x, T, H, job.tasks);
    } catch (...) {
      std::lock_guard<std::mutex> l(err_mu);
      if (!cpu_error) cpu_error = std::current_exception();
    }
    job_done(job, t0);
  });
  tbb::flow::function_node<int> side(g, 1, [&](int) {
    try {
      alongside();
    } catch (...) {
      std::lock_guard<std::mutex> l(err_mu);
      if (!cpu_error) cpu_error = std::current_exception();
    }
  });
  auto run_here = [&](const Job& job) {  // on this thread (its exceptions propagate; cleanup unpins)
    const auto t0 = std::chrono::steady_clock::now();
    note_start(t0);
    s.cpu->expert_group(x, T, H, job.tasks);
    job_done(job, t0);
  };
  // A CPU job goes to the graph only with overlap and disk reads in this layer (this thread then submits and
  // lands the reads, which add jobs as they land); otherwise this thread computes it: as a graph task the
  // resident rows started 20-50 µs into a layer and the layer ended 50-60 µs after its last CPU job on the
  // H200's host (run22 telemetry: the graph's hand-off and join).
  auto dispatch = [&](Job job) {
    if (s.options.overlap && !misses.empty()) {
      cpu_rows.try_put(std::move(job));
    } else {
      run_here(job);
    }
  };

  // Whatever fails below (a read, a CPU group, the shared expert, a GPU fallback), the layer leaves the store
  // consistent: reads drained, graph tasks finished, no slot left pinned, no slot holding a partial read.
  // What the issue writes lives out here: when the layer throws, cleanup waits for the issue thread before
  // these go out of scope. gpu_failed: the issue failed.
  PendingGroup pending;
  bool gpu_failed = false;
  std::string gpu_error;
  double issue_s = 0, issued_at = -1;  // the issue's duration; when it ended, from the layer's start
  bool issue_posted = false;           // the GPU issue runs on the store's issue thread
  auto cleanup = [&] {
    try {
      while (s.reader->outstanding() > 0) (void)s.reader->wait_any();
    } catch (...) {
    }
    try {
      g.wait_for_all();
    } catch (...) {
    }
    if (issue_posted) {
      try {
        s.issuer->wait();  // `pending` is written there
      } catch (...) {
      }
    }
    pending.discard();
    s.pf_forget();
    for (auto& sl : s.slots) sl.pins = 0;
  };
  try {
    // 1. Shared expert (when on the CPU) first: with overlap a graph task that starts at once on a worker.
    // The GPU group goes to the store's issue thread (the issue costs ~0.1 ms of host time: planning,
    // staging, launches), so the CPU rows, usually the longer part, never wait for it.
    if (alongside) {
      if (s.options.overlap) {
        side.try_put(0);
      } else {
        alongside();
      }
    }
    const bool dispatched_cpu = !ram_tasks.empty();

    // 2. GPU group, issued without waiting (serially: issued and taken now).
    auto recompute_gpu_on_cpu = [&](const std::string& why) {
      if (!s.gpu_warned) {
        fmt::print(stderr, "strata: warning: GPU expert group failed ({}); recomputing it on the CPU\n", why);
        s.gpu_warned = true;
      }
      ++s.tel.gpu_fallbacks;
      // The host views (mapping, or memory made at load) stay valid for VRAM experts: compute from them.
      std::vector<ExpertTask> host = gpu_tasks;
      for (size_t i = 0; i < host.size(); ++i) host[i].expert = gpu_host[i];
      s.cpu->expert_group(x, T, H, host);
    };
    // With CPU work beside it (overlap on), the issue goes to the store's issue thread, and this thread goes
    // on to the disk reads and into the CPU rows (g.wait_for_all runs the CPU job here if no worker has taken
    // it).
    const bool cpu_work = !misses.empty() || static_cast<bool>(alongside) || dispatched_cpu;
    const bool issue_beside = s.options.overlap && cpu_work && !gpu_tasks.empty();
    auto issue_gpu = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        pending = s.gpu->issue(x, T, H, gpu_tasks);
      } catch (const Error& e) {
        pending = PendingGroup();
        gpu_failed = true;
        gpu_error = e.what();
      }
      issue_s = seconds_since(t0);
      issued_at = seconds_since(t_layer);
    };
    // Waits for the issued group (its wait is counted as take time); a failure recomputes it on the CPU.
    auto take_gpu = [&] {
      const auto t1 = std::chrono::steady_clock::now();
      try {
        pending.take();
      } catch (const Error& e) {
        recompute_gpu_on_cpu(e.what());
      }
      s.tel.take_s += seconds_since(t1);
      gpu_done = seconds_since(t_layer);
    };
    // Only the issue goes to the issue thread; this thread takes the group after its CPU rows. A take on the
    // issue thread (its wait yielding the core) finished 40-80 µs per layer after the rows on the H200's busy
    // host (it was not scheduled again until a row thread stopped); here the GPU is long done and the take is
    // the output copy (run 2026-12-03 #6: overlap 1.148 / 1.176 -> 1.064 / 1.138 at 50 / 75 % of the experts
    // in VRAM).
    if (issue_beside) {
      if (!s.issuer) s.issuer = std::make_unique<IssueThread>();
      s.issuer->post(issue_gpu);
      issue_posted = true;
    } else if (!gpu_tasks.empty()) {
      issue_gpu();
      s.tel.gpu_issue_s += issue_s;
      if (gpu_failed) {
        recompute_gpu_on_cpu(gpu_error);
      } else if (!s.options.overlap) {
        take_gpu();
      }
    }

    // The resident rows, once the GPU group is on its way (on this thread unless disk reads follow;
    // dispatch). Without disk misses the next layer's look-ahead reads go out first (nothing else is
    // submitted); with them, after this layer's reads.
    const bool prefetch_first = s.options.prefetch && misses.empty();
    if (prefetch_first) issue_prefetch(layer, x, T);
    if (dispatched_cpu) dispatch(Job{std::move(ram_tasks), std::move(hit_slots)});

    // 3. Disk: each missing expert gets a slot (the least recently used free one) and its reads; it goes to
    // the CPU rows as soon as all its runs have landed.
    if (!misses.empty()) {
      double waited = 0;
      std::unordered_map<uint64_t, size_t> ticket_miss;  // ticket → index in misses
      std::vector<int> runs_left(misses.size(), 0);
      std::vector<int32_t> miss_slot(misses.size(), -1);
      auto land = [&](const FileReader::Completion& c) {
        c.check();
        const size_t i = ticket_miss.at(c.ticket);
        if (--runs_left[i] > 0) return;
        const Work& w = *misses[i];
        Entry& en = s.entry(layer, w.expert);
        Slot& sl = s.slots[static_cast<size_t>(miss_slot[i])];
        sl.view = s.view_in(en, sl.mem.get());
        sl.key = layer * s.experts + w.expert;
        en.tier = Tier::kCache;
        en.slot = miss_slot[i];
        s.tel.disk_bytes += en.buffer_bytes;
        Job job;
        job.tasks.push_back({&sl.view, w.rows, w.out});
        job.slots.push_back(miss_slot[i]);
        dispatch(std::move(job));
      };
      auto wait_one = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        const auto c = s.reader->wait_any();
        waited += seconds_since(t0);
        if (s.pf_ticket.count(c.ticket)) {
          s.pf_land(c);
        } else {
          land(c);
        }
      };
      auto free_slot = [&]() -> int32_t {
        int32_t best = -1;
        std::lock_guard<std::mutex> l(pin_mu);
        for (size_t i = 0; i < s.slots.size(); ++i) {
          const Slot& sl = s.slots[i];
          if (sl.pins > 0) continue;
          if (best < 0 || sl.last_use < s.slots[static_cast<size_t>(best)].last_use)
            best = static_cast<int32_t>(i);
        }
        return best;
      };
      try {
        for (size_t i = 0; i < misses.size(); ++i) {
          int32_t sl = free_slot();
          while (sl < 0) {
            // Every slot is being read or computed: let a read land, or the CPU rows finish.
            if (s.reader->outstanding() > 0) {
              wait_one();
            } else {
              g.wait_for_all();
              if (cpu_error) std::rethrow_exception(cpu_error);
              sl = free_slot();
              if (sl < 0) fail(kComp, "internal: every expert cache slot is in use with nothing in flight");
            }
            sl = free_slot();
          }
          Slot& slot = s.slots[static_cast<size_t>(sl)];
          {
            std::lock_guard<std::mutex> l(pin_mu);
            slot.pins = 1;
          }
          if (slot.key >= 0) {  // evict
            Entry& old = s.entries[static_cast<size_t>(slot.key)];
            old.tier = Tier::kDisk;
            old.slot = -1;
            slot.key = -1;
          }
          slot.last_use = s.clock;
          miss_slot[i] = sl;
          const Entry& en = s.entry(layer, misses[i]->expert);
          ++s.tel.disk_reads;
          runs_left[i] = static_cast<int>(en.runs.size());
          for (const Run& r : en.runs) {
            const uint64_t t = s.reader->submit(r.file, r.read_offset, r.read_length, slot.mem.get() + r.dst);
            ticket_miss[t] = i;
          }
          if (!s.options.overlap) {
            while (runs_left[i] > 0) wait_one();
          }
        }
        while (s.reader->outstanding() > s.pf_ticket.size()) wait_one();
      } catch (...) {
        // A failed read: let everything in flight finish, leave no half-read slot behind, report the read.
        try {
          while (s.reader->outstanding() > 0) (void)s.reader->wait_any();
        } catch (...) {
        }
        g.wait_for_all();
        for (size_t i = 0; i < misses.size(); ++i) {
          if (miss_slot[i] < 0) continue;
          Slot& slot = s.slots[static_cast<size_t>(miss_slot[i])];
          if (runs_left[i] > 0) {
            slot.pins = 0;
            slot.key = -1;
          }
        }
        throw;
      }
      s.tel.disk_wait_s += waited;
    }

    if (s.options.prefetch && !prefetch_first) issue_prefetch(layer, x, T);
    g.wait_for_all();
    s.tel.cpu_rows_s += cpu_s;
    if (cpu_start >= 0) s.tel.cpu_start_s += cpu_start;
    if (cpu_end >= 0) s.tel.cpu_end_s += cpu_end;
    if (issue_posted) {  // issued on the issue thread (normally long done): waiting for it counts as take
                         // time
      const auto t1 = std::chrono::steady_clock::now();
      s.issuer->wait();
      issue_posted = false;
      s.tel.take_s += seconds_since(t1);
      s.tel.gpu_issue_s += issue_s;
      if (gpu_failed) {
        recompute_gpu_on_cpu(gpu_error);
        gpu_done = seconds_since(t_layer);
      }
    }
    if (pending) take_gpu();
    if (gpu_done >= 0) s.tel.gpu_done_s += gpu_done;
    if (issued_at >= 0) s.tel.gpu_issued_s += issued_at;  // (the issue thread's write: read after its wait)
    if (cpu_error) std::rethrow_exception(cpu_error);
  } catch (...) {
    cleanup();
    throw;
  }
  s.tel.layer_s += seconds_since(t_layer);
}

int64_t ExpertStore::pinned_slots() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  int64_t n = 0;
  for (const auto& sl : impl_->slots) n += sl.pins > 0 ? 1 : 0;
  return n;
}

// ---- between turns ------------------------------------------------------------------------------------

void ExpertStore::end_turn() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  stats_.turns = std::max(stats_.turns, s.turn);
  ++s.turn;
  if (s.options.pin == "none") return;  // fixed placement: nothing moves, nothing is saved
  // Re-placement with hysteresis: a candidate replaces the weakest member of a tier only when it was routed
  // clearly more often (25 % and 2 tokens more); at most 16 moves per tier per turn. Every move first makes
  // the new copy (which may fail: a read error, out of memory) and only then changes the two entries, so a
  // failure leaves the store as it was.
  auto count = [&](int64_t key) { return stats_.count[static_cast<size_t>(key)]; };
  auto release_slot = [&](Entry& en) {
    if (en.tier == Tier::kCache) {
      s.slots[static_cast<size_t>(en.slot)].key = -1;
      en.slot = -1;
      en.tier = Tier::kDisk;
    }
  };
  // Where an expert goes when it leaves a tier: RAM when its bytes are not streamable (memory made at load)
  // or the plan maps everything, else disk.
  auto demoted_tier = [&](const Entry& en) {
    return plan_.mapped || en.runs.empty() || en.pinned ? Tier::kRam : Tier::kDisk;
  };
  // One tier's re-placement: members and candidates from the statistics (most used first); while the best
  // remaining candidate clearly beats the weakest remaining member, move(candidate, member).
  auto rebalance = [&](auto is_member, auto is_candidate, auto move) {
    std::vector<int64_t> members, candidates;
    for (auto [l, e] : stats_.ranked()) {
      if (l >= s.layers || !s.model.layers()[static_cast<size_t>(l)].moe) continue;
      const int64_t key = l * s.experts + e;
      const Entry& en = s.entries[static_cast<size_t>(key)];
      if (is_member(en))
        members.push_back(key);
      else if (is_candidate(en))
        candidates.push_back(key);
    }
    int moves = 0;
    for (int64_t cand : candidates) {
      if (members.empty() || moves >= 16) break;
      const int64_t weak = members.back();
      if (count(cand) <= count(weak) + count(weak) / 4 + 2) break;
      members.pop_back();
      ++moves;
      move(s.entries[static_cast<size_t>(cand)], s.entries[static_cast<size_t>(weak)]);
    }
  };
  if (!plan_.mapped) {
    // The pinned set (kRam with a pinned copy). The member's buffer (slot-sized, so it fits any expert) takes
    // the candidate's bytes; a failed read leaves both as they were except the member, which then streams.
    rebalance([](const Entry& en) { return en.tier == Tier::kRam && static_cast<bool>(en.pinned); },
              [](const Entry& en) {
                return (en.tier == Tier::kCache || en.tier == Tier::kDisk) && !en.runs.empty();
              },
              [&](Entry& in, Entry& out) {
                Buffer buf = std::move(out.pinned);
                out.tier = Tier::kDisk;
                s.read_now(in, buf.get());
                release_slot(in);
                in.pinned = std::move(buf);
                in.pinned_view = s.view_in(in, in.pinned.get());
                in.tier = Tier::kRam;
              });
  }
  // VRAM: free the weakest member first (VRAM holds no spare expert), then upload the candidate; a failed
  // upload leaves the candidate where it was and the tier one expert smaller, with a warning. A pinned
  // candidate hands its pinned buffer to the member it replaces when that member is streamable.
  if (s.gpu != nullptr && plan_.vram > 0) {
    rebalance([](const Entry& en) { return en.tier == Tier::kVram; }, [](const Entry&) { return true; },
              [&](Entry& in, Entry& out) {
                out.resident.clear();
                out.tier = demoted_tier(out);
                if (in.pinned && !out.runs.empty()) {
                  try {
                    s.read_now(out, in.pinned.get());
                    out.pinned = std::move(in.pinned);
                    out.pinned_view = s.view_in(out, out.pinned.get());
                    out.tier = Tier::kRam;
                  } catch (const std::exception&) {
                    out.tier = demoted_tier(out);
                  }
                }
                try {
                  s.upload(in);
                } catch (const std::exception& e) {
                  plan_.warnings.push_back(
                      fmt::format("re-placement: an upload to {} failed ({}); VRAM holds one expert fewer",
                                  s.gpu->name(), e.what()));
                  return;
                }
                release_slot(in);
                in.pinned.reset();
                in.tier = Tier::kVram;
              });
  }
  if (!plan_.stats_path.empty()) {
    try {
      save_routing_stats(stats_, plan_.stats_path);
    } catch (const Error& e) {
      if (!s.save_warned) {
        fmt::print(stderr, "strata: warning: routing statistics not saved: {}\n", e.what());
        s.save_warned = true;
      }
    }
  }
}

}  // namespace strata
