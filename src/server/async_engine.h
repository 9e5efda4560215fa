// AsyncEngine: the thread-safe front of the single-threaded m3::Engine. One engine thread loops
// step() while there is work (sleeping on a condition variable otherwise); HTTP threads submit
// requests through a queue and wait for acceptance, read their outputs from a per-request
// OutputStream (condition variable, no polling sleeps), and abort requests whose client went away.
// step() runs without the queue lock; stats are a snapshot published after each step, so /health
// and /metrics never wait for a step.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace m3::server {

// Outputs of one client request (which may hold several engine requests: n > 1, prompt lists).
class OutputStream {
 public:
  // Waits up to `timeout` for outputs; moves all queued ones into `out`. Returns false when the
  // engine failed (error() says why).
  bool wait(std::vector<RequestOutput>& out, std::chrono::milliseconds timeout);
  std::string error() const;

 private:
  friend class AsyncEngine;
  void push(RequestOutput o);
  void fail(const std::string& why);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> q_;
  std::string error_;
  bool failed_ = false;
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  TextOptions text;  // how the engine makes its text deltas
  RequestKv kv;      // P/D disaggregation (kv_transfer_params)
  std::vector<MultimodalSpan> mm;  // image embeddings for placeholder spans of the prompt
};

class AsyncEngine {
 public:
  // `max_waiting`: engine requests that may wait for a place in the running batch (queued in the
  // engine or not yet handed to it, beyond the batch's free places); submit() past it throws ApiError
  // 503. 0: no limit.
  AsyncEngine(Engine& engine, Metrics& metrics, size_t max_waiting = 0);
  ~AsyncEngine();  // stops the thread, aborting what is left
  // Queues the requests as one group; all are accepted or none (m3::Error with the engine's reason;
  // ApiError 503 when the waiting queue is full: a group is refused when others already wait and it
  // would take the queue past max_waiting, so a group larger than the limit still runs on its own).
  std::shared_ptr<OutputStream> submit(std::vector<EngineRequest> reqs);
  // Aborts requests (no-op for finished or unknown ids); their outputs stop.
  void abort(const std::vector<std::string>& ids);
  // Stops the engine thread; running requests are aborted.
  void stop();
  bool alive() const;
  // P/D: verifies pulled pages on the calling thread (Engine::verify_remote; thread-safe).
  void verify_remote(const std::vector<int32_t>& prompt, const std::vector<MultimodalSpan>& mm, RemotePrefill& rp) const {
    engine_.verify_remote(prompt, mm, rp);
  }
  // Wakes the engine thread for its timers (a KV lease read by another engine: its pages go back).
  void poke();
  EngineStats stats() const;
  // One API request's parameters (vllm:request_params_n / _max_tokens).
  void observe_request_params(int n, int64_t max_tokens) { metrics_.observe_request_params(n, max_tokens); }

 private:
  struct Track {
    std::shared_ptr<OutputStream> stream;
    std::chrono::steady_clock::time_point arrival, last, first_token;
    bool first = true;
    int64_t generated = 0;
  };
  struct Pending {
    std::vector<EngineRequest> reqs;
    std::shared_ptr<OutputStream> stream;
    bool done = false, shutdown = false;
    std::string error;
  };
  void loop();
  void dispatch(std::vector<RequestOutput>& outs);
  int64_t step_tokens_seen_ = -1;  // prompt + generated tokens the engine had computed (vllm:iteration_tokens_total)

  Engine& engine_;
  Metrics& metrics_;
  size_t max_waiting_ = 0;
  size_t pending_reqs_ = 0;  // engine requests in submits_ (guarded by mu_)
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable done_cv_;  // wakes submitters
  std::deque<std::shared_ptr<Pending>> submits_;
  std::vector<std::string> aborts_;
  std::map<std::string, Track> tracks_;  // engine thread only
  EngineStats publish_stats();  // also returns the copy
  mutable std::mutex stats_mu_;  // guards stats_ only: readers never wait for a step
  EngineStats stats_;            // snapshot published after each step
  std::atomic<bool> stop_{false}, dead_{false};
  bool poke_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace m3::server
