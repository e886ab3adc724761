// Serving engine: bounded queue, one scheduler thread, batched prefill of new sequences and batched decode of
// all active ones through forward_batch; text streamed to each request as it becomes final.
#include "strata/engine.hpp"

#include <algorithm>

#include "strata/error.hpp"

namespace strata {

using Clock = std::chrono::steady_clock;

bool RequestState::next(std::string* chunk, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || ended_; });
  chunk->swap(pending_);
  pending_.clear();
  return !(ended_ && chunk->empty());
}

GenerationResult RequestState::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return ended_; });
  return result_;
}

GenerationResult RequestState::result() const {
  std::lock_guard lk(mu_);
  return result_;
}

void RequestState::push(const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard lk(mu_);
    pending_ += text;
  }
  cv_.notify_all();
}

void RequestState::finish(GenerationResult r) {
  {
    std::lock_guard lk(mu_);
    result_ = std::move(r);
    ended_ = true;
  }
  cv_.notify_all();
}

struct Engine::Active {
  std::shared_ptr<RequestState> state;
  std::unique_ptr<Session> session;
  std::unique_ptr<Generation> gen;
  std::vector<int32_t> prompt;
  int32_t last = -1;
  Clock::time_point start;
  double ttft = 0;
};

Engine::Engine(std::shared_ptr<const Model> model, std::shared_ptr<const ModelAssets> assets,
               EngineOptions options)
    : model_(std::move(model)), assets_(std::move(assets)), opt_(options) {
  if (opt_.max_active < 1) opt_.max_active = 1;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestState> Engine::submit(GenerationRequest req) {
  if (req.prompt.empty()) fail("request", "the prompt is empty");
  const int64_t ctx = assets_->context_length > 0 ? assets_->context_length : model_->spec().max_positions;
  if (ctx > 0 && static_cast<int64_t>(req.prompt.size()) >= ctx) {
    fail("request", "the prompt has {} tokens but the context holds {}", req.prompt.size(), ctx);
  }
  if (ctx > 0) req.max_new = std::min<int64_t>(req.max_new, ctx - static_cast<int64_t>(req.prompt.size()));
  check_sampling_params(req.sampling);
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= model_->spec().vocab) fail("request", "token id {} is outside the vocabulary", id);
  }
  auto state = std::make_shared<RequestState>();
  {
    std::lock_guard lk(mu_);
    // Refuse only when the queue is at its limit and no decode slot is free to take the request at once.
    const int waiting = static_cast<int>(queue_.size());
    if (waiting >= opt_.max_queue && stats_.active + waiting >= opt_.max_active) {
      ++stats_.rejected;
      throw QueueFull(fmt::format("the queue is full ({} requests waiting)", queue_.size()));
    }
    queue_.emplace_back(std::move(req), state);
    ++stats_.requests;
    stats_.queued = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return state;
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Engine::loop() {
  std::vector<std::unique_ptr<Active>> active;
  auto retire = [&](Active& a, const std::string& reason, const std::string& error = {}) {
    GenerationResult r;
    r.ids = a.gen ? a.gen->ids() : std::vector<int32_t>{};
    r.text = a.gen ? a.gen->text() : std::string{};
    r.finish_reason = reason;
    r.error = error;
    r.prompt_tokens = static_cast<int64_t>(a.prompt.size());
    r.ttft_s = a.ttft;
    r.total_s = std::chrono::duration<double>(Clock::now() - a.start).count();
    {
      std::lock_guard lk(mu_);
      if (reason == "cancelled")
        ++stats_.cancelled;
      else
        ++stats_.completed;
      stats_.generated_tokens += static_cast<int64_t>(r.ids.size());
      stats_.prompt_tokens += r.prompt_tokens;
    }
    a.state->finish(std::move(r));
    // A request is a turn for the expert tiers: re-placement and saved routing statistics, between passes.
    if (ExpertStore* store = model_->expert_store()) {
      try {
        store->end_turn();
      } catch (const std::exception&) {
        // end_turn reports its own problems (warning once); serving goes on.
      }
    }
  };
  // Applies one forward pass's logits to each sequence; returns false when it finished.
  auto advance = [&](Active& a, const std::vector<float>& logits) {
    if (a.state->cancelled()) {
      a.gen->cancel();
      retire(a, "cancelled");
      return false;
    }
    const int32_t id = a.gen->step(logits);
    a.state->push(a.gen->take_text());
    if (a.gen->done()) {
      retire(a, a.gen->finish_reason());
      return false;
    }
    a.last = id;
    return true;
  };
  for (;;) {
    std::vector<std::unique_ptr<Active>> fresh;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !active.empty(); });
      if (stop_) break;
      while (!queue_.empty() && static_cast<int>(active.size() + fresh.size()) < opt_.max_active) {
        auto [req, state] = std::move(queue_.front());
        queue_.pop_front();
        auto a = std::make_unique<Active>();
        a->state = state;
        a->start = Clock::now();
        a->prompt = std::move(req.prompt);
        try {
          a->session = std::make_unique<Session>(model_, opt_.threads);
          a->gen = std::make_unique<Generation>(assets_->tokenizer, req.sampling, assets_->eos_ids, req.stop,
                                                req.max_new);
        } catch (const std::exception& e) {
          // This request cannot start; it ends with the error and the engine goes on.
          GenerationResult r;
          r.finish_reason = "error";
          r.error = e.what();
          r.prompt_tokens = static_cast<int64_t>(a->prompt.size());
          state->finish(std::move(r));
          continue;
        }
        fresh.push_back(std::move(a));
      }
      stats_.queued = static_cast<int>(queue_.size());
      stats_.active = static_cast<int>(active.size() + fresh.size());
    }
    try {
      // Prefill the new sequences together. A failure here ends only these new sequences.
      if (!fresh.empty()) {
        std::vector<Session*> ss;
        std::vector<std::span<const int32_t>> ids;
        for (auto& a : fresh) {
          ss.push_back(a->session.get());
          ids.emplace_back(a->prompt);
        }
        const auto logits = forward_batch(ss, ids, false);
        for (size_t i = 0; i < fresh.size(); ++i) {
          fresh[i]->ttft = std::chrono::duration<double>(Clock::now() - fresh[i]->start).count();
          if (advance(*fresh[i], logits[i])) {
            active.push_back(std::move(fresh[i]));
          } else {
            fresh[i].reset();
          }
        }
      }
    } catch (const std::exception& e) {
      for (auto& a : fresh) {
        if (a) retire(*a, "error", e.what());
      }
    }
    try {
      // Decode every active sequence by one token, together.
      std::vector<Active*> step;
      for (auto& a : active) {
        if (a->state->cancelled()) {
          a->gen->cancel();
          retire(*a, "cancelled");
          a.reset();
        } else {
          step.push_back(a.get());
        }
      }
      std::erase(active, nullptr);
      if (!step.empty()) {
        std::vector<Session*> ss;
        std::vector<std::span<const int32_t>> ids;
        for (auto* a : step) {
          ss.push_back(a->session.get());
          ids.emplace_back(&a->last, 1);
        }
        const auto t0 = Clock::now();
        const auto logits = forward_batch(ss, ids, false);
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        {
          std::lock_guard lk(mu_);
          stats_.decode_tok_per_s = dt > 0 ? static_cast<double>(step.size()) / dt : 0;
        }
        for (size_t i = 0; i < step.size(); ++i) {
          if (!advance(*step[i], logits[i])) {
            for (auto& a : active) {
              if (a.get() == step[i]) a.reset();
            }
          }
        }
        std::erase(active, nullptr);
      }
    } catch (const std::exception& e) {
      // A failed decode pass ends the sequences in it with an error; the engine keeps serving.
      for (auto& a : active) {
        if (a) retire(*a, "error", e.what());
      }
      active.clear();
    }
    {
      std::lock_guard lk(mu_);
      stats_.active = static_cast<int>(active.size());
    }
  }
  for (auto& a : active) retire(*a, "cancelled");
  std::lock_guard lk(mu_);
  for (auto& [req, state] : queue_) {
    GenerationResult r;
    r.finish_reason = "cancelled";
    state->finish(r);
  }
}

}  // namespace strata
