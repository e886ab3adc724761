// Expert tiers on a CPU-only host: streamed from disk through a cache smaller than one layer's experts, with
// and without overlap, any thread count, either read engine, pinned from saved statistics — all bitwise equal
// to the experts used straight from the mapped checkpoint. Routing statistics files and budgets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "strata/convert.hpp"
#include "strata/error.hpp"
#include "strata/expert_store.hpp"
#include "strata/model.hpp"
#include "strata/routing_stats.hpp"
#include "strata/safetensors.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

// A fixture converted to a Q4_G64 container (experts streamable), once per fixture name.
fs::path container(const std::string& fixture) {
  static TempDir dir;
  const fs::path out = dir.path() / fixture;
  if (!fs::exists(out / "strata-manifest.json")) {
    // The checkpoint without the oracle's expected.* files (they are not weights).
    const fs::path in = dir.path() / (fixture + "-hf");
    fs::create_directories(in);
    for (const auto& f : fs::directory_iterator(fixtures_dir() / fixture)) {
      if (f.path().filename().string().rfind("expected", 0) != 0) fs::copy(f.path(), in / f.path().filename());
    }
    ConvertOptions o;
    o.in = in;
    o.out = out;
    o.shard_bytes = 64 << 10;  // several shards: experts of one layer spread over files
    convert_checkpoint(o);
  }
  return out;
}

struct Run {
  std::vector<float> logits;  // prefill of all but the last 3 ids (all rows), then 3 decode steps
  StoreTelemetry tel;
};

Run run(const fs::path& model_dir, std::optional<StoreOptions> store, int threads = 0, int turns = 1) {
  LoadOptions lo;
  lo.store = store;
  auto model = Model::load(model_dir, backends_named("", threads), lo);
  const Expected e = load_expected(fixtures_dir() / model_dir.filename());
  const auto& ids = e.sequence;
  Run r;
  for (int t = 0; t < turns; ++t) {
    Session s(model, threads);
    const size_t P = ids.size() - 3;
    r.logits = s.forward(std::span<const int32_t>(ids.data(), P), true);
    for (size_t i = P; i < ids.size(); ++i) {
      const auto l = s.forward(std::span<const int32_t>(&ids[i], 1), false);
      r.logits.insert(r.logits.end(), l.begin(), l.end());
    }
    if (model->expert_store()) model->expert_store()->end_turn();
  }
  if (model->expert_store()) r.tel = model->expert_store()->telemetry();
  return r;
}

StoreOptions streaming(double ram_gb = 0.0) {
  StoreOptions o;
  o.ram_gb = ram_gb;
  o.pin = "none";
  return o;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("streamed experts equal mapped experts bit for bit, whatever the overlap, threads or read engine") {
  for (const char* fixture : {"deepseek_v3-tiny", "glm_moe_dsa-tiny", "qwen3_moe-tiny", "glm4_moe-tiny"}) {
    if (!fs::exists(fixtures_dir() / fixture)) continue;
    CAPTURE(fixture);
    const fs::path dir = container(fixture);
    const Run ref = run(dir, std::nullopt);
    // Pure streaming: the budget is below one expert, so the cache has its minimum of 4 slots — fewer than the
    // experts one layer routes to for the prompt.
    StoreOptions o = streaming(0.0);
    const Run a = run(dir, o);
    CHECK(bitwise_equal(a.logits, ref.logits));
    CHECK(a.tel.disk_reads > 0);
    CHECK(a.tel.disk_bytes > 0);
    o.overlap = false;
    CHECK(bitwise_equal(run(dir, o).logits, ref.logits));
    o.overlap = true;
    CHECK(bitwise_equal(run(dir, o, 1).logits, ref.logits));
    o.reader.engine = IoEngine::kPread;
    o.reader.queue_depth = 2;
    CHECK(bitwise_equal(run(dir, o, 2).logits, ref.logits));
    o.reader.direct = DirectIo::kOn;
    CHECK(bitwise_equal(run(dir, o).logits, ref.logits));
    // Router look-ahead prefetch: only the cache changes.
    // (a cache of half the experts: look-ahead only fills slots no layer of the last token used)
    LoadOptions plo;
    const double half_gb =
        static_cast<double>(Model::load(dir, backends_named(), plo)->param_counts().routed_bytes) / 2 / (1024.0 * 1024 * 1024);
    StoreOptions pf = streaming(half_gb);
    pf.prefetch = true;
    const Run p = run(dir, pf, 0, 2);
    CHECK(bitwise_equal(p.logits, ref.logits));
    CHECK(p.tel.prefetch_reads > 0);
    MESSAGE(std::string(fixture) << ": prefetch recall " << p.tel.prefetch_recall() << " (" << p.tel.prefetch_hits << " hits, "
                    << p.tel.disk_reads << " misses, " << p.tel.prefetch_reads << " read ahead)");
    pf.overlap = false;
    CHECK(bitwise_equal(run(dir, pf, 1).logits, ref.logits));
    // A cache that holds about half the experts: hits and misses mixed.
    LoadOptions lo;
    auto probe = Model::load(dir, backends_named(), lo);
    const double half = static_cast<double>(probe->param_counts().routed_bytes) / 2 / (1024.0 * 1024 * 1024);
    const Run c = run(dir, streaming(half), 0, 2);
    CHECK(bitwise_equal(c.logits, ref.logits));
    CHECK(c.tel.cache_hits > 0);
    // Everything fits: used from the mapping, no reads.
    const Run m = run(dir, streaming(100.0 * half + 1.0));
    CHECK(bitwise_equal(m.logits, ref.logits));
    CHECK(m.tel.disk_reads == 0);
  }
}

TEST_CASE("routing statistics: saved each turn, pin the hottest experts at the next load, refuse another model") {
  const fs::path dir = container("deepseek_v3-tiny");
  TempDir tmp;
  const fs::path stats = tmp.path() / "routing.stats";
  const Run ref = run(dir, std::nullopt);
  StoreOptions o = streaming(0.0);
  o.pin = stats.string();
  // A budget for a few experts: with statistics, half of it pins the hottest ones.
  LoadOptions lo;
  auto probe = Model::load(dir, backends_named(), lo);
  const auto pc = probe->param_counts();
  o.ram_gb = static_cast<double>(pc.per_expert_bytes) * 12 / (1024.0 * 1024 * 1024);
  const Run first = run(dir, o, 0, 2);
  CHECK(bitwise_equal(first.logits, ref.logits));
  REQUIRE(fs::exists(stats));
  lo.store = o;
  auto model = Model::load(dir, backends_named(), lo);
  const StorePlan& plan = model->expert_store()->plan();
  CHECK(plan.ram > 0);  // pinned from the statistics
  CHECK(model->expert_store()->stats().turns == 2);
  CHECK(bitwise_equal(run(dir, o).logits, ref.logits));
  // The same statistics offered to another model are refused with a clear message.
  const fs::path other = container("glm_moe_dsa-tiny");
  StoreOptions w = streaming(0.0);
  w.pin = stats.string();
  LoadOptions wl;
  wl.store = w;
  try {
    (void)Model::load(other, backends_named(), wl);
    FAIL("statistics of another model were accepted");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("another model") != std::string::npos);
    CHECK(msg.find(stats.string()) != std::string::npos);
  }
}

TEST_CASE("a RAM budget larger than the machine is clamped with a warning") {
  const fs::path dir = container("qwen3_moe-tiny");
  StoreOptions o;
  o.ram_gb = 1e6;  // a petabyte
  o.pin = "none";
  LoadOptions lo;
  lo.store = o;
  auto model = Model::load(dir, backends_named(), lo);
  const StorePlan& p = model->expert_store()->plan();
  REQUIRE(!p.warnings.empty());
  CHECK(p.warnings[0].find("clamped") != std::string::npos);
  CHECK(p.mapped);
  const std::string text = model->expert_store()->plan_text();
  CHECK(text.find("expert plan") != std::string::npos);
  CHECK(text.find("warning") != std::string::npos);
}

TEST_CASE("a read error under a streamed expert names the file; the store stays usable after it") {
  // Copy a container, load it streaming everything, then cut a shard right where its trailing run of expert
  // tensors begins (the dense bytes before that point stay readable through the mapping). The forward pass
  // fails with the reader's error; with the file restored, the next passes are bitwise the reference.
  TempDir tmp;
  const fs::path src = container("qwen3_moe-tiny");
  const fs::path dir = tmp.path() / "qwen3_moe-tiny";
  fs::copy(src, dir, fs::copy_options::recursive);
  fs::path victim;
  uint64_t cut = 0;
  {
    SafetensorsSet set(dir);
    for (const auto& f : set.files()) {
      std::vector<const TensorInfo*> by_offset;
      for (const auto& [name, info] : f->tensors()) by_offset.push_back(&info);
      std::sort(by_offset.begin(), by_offset.end(),
                [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
      size_t i = by_offset.size();
      while (i > 0 && by_offset[i - 1]->name.find(".mlp.experts.") != std::string::npos) --i;
      if (i < by_offset.size()) {
        victim = f->path();
        cut = f->file_offset(f->data(*by_offset[i]));
        break;
      }
    }
  }
  REQUIRE(!victim.empty());
  const std::string saved = read_text(victim);
  const Run ref = run(src, std::nullopt);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    StoreOptions o = streaming(0.0);
    o.overlap = overlap;
    LoadOptions lo;
    lo.store = o;
    auto model = Model::load(dir, backends_named(), lo);
    const Expected e = load_expected(fixtures_dir() / "qwen3_moe-tiny");
    fs::resize_file(victim, cut);
    bool threw = false;
    try {
      Session s(model);
      (void)s.forward(e.sequence, true);
    } catch (const Error& err) {
      threw = true;
      const std::string msg = err.what();
      CHECK(msg.find(victim.string()) != std::string::npos);
      CHECK(msg.find("offset") != std::string::npos);
    }
    CHECK(threw);
    CHECK(model->expert_store()->pinned_slots() == 0);
    write_text(victim, saved);
    Session s(model);
    const auto logits = s.forward(std::span<const int32_t>(e.sequence.data(), e.sequence.size() - 3), true);
    const std::vector<float> want(ref.logits.begin(), ref.logits.begin() + static_cast<std::ptrdiff_t>(logits.size()));
    CHECK(bitwise_equal(logits, want));
    CHECK(model->expert_store()->pinned_slots() == 0);
  }
}

TEST_CASE("re-placement between turns moves hot experts into the pinned set; results stay bitwise equal") {
  const fs::path dir = container("deepseek_v3-tiny");
  const Run ref = run(dir, std::nullopt);
  TempDir tmp;
  const fs::path stats_file = tmp.path() / "crafted.stats";
  LoadOptions plain;
  auto probe = Model::load(dir, backends_named(), plain);
  const ModelSpec& spec = probe->spec();
  // Crafted statistics: the last experts of every layer look hot (1 token each) — the prompt will route
  // elsewhere far more often, so end_turn must swap.
  RoutingStats st(spec.n_layers, spec.n_experts, model_fingerprint(dir));
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    if (!probe->layers()[static_cast<size_t>(l)].moe) continue;
    for (int64_t e = spec.n_experts - 3; e < spec.n_experts; ++e) st.record(l, e, 1, 1);
  }
  save_routing_stats(st, stats_file);
  StoreOptions o = streaming(0.0);
  o.pin = stats_file.string();
  o.ram_gb = static_cast<double>(probe->param_counts().per_expert_bytes) * 16 / (1024.0 * 1024 * 1024);
  LoadOptions lo;
  lo.store = o;
  auto model = Model::load(dir, backends_named(), lo);
  ExpertStore& store = *model->expert_store();
  REQUIRE(store.plan().ram > 0);
  auto tiers = [&] {
    std::vector<Tier> t;
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      if (!model->layers()[static_cast<size_t>(l)].moe) continue;
      for (int64_t e = 0; e < spec.n_experts; ++e) t.push_back(store.tier_of(l, e));
    }
    return t;
  };
  const Expected e = load_expected(fixtures_dir() / "deepseek_v3-tiny");
  const size_t P = e.sequence.size() - 3;
  for (int rep = 0; rep < 4; ++rep) {  // counts well above the hysteresis margin
    Session s(model);
    CHECK(bitwise_equal(s.forward(std::span<const int32_t>(e.sequence.data(), P), true),
                        std::vector<float>(ref.logits.begin(), ref.logits.begin() + static_cast<std::ptrdiff_t>(P * spec.vocab))));
  }
  const auto before = tiers();
  store.end_turn();
  const auto after = tiers();
  CHECK(before != after);
  int64_t pinned = 0;
  for (Tier t : after) pinned += t == Tier::kRam ? 1 : 0;
  CHECK(pinned == store.plan().ram);  // moves, never growth
  Session s(model);
  CHECK(bitwise_equal(s.forward(std::span<const int32_t>(e.sequence.data(), P), true),
                      std::vector<float>(ref.logits.begin(), ref.logits.begin() + static_cast<std::ptrdiff_t>(P * spec.vocab))));
  CHECK(store.pinned_slots() == 0);
  // pin none: fixed placement, end_turn moves nothing.
  StoreOptions fixed = o;
  fixed.pin = "none";
  LoadOptions fl;
  fl.store = fixed;
  auto frozen = Model::load(dir, backends_named(), fl);
  std::vector<Tier> t0;
  for (int64_t l = 0; l < spec.n_layers; ++l)
    for (int64_t x = 0; x < spec.n_experts && frozen->layers()[static_cast<size_t>(l)].moe; ++x)
      t0.push_back(frozen->expert_store()->tier_of(l, x));
  {
    Session fs1(frozen);
    (void)fs1.forward(std::span<const int32_t>(e.sequence.data(), P), true);
  }
  frozen->expert_store()->end_turn();
  std::vector<Tier> t1;
  for (int64_t l = 0; l < spec.n_layers; ++l)
    for (int64_t x = 0; x < spec.n_experts && frozen->layers()[static_cast<size_t>(l)].moe; ++x)
      t1.push_back(frozen->expert_store()->tier_of(l, x));
  // Cache contents may change; the pinned set (kRam) may not.
  for (size_t i = 0; i < t0.size(); ++i) CHECK((t0[i] == Tier::kRam) == (t1[i] == Tier::kRam));
}
