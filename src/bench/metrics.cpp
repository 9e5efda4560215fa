// Serving-benchmark metric definitions (docs/serving.md 10.2); see metrics.h.
#include "bench/metrics.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <string>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "base/error.h"
#include "base/text_list.h"

namespace m3::bench {

namespace {

const char* const kMetricNames[] = {"ttft", "tpot", "itl", "e2el"};

double parse_number(const std::string& s, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !std::isfinite(v)) throw Error(what + ": expected a number, got '" + s + "'");
  return v;
}

// A percentile as vLLM names it in keys and rows: 99 -> "99", 99.9 -> "99.9".
std::string percentile_word(double p) {
  return p == std::floor(p) ? fmt::format("{}", int64_t(p)) : fmt::format("{}", p);
}

}  // namespace

GoodputSlo parse_goodput(const std::vector<std::string>& items) {
  GoodputSlo slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw Error("--goodput: expected KEY:VALUE (KEY one of ttft, tpot, e2el; VALUE in ms), got '" + item + "'");
    const std::string key = item.substr(0, colon);
    const double v = parse_number(item.substr(colon + 1), "--goodput " + key);
    if (v < 0) throw Error("--goodput " + key + ": the objective must be >= 0 ms, got " + item.substr(colon + 1));
    if (key == "ttft") slo.ttft_ms = v;
    else if (key == "tpot") slo.tpot_ms = v;
    else if (key == "e2el") slo.e2el_ms = v;
    else throw Error("--goodput: unknown metric '" + key + "' (expected ttft, tpot or e2el)");
  }
  return slo;
}

ReportSelection parse_report_selection(const std::string& metrics, const std::string& percentiles) {
  ReportSelection sel;
  if (metrics.empty() && percentiles.empty()) return sel;
  for (const std::string& m : split_trimmed(metrics.empty() ? "ttft,tpot,itl" : metrics)) {
    if (std::find(std::begin(kMetricNames), std::end(kMetricNames), m) == std::end(kMetricNames))
      throw Error("--percentile-metrics: unknown metric '" + m + "' (expected ttft, tpot, itl, e2el)");
    if (std::find(sel.metrics.begin(), sel.metrics.end(), m) == sel.metrics.end()) sel.metrics.push_back(m);
  }
  for (const std::string& p : split_trimmed(percentiles.empty() ? "99" : percentiles)) {
    const double v = parse_number(p, "--metric-percentiles");
    if (!(v > 0 && v <= 100)) throw Error("--metric-percentiles: " + p + " is outside (0, 100]");
    sel.percentiles.push_back(v);
  }
  if (sel.metrics.empty()) throw Error("--percentile-metrics: no metric given");
  if (sel.percentiles.empty()) throw Error("--metric-percentiles: no percentile given");
  return sel;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

LatencyStats latency_stats(const std::vector<double>& seconds) {
  LatencyStats s;
  s.count = seconds.size();
  if (seconds.empty()) return s;
  std::vector<double> ms(seconds.size());
  for (size_t i = 0; i < seconds.size(); ++i) ms[i] = seconds[i] * 1000.0;
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size());
  double var = 0;
  for (double x : ms) var += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(var / double(ms.size()));  // population std, as numpy.std
  s.median = percentile(ms, 50);
  s.p90 = percentile(ms, 90);
  s.p99 = percentile(ms, 99);
  s.min = *std::min_element(ms.begin(), ms.end());
  s.max = *std::max_element(ms.begin(), ms.end());
  s.ms = std::move(ms);
  return s;
}

std::vector<double> tpot_values(const std::vector<RequestTrace>& traces) {
  std::vector<double> out;
  for (const auto& t : traces)
    if (t.success && t.output_tokens > 1) out.push_back((t.latency - t.ttft) / double(t.output_tokens - 1));
  return out;
}

BenchMetrics compute_metrics(const std::vector<RequestTrace>& traces, double duration, const GoodputSlo& slo) {
  BenchMetrics m;
  m.duration = duration;
  std::vector<double> ttft, itl, e2el;
  std::map<int64_t, int64_t> per_second;         // chunk count per 1-s bucket since the start
  std::vector<std::pair<double, int>> events;    // (time, +1 send / -1 done)
  for (const auto& t : traces) {
    if (!t.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    if (slo.any()) {
      // TPOT of a one-token reply is 0 (it has no decode time), as vLLM counts it.
      const double tpot_ms = t.output_tokens > 1 ? (t.latency - t.ttft) / double(t.output_tokens - 1) * 1000.0 : 0.0;
      const bool good = (slo.ttft_ms < 0 || t.ttft * 1000.0 <= slo.ttft_ms) && (slo.tpot_ms < 0 || tpot_ms <= slo.tpot_ms) &&
                        (slo.e2el_ms < 0 || t.latency * 1000.0 <= slo.e2el_ms);
      m.good_requests += good;
    }
    m.total_input += t.prompt_len;
    m.total_output += t.output_tokens;
    ttft.push_back(t.ttft);
    e2el.push_back(t.latency);
    itl.insert(itl.end(), t.itl.begin(), t.itl.end());
    double at = t.send + t.ttft;
    per_second[int64_t(std::floor(at))] += 1;
    for (double g : t.itl) {
      at += g;
      per_second[int64_t(std::floor(at))] += 1;
    }
    events.push_back({t.send, +1});
    events.push_back({t.send + t.latency, -1});
  }
  m.goodput_measured = slo.any();
  if (duration > 0) {
    m.request_goodput = double(m.good_requests) / duration;
    m.request_throughput = double(m.completed) / duration;
    m.output_throughput = double(m.total_output) / duration;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration;
  }
  for (auto& [sec, n] : per_second) m.peak_output_throughput = std::max(m.peak_output_throughput, double(n));
  // Ends sort before sends at the same instant: a request that finishes as another starts does not overlap it.
  std::sort(events.begin(), events.end());
  int64_t cur = 0;
  for (auto& e : events) {
    cur += e.second;
    m.peak_concurrency = std::max(m.peak_concurrency, cur);
  }
  m.ttft = latency_stats(ttft);
  m.tpot = latency_stats(tpot_values(traces));
  m.itl = latency_stats(itl);
  m.e2el = latency_stats(e2el);
  return m;
}

static nlohmann::ordered_json stats_json(const LatencyStats& s) {
  return {{"mean", s.mean}, {"median", s.median}, {"std", s.std}, {"p90", s.p90}, {"p99", s.p99},
          {"min", s.min},   {"max", s.max},       {"count", s.count}};
}

static const LatencyStats& stats_of(const BenchMetrics& m, const std::string& name) {
  return name == "ttft" ? m.ttft : name == "tpot" ? m.tpot : name == "itl" ? m.itl : m.e2el;
}

nlohmann::ordered_json metrics_json(const BenchMetrics& m, const ReportSelection& sel) {
  nlohmann::ordered_json j;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["duration"] = m.duration;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.peak_output_throughput;
  j["max_concurrent_requests"] = m.peak_concurrency;
  j["request_goodput"] = m.goodput_measured ? nlohmann::ordered_json(m.request_goodput) : nlohmann::ordered_json(nullptr);
  const std::pair<const char*, const LatencyStats*> ls[] = {
      {"ttft", &m.ttft}, {"tpot", &m.tpot}, {"itl", &m.itl}, {"e2el", &m.e2el}};
  for (auto& [name, s] : ls) {
    // vLLM's flat keys (mean_ttft_ms, p99_ttft_ms, ...) plus a nested object.
    j[fmt::format("mean_{}_ms", name)] = s->mean;
    j[fmt::format("median_{}_ms", name)] = s->median;
    j[fmt::format("std_{}_ms", name)] = s->std;
    j[fmt::format("p90_{}_ms", name)] = s->p90;
    j[fmt::format("p99_{}_ms", name)] = s->p99;
    j[name] = stats_json(*s);
  }
  for (const std::string& name : sel.metrics)
    for (double p : sel.percentiles)
      j[fmt::format("p{}_{}_ms", percentile_word(p), name)] = percentile(stats_of(m, name).ms, p);
  return j;
}

std::string format_report(const BenchMetrics& m, const std::string& title, const ReportSelection& sel) {
  std::string o;
  const std::string bar(50, '=');
  o += fmt::format("{:=^50}\n", " " + title + " ");
  auto row = [&](const std::string& k, const std::string& v) { o += fmt::format("{:<40}{:>10}\n", k, v); };
  row("Successful requests:", std::to_string(m.completed));
  row("Failed requests:", std::to_string(m.failed));
  row("Benchmark duration (s):", fmt::format("{:.2f}", m.duration));
  row("Total input tokens:", std::to_string(m.total_input));
  row("Total generated tokens:", std::to_string(m.total_output));
  row("Request throughput (req/s):", fmt::format("{:.2f}", m.request_throughput));
  if (m.goodput_measured) row("Request goodput (req/s):", fmt::format("{:.2f}", m.request_goodput));
  row("Output token throughput (tok/s):", fmt::format("{:.2f}", m.output_throughput));
  row("Peak output token throughput (tok/s):", fmt::format("{:.2f}", m.peak_output_throughput));
  row("Peak concurrent requests:", std::to_string(m.peak_concurrency));
  row("Total token throughput (tok/s):", fmt::format("{:.2f}", m.total_token_throughput));
  const std::tuple<const char*, const char*, const LatencyStats*> ls[] = {
      {"Time to First Token", "TTFT", &m.ttft},
      {"Time per Output Token (excl. 1st token)", "TPOT", &m.tpot},
      {"Inter-token Latency", "ITL", &m.itl},
      {"End-to-end Latency", "E2EL", &m.e2el}};
  for (auto& [head, name, s] : ls) {
    if (!sel.metrics.empty()) {
      // As vLLM: only the selected metrics, each with its mean, median and the chosen percentiles.
      std::string key(name);
      std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::tolower(c)); });
      if (std::find(sel.metrics.begin(), sel.metrics.end(), key) == sel.metrics.end()) continue;
      o += fmt::format("{:-^50}\n", head);
      row(fmt::format("Mean {} (ms):", name), fmt::format("{:.2f}", s->mean));
      row(fmt::format("Median {} (ms):", name), fmt::format("{:.2f}", s->median));
      for (double p : sel.percentiles)
        row(fmt::format("P{} {} (ms):", percentile_word(p), name), fmt::format("{:.2f}", percentile(s->ms, p)));
      continue;
    }
    o += fmt::format("{:-^50}\n", head);
    row(fmt::format("Mean {} (ms):", name), fmt::format("{:.2f}", s->mean));
    row(fmt::format("Median {} (ms):", name), fmt::format("{:.2f}", s->median));
    row(fmt::format("Std {} (ms):", name), fmt::format("{:.2f}", s->std));
    row(fmt::format("P90 {} (ms):", name), fmt::format("{:.2f}", s->p90));
    row(fmt::format("P99 {} (ms):", name), fmt::format("{:.2f}", s->p99));
  }
  o += bar + "\n";
  return o;
}

}  // namespace m3::bench
