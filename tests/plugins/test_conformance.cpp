// Plugin conformance: every loaded plugin against cpu_generic on the same random inputs (odd sizes, tails,
// experts with 0/1/4/64 rows), bit for bit in exact mode, and independent of the thread count.
#include <cmath>
#include <cstring>

#include "strata/error.hpp"
#include "strata/quant.hpp"
#include "test_matrices.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

// Plain double-precision reference, to check the reference itself is right (not only that plugins agree).
double ref_dot(const HostMatrix& m, int64_t o, const float* x) {
  double s = 0;
  std::vector<float> deq;
  if (is_q4(m.format)) {
    deq.resize(static_cast<size_t>(m.rows * m.cols));
    dequantize_q4(m.view(), deq.data());
  }
  for (int64_t i = 0; i < m.cols; ++i) {
    float w;
    if (is_q4(m.format)) {
      w = deq[static_cast<size_t>(o * m.cols + i)];
    } else if (m.format == WeightFormat::F32) {
      std::memcpy(&w, m.bytes.data() + 4 * (o * m.cols + i), 4);
    } else {
      uint16_t h;
      std::memcpy(&h, m.bytes.data() + 2 * (o * m.cols + i), 2);
      w = m.format == WeightFormat::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    s += static_cast<double>(w) * x[i];
  }
  return s;
}

// The exact-mode (CPU) plugins: they share the canonical reduction order, so they must agree bit for bit. The
// cuda plugin computes in another order and is checked within its tolerance by test_cuda; cpu_vnni, which is
// not exact mode, by test_cpu_vnni.
std::vector<std::string> plugins_under_test() {
  std::vector<std::string> names;
  for (const auto* p : build_registry().ranked(/*exact_only=*/true)) {
    if (p->name.rfind("cpu_", 0) == 0) names.push_back(p->name);
  }
  return names;
}

const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16,
                                 WeightFormat::Q4_ROW, WeightFormat::Q4_G64};

// The same matrix as F32 holding the dequantized values (the int4 exact-mode contract).
HostMatrix dequantized(const HostMatrix& q) {
  HostMatrix f{WeightFormat::F32,
               q.rows,
               q.cols,
               std::vector<std::byte>(static_cast<size_t>(q.rows * q.cols) * 4),
               {}};
  dequantize_q4(q.view(), reinterpret_cast<float*>(f.bytes.data()));
  return f;
}

}  // namespace

TEST_CASE("matmul: every plugin equals cpu_generic bit for bit, and the reference is right") {
  std::mt19937 rng(1234);
  auto ref = backends_named("cpu_generic", 0);
  const auto names = plugins_under_test();
  MESSAGE("plugins under test: " << fmt::format("{}", fmt::join(names, ", ")));
  struct Shape {
    int64_t o, i, s;
  };
  // (4100 and 2113 columns with 3-5 x rows: GLM-width rows, several x rows, a tail)
  for (Shape sh :
       {Shape{1, 1, 1}, Shape{7, 13, 1}, Shape{33, 64, 3}, Shape{65, 100, 17}, Shape{130, 257, 5},
        Shape{16, 2048, 2}, Shape{9, 129, 4}, Shape{5, 63, 6}, Shape{37, 4100, 5}, Shape{19, 2113, 3}}) {
    for (WeightFormat f : kFormats) {
      CAPTURE(sh.o);
      CAPTURE(sh.i);
      CAPTURE(sh.s);
      CAPTURE(weight_format_name(f));
      const HostMatrix w = random_matrix(rng, f, sh.o, sh.i);
      const auto x = random_vec(rng, static_cast<size_t>(sh.s * sh.i));
      std::vector<float> y0(static_cast<size_t>(sh.s * sh.o));
      ref.dense->matmul(w.view(), x.data(), sh.s, y0.data());
      for (int64_t s = 0; s < sh.s; ++s) {
        for (int64_t o = 0; o < sh.o; ++o) {
          const double r = ref_dot(w, o, x.data() + s * sh.i);
          CHECK(std::fabs(y0[s * sh.o + o] - r) <=
                1e-5 * (1 + std::fabs(r)) + 1e-6 * std::sqrt(double(sh.i)));
        }
      }
      for (const auto& name : names) {
        for (int threads : {1, 0}) {
          auto b = backends_named(name, threads);
          std::vector<float> y(y0.size(), NAN);
          b.dense->matmul(w.view(), x.data(), sh.s, y.data());
          CAPTURE(name);
          CAPTURE(threads);
          CHECK(std::memcmp(y.data(), y0.data(), y.size() * 4) == 0);
        }
      }
      if (is_q4(f)) {  // int4 = the float kernel on the dequantized weights, bit for bit
        const HostMatrix fd = dequantized(w);
        std::vector<float> yf(y0.size());
        ref.dense->matmul(fd.view(), x.data(), sh.s, yf.data());
        CHECK(std::memcmp(yf.data(), y0.data(), y0.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("expert_group: every plugin equals cpu_generic, experts with 0, 1, 4 and 64 rows") {
  std::mt19937 rng(99);
  auto ref = backends_named("cpu_generic", 0);
  const auto names = plugins_under_test();
  for (WeightFormat f : kFormats) {
    for (const auto& hidden_ffn : {std::pair<int64_t, int64_t>{24, 40}, {96, 33}, {130, 64}, {200, 129}}) {
      const int64_t hidden = hidden_ffn.first, ffn = hidden_ffn.second;  // (clang 14 cannot capture bindings)
      CAPTURE(weight_format_name(f));
      CAPTURE(hidden);
      CAPTURE(ffn);
      const RandomExpertGroup g(rng, hidden, ffn, 70, {0, 1, 4, 64, 3}, same_format(f, 5));
      const auto want = g.run(*ref.dense);
      // Spot-check the reference against double precision on the 1-row expert.
      {
        const float* xr = g.x.data() + g.rows[1][0] * hidden;
        std::vector<float> h(static_cast<size_t>(ffn));
        for (int64_t j = 0; j < ffn; ++j) {
          const double gate = ref_dot(g.store[3], j, xr), u = ref_dot(g.store[4], j, xr);
          h[j] = static_cast<float>(gate / (1 + std::exp(-gate)) * u);
        }
        for (int64_t o = 0; o < hidden; ++o) {
          const double r = ref_dot(g.store[5], o, h.data());
          CHECK(std::fabs(want[1][o] - r) <= 1e-4 * (1 + std::fabs(r)));
        }
      }
      for (const auto& name : names) {
        for (int threads : {1, 0}) {
          CAPTURE(name);
          CAPTURE(threads);
          auto b = backends_named(name, threads);
          CHECK(g.run(*b.experts.front()) == want);
        }
      }
    }
  }
}

TEST_CASE("bad arguments come back as errors, not crashes") {
  auto b = backends_named("cpu_generic");
  std::mt19937 rng(5);
  const HostMatrix w = random_matrix(rng, WeightFormat::F32, 4, 8);
  std::vector<float> x(16), y(8);
  ExpertMatrices e{w.view(), w.view(), random_matrix(rng, WeightFormat::F32, 8, 4).view()};
  std::vector<int32_t> rows = {0, 5};
  std::vector<float> out(16);
  ExpertTask t{&e, rows, out.data()};
  CHECK_THROWS_WITH_AS(b.dense->expert_group(x.data(), 2, 8, std::span(&t, 1)),
                       doctest::Contains("row index 5 outside [0, 2)"), Error);
  Matrix q = w.view();
  q.format = WeightFormat::Q4_G64;
  CHECK(b.dense->supports_matmul(WeightFormat::Q4_G64));
  CHECK_THROWS_WITH_AS(b.dense->matmul(q, x.data(), 2, y.data()),
                       doctest::Contains("int4 matrix without scales"), Error);
  q.format = static_cast<WeightFormat>(17);
  CHECK(!b.dense->supports_matmul(q.format));
  CHECK_THROWS_WITH_AS(b.dense->matmul(q, x.data(), 2, y.data()),
                       doctest::Contains("is not supported by this backend"), Error);
  ExpertMatrices bad{w.view(), w.view(), w.view()};
  ExpertTask tb{&bad, std::span<const int32_t>(rows.data(), 1), out.data()};
  CHECK_THROWS_WITH_AS(b.dense->expert_group(x.data(), 2, 8, std::span(&tb, 1)),
                       doctest::Contains("inconsistent gate/up/down shapes"), Error);
}
