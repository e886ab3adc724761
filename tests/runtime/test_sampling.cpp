// Sampling: greedy, seeded reproducibility, top-k / top-p / min-p filters, the distribution, bad parameters;
// and Generation's stop strings, EOS and streaming-safe text on a real tokenizer.
#include <cmath>
#include <map>

#include "strata/error.hpp"
#include "strata/generation.hpp"
#include "strata/sampling.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

TEST_CASE("greedy and degenerate filters pick the argmax") {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -3.0f, 2.0f};
  SamplingParams p;
  p.temperature = 0;
  CHECK(Sampler(p).sample(logits) == 1);  // first maximum wins
  p.temperature = 1.0f;
  p.seed = 5;
  p.top_k = 1;
  CHECK(Sampler(p).sample(logits) == 1);
  p.top_k = 0;
  p.top_p = 1e-6f;
  CHECK(Sampler(p).sample(logits) == 1);
  p.top_p = 1;
  p.min_p = 1.0f;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) {
    const int32_t id = s.sample(logits);
    CHECK((id == 1 || id == 4));  // both at the maximum probability
  }
}

TEST_CASE("seeded sampling is reproducible and follows the distribution") {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = 0.1 .. 0.4
  SamplingParams p;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> da, db;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(logits));
    db.push_back(b.sample(logits));
  }
  CHECK(da == db);
  std::map<int32_t, int> count;
  Sampler c(p);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[c.sample(logits)];
  for (int k = 0; k < 4; ++k) CHECK(std::fabs(count[k] / double(n) - (k + 1) / 10.0) < 0.01);
  // top_k = 2 keeps ids 3 and 2 with p = 4/7, 3/7.
  p.top_k = 2;
  Sampler d(p);
  std::map<int32_t, int> ck;
  for (int i = 0; i < n; ++i) ++ck[d.sample(logits)];
  CHECK(ck.count(0) == 0);
  CHECK(ck.count(1) == 0);
  CHECK(std::fabs(ck[3] / double(n) - 4.0 / 7.0) < 0.01);
  // top_p = 0.65 keeps 0.4 + 0.3 (>= 0.65) → ids 3 and 2.
  p.top_k = 0;
  p.top_p = 0.65f;
  Sampler e(p);
  for (int i = 0; i < 500; ++i) CHECK(e.sample(logits) >= 2);
  // min_p = 0.5 keeps p >= 0.2: ids 1, 2, 3.
  p.top_p = 1;
  p.min_p = 0.5f;
  Sampler f(p);
  for (int i = 0; i < 500; ++i) CHECK(f.sample(logits) >= 1);
}

TEST_CASE("bad sampling parameters name the parameter") {
  SamplingParams p;
  p.temperature = -1;
  CHECK_THROWS_WITH_AS(check_sampling_params(p), doctest::Contains("temperature -1"), Error);
  p = {};
  p.top_p = 0;
  CHECK_THROWS_WITH_AS(check_sampling_params(p), doctest::Contains("top_p"), Error);
  p = {};
  p.min_p = 2;
  CHECK_THROWS_WITH_AS(check_sampling_params(p), doctest::Contains("min_p"), Error);
  p = {};
  p.top_k = -3;
  CHECK_THROWS_WITH_AS(check_sampling_params(p), doctest::Contains("top_k"), Error);
}

namespace {
// Logits that make `id` the argmax.
std::vector<float> pick(int32_t id, size_t vocab) {
  std::vector<float> l(vocab, 0.0f);
  l[static_cast<size_t>(id)] = 10.0f;
  return l;
}
}  // namespace

TEST_CASE("Generation: EOS, max tokens, stop strings, and text released only when final") {
  auto tok = Tokenizer::from_file(fixtures_dir() / "tokenizer-bpe" / "tokenizer.json");
  const size_t V = tok->vocab_size();
  const std::vector<int32_t> ids = tok->encode("Hello, world! Goodbye.");
  REQUIRE(ids.size() > 4);
  SamplingParams greedy;
  greedy.temperature = 0;
  {
    Generation g(tok, greedy, {2}, {}, 100);
    std::string streamed;
    for (int32_t id : ids) {
      CHECK(g.step(pick(id, V)) == id);
      streamed += g.take_text();
    }
    CHECK(g.step(pick(2, V)) == -1);  // EOS ends it and is not part of the text
    streamed += g.take_text();
    CHECK(g.finish_reason() == "stop");
    CHECK(streamed == "Hello, world! Goodbye.");
    CHECK(g.ids() == ids);
  }
  {
    Generation g(tok, greedy, {2}, {}, 3);
    for (int i = 0; i < 3; ++i) g.step(pick(ids[static_cast<size_t>(i)], V));
    CHECK(g.finish_reason() == "length");
    CHECK(g.ids().size() == 3);
  }
  {
    Generation g(tok, greedy, {2}, {"world"}, 100);
    std::string streamed;
    for (int32_t id : ids) {
      g.step(pick(id, V));
      const std::string t = g.take_text();
      CHECK(t.find("wor") == std::string::npos);  // a possible stop-string prefix is held back
      streamed += t;
      if (g.done()) break;
    }
    CHECK(g.finish_reason() == "stop");
    CHECK(streamed == "Hello, ");
  }
  {
    // Several stop strings: the one that starts earliest in the text cuts it, whatever the list order.
    Generation g(tok, greedy, {2}, {"world", "llo"}, 100);
    std::string streamed;
    for (int32_t id : ids) {
      g.step(pick(id, V));
      streamed += g.take_text();
      if (g.done()) break;
    }
    CHECK(g.finish_reason() == "stop");
    CHECK(streamed == "He");
  }
}
