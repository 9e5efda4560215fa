// AsyncEngine implementation (see async_engine.h).
#include "server/async_engine.h"

#include <algorithm>
#include <cstdio>

#include "base/error.h"
#include "server/errors.h"

namespace m3::server {

bool OutputStream::wait(std::vector<RequestOutput>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !q_.empty() || failed_; });
  while (!q_.empty()) {
    out.push_back(std::move(q_.front()));
    q_.pop_front();
  }
  return !failed_;
}

std::string OutputStream::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

void OutputStream::push(RequestOutput o) {
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(o));
  }
  cv_.notify_all();
}

void OutputStream::fail(const std::string& why) {
  {
    std::lock_guard lk(mu_);
    failed_ = true;
    error_ = why;
  }
  cv_.notify_all();
}

AsyncEngine::AsyncEngine(Engine& engine, Metrics& metrics, size_t max_waiting)
    : engine_(engine), metrics_(metrics), max_waiting_(max_waiting) {
  if (engine_.kv_leases()) engine_.kv_leases()->set_notify([this] { poke(); });
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  if (engine_.kv_leases()) engine_.kv_leases()->set_notify(nullptr);
  stop();
}

void AsyncEngine::poke() {
  {
    std::lock_guard lk(mu_);
    poke_ = true;
  }
  cv_.notify_all();
}

void AsyncEngine::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  done_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool AsyncEngine::alive() const {
  return !dead_.load() && !stop_.load();
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard lk(stats_mu_);
  return stats_;
}

EngineStats AsyncEngine::publish_stats() {
  EngineStats s = engine_.stats();
  std::lock_guard lk(stats_mu_);
  stats_ = s;
  return s;
}

std::shared_ptr<OutputStream> AsyncEngine::submit(std::vector<EngineRequest> reqs) {
  auto p = std::make_shared<Pending>();
  p->reqs = std::move(reqs);
  p->stream = std::make_shared<OutputStream>();
  std::unique_lock lk(mu_);
  if (stop_) throw ApiError(503, "the server is shutting down");
  if (dead_) throw ApiError(503, "the engine is not running (it failed; see the server log)");
  if (max_waiting_ > 0) {
    // Sequences not running yet (handed to the engine or still queued here), less the batch's free
    // places: those start at the next step, so a burst into an idle server is not refused.
    size_t waiting = pending_reqs_, running = 0;
    {
      std::lock_guard sl(stats_mu_);
      waiting += stats_.waiting;
      running = stats_.running;
    }
    const size_t slots = size_t(std::max(0, engine_.config().max_num_seqs)), free_slots = slots > running ? slots - running : 0;
    waiting = waiting > free_slots ? waiting - free_slots : 0;
    if (waiting > 0 && waiting + p->reqs.size() > max_waiting_)
      throw ApiError(503, "the server is busy: " + std::to_string(waiting) + " requests are waiting (limit " +
                              std::to_string(max_waiting_) + ", --max-waiting-requests); retry later");
  }
  pending_reqs_ += p->reqs.size();
  submits_.push_back(p);
  cv_.notify_all();
  done_cv_.wait(lk, [&] { return p->done || stop_; });
  if (!p->done || p->shutdown) throw ApiError(503, "the server is shutting down");
  if (!p->error.empty()) throw Error(p->error);
  return p->stream;
}

void AsyncEngine::abort(const std::vector<std::string>& ids) {
  {
    std::lock_guard lk(mu_);
    aborts_.insert(aborts_.end(), ids.begin(), ids.end());
  }
  cv_.notify_all();
}

void AsyncEngine::dispatch(std::vector<RequestOutput>& outs) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& o : outs) {
    auto it = tracks_.find(o.request_id);
    if (it == tracks_.end()) continue;
    Track& t = it->second;
    const int64_t n = int64_t(o.new_tokens.size());
    if (n > 0) {
      if (t.first) {
        metrics_.observe_ttft(std::chrono::duration<double>(now - t.arrival).count());
        t.first_token = now;
        metrics_.add_prompt_tokens(o.num_prompt_tokens);
        t.first = false;
      } else {
        metrics_.observe_itl(std::chrono::duration<double>(now - t.last).count());
      }
      t.last = now;
      t.generated += n;
      metrics_.add_generation_tokens(n);
    }
    if (o.finished) {
      metrics_.request_finished(std::chrono::duration<double>(now - t.arrival).count(), o.num_prompt_tokens,
                                t.generated, finish_reason_name(o.finish_reason), o.queue_seconds,
                                t.first ? -1.0 : std::chrono::duration<double>(t.first_token - t.arrival).count());
      t.stream->push(std::move(o));
      tracks_.erase(it);
    } else {
      t.stream->push(std::move(o));
    }
  }
}

void AsyncEngine::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    auto ready = [&] { return stop_ || poke_ || !submits_.empty() || !aborts_.empty() || engine_.has_work(); };
    // The engine's timers (KV leases) run even when there is no work: wake at the next deadline.
    if (const auto t = engine_.next_timer()) cv_.wait_until(lk, *t, ready);
    else cv_.wait(lk, ready);
    if (stop_) break;
    if (poke_ || !engine_.has_work()) {
      poke_ = false;
      engine_.housekeeping();
      publish_stats();
    }
    // Admissions and aborts happen between steps, under the lock (the engine is single-threaded).
    const bool admitted = !submits_.empty();
    while (!submits_.empty()) {
      auto p = submits_.front();
      submits_.pop_front();
      pending_reqs_ -= p->reqs.size();
      std::vector<std::string> added;
      try {
        for (auto& r : p->reqs) {
          engine_.add_request(r.id, r.prompt, r.params, r.text, r.kv, r.mm);
          added.push_back(r.id);
        }
        const auto now = std::chrono::steady_clock::now();
        for (auto& r : p->reqs) tracks_[r.id] = Track{p->stream, now, now};
      } catch (const std::exception& e) {
        for (auto& id : added) engine_.abort(id);
        p->error = e.what();
      }
      p->done = true;
    }
    if (admitted) publish_stats();  // the waiting count submit() checks includes them from now on
    done_cv_.notify_all();
    std::vector<RequestOutput> aborted;
    for (auto& id : aborts_) {
      RequestOutput o;
      if (tracks_.count(id) && engine_.abort(id, &o)) aborted.push_back(std::move(o));
    }
    aborts_.clear();
    dispatch(aborted);
    if (engine_.has_work()) {
      // The step runs without the lock: only this thread touches the engine, and submitters,
      // aborts, /health and /metrics must not wait for a whole step.
      lk.unlock();
      std::vector<RequestOutput> outs;
      std::string failure;
      try {
        outs = engine_.step();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty()) {
        std::fprintf(stderr, "[m3serve] engine step failed: %s\n", failure.c_str());
        lk.lock();
        dead_ = true;
        for (auto& [id, t] : tracks_) t.stream->fail("engine error: " + failure);
        tracks_.clear();
        break;
      }
      {
        // Tokens this step computed (vLLM's vllm:iteration_tokens_total histogram).
        const EngineStats st = publish_stats();
        const int64_t seen = st.prompt_tokens_computed + st.generated_tokens;
        if (step_tokens_seen_ >= 0 && seen > step_tokens_seen_) metrics_.observe_iteration_tokens(seen - step_tokens_seen_);
        step_tokens_seen_ = seen;
      }
      dispatch(outs);
      lk.lock();
    } else {
      publish_stats();
    }
  }
  // Stopping (or dead): abort everything left so every stream ends.
  for (auto& [id, t] : tracks_) {
    RequestOutput o;
    if (!engine_.abort(id, &o)) {  // unknown to the engine: the stream still ends
      o.request_id = id;
      o.finished = true;
      o.finish_reason = FinishReason::Abort;
    }
    t.stream->push(std::move(o));
  }
  tracks_.clear();
  for (auto& p : submits_) {
    p->error = "the engine is not running";
    p->shutdown = true;
    p->done = true;
  }
  submits_.clear();
  pending_reqs_ = 0;
  publish_stats();
  done_cv_.notify_all();
}

}  // namespace m3::server
