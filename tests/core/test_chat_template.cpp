// Chat templates: real model templates and feature snippets against Python jinja2 (cases.json), loading from
// tokenizer_config.json, and errors that name the construct and the template line.
#include <ctime>
#include <map>

#include "strata/chat_template.hpp"
#include "strata/error.hpp"
#include "test_util.hpp"

using namespace strata;
using namespace strata::test;
using ojson = nlohmann::ordered_json;

#define CHECK_CONTAINS(expr, sub)                                        \
  do {                                                                   \
    const std::string got_ = (expr);                                     \
    CHECK_MESSAGE(got_.find(sub) != std::string::npos, "got: " << got_); \
  } while (0)

namespace {

fs::path templates_dir() {
  return fixtures_dir() / "chat_templates";
}

const ojson& cases() {
  static const ojson c = ojson::parse(read_text(templates_dir() / "cases.json"));
  return c;
}

std::optional<std::string> token(const ojson& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  return cfg[key].is_string() ? cfg[key].get<std::string>() : cfg[key]["content"].get<std::string>();
}

ChatTemplate load_fixture(const std::string& name) {
  ChatTemplate t(read_text(templates_dir() / (name + ".jinja")));
  const ojson cfg = ojson::parse(read_text(templates_dir() / (name + ".json")));
  t.set_special_tokens(token(cfg, "bos_token"), token(cfg, "eos_token"));
  return t;
}

std::string render_snippet(const std::string& source) {
  return ChatTemplate(source).render(ojson::array(), false, cases()["snippet_context"]);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("real chat templates render exactly as transformers' jinja2 environment does") {
  std::map<std::string, ChatTemplate> templates;
  size_t n = 0, errors = 0;
  for (const auto& c : cases()["cases"]) {
    const std::string name = c["template"].get<std::string>();
    if (templates.count(name) == 0) templates.emplace(name, load_fixture(name));
    const ChatTemplate& t = templates.at(name);
    CAPTURE(name);
    CAPTURE(c["name"].get<std::string>());
    if (c.contains("expected_error")) {
      // jinja2 raised (e.g. the original Qwen3 template on content=None); strata must refuse too.
      CAPTURE(c["expected_error"].get<std::string>());
      CHECK_THROWS_AS(t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]), Error);
      ++errors;
    } else {
      const std::string got = t.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
      CHECK(got == c["expected"].get<std::string>());
    }
    ++n;
  }
  CHECK(templates.size() >= 5);
  CHECK(n >= 100);
  CHECK(errors >= 1);
}

TEST_CASE(
    "feature snippets match jinja2: whitespace control, expressions, loops, macros, filters, tests, "
    "methods") {
  for (const auto& s : cases()["snippets"]) {
    const std::string src = s["source"].get<std::string>();
    CAPTURE(src);
    if (s.contains("expected_error")) {
      CAPTURE(s["expected_error"].get<std::string>());
      CHECK_THROWS_AS(render_snippet(src), Error);
    } else {
      std::string got;
      CHECK_NOTHROW(got = render_snippet(src));
      CHECK(got == s["expected"].get<std::string>());
    }
  }
}

TEST_CASE("where Python has no limit, the interpreter stops with an error naming it (fuzz/ findings)") {
  struct Case {
    const char* source;
    const char* expected_in_error;
  };
  for (const Case c : {
           Case{"{{ 2 ** 63 }}", "integer overflow in ** (template integers are 64-bit)"},
           Case{"{{ 2 ** 1000000000000000000 }}", "integer overflow in **"},  // by squaring, not 10^18 steps
           Case{"{{ 9223372036854775807 + 1 }}", "integer overflow in +"},
           Case{"{{ -9223372036854775807 - 2 }}", "integer overflow in -"},
           Case{"{{ 4611686018427387904 * 2 }}", "integer overflow in *"},
           Case{"{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow in //"},
           Case{"{{ -(-9223372036854775807 - 1) }}", "integer overflow in unary -"},
           Case{"{{ (-9223372036854775807 - 1)|abs }}", "integer overflow in abs"},
           Case{"{{ 1e19|int }}", "int(1e+19) is beyond 64-bit integers"},
           Case{"{{ '1e300'|int }}", "is beyond 64-bit integers"},
           Case{"{{ 'ab' * 100000000 }}", "beyond the interpreter's limit of 67108864 elements"},
           Case{"{{ [1, 2] * 40000000 }}", "beyond the interpreter's limit"},
           Case{"{{ '%9999999999s'|format('x') }}", "format width is too large (at most 1048576)"},
           Case{"{{ '%.99999999999f'|format(1.5) }}", "format precision is too large"},
           Case{"{{ '%5-3s'|format('x') }}", "unsupported format specification '%5-3'"},
           Case{"{{ '%0\\x00e'|format(1.5) }}",
                "unsupported format character"},  // a NUL once passed for a flag
       }) {
    const std::string src = c.source;
    const std::string err = error_of([&] { render_snippet(src); });
    CAPTURE(src);
    CAPTURE(err);
    CHECK(err.find(c.expected_in_error) != std::string::npos);
  }
  // Nesting and running time (each crashed the process with a stack overflow or ran for minutes before).
  const std::string deep_parens = "{{ " + std::string(20000, '(') + "1" + std::string(20000, ')') + " }}";
  CHECK(error_of([&] { render_snippet(deep_parens); }).find("expressions nest deeper than 200 levels") !=
        std::string::npos);
  CHECK(error_of([&] { render_snippet("{{ " + std::string(50000, '-') + "1 }}"); }).find("nest deeper") !=
        std::string::npos);
  std::string deep_blocks;
  for (int k = 0; k < 5000; ++k) deep_blocks += "{% if true %}";
  CHECK(error_of([&] { render_snippet(deep_blocks); }).find("blocks nest deeper than 200 levels") !=
        std::string::npos);
  CHECK(error_of([&] {
          render_snippet(
              "{% set ns = namespace(x=0) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
              "{% endfor %}{{ ns.x }}");
        }).find("values nest deeper than 512 levels") != std::string::npos);
  // A namespace holding itself (directly, in a list, or through another namespace) was a cycle of shared
  // pointers: printing it recursed without end, and it was never freed (LeakSanitizer, per render).
  // Namespaces may not hold namespaces at all (jinja2 allows it; no chat template does it).
  for (const char* src : {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
                          "{% set ns = namespace() %}{% set ns.xs = [1, [ns]] %}",
                          "{% set a = namespace() %}{% set b = namespace(a=a) %}",
                          "{% set a = namespace() %}{% set b = namespace() %}{% set b.d = {'x': [a]} %}"}) {
    CAPTURE(std::string(src));
    CHECK(error_of([&] { render_snippet(src); }).find("a namespace cannot hold another namespace") !=
          std::string::npos);
  }
  CHECK(render_snippet("{% set a = namespace(n=1, l=[[1], {'k': 2}]) %}{% set xs = [a, a] %}{{ xs[1].n }}"
                       "{{ a.l[1].k }}") == "12");  // namespaces inside lists and dicts are fine
  CHECK(error_of([&] {
          render_snippet("{% for a in range(100000) %}{% for b in range(100) %}{% endfor %}{% endfor %}");
        }).find("more than 250000 loop iterations") != std::string::npos);
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "hi", "x": )" + std::string(100000, '[') +
                                  std::string(100000, ']') + "}]");
  CHECK(error_of([&] {
          ChatTemplate("{{ messages }}").render(msgs, false);
        }).find("nests deeper than 512 levels") != std::string::npos);
  // Up to the limits, the same operations work.
  CHECK(render_snippet("{{ 2 ** 62 + (2 ** 62 - 1) }}") == "9223372036854775807");
  CHECK(render_snippet("{{ ('%20s'|format('x'))|length }}") == "20");
}

TEST_CASE("from_tokenizer_config: string, list with default, chat_template.jinja, special token forms") {
  TempDir dir;
  const std::string qwen = read_text(templates_dir() / "qwen3.jinja");
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "Hi"}])");

  ojson cfg = ojson::parse(read_text(templates_dir() / "deepseek_v3.json"));
  cfg["chat_template"] = read_text(templates_dir() / "deepseek_v3.jinja");
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  auto ds = ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json");
  CHECK(ds.bos_token() == "<｜begin▁of▁sentence｜>");
  CHECK(ds.eos_token() == "<｜end▁of▁sentence｜>");
  CHECK(ds.render(msgs, true) == "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");

  cfg = ojson::object();
  cfg["bos_token"] = nullptr;
  cfg["eos_token"] = "<|im_end|>";
  cfg["chat_template"] = ojson::array(
      {{{"name", "tool_use"}, {"template", "TOOLS"}}, {{"name", "default"}, {"template", qwen}}});
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  auto q = ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json");
  CHECK(q.bos_token().empty());
  CHECK(q.eos_token() == "<|im_end|>");
  CHECK(q.render(msgs, true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(q.render(msgs, true, ojson{{"enable_thinking", false}}) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // bos_token is left undefined when the tokenizer has none (transformers leaves it out of the context).
  CHECK(ChatTemplate("{{ bos_token is defined }}").render(msgs, false) == "False");

  cfg.erase("chat_template");
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  write_text(dir.path() / "chat_template.jinja", "[gMASK]<sop>{{ messages[0].content }}{{ eos_token }}\n");
  CHECK(ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json").render(msgs, false) ==
        "[gMASK]<sop>Hi<|im_end|>");
  fs::remove(dir.path() / "chat_template.jinja");
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json"),
                       doctest::Contains("no \"chat_template\" and there is no chat_template.jinja"), Error);

  cfg["chat_template"] = ojson::array({{{"name", "tool_use"}, {"template", "x"}}});
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json"),
                       doctest::Contains("no template named \"default\" (it has: tool_use)"), Error);
  cfg["chat_template"] = 7;
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json"),
                       doctest::Contains("must be a string or a list"), Error);
  cfg["chat_template"] = "x";
  cfg["eos_token"] = 3;
  write_text(dir.path() / "tokenizer_config.json", cfg.dump());
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(dir.path() / "tokenizer_config.json"),
                       doctest::Contains("'eos_token' must be a string or an object"), Error);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(dir.path() / "missing.json"),
                       doctest::Contains("cannot open"), Error);
}

TEST_CASE("render context: messages, tools, documents, add_generation_prompt, extra keys, key order") {
  const nlohmann::json msgs = nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
  ChatTemplate t("{{ messages|length }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ flag }}");
  CHECK(t.render(msgs, true) == "1|None|None|True|");
  CHECK(t.render(msgs, false, {{"flag", 3}, {"tools", {1}}}) == "1|[1]|None|False|3");
  CHECK_THROWS_WITH_AS(t.render(msgs, false, {{"messages", 1}}),
                       doctest::Contains("extra variable 'messages'"), Error);
  CHECK_THROWS_WITH_AS(t.render(nlohmann::json::object(), false),
                       doctest::Contains("messages must be a JSON array"), Error);
  // tojson keeps the caller's key order with ordered_json; nlohmann::json has already sorted the keys.
  ChatTemplate j("{{ messages[0]|tojson }}");
  CHECK(j.render(ojson::parse(R"([{"role": "user", "content": "é"}])"), false) ==
        R"({"role": "user", "content": "é"})");
  CHECK(j.render(nlohmann::json::parse(R"([{"role": "user", "content": "é"}])"), false) ==
        R"({"content": "é", "role": "user"})");
}

TEST_CASE("strftime_now formats the current local time") {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char year[8];
  std::strftime(year, sizeof year, "%Y", &tm);
  const std::string out = ChatTemplate("{{ strftime_now('%Y') }}").render(ojson::array(), false);
  CHECK(out.size() == 4);
  CHECK((out == year || std::stoi(out) == std::stoi(year) + 1));  // a year boundary between the two calls
}

TEST_CASE("syntax errors and unsupported constructs name the construct and the line") {
  auto parse = [](const std::string& src) { return error_of([&] { ChatTemplate t(src); }); };
  CHECK(parse("a\n{% include 'x.jinja' %}") ==
        std::string(
            "[chat_template] line 2: unsupported tag '{% include %}' (supported tags: if/elif/else/endif, "
            "for/else/endfor, set/endset, macro/endmacro, filter/endfilter, with/endwith, raw/endraw, break, "
            "continue, generation/endgeneration)"));
  CHECK_CONTAINS(parse("\n\n{% frobnicate %}"), "line 3: unknown tag '{% frobnicate %}'");
  CHECK_CONTAINS(parse("{% extends 'base' %}"), "line 1: unsupported tag '{% extends %}'");
  CHECK_CONTAINS(parse("{% call m() %}x{% endcall %}"), "unsupported tag '{% call %}'");
  CHECK_CONTAINS(parse("x\n{{ y | frob }}"), "line 2: no filter named 'frob'");
  CHECK_CONTAINS(parse("{% if x is frob %}{% endif %}"), "line 1: no test named 'frob'");
  CHECK_CONTAINS(parse("a\n{% if x %}\nb"), "line 2: '{% if %}' is never closed (expected '{% endif %}')");
  CHECK_CONTAINS(parse("{% for x in y %}"), "'{% for %}' is never closed");
  CHECK_CONTAINS(parse("a\n\n{% endif %}"), "line 3: unexpected '{% endif %}'");
  CHECK_CONTAINS(parse("{{ 1 + }}"), "line 1: expected an expression, got end of tag");
  CHECK_CONTAINS(parse("{{ x"), "unclosed '{{': missing '}}'");
  CHECK_CONTAINS(parse("{# never closed"), "unclosed comment");
  CHECK_CONTAINS(parse("{{ 'abc }}"), "unterminated string literal");
  CHECK_CONTAINS(parse("{{ f(*args) }}"), "'*args' / '**kwargs' in calls are not supported");
  CHECK_CONTAINS(parse("{% for x in y recursive %}{% endfor %}"), "recursive for loops are not supported");
  CHECK_CONTAINS(parse("{{ a ? b }}"), "unexpected character '?'");
  CHECK_CONTAINS(parse("{% raw %}never ended"), "without '{% endraw %}'");
  CHECK_CONTAINS(parse("{% set x %}"), "'{% set %}' is never closed");
}

TEST_CASE("runtime errors name the template line") {
  auto run = [](const std::string& src) {
    return error_of([&] { ChatTemplate(src).render(ojson::parse(R"([{"role": "tool"}])"), false); });
  };
  CHECK(run("ok\n{{ raise_exception('Only user and assistant roles are supported!') }}") ==
        "[chat_template] line 2: raise_exception: Only user and assistant roles are supported!");
  CHECK(run("\n\n{{ nothing.attr }}") == "[chat_template] line 3: 'nothing' is undefined");
  CHECK(run("{{ messages[0].content.strip() }}") ==
        "[chat_template] line 1: 'dict object' has no attribute 'content'");
  CHECK(run("{{ 1 / 0 }}") == "[chat_template] line 1: division by zero");
  CHECK(run("{{ 'a' + 1 }}") == "[chat_template] line 1: can only concatenate str (not \"int\") to str");
  CHECK(run("{% for m in messages %}\n{{ m.role + m.nope }}{% endfor %}") ==
        "[chat_template] line 2: 'dict object' has no attribute 'nope'");
  CHECK(run("{% set ns = namespace(l=[]) %}{{ ns.l.append(1) }}") ==
        "[chat_template] line 1: access to attribute 'append' of 'list' object is unsafe.");
  CHECK(run("{% set x = 1 %}{% set x.a = 2 %}") ==
        "[chat_template] line 1: cannot assign attribute on non-namespace object");
  CHECK(run("{% macro m() %}\n\n{{ raise_exception('in macro') }}{% endmacro %}\n{{ m() }}") ==
        "[chat_template] line 3: raise_exception: in macro");
  CHECK(run("{{ messages|tojson }}{{ nothing|tojson }}") ==
        "[chat_template] line 1: Object of type Undefined is not JSON serializable");
}

TEST_CASE("interpreter details beyond the fixtures") {
  auto r = [](const std::string& src) { return ChatTemplate(src).render(ojson::array(), false); };
  CHECK(r("{% for i in range(3) %}{{ i }}{% endfor %}") == "012");
  CHECK(r("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i > 2 %}{% break %}{% endif %}"
          "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") == "3");
  CHECK(r("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}") == "321");
  CHECK(r("{{ '%s-%s' % ('a', 'b') }}|{{ '%d%%' % 5 }}") == "a-b|5%");
  CHECK(r("{{ {'a': {'b': [1, {'c': 'd'}]}}.a.b[1].c }}") == "d");
  CHECK(r("{{ 'x' if none_var is none else 'y' }}") == "y");
  CHECK(r("{% set d = {'k': 1} %}{{ d.get('k') }}{{ d.get('z', 2) }}{{ d.items()|list }}") == "12[('k', 1)]");
  CHECK(r("{{ 9007199254740993 }}|{{ -2 ** 2 }}|{{ 2 ** -1 }}") == "9007199254740993|4|0.5");
  CHECK(r("  {%- if true %}\n  x\n  {%- endif %}  ") == "  x  ");
  CHECK(r("{{ 'a' }}\n{# c #}\n{{ 'b' }}") == "a\nb");
}
