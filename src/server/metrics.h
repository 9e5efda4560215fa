// Prometheus metrics with vLLM's names (vllm:*): request gauges, token counters and the TTFT /
// inter-token / end-to-end latency histograms, rendered in the text exposition format.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace m3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> buckets) : bounds_(std::move(buckets)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Appends the _bucket/_sum/_count lines for `name` with the given label text (no braces).
  void render(std::string& out, const std::string& name, const std::string& labels, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Thread-safe: the engine thread records, the HTTP threads render.
class Metrics {
 public:
  Metrics();
  void observe_ttft(double s);
  void observe_itl(double s);
  // queue_s: engine arrival to first scheduling (-1: never scheduled); ttft_s: arrival to the first token
  // (-1: none). They give vLLM's queue / prefill / decode / inference time and per-request TPOT histograms.
  void request_finished(double e2e_s, int64_t prompt_tokens, int64_t generation_tokens, const std::string& reason,
                        double queue_s = -1, double ttft_s = -1);
  void observe_iteration_tokens(int64_t n);
  void observe_request_params(int n, int64_t max_tokens);  // one API request (vllm:request_params_*)
  // vllm:cache_config_info's labels (block_size, cache_dtype, ...), set once at start.
  void set_cache_config(std::string labels);
  void add_generation_tokens(int64_t n);
  void add_prompt_tokens(int64_t n);
  std::string render(const std::string& model_name, const EngineStats& st) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, req_prompt_, req_gen_;
  Histogram queue_, prefill_, decode_, inference_, req_tpot_, iter_tokens_, params_n_, params_max_tokens_;
  std::string cache_config_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, int64_t> success_;
  std::string instance_id_;  // m3serve:instance_info
};

}  // namespace m3::server
