// Serving-benchmark metrics (docs/serving.md 10.2, as `vllm bench serve` computes them): per-request
// traces in, TTFT / TPOT / ITL / E2EL statistics and request / token throughputs out. Pure
// computation, no clocks, so the definitions can be tested on synthetic traces.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::bench {

// One request as the client saw it. Times are seconds; `send` is relative to the benchmark start.
struct RequestTrace {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;     // input tokens
  int64_t output_tokens = 0;  // from `usage` when the server sent it, else a tokenizer / chunk count
  double send = 0;            // send time since the benchmark start
  double ttft = 0;            // send -> first non-empty chunk
  double latency = 0;         // send -> last non-empty chunk (E2EL)
  std::vector<double> itl;    // gaps between consecutive non-empty chunks
  std::string text;           // the generated text (--save-result's generated_texts)
};

// Mean, median, std and percentiles of one latency metric, in milliseconds.
struct LatencyStats {
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  size_t count = 0;
  std::vector<double> ms;  // the values, for other percentiles (--metric-percentiles)
};

// Service-level objectives for goodput (`--goodput ttft:MS tpot:MS e2el:MS`, as vLLM): a request is
// good when it meets every objective given; a negative value means no objective on that metric.
struct GoodputSlo {
  double ttft_ms = -1, tpot_ms = -1, e2el_ms = -1;
  bool any() const { return ttft_ms >= 0 || tpot_ms >= 0 || e2el_ms >= 0; }
};
// Parses vLLM's KEY:VALUE list (keys ttft, tpot, e2el; values in ms, >= 0); throws m3::Error naming
// the bad entry.
GoodputSlo parse_goodput(const std::vector<std::string>& items);

// Which metrics the report gives percentiles for, and which percentiles (`--percentile-metrics`,
// `--metric-percentiles`). Empty: m3serve's default report (every metric; median, P90, P99).
struct ReportSelection {
  std::vector<std::string> metrics;  // of ttft, tpot, itl, e2el
  std::vector<double> percentiles;   // in (0, 100]
};
// Parses the two comma-separated lists as vLLM spells them; either may be empty (its default then:
// ttft,tpot,itl and 99). Throws m3::Error naming a bad entry.
ReportSelection parse_report_selection(const std::string& metrics, const std::string& percentiles);

struct BenchMetrics {
  int64_t completed = 0, failed = 0;
  double duration = 0;  // seconds, first send -> last completion
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0;       // req/s
  double output_throughput = 0;        // output tok/s
  double total_token_throughput = 0;   // (input + output) tok/s
  double peak_output_throughput = 0;   // max over 1-s buckets of chunks streamed (tokens/s)
  int64_t peak_concurrency = 0;        // max requests in flight
  LatencyStats ttft, tpot, itl, e2el;
  bool goodput_measured = false;       // a --goodput objective was given
  int64_t good_requests = 0;           // requests meeting every objective
  double request_goodput = 0;          // good requests per second
};

// Linear-interpolated percentile (numpy's default), p in [0, 100]. Empty input gives 0.
double percentile(std::vector<double> v, double p);
// Statistics of values given in seconds, reported in milliseconds.
LatencyStats latency_stats(const std::vector<double>& seconds);

// All metrics from the traces and the benchmark duration (seconds). Failed requests count only in
// `failed`.
BenchMetrics compute_metrics(const std::vector<RequestTrace>& traces, double duration, const GoodputSlo& slo = {});

// Per-request TPOT values (seconds) as defined in 10.2: (E2EL - TTFT) / (output_tokens - 1) for the
// successful requests with more than one output token.
std::vector<double> tpot_values(const std::vector<RequestTrace>& traces);

// The result JSON's metric keys; with a selection, also vLLM's p<N>_<metric>_ms for each percentile.
nlohmann::ordered_json metrics_json(const BenchMetrics& m, const ReportSelection& sel = {});
// The vLLM-style text report.
std::string format_report(const BenchMetrics& m, const std::string& title, const ReportSelection& sel = {});

}  // namespace m3::bench
