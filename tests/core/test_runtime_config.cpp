// YAML runtime config: accepted forms, and clear errors with the line for unknown keys, wrong types, bad
// YAML.
#include "strata/error.hpp"
#include "strata/runtime_config.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;

TEST_CASE("a full config parses") {
  const auto cfg = parse_runtime_config(R"(
plugins:
  path: [extra, /opt/strata/plugins]
backends:
  dense: cpu_generic
  experts: [cpu_avx512, cpu_generic]
memory:
  vram_gb: auto
  ram_gb: 48
  reserve_gb: 2.5
  pin: none
scheduler:
  threads: 8
  overlap: false
)",
                                        "/etc/strata/x.yaml");
  REQUIRE(cfg.plugins.path.size() == 2);
  CHECK(cfg.plugins.path[0] == fs::path("/etc/strata/extra"));
  CHECK(cfg.plugins.path[1] == fs::path("/opt/strata/plugins"));
  CHECK(cfg.backends.dense == std::vector<std::string>{"cpu_generic"});
  CHECK(cfg.backends.experts == std::vector<std::string>{"cpu_avx512", "cpu_generic"});
  CHECK(!cfg.memory.vram_gb.has_value());
  CHECK(cfg.memory.ram_gb.value() == 48);
  CHECK(cfg.memory.reserve_gb == 2.5);
  CHECK(cfg.memory.pin == "none");
  CHECK(cfg.scheduler.threads == 8);
  CHECK(!cfg.scheduler.overlap);
}

TEST_CASE("a config path that is a directory is refused by name") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(load_runtime_config(tmp.path()), doctest::Contains("it is a directory"), Error);
}

TEST_CASE("backends.dense: a name or a preference list") {
  CHECK(parse_runtime_config("backends: {dense: [cpu_vnni, auto]}", "d.yaml").backends.dense ==
        std::vector<std::string>{"cpu_vnni", "auto"});
  CHECK(parse_runtime_config("backends: {dense: cpu_avx512}", "d.yaml").backends.dense ==
        std::vector<std::string>{"cpu_avx512"});
  CHECK_THROWS_WITH_AS(parse_runtime_config("backends: {dense: []}", "d.yaml"),
                       doctest::Contains("'backends.dense' is an empty list"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("backends: {dense: {a: 1}}", "d.yaml"),
                       doctest::Contains("'backends.dense' must be a string or a list of strings"), Error);
}

TEST_CASE("empty config gives defaults; the shipped configs parse") {
  const auto cfg = parse_runtime_config("", "empty.yaml");
  CHECK(cfg.backends.dense == std::vector<std::string>{"auto"});
  CHECK(cfg.backends.experts.empty());
  CHECK(cfg.scheduler.threads == 0);
  for (const auto& e : fs::directory_iterator(fs::path(STRATA_SOURCE_DIR) / "configs")) {
    CAPTURE(e.path().string());
    CHECK_NOTHROW(load_runtime_config(e.path()));
  }
}

TEST_CASE("errors name the file, the line and what was expected") {
  CHECK_THROWS_WITH_AS(
      parse_runtime_config("backends:\n  dense: cpu_generic\n  expert: [x]\n", "c.yaml"),
      doctest::Contains("c.yaml:3: unknown key 'backends.expert' (expected one of: dense, experts)"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("colour: blue\n", "c.yaml"),
                       doctest::Contains("c.yaml:1: unknown key 'colour'"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("scheduler:\n  threads: many\n", "c.yaml"),
                       doctest::Contains("c.yaml:2: 'scheduler.threads' must be a number"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("scheduler:\n  threads: 2.5\n", "c.yaml"),
                       doctest::Contains("non-negative integer"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("scheduler:\n  overlap: maybe\n", "c.yaml"),
                       doctest::Contains("'scheduler.overlap' must be true or false"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("memory:\n  ram_gb: lots\n", "c.yaml"),
                       doctest::Contains("c.yaml:2: 'memory.ram_gb' must be 'auto' or a non-negative number"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("backends: [a, b]\n", "c.yaml"),
                       doctest::Contains("'backends' must be a mapping"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("backends:\n  dense: [a\n", "c.yaml"),
                       doctest::Contains("malformed YAML"), Error);
  CHECK_THROWS_WITH_AS(load_runtime_config("/nonexistent/strata.yaml"), doctest::Contains("cannot open"),
                       Error);
  // Found by fuzz/fuzz_runtime_config: a list or mapping as a key, and non-finite numbers.
  CHECK_THROWS_WITH_AS(parse_runtime_config("plugins:\n  [a]: [b]\n", "c.yaml"),
                       doctest::Contains("c.yaml:2: a key of 'plugins' is a list; expected a plain name"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("{a: 1}: 2\n", "c.yaml"),
                       doctest::Contains("a key of 'the top level' is a mapping"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("memory:\n  ram_gb: .nan\n", "c.yaml"),
                       doctest::Contains("'memory.ram_gb' must be 'auto' or a non-negative number"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("scheduler:\n  threads: 3e35\n", "c.yaml"),
                       doctest::Contains("non-negative integer (0 = all cores) up to 65536"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("disk:\n  queue_depth: 1e300\n", "c.yaml"),
                       doctest::Contains("an integer from 1 to 4096"), Error);
  CHECK_THROWS_WITH_AS(parse_runtime_config("memory:\n  reserve_gb: .inf\n", "c.yaml"),
                       doctest::Contains("'memory.reserve_gb' must be a number"), Error);
}

TEST_CASE("the disk section: direct_io true/false/auto, queue depth, engine; bad values name the key") {
  const auto cfg =
      parse_runtime_config("disk:\n  direct_io: true\n  queue_depth: 64\n  engine: pread\n", "d.yaml");
  CHECK(cfg.disk.direct_io == "true");
  CHECK(cfg.disk.queue_depth == 64);
  CHECK(cfg.disk.engine == "pread");
  CHECK(parse_runtime_config("disk:\n  direct_io: auto\n", "d.yaml").disk.direct_io == "auto");
  CHECK(parse_runtime_config("disk:\n  direct_io: false\n", "d.yaml").disk.direct_io == "false");
  const RuntimeConfig def;
  CHECK(def.disk.direct_io == "auto");
  CHECK(def.disk.queue_depth == 32);
  for (const char* bad :
       {"disk:\n  queue_depth: 0\n", "disk:\n  queue_depth: 2.5\n", "disk:\n  engine: aio\n",
        "disk:\n  direct_io: sometimes\n", "disk:\n  prefetch: true\n"}) {
    CAPTURE(bad);
    try {
      (void)parse_runtime_config(bad, "d.yaml");
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK(m.find("d.yaml:2") != std::string::npos);
      CHECK(m.find("disk.") != std::string::npos);
    }
  }
}
