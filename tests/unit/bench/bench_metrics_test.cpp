// bench serve metric definitions (docs/serving.md 10.2) on a synthetic trace with known answers:
// TTFT, TPOT (first token excluded, only requests with > 1 output token), ITL pooled per chunk,
// E2EL, numpy-style percentiles, throughputs, peak concurrency / per-second output, and the
// Prometheus counter reader used for the prefix-cache hit rate. No timing is involved.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/metrics.h"
#include "bench/plot.h"
#include "bench/serve_bench.h"
#include "base/error.h"

using namespace m3::bench;

namespace {

RequestTrace ok(double send, double ttft, std::vector<double> itl, int64_t in, int64_t out) {
  RequestTrace t;
  t.success = true;
  t.send = send;
  t.ttft = ttft;
  t.itl = std::move(itl);
  t.latency = ttft;
  for (double g : t.itl) t.latency += g;
  t.prompt_len = in;
  t.output_tokens = out;
  return t;
}

std::vector<RequestTrace> trace() {
  RequestTrace failed;
  failed.success = false;
  failed.prompt_len = 1000;
  failed.send = 0.0;
  return {
      ok(0.0, 0.1, {0.02, 0.03, 0.05}, 10, 4),  // chunks at 0.10 0.12 0.15 0.20; TPOT 0.1/3
      ok(0.1, 0.3, {0.1}, 20, 5),               // one chunk carried 4 tokens: 1 ITL gap, TPOT 0.1/4
      ok(1.0, 0.2, {}, 30, 1),                  // a single output token: no TPOT, no ITL
      failed,
  };
}

}  // namespace

TEST(BenchMetrics, PercentileIsNumpyLinear) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 90), 2.8);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(percentile({1, 2}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({1, 2}, 100), 2);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(BenchMetrics, LatencyDefinitions) {
  const BenchMetrics m = compute_metrics(trace(), 2.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  // TTFT (ms): 100, 300, 200.
  EXPECT_EQ(m.ttft.count, 3u);
  EXPECT_NEAR(m.ttft.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft.std, std::sqrt(20000.0 / 3), 1e-9);  // population std
  EXPECT_NEAR(m.ttft.p90, 280, 1e-9);
  EXPECT_NEAR(m.ttft.p99, 298, 1e-9);
  // TPOT: (E2EL - TTFT) / (output - 1) for requests with > 1 output token: 100/3 and 100/4 ms.
  EXPECT_EQ(m.tpot.count, 2u);
  EXPECT_NEAR(m.tpot.mean, (100.0 / 3 + 25.0) / 2, 1e-9);
  EXPECT_NEAR(m.tpot.median, (100.0 / 3 + 25.0) / 2, 1e-9);
  // ITL: every gap between non-empty chunks, pooled: 20, 30, 50, 100 ms.
  EXPECT_EQ(m.itl.count, 4u);
  EXPECT_NEAR(m.itl.mean, 50, 1e-9);
  EXPECT_NEAR(m.itl.median, 40, 1e-9);
  EXPECT_NEAR(m.itl.p90, 85, 1e-9);
  EXPECT_NEAR(m.itl.max, 100, 1e-9);
  // E2EL: 200, 400, 200 ms.
  EXPECT_NEAR(m.e2el.mean, 800.0 / 3, 1e-9);
  EXPECT_NEAR(m.e2el.median, 200, 1e-9);
  EXPECT_NEAR(m.e2el.p99, 396, 1e-9);  // sorted 200 200 400: 200 + 0.98 * 200
}

TEST(BenchMetrics, Throughputs) {
  const BenchMetrics m = compute_metrics(trace(), 2.0);
  EXPECT_EQ(m.total_input, 60);   // the failed request's tokens do not count
  EXPECT_EQ(m.total_output, 10);
  EXPECT_DOUBLE_EQ(m.duration, 2.0);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 35.0);
  // Chunks in second 0: 4 (A) + 2 (B); second 1: 1 (C).
  EXPECT_DOUBLE_EQ(m.peak_output_throughput, 6.0);
  // A [0, 0.2] and B [0.1, 0.5] overlap; C [1.0, 1.2] is alone.
  EXPECT_EQ(m.peak_concurrency, 2);
}

TEST(BenchMetrics, TpotSkipsSingleTokenAndFailed) {
  auto v = tpot_values(trace());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0], 0.1 / 3, 1e-12);
  EXPECT_NEAR(v[1], 0.1 / 4, 1e-12);
}

TEST(BenchMetrics, EmptyAndAllFailed) {
  RequestTrace f;
  const BenchMetrics m = compute_metrics({f, f}, 1.0);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft.count, 0u);
  EXPECT_DOUBLE_EQ(m.output_throughput, 0);
  EXPECT_EQ(m.peak_concurrency, 0);
}

TEST(BenchMetrics, JsonAndReportFields) {
  const BenchMetrics m = compute_metrics(trace(), 2.0);
  const auto j = metrics_json(m);
  for (const char* k : {"completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                        "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                        "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p90_itl_ms", "p99_e2el_ms"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NEAR(j["mean_itl_ms"].get<double>(), 50, 1e-9);
  const std::string r = format_report(m, "Serving Benchmark Result");
  EXPECT_NE(r.find("Mean TPOT (ms):"), std::string::npos);
  EXPECT_NE(r.find("Total token throughput (tok/s):"), std::string::npos);
  const std::string svg = latency_svg(trace(), "t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("TPOT (ms), n=2"), std::string::npos);
}

TEST(BenchMetrics, PrometheusSum) {
  const std::string text =
      "# HELP vllm:prefix_cache_hits_total Prefix cache hits.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\n"
      "vllm:prefix_cache_hits_total{model_name=\"a\",engine=\"0\"} 128\n"
      "vllm:prefix_cache_hits_total{model_name=\"a\",engine=\"1\"} 64\n"
      "vllm:prefix_cache_hits_totalx 5\n"
      "vllm:prefix_cache_queries_total 1000\n";
  EXPECT_DOUBLE_EQ(prometheus_sum(text, "vllm:prefix_cache_hits_total"), 192);
  EXPECT_DOUBLE_EQ(prometheus_sum(text, "vllm:prefix_cache_queries_total"), 1000);
  EXPECT_DOUBLE_EQ(prometheus_sum(text, "vllm:nothing"), -1);
}

// --goodput: a request is good when it meets every objective given. The trace's successful requests:
// TTFT 100 / 300 / 200 ms, TPOT 33.3 / 25 / 0 ms (a one-token reply has none), E2EL 200 / 400 / 200 ms.
TEST(BenchMetrics, GoodputCountsRequestsMeetingEveryObjective) {
  EXPECT_FALSE(compute_metrics(trace(), 2.0).goodput_measured);
  const BenchMetrics a = compute_metrics(trace(), 2.0, parse_goodput({"ttft:200"}));
  EXPECT_TRUE(a.goodput_measured);
  EXPECT_EQ(a.good_requests, 2);  // 100 and 200 ms
  EXPECT_DOUBLE_EQ(a.request_goodput, 1.0);
  EXPECT_EQ(compute_metrics(trace(), 2.0, parse_goodput({"ttft:200", "tpot:30"})).good_requests, 1);  // 200 ms, TPOT 0
  EXPECT_EQ(compute_metrics(trace(), 2.0, parse_goodput({"e2el:399.9"})).good_requests, 2);
  EXPECT_EQ(compute_metrics(trace(), 2.0, parse_goodput({"ttft:0"})).good_requests, 0);
  const auto j = metrics_json(a);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  EXPECT_TRUE(metrics_json(compute_metrics(trace(), 2.0))["request_goodput"].is_null());
  EXPECT_NE(format_report(a, "t").find("Request goodput (req/s):"), std::string::npos);
  for (const char* bad : {"ttft", "ttft:x", "ttft:-1", "itl:5", "ttft:1e999"}) EXPECT_THROW(parse_goodput({bad}), m3::Error) << bad;
}

// --percentile-metrics / --metric-percentiles: vLLM's defaults fill in for the list not given, the
// report shows only the selected metrics with their mean, median and percentiles, the JSON gains
// p<N>_<metric>_ms keys named as vLLM names them (99 -> p99, 99.9 -> p99.9).
TEST(BenchMetrics, PercentileSelection) {
  EXPECT_TRUE(parse_report_selection("", "").metrics.empty());
  const ReportSelection d = parse_report_selection("", "50");
  EXPECT_EQ(d.metrics, (std::vector<std::string>{"ttft", "tpot", "itl"}));
  const ReportSelection s = parse_report_selection("ttft, e2el", "");
  EXPECT_EQ(s.percentiles, std::vector<double>{99});
  const ReportSelection p = parse_report_selection("e2el", "50,99.9");
  const BenchMetrics m = compute_metrics(trace(), 2.0);
  const auto j = metrics_json(m, p);
  EXPECT_NEAR(j["p50_e2el_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["p99.9_e2el_ms"].get<double>(), 200 + 200 * 0.998, 1e-6);  // numpy linear over 200, 200, 400
  const std::string r = format_report(m, "t", p);
  EXPECT_NE(r.find("P99.9 E2EL (ms):"), std::string::npos);
  EXPECT_EQ(r.find("TTFT"), std::string::npos);
  for (auto [mt, pc] : {std::pair<const char*, const char*>{"ttfb", ""}, {"", "0"}, {"", "101"}, {"", "x"}, {",", ""}})
    EXPECT_THROW(parse_report_selection(mt, pc), m3::Error) << mt << " / " << pc;
}
