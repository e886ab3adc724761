// strata serve: an OpenAI-compatible HTTP API (cpp-httplib) over the serving engine. The port is bound before
// the model loads (requests meanwhile get 503), bad requests get 4xx JSON errors, streams end when the client
// leaves.
#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "commands.hpp"
#include "strata/engine.hpp"
#include "strata/error.hpp"
#include "strata/json_text.hpp"

namespace strata::app {
namespace {

using json = nlohmann::ordered_json;  // keeps request key order (tool schemas render as HF renders them)
using Clock = std::chrono::steady_clock;

httplib::Server* g_server = nullptr;
void on_stop(int) {
  if (g_server != nullptr) g_server->stop();
}

struct HttpError {
  HttpError(int s, std::string m, std::string t = "invalid_request_error", std::string p = "",
            std::string c = "")
      : status(s), message(std::move(m)), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}
  int status;
  std::string message;
  std::string type;
  std::string param;
  std::string code;
};

// JSON text that never throws: invalid UTF-8 (from a client body or a file name) becomes U+FFFD.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json error_body(const HttpError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
  throw HttpError{400, message, "invalid_request_error", param, code};
}

// Typed accessors for request fields: a known field with the wrong type is a 400 naming the field.
std::optional<double> number_field(const json& b, const char* k, double lo, double hi) {
  if (!b.contains(k) || b[k].is_null()) return std::nullopt;
  if (!b[k].is_number()) bad(k, fmt::format("'{}' must be a number", k));
  const double v = b[k].get<double>();
  if (!(v >= lo && v <= hi)) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, v));
  return v;
}

std::optional<int64_t> int_field(const json& b, const char* k, int64_t lo, int64_t hi) {
  if (!b.contains(k) || b[k].is_null()) return std::nullopt;
  if (!b[k].is_number_integer()) bad(k, fmt::format("'{}' must be an integer", k));
  const int64_t v = b[k].get<int64_t>();
  if (v < lo || v > hi) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, v));
  return v;
}

bool bool_field(const json& b, const char* k, bool def) {
  if (!b.contains(k) || b[k].is_null()) return def;
  if (!b[k].is_boolean()) bad(k, fmt::format("'{}' must be true or false", k));
  return b[k].get<bool>();
}

std::vector<std::string> stop_field(const json& b) {
  std::vector<std::string> out;
  if (!b.contains("stop") || b["stop"].is_null()) return out;
  const json& s = b["stop"];
  if (s.is_string()) {
    out.push_back(s.get<std::string>());
  } else if (s.is_array() && s.size() <= 16) {
    for (const auto& e : s) {
      if (!e.is_string()) bad("stop", "'stop' must be a string or a list of up to 16 strings");
      out.push_back(e.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or a list of up to 16 strings");
  }
  return out;
}

// The text of a message's content: a string, or a list of {"type": "text", "text": ...} parts.
std::string content_text(const json& c, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(param, "message content must be a string or a list of text parts");
  std::string out;
  for (const auto& part : c) {
    // (no part.value("type", ""): it throws when "type" is there but not a string)
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    }
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string random_id(const char* prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::lock_guard lk(mu);
  return fmt::format("{}-{:016x}", prefix, rng());
}

class Server {
 public:
  Server(const ModelOptions& mo, const GenOptions& go, const ServeOptions& so) : mo_(mo), go_(go), so_(so) {
    if (so_.api_key.empty()) {
      if (const char* k = std::getenv("STRATA_API_KEY")) so_.api_key = k;
    }
    if (mo_.model.empty()) mo_.model = default_model_dir();
    if (so_.model_name.empty())
      so_.model_name = std::filesystem::path(mo_.model).lexically_normal().filename().string();
    if (so_.model_name.empty()) so_.model_name = "strata";
  }

  int run() {
    httplib::Server svr;
    svr.new_task_queue = [this] {
      return new httplib::ThreadPool(static_cast<size_t>(so_.parallel + so_.queue + 8));
    };
    svr.set_payload_max_length(static_cast<size_t>(so_.max_body_kb) * 1024);
    svr.set_read_timeout(60, 0);
    svr.set_write_timeout(60, 0);
    svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const char* msg = res.status == 404   ? "no such route"
                        : res.status == 413 ? "the request body is too large"
                                            : "request failed";
      send_error(res, HttpError(res.status, msg));
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, HttpError(500, what, "server_error"));
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool ready = engine() != nullptr;
      res.status = ready ? 200 : 503;
      res.set_content(dump(json{{"status", ready ? "ok" : "loading"}}), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); });
    svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&](Engine&) {
        res.set_content(dump(json{{"object", "list"},
                                  {"data", json::array({{{"id", so_.model_name},
                                                         {"object", "model"},
                                                         {"created", created_},
                                                         {"owned_by", "strata"}}})}}),
                        "application/json");
      });
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&](Engine& e) { complete(e, req, res, true); });
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&](Engine& e) { complete(e, req, res, false); });
    });

    if (!svr.bind_to_port(so_.host, so_.port)) {
      fail("serve", "cannot listen on {}:{} (in use, or not an address of this machine)", so_.host, so_.port);
    }
    g_server = &svr;
    std::signal(SIGINT, on_stop);
    std::signal(SIGTERM, on_stop);
    std::thread http([&] { svr.listen_after_bind(); });
    // stop() only takes effect once the listener runs: wait for it, so an early load failure cannot hang
    // here.
    for (int i = 0; i < 500 && !svr.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fmt::print(stderr, "strata serve: listening on http://{}:{} — loading {} ...\n", so_.host, so_.port,
               mo_.model);
    try {
      // Test hook: delay the load so tests can see the 503 answered while loading.
      if (const char* d = std::getenv("STRATA_SERVE_TEST_LOAD_DELAY_MS")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(d)));
      }
      Loaded l = load(mo_, true);
      l.assets->require_tokenizer();
      if (!l.assets->chat_template) {
        fmt::print(stderr,
                   "strata serve: warning: {} has no chat template; /v1/chat/completions will answer 400\n",
                   mo_.model);
      }
      loaded_ = std::make_unique<Loaded>(std::move(l));
      EngineOptions eo;
      eo.max_active = so_.parallel;
      eo.max_queue = so_.queue;
      eo.threads = loaded_->config.scheduler.threads;
      auto eng = std::make_shared<Engine>(loaded_->model, loaded_->assets, eo);
      std::atomic_store(&engine_, eng);
      fmt::print(stderr, "strata serve: ready — model '{}' ({}), {} parallel, queue {}{}\n", so_.model_name,
                 family_name(loaded_->model->spec().family), so_.parallel, so_.queue,
                 so_.api_key.empty() ? "" : ", API key required");
    } catch (const std::exception& e) {
      fmt::print(stderr, "strata: {}\n", e.what());
      svr.stop();
      http.join();
      return 1;
    }
    http.join();
    std::atomic_store(&engine_, std::shared_ptr<Engine>());
    g_server = nullptr;
    return 0;
  }

 private:
  std::shared_ptr<Engine> engine() const { return std::atomic_load(&engine_); }

  // Auth and readiness, then the handler; HttpError and bad requests become JSON errors.
  template <class F>
  void guarded(const httplib::Request& req, httplib::Response& res, F&& f) {
    try {
      if (!so_.api_key.empty()) {
        const std::string auth = req.get_header_value("Authorization");
        if (auth != "Bearer " + so_.api_key) {
          throw HttpError{401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                          "invalid_request_error", "", "invalid_api_key"};
        }
      }
      auto e = engine();
      if (!e)
        throw HttpError{503, "the model is still loading; retry shortly", "server_error", "",
                        "model_loading"};
      f(*e);
    } catch (const HttpError& he) {
      send_error(res, he);
    } catch (const QueueFull& q) {
      send_error(
          res, HttpError(429, std::string("server busy: ") + q.what(), "rate_limit_error", "", "queue_full"));
    } catch (const Error& se) {
      send_error(res, HttpError(400, se.what()));
    }
  }

  void complete(Engine& eng, const httplib::Request& req, httplib::Response& res, bool chat) {
    json body;
    try {
      body = parse_json_text<json>(req.body, "request", "the body");  // too deep: strata::Error, a 400
    } catch (const json::exception& e) {
      bad("", std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) bad("", "the body must be a JSON object");
    if (body.contains("model") && !body["model"].is_string()) bad("model", "'model' must be a string");
    if (body.contains("n") && !body["n"].is_null()) {
      if (!body["n"].is_number_integer() || body["n"].get<int64_t>() != 1)
        bad("n", "only n = 1 is supported");
    }
    const Tokenizer& tok = eng.assets().require_tokenizer();
    std::vector<int32_t> prompt;
    if (chat) {
      if (!eng.assets().chat_template)
        bad("messages", "this model has no chat template; use /v1/completions");
      if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
        bad("messages", "'messages' must be a non-empty list of {role, content} objects");
      }
      json msgs = json::array();
      for (size_t i = 0; i < body["messages"].size(); ++i) {
        const json& m = body["messages"][i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
          bad(fmt::format("messages[{}]", i), "each message needs a string 'role'");
        }
        json out = m;
        out["content"] = content_text(m.value("content", json()), i);
        msgs.push_back(out);
      }
      json extra = json::object();
      if (body.contains("tools") && body["tools"].is_array()) extra["tools"] = body["tools"];
      if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()) {
        for (auto it = body["chat_template_kwargs"].begin(); it != body["chat_template_kwargs"].end(); ++it)
          extra[it.key()] = *it;
      }
      const std::string text = eng.assets().chat_template->render(msgs, true, extra);
      prompt = tok.encode(text, false);
    } else {
      if (!body.contains("prompt") || !body["prompt"].is_string()) bad("prompt", "'prompt' must be a string");
      prompt = tok.encode(body["prompt"].get<std::string>(), true);
      if (prompt.empty()) bad("prompt", "the prompt is empty");
    }
    const int64_t ctx = eng.assets().context_length;
    if (ctx > 0 && static_cast<int64_t>(prompt.size()) >= ctx) {
      bad(chat ? "messages" : "prompt",
          fmt::format("the prompt has {} tokens but this model's context length is {}", prompt.size(), ctx),
          "context_length_exceeded");
    }
    GenerationRequest gr;
    gr.prompt = std::move(prompt);
    gr.sampling = go_.sampling(eng.assets());
    if (auto v = number_field(body, "temperature", 0, 2)) gr.sampling.temperature = static_cast<float>(*v);
    if (auto v = number_field(body, "top_p", 1e-9, 1)) gr.sampling.top_p = static_cast<float>(*v);
    if (auto v = number_field(body, "min_p", 0, 1)) gr.sampling.min_p = static_cast<float>(*v);
    if (auto v = int_field(body, "top_k", 0, 1 << 30)) gr.sampling.top_k = static_cast<int32_t>(*v);
    if (auto v = int_field(body, "seed", INT64_MIN, INT64_MAX)) gr.sampling.seed = static_cast<uint64_t>(*v);
    gr.max_new = go_.max_new;
    if (auto v = int_field(body, "max_tokens", 1, 1 << 30)) gr.max_new = *v;
    if (auto v = int_field(body, "max_completion_tokens", 1, 1 << 30)) gr.max_new = *v;
    gr.stop = stop_field(body);
    const bool stream = bool_field(body, "stream", false);
    bool include_usage = false;
    if (body.contains("stream_options") && body["stream_options"].is_object()) {
      include_usage = bool_field(body["stream_options"], "include_usage", false);
    }
    const int64_t n_prompt = static_cast<int64_t>(gr.prompt.size());
    auto state = eng.submit(std::move(gr));
    const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const std::string object = chat ? "chat.completion" : "text_completion";
    auto usage = [](int64_t p, int64_t c) {
      return json{{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
    };
    if (!stream) {
      const GenerationResult r = state->wait();
      if (r.finish_reason == "error") throw HttpError(500, r.error, "server_error");
      json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
      if (chat)
        choice["message"] = {{"role", "assistant"}, {"content", r.text}};
      else
        choice["text"] = r.text;
      res.set_content(dump(json{{"id", id},
                                {"object", object},
                                {"created", created},
                                {"model", so_.model_name},
                                {"choices", json::array({choice})},
                                {"usage", usage(n_prompt, static_cast<int64_t>(r.ids.size()))}}),
                      "application/json");
      return;
    }
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [=, this](const json& delta_or_text, const json& finish) {
      json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
      if (chat)
        choice["delta"] = delta_or_text;
      else
        choice["text"] = delta_or_text;
      return json{{"id", id},
                  {"object", chunk_object},
                  {"created", created},
                  {"model", so_.model_name},
                  {"choices", json::array({choice})}};
    };
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this, started = false](size_t, httplib::DataSink& sink) mutable {
          auto send = [&](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (!started) {
            started = true;
            if (chat && !send(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))) {
              state->cancel();
              return false;
            }
          }
          std::string text;
          const bool more = state->next(&text, std::chrono::milliseconds(200));
          if (!sink.is_writable()) {
            state->cancel();  // the client went away: free the slot
            return false;
          }
          if (!text.empty()) {
            if (!send(chunk(chat ? json{{"content", text}} : json(text), nullptr))) {
              state->cancel();
              return false;
            }
          }
          if (more) return true;
          const GenerationResult r = state->result();
          if (r.finish_reason == "error") {
            send(error_body(HttpError(500, r.error, "server_error")));
          } else {
            send(chunk(chat ? json::object() : json(""), r.finish_reason));
            if (include_usage) {
              send(json{{"id", id},
                        {"object", chunk_object},
                        {"created", created},
                        {"model", so_.model_name},
                        {"choices", json::array()},
                        {"usage", usage(n_prompt, static_cast<int64_t>(r.ids.size()))}});
            }
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        },
        [state](bool) { state->cancel(); });
  }

  void metrics(httplib::Response& res) {
    auto e = engine();
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
    };
    metric("strata_up", "gauge", "1 when the model is loaded and serving", e ? 1 : 0);
    if (e) {
      const EngineStats s = e->stats();
      metric("strata_requests_total", "counter", "generation requests accepted",
             static_cast<double>(s.requests));
      metric("strata_requests_completed_total", "counter", "requests finished normally",
             static_cast<double>(s.completed));
      metric("strata_requests_cancelled_total", "counter", "requests cancelled (client gone)",
             static_cast<double>(s.cancelled));
      metric("strata_requests_rejected_total", "counter", "requests refused with 429 (queue full)",
             static_cast<double>(s.rejected));
      metric("strata_prompt_tokens_total", "counter", "prompt tokens processed",
             static_cast<double>(s.prompt_tokens));
      metric("strata_generated_tokens_total", "counter", "tokens generated",
             static_cast<double>(s.generated_tokens));
      metric("strata_queue_length", "gauge", "requests waiting for a slot", s.queued);
      metric("strata_active_sequences", "gauge", "sequences being decoded", s.active);
      metric("strata_decode_tokens_per_second", "gauge", "tokens per second of the last batched decode step",
             s.decode_tok_per_s);
      if (const ExpertStore* st = e->model().expert_store()) {
        const StoreTelemetry t = st->telemetry();
        const std::pair<const char*, uint64_t> hits[] = {
            {"vram", t.vram_hits}, {"ram", t.ram_hits}, {"cache", t.cache_hits}, {"disk", t.disk_reads}};
        out +=
            "# HELP strata_expert_uses_total routed (layer, expert) uses by the tier that served them\n"
            "# TYPE strata_expert_uses_total counter\n";
        for (const auto& [tier, n] : hits)
          out += fmt::format("strata_expert_uses_total{{tier=\"{}\"}} {}\n", tier, n);
        metric("strata_expert_disk_bytes_total", "counter", "bytes of expert weights read from disk",
               static_cast<double>(t.disk_bytes));
        metric("strata_expert_gpu_fallbacks_total", "counter", "GPU expert groups recomputed on the CPU",
               static_cast<double>(t.gpu_fallbacks));
        metric("strata_moe_layer_seconds_total", "counter", "time in routed-expert layers", t.layer_s);
      }
    }
    res.set_content(out, "text/plain; version=0.0.4");
  }

  ModelOptions mo_;
  GenOptions go_;
  ServeOptions so_;
  std::unique_ptr<Loaded> loaded_;
  std::shared_ptr<Engine> engine_;
  const int64_t created_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
};

}  // namespace

int cmd_serve(const ModelOptions& o, const GenOptions& g, const ServeOptions& s) {
  return Server(o, g, s).run();
}

}  // namespace strata::app
