// Routing statistics: ranking order, save/load round trip, refusal of another model's, other dimensions' and
// damaged files, atomic saves, and the model fingerprint.
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include "strata/error.hpp"
#include "strata/routing_stats.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

// doctest::Contains wants a doctest::String (it keeps a copy).
doctest::Contains contains(const std::string& s) {
  return doctest::Contains(s.c_str());
}

RoutingStats sample_stats(int64_t layers, int64_t experts, const std::string& fp) {
  RoutingStats s(layers, experts, fp);
  std::mt19937_64 rng(layers * 1000 + experts);
  for (uint64_t turn = 1; turn <= 20; ++turn) {
    for (int k = 0; k < 8; ++k) s.record(rng() % layers, rng() % experts, 1 + rng() % 5, turn);
  }
  return s;
}

void check_equal(const RoutingStats& a, const RoutingStats& b) {
  CHECK(a.layers == b.layers);
  CHECK(a.experts == b.experts);
  CHECK(a.count == b.count);
  CHECK(a.last_turn == b.last_turn);
  CHECK(a.turns == b.turns);
  CHECK(a.fingerprint == b.fingerprint);
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("record and ranked: count desc, then last turn desc, then (layer, expert) asc") {
  RoutingStats s(2, 3, "fp");
  CHECK(s.count.size() == 6);
  s.record(0, 0, 5, 1);  // count 5, last turn 1
  s.record(1, 2, 5, 3);  // count 5, last turn 3: ahead of (0, 0)
  s.record(0, 2, 2, 2);
  s.record(1, 0, 2, 2);  // same count and turn as (0, 2): (layer, expert) order
  s.record(1, 1, 1, 4);
  s.record(1, 1, 1, 2);  // an older turn does not move last_turn back
  CHECK(s.count_of(1, 1) == 2);
  CHECK(s.last_turn[1 * 3 + 1] == 4);
  CHECK(s.turns == 4);
  const std::vector<std::pair<int64_t, int64_t>> want = {{1, 2}, {0, 0}, {1, 1}, {0, 2}, {1, 0}, {0, 1}};
  CHECK(s.ranked() == want);
  CHECK(RoutingStats(3, 2, "").ranked() ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}});

  CHECK_THROWS_WITH_AS(s.record(2, 0, 1, 5),
                       contains("(layer 2, expert 0) is out of range (expected layer < 2, expert < 3)"),
                       Error);
  CHECK_THROWS_WITH_AS(s.record(0, -1, 1, 5), contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(RoutingStats(0, 8, ""), contains("expected both >= 1"), Error);
}

TEST_CASE("save and load round trip") {
  TempDir tmp;
  const fs::path p = tmp.path() / "routing.bin";
  const RoutingStats s = sample_stats(5, 7, "0123456789abcdef");
  save_routing_stats(s, p);
  check_equal(load_routing_stats(p, "0123456789abcdef", 5, 7), s);
  CHECK(files_in(tmp.path()) == std::vector<fs::path>{"routing.bin"});  // no temporary left behind

  // Saving again replaces the file.
  RoutingStats t = s;
  t.record(4, 6, 1000, 21);
  save_routing_stats(t, p);
  const RoutingStats back = load_routing_stats(p, "0123456789abcdef", 5, 7);
  check_equal(back, t);
  CHECK(back.ranked().front() == std::pair<int64_t, int64_t>{4, 6});
}

TEST_CASE("another model's statistics, other dimensions and damaged files are refused, naming the file") {
  TempDir tmp;
  const fs::path p = tmp.path() / "routing.bin";
  save_routing_stats(sample_stats(4, 8, "aaaaaaaaaaaaaaaa"), p);

  CHECK_THROWS_WITH_AS(load_routing_stats(p, "bbbbbbbbbbbbbbbb", 4, 8),
                       contains("[routing_stats] routing statistics in " + p.string() +
                                " were recorded for another model (fingerprint aaaaaaaaaaaaaaaa, this "
                                "model is bbbbbbbbbbbbbbbb); delete it or set memory.pin: none"),
                       Error);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 16),
                       contains("routing statistics in " + p.string() +
                                " are for 4 layers × 8 experts; this model has 4 × 16"),
                       Error);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 3, 8), contains("this model has 3 × 8"),
                       Error);

  const std::string good = read_text(p);
  const size_t full = good.size();
  CHECK(full == 40 + 16 + 16 * 32 + 8);
  for (size_t keep : {size_t{0}, size_t{7}, size_t{20}, size_t{40}, size_t{60}, full - 8, full - 1}) {
    CAPTURE(keep);
    write_text(p, good.substr(0, keep));
    CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8),
                         contains("routing statistics in " + p.string() +
                                  " are truncated: " + std::to_string(keep) + " bytes, expected"),
                         Error);
  }
  write_text(p, good + "x");
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8),
                       contains("are corrupt (trailing bytes): " + std::to_string(full + 1) +
                                " bytes, expected " + std::to_string(full)),
                       Error);
  std::string flipped = good;
  flipped[40 + 16 + 8 * 3] ^= 0x10;  // a count
  write_text(p, flipped);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8),
                       contains("routing statistics in " + p.string() + " are corrupt: checksum"), Error);
  flipped = good;
  flipped[41] ^= 0x01;  // the fingerprint: reported as damage, not as another model
  write_text(p, flipped);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8), contains("corrupt: checksum"), Error);
  flipped = good;
  flipped[16] = static_cast<char>(0xFF);  // layers: absurd
  flipped[23] = static_cast<char>(0x7F);
  write_text(p, flipped);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8), contains("are corrupt: header says"),
                       Error);
  flipped = good;
  flipped[8] = 9;  // version
  write_text(p, flipped);
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8),
                       contains("have format version 9; expected version 1"), Error);
  write_text(p, "{\"not\": \"ours\", \"padding\": \"...................................\"}");
  CHECK_THROWS_WITH_AS(load_routing_stats(p, "aaaaaaaaaaaaaaaa", 4, 8),
                       contains(p.string() + " is not a strata routing statistics file"), Error);
  CHECK_THROWS_WITH_AS(load_routing_stats(tmp.path() / "none.bin", "aaaaaaaaaaaaaaaa", 4, 8),
                       contains("cannot open routing statistics " + (tmp.path() / "none.bin").string()),
                       Error);
}

TEST_CASE("a failed save leaves the previous file intact and no temporary behind") {
  TempDir tmp;
  const fs::path p = tmp.path() / "routing.bin";
  const RoutingStats old_stats = sample_stats(2, 2, "fp-old");
  save_routing_stats(old_stats, p);
  const std::string old_bytes = read_text(p);
  const RoutingStats big = sample_stats(64, 64, "fp-new");  // 64 KiB

  // A file size limit makes the write of the temporary fail (EFBIG) — it works as root too, unlike a
  // read-only folder.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  std::string message;
  try {
    save_routing_stats(big, p);
  } catch (const Error& e) {
    threw = true;
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(message.find(p.string()) != std::string::npos);
  CHECK(read_text(p) == old_bytes);
  check_equal(load_routing_stats(p, "fp-old", 2, 2), old_stats);
  CHECK(files_in(tmp.path()) == std::vector<fs::path>{"routing.bin"});

  // A read-only folder (only meaningful without root, which ignores permissions).
  if (::geteuid() != 0) {
    REQUIRE(::chmod(tmp.path().c_str(), 0555) == 0);
    CHECK_THROWS_WITH_AS(save_routing_stats(big, p), contains(p.string()), Error);
    ::chmod(tmp.path().c_str(), 0755);
    CHECK(read_text(p) == old_bytes);
  } else {
    MESSAGE("running as root: the read-only folder case is skipped (root writes anyway)");
  }

  // A folder that does not exist: the error names the path.
  CHECK_THROWS_WITH_AS(save_routing_stats(big, tmp.path() / "no" / "routing.bin"),
                       contains((tmp.path() / "no" / "routing.bin").string()), Error);
  // Inconsistent statistics are refused before anything is written.
  RoutingStats broken = big;
  broken.count.pop_back();
  CHECK_THROWS_WITH_AS(save_routing_stats(broken, p),
                       contains("count has 4095 and last_turn 4096 entries, expected 64 × 64 = 4096"), Error);
  CHECK(read_text(p) == old_bytes);
}

TEST_CASE("model fingerprint: stable, differs between models, follows config.json, ignores sharding") {
  const fs::path tiny = fixtures_dir() / "qwen3_moe-tiny";
  const std::string fp = model_fingerprint(tiny);
  CHECK(fp.size() == 16);
  CHECK(fp.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(model_fingerprint(tiny) == fp);
  CHECK(model_fingerprint(fixtures_dir() / "qwen3_moe-alt") != fp);

  // The same tensors in two shards with an index, and the same config: the same fingerprint.
  TempDir tmp;
  const fs::path resharded = tmp.path() / "resharded";
  fs::create_directories(resharded);
  fs::copy_file(tiny / "config.json", resharded / "config.json");
  SafetensorsSet set(tiny);
  std::vector<TensorToWrite> first, second;
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  size_t i = 0;
  for (const auto& [name, ref] : set.all()) {
    const bool to_first = i++ % 2 == 0;
    (to_first ? first : second)
        .push_back(
            {name, ref.info->dtype, ref.info->shape, {ref.data(), static_cast<size_t>(ref.info->nbytes)}});
    index["weight_map"][name] = to_first ? "model-1.safetensors" : "model-2.safetensors";
  }
  write_safetensors(resharded / "model-1.safetensors", first);
  write_safetensors(resharded / "model-2.safetensors", second);
  write_text(resharded / "model.safetensors.index.json", index.dump());
  CHECK(model_fingerprint(resharded) == fp);
  CHECK(model_fingerprint(resharded, SafetensorsSet(resharded)) == fp);

  // A changed config.json changes it.
  write_text(resharded / "config.json", read_text(tiny / "config.json") + "\n");
  CHECK(model_fingerprint(resharded) != fp);
  fs::remove(resharded / "config.json");
  CHECK_THROWS_WITH_AS(model_fingerprint(resharded),
                       contains((resharded / "config.json").string() + ": cannot read it"), Error);
}
