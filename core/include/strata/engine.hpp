// The serving engine: a bounded queue of generation requests and one scheduler thread that prefills new
// sequences and decodes all active ones together (one batched forward pass per step, batch union of experts).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/generation.hpp"
#include "strata/model.hpp"

namespace strata {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::vector<std::string> stop;
  int64_t max_new = 256;
};

struct GenerationResult {
  std::vector<int32_t> ids;
  std::string text;
  std::string finish_reason;  // stop | length | cancelled | error
  std::string error;          // when finish_reason == "error"
  int64_t prompt_tokens = 0;
  double ttft_s = 0, total_s = 0;
};

// Shared by the engine and whoever submitted the request. Thread-safe.
class RequestState {
 public:
  // Blocks until text arrives, the request ends, or the timeout passes. Returns new text in *chunk (maybe
  // empty) and false once the request has ended and all its text was taken.
  bool next(std::string* chunk, std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  GenerationResult wait();  // blocks until the end
  GenerationResult result() const;

 private:
  friend class Engine;
  void push(const std::string& text);
  void finish(GenerationResult r);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  bool ended_ = false;
  GenerationResult result_;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  int max_active = 8;  // sequences decoded together
  int max_queue = 16;  // waiting requests beyond which submit refuses (HTTP 429)
  int threads = 0;
};

struct EngineStats {
  int64_t requests = 0, completed = 0, cancelled = 0, rejected = 0, generated_tokens = 0, prompt_tokens = 0;
  int queued = 0, active = 0;
  double decode_tok_per_s = 0;  // over the last decode steps
};

class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, std::shared_ptr<const ModelAssets> assets,
         EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; throws QueueFull when the queue is at max_queue, strata::Error for a bad request (empty
  // or too-long prompt, bad sampling parameters).
  std::shared_ptr<RequestState> submit(GenerationRequest req);
  EngineStats stats() const;
  const ModelAssets& assets() const { return *assets_; }
  const Model& model() const { return *model_; }

 private:
  struct Active;
  void loop();
  std::shared_ptr<const Model> model_;
  std::shared_ptr<const ModelAssets> assets_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestState>>> queue_;
  bool stop_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace strata
