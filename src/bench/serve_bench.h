// `m3serve bench serve`: a load generator for any OpenAI-compatible endpoint, the equivalent of
// `vllm bench serve` (random dataset, Poisson arrivals, a concurrency cap, streamed requests) plus
// an agentic multi-turn workload (growing contexts, a stable session header, prefix-cache hit rate).
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::bench {

struct ServeBenchOptions {
  std::string base_url;  // http://host:port; built from host/port when empty
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model;  // served name; empty: the first of /v1/models
  // vLLM's --backend: vllm, openai, sglang, lmdeploy, scalellm (completions) or openai-chat (chat);
  // empty: the endpoint decides.
  std::string backend;
  std::string endpoint;  // empty: /v1/chat/completions for --backend openai-chat, else /v1/completions
  std::string dataset_name = "random";  // random, sharegpt, custom or agentic
  std::string dataset_path;             // sharegpt / custom
  int64_t sharegpt_output_len = 0;      // > 0: fixed output length instead of the reply's
  int64_t custom_output_len = 256;
  bool custom_skip_chat_template = false;
  int64_t random_input_len = 1024, random_output_len = 128, random_prefix_len = 0;
  double random_range_ratio = 0.0;
  int64_t num_prompts = 1000;
  int64_t max_concurrency = 0;  // 0: no cap
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;  // Gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 steadier
  std::vector<std::string> goodput;       // KEY:MS objectives (ttft, tpot, e2el)
  std::string percentile_metrics, metric_percentiles;  // vLLM's lists; empty: the default report
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::string tokenizer_dir;  // local tokenizer; else the server's /tokenize and /detokenize
  std::string api_key;        // also from OPENAI_API_KEY
  std::string save_result, plot;
  bool progress = true;  // a progress bar when stderr is a terminal
  // Agentic workload.
  int64_t num_sessions = 4, turns = 4, tool_result_len = 256;
  std::string session_header = "X-Dynamo-Session-ID";
};

// Runs the benchmark, prints the report to stdout, writes --save-result / --plot. Returns the
// result JSON. Throws m3::Error when the server cannot be reached or set-up fails.
nlohmann::ordered_json run_serve_bench(const ServeBenchOptions& opt);

// Sum of every sample of a Prometheus metric (all label sets) in a /metrics text; -1 when absent.
double prometheus_sum(const std::string& text, const std::string& name);

}  // namespace m3::bench
