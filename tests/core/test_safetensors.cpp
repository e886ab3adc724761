// safetensors reader and writer: round trip, sharded sets, and every malformed-file error names file and
// tensor.
#include <cstring>

#include "strata/error.hpp"
#include "strata/json_text.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

namespace {

std::vector<std::byte> raw_file(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void write_raw(const fs::path& p, const std::vector<std::byte>& b) {
  write_file_atomic(p, b);
}

}  // namespace

TEST_CASE("round trip of every dtype and shape") {
  TempDir tmp;
  std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  std::vector<uint16_t> h = {0x3f80, 0xc000};
  std::vector<int32_t> i = {1, -2, 3};
  std::vector<uint8_t> u = {9, 8, 7, 6, 5};
  const fs::path p = tmp.path() / "a.safetensors";
  write_safetensors(p,
                    {{"f", DType::F32, {2, 3}, std::as_bytes(std::span(f))},
                     {"h", DType::BF16, {2}, std::as_bytes(std::span(h))},
                     {"g", DType::F16, {2}, std::as_bytes(std::span(h))},
                     {"i", DType::I32, {3}, std::as_bytes(std::span(i))},
                     {"u", DType::U8, {5}, std::as_bytes(std::span(u))},
                     {"empty", DType::F32, {0, 4}, {}}},
                    {{"format", "pt"}});
  SafetensorsFile r(p);
  CHECK(r.tensors().size() == 6);
  CHECK(r.metadata().at("format") == "pt");
  const TensorInfo* t = r.find("f");
  REQUIRE(t);
  CHECK(t->dtype == DType::F32);
  CHECK(t->shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(r.data(*t), f.data(), 24) == 0);
  CHECK(r.find("u")->nbytes == 5);
  CHECK(std::memcmp(r.data(*r.find("u")), u.data(), 5) == 0);
  CHECK(r.find("empty")->numel() == 0);
  CHECK(r.find("nope") == nullptr);
}

TEST_CASE("truncated files are errors naming the file and the tensor") {
  TempDir tmp;
  std::vector<float> f(64, 1.0f);
  const fs::path p = tmp.path() / "t.safetensors";
  write_safetensors(p, {{"weight", DType::F32, {8, 8}, std::as_bytes(std::span(f))}});
  const auto full = read_text(p);
  write_text(p, full.substr(0, full.size() - 10));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("t.safetensors: tensor 'weight'"), Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("truncated"), Error);
  write_text(p, full.substr(0, 5));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("too short"), Error);
  write_text(p, full.substr(0, 40));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("header length"), Error);
}

TEST_CASE("malformed headers") {
  TempDir tmp;
  const fs::path p = tmp.path() / "m.safetensors";
  write_raw(p, raw_file("{not json", 0));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("not valid JSON"), Error);
  write_raw(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("needs 16 bytes but data_offsets span 12"),
                       Error);
  write_raw(p, raw_file(R"({"w":{"dtype":"Q9","shape":[2],"data_offsets":[0,2]}})", 2));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("unsupported dtype 'Q9'"), Error);
  write_raw(p, raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("non-negative"), Error);
  write_raw(p, raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("reversed"), Error);
  write_raw(
      p,
      raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("overlap"), Error);
  write_raw(p, raw_file(R"({"w":{"dtype":"F32","shape":[1]}})", 4));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("tensor 'w'"), Error);
  write_raw(p, raw_file(R"([1,2])", 0));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p}, doctest::Contains("JSON object"), Error);
  // 100 000 nested arrays in a metadata value: refused before the parse (copies of it overflowed the stack)
  write_raw(
      p,
      raw_file(R"({"__metadata__":{"x":)" + std::string(100000, '[') + std::string(100000, ']') + "}}", 0));
  CHECK_THROWS_WITH_AS(SafetensorsFile{p},
                       doctest::Contains("header: arrays and objects nest deeper than 128"), Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile{tmp.path() / "absent.safetensors"}, doctest::Contains("cannot open"),
                       Error);
}

TEST_CASE("sharded checkpoints through model.safetensors.index.json") {
  TempDir tmp;
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_safetensors(tmp.path() / "model-00001-of-00002.safetensors",
                    {{"a", DType::F32, {2}, std::as_bytes(std::span(a))}});
  write_safetensors(tmp.path() / "model-00002-of-00002.safetensors",
                    {{"b", DType::F32, {3}, std::as_bytes(std::span(b))}});
  write_text(
      tmp.path() / "model.safetensors.index.json",
      R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  SafetensorsSet set(tmp.path());
  CHECK(set.size() == 2);
  REQUIRE(set.find("b"));
  CHECK(std::memcmp(set.find("b")->data(), b.data(), 12) == 0);
  CHECK(set.find("b")->file->path().filename() == "model-00002-of-00002.safetensors");

  write_text(
      tmp.path() / "model.safetensors.index.json",
      R"({"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00003-of-00003.safetensors"}})");
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()},
                       doctest::Contains("shard 'model-00003-of-00003.safetensors'"), Error);
  write_text(tmp.path() / "model.safetensors.index.json",
             R"({"weight_map":{"zz":"model-00001-of-00002.safetensors"}})");
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()}, doctest::Contains("tensor 'zz' is listed"), Error);
  write_text(tmp.path() / "model.safetensors.index.json", R"({"weight_map":[]})");
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()}, doctest::Contains("weight_map"), Error);
  write_text(tmp.path() / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()}, doctest::Contains("not a plain file name"), Error);
}

TEST_CASE("unindexed folders: all *.safetensors, duplicates are errors") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()}, doctest::Contains("no *.safetensors"), Error);
  std::vector<float> a = {1, 2};
  write_safetensors(tmp.path() / "x.safetensors", {{"a", DType::F32, {2}, std::as_bytes(std::span(a))}});
  CHECK(SafetensorsSet(tmp.path()).size() == 1);
  write_safetensors(tmp.path() / "y.safetensors", {{"a", DType::F32, {2}, std::as_bytes(std::span(a))}});
  CHECK_THROWS_WITH_AS(SafetensorsSet{tmp.path()}, doctest::Contains("appears in both"), Error);
}

TEST_CASE("atomic writes never leave a half file in place") {
  TempDir tmp;
  const fs::path p = tmp.path() / "out.safetensors";
  std::vector<float> a = {1, 2};
  write_safetensors(p, {{"a", DType::F32, {2}, std::as_bytes(std::span(a))}});
  const std::string before = read_text(p);
  // A tensor whose bytes do not match its shape is refused before anything is written.
  CHECK_THROWS_AS(write_safetensors(p, {{"a", DType::F32, {3}, std::as_bytes(std::span(a))}}), Error);
  CHECK(read_text(p) == before);
  // Writing into a folder that does not exist fails and leaves nothing behind.
  CHECK_THROWS_AS(write_file_atomic(tmp.path() / "missing" / "f", std::as_bytes(std::span(a))), Error);
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++n;
  CHECK(n == 1);
}

TEST_CASE("json_nesting: arrays and objects, not brackets inside strings") {
  CHECK(json_nesting("") == 0);
  CHECK(json_nesting("42") == 0);
  CHECK(json_nesting(R"({"a": [1, {"b": []}]})") == 4);
  CHECK(json_nesting(R"(["[[[[", "\"[[", "\\", [1]])") == 2);  // an escaped quote, an escaped backslash
  CHECK(json_nesting(std::string(200, '[')) == 200);           // malformed: scanned as far as it goes
}
