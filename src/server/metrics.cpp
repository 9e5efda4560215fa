// Prometheus metrics rendering (see metrics.h); bucket bounds follow vLLM's.
#include "server/metrics.h"

#include <algorithm>
#include <random>
#include <tuple>

#include <vector>

#include <fmt/format.h>

namespace m3::server {

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  for (size_t i = 0; i < bounds_.size(); ++i)
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], counts_[i]);
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0}),
      req_prompt_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000,
                   500000, 1000000}),
      req_gen_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000,
                1000000}),
      queue_(e2e_.bounds()),
      prefill_(e2e_.bounds()),
      decode_(e2e_.bounds()),
      inference_(e2e_.bounds()),
      req_tpot_(itl_.bounds()),
      iter_tokens_({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}),
      params_n_({1, 2, 5, 10, 20}),
      params_max_tokens_(req_gen_.bounds()) {
  std::random_device rd;
  instance_id_ = fmt::format("{:08x}{:08x}", rd(), rd());
}

void Metrics::observe_iteration_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  iter_tokens_.observe(double(n));
}
void Metrics::observe_request_params(int n, int64_t max_tokens) {
  std::lock_guard lk(mu_);
  params_n_.observe(double(n));
  params_max_tokens_.observe(double(max_tokens));
}
void Metrics::set_cache_config(std::string labels) {
  std::lock_guard lk(mu_);
  cache_config_ = std::move(labels);
}

void Metrics::observe_ttft(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard lk(mu_);
  itl_.observe(s);
}
void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  generation_tokens_ += n;
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += n;
}
void Metrics::request_finished(double e2e_s, int64_t prompt_tokens, int64_t generation_tokens,
                               const std::string& reason, double queue_s, double ttft_s) {
  std::lock_guard lk(mu_);
  if (queue_s >= 0) {
    queue_.observe(queue_s);
    inference_.observe(std::max(0.0, e2e_s - queue_s));
    if (ttft_s >= 0) prefill_.observe(std::max(0.0, ttft_s - queue_s));
  }
  if (ttft_s >= 0) {
    decode_.observe(std::max(0.0, e2e_s - ttft_s));
    if (generation_tokens > 1) req_tpot_.observe(std::max(0.0, e2e_s - ttft_s) / double(generation_tokens - 1));
  }
  e2e_.observe(e2e_s);
  req_prompt_.observe(double(prompt_tokens));
  req_gen_.observe(double(generation_tokens));
  ++success_[reason];
}

namespace {
// A Prometheus label value: backslash, double quote and newline escaped (one bad line fails a whole scrape).
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

std::string Metrics::render(const std::string& model_name, const EngineStats& st) const {
  const std::string L = "model_name=\"" + label_value(model_name) + "\",engine=\"0\"";
  std::string o;
  auto gauge = [&](const char* name, const std::string& help, double v) {
    o += fmt::format("# HELP vllm:{} {}\n# TYPE vllm:{} gauge\nvllm:{}{{{}}} {}\n", name, help, name, name, L, v);
  };
  auto counter = [&](const char* name, const std::string& help, double v) {
    o += fmt::format("# HELP vllm:{}_total {}\n# TYPE vllm:{}_total counter\nvllm:{}_total{{{}}} {}\n", name, help,
                     name, name, L, v);
  };
  gauge("num_requests_running", "Number of requests in model execution batches.", double(st.running));
  gauge("num_requests_waiting", "Number of requests waiting to be processed.", double(st.waiting));
  const double usage = st.total_pages > 0 ? 1.0 - double(st.free_pages) / double(st.total_pages) : 0.0;
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage);
  counter("num_preemptions", "Cumulative number of preemptions.", double(st.preemptions));
  counter("prefix_cache_queries", "Prefix cache queries, in tokens.", double(st.prefix_queries));
  counter("prefix_cache_hits", "Prefix cache hits, in tokens.", double(st.prefix_hits));
  if (!st.spec_accepted_per_pos.empty()) {
    counter("spec_decode_num_drafts", "Number of spec decoding drafts.", double(st.spec_drafts));
    counter("spec_decode_num_draft_tokens", "Number of draft tokens.", double(st.spec_draft_tokens));
    counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.", double(st.spec_accepted_tokens));
    o += "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n"
         "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n";
    for (size_t i = 0; i < st.spec_accepted_per_pos.size(); ++i)
      o += fmt::format("vllm:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", L, i,
                       st.spec_accepted_per_pos[i]);
  }
  if (st.has_tier || st.has_shared_tier) {
    // The KV tiers beyond the pool (m3serve's own names: vLLM's offloading metrics differ by connector).
    auto m3 = [&](const char* name, const char* type, const std::string& help, const std::string& labels, double v) {
      o += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} {}\nm3serve:{}{{{}}} {}\n", name, help, name, type, name,
                       labels, v);
    };
    m3("kv_tier_offloaded_pages_total", "counter", "KV pages written to the local tier when the pool evicted them.", L,
       double(st.tier_offloaded_pages));
    m3("kv_tier_loaded_pages_total", "counter", "Prefix pages loaded from a tier instead of recomputed.", L,
       double(st.tier_loaded_pages));
    m3("kv_tier_load_failures_total", "counter", "Tier pages refused by verification (recomputed).", L,
       double(st.tier_load_failures));
    // One family per counter, a sample per tier (local, shared).
    std::vector<std::pair<const KvTierStats*, const char*>> tiers;
    if (st.has_tier) tiers.emplace_back(&st.tier, "local");
    if (st.has_shared_tier) tiers.emplace_back(&st.shared_tier, "shared");
    auto family = [&](const char* name, const char* help, auto value) {
      o += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} counter\n", name, help, name);
      for (const auto& [t, which] : tiers)
        o += fmt::format("m3serve:{}{{{},tier=\"{}\"}} {}\n", name, L, which, double(value(*t)));
    };
    family("kv_tier_hits_total", "Tier lookups that found the page.", [](const KvTierStats& t) { return t.hits; });
    family("kv_tier_misses_total", "Tier lookups that did not (or failed).", [](const KvTierStats& t) { return t.misses; });
    family("kv_tier_stored_pages_total", "Pages handed to the tier.", [](const KvTierStats& t) { return t.stored_pages; });
    family("kv_tier_read_bytes_total", "Bytes read from the tier.", [](const KvTierStats& t) { return t.bytes_read; });
    family("kv_tier_written_bytes_total", "Bytes written to the tier's files or store.",
           [](const KvTierStats& t) { return t.bytes_written; });
    family("kv_tier_read_seconds_total", "Time spent reading pages from the tier.",
           [](const KvTierStats& t) { return t.read_seconds; });
    if (st.has_tier)
      m3("kv_tier_held_bytes", "gauge", "Bytes the local tier holds.", L + ",tier=\"local\"", double(st.tier.held_bytes));
  }
  {
    auto m3 = [&](const char* name, const char* type, const std::string& help, double v) {
      o += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} {}\nm3serve:{}{{{}}} {}\n", name, help, name, type, name,
                       L, v);
    };
    // Prompt tokens this engine ran through the model (vllm:prompt_tokens counts requests' prompts,
    // whatever computed them): with prefix hits, tiers or a remote prefill it is smaller.
    m3("prompt_tokens_computed_total", "counter", "Prompt tokens computed by this engine's forward passes.",
       double(st.prompt_tokens_computed));
    m3("kv_free_pages", "gauge", "KV pages free (cached ones included).", double(st.free_pages));
    m3("step_latency_tail_steps_total", "counter",
       "Steps that read prompts past --step-latency-factor under --step-latency-tail-share.", double(st.tail_steps));
    m3("step_latency_tail_held_total", "counter", "Inter-token latencies those steps held up.", double(st.tail_held));
    if (st.has_leases) {
      // Prefill side of P/D disaggregation: pages held for decode engines under leases.
      m3("kv_leases_active", "gauge", "KV leases held for decode engines.", double(st.leases.active));
      m3("kv_leased_pages", "gauge", "KV pages held under leases.", double(st.leases.pages));
      m3("kv_leases_granted_total", "counter", "KV leases granted.", double(st.leases.granted));
      m3("kv_leases_read_total", "counter", "KV leases read by a decode engine (pages returned).", double(st.leases.read));
      m3("kv_leases_expired_total", "counter", "KV leases expired unread (pages returned).", double(st.leases.expired));
      m3("kv_lease_reads_refused_total", "counter", "KV reads refused (unknown, stale or foreign ids).",
         double(st.leases.refused));
      m3("kv_transfer_sent_bytes_total", "counter", "KV page bytes sent to decode engines.", double(st.leases.bytes_sent));
    }
    if (st.remote_prefills > 0) {
      m3("kv_remote_prefills_total", "counter", "Requests whose prompt KV was pulled from a prefill engine.",
         double(st.remote_prefills));
      m3("kv_remote_pages_loaded_total", "counter", "Pulled KV pages imported.", double(st.remote_pages_loaded));
      m3("kv_remote_load_failures_total", "counter", "Pulled KV pages that failed verification.",
         double(st.remote_load_failures));
    }
  }
  std::lock_guard lk(mu_);
  counter("prompt_tokens", "Number of prefill tokens processed.", double(prompt_tokens_));
  counter("generation_tokens", "Number of generation tokens processed.", double(generation_tokens_));
  o += "# HELP vllm:request_success_total Count of successfully processed requests.\n"
       "# TYPE vllm:request_success_total counter\n";
  for (const char* r : {"stop", "length", "abort"}) {
    auto it = success_.find(r);
    o += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", L, r,
                     it == success_.end() ? 0 : it->second);
  }
  // vLLM's histograms (its Grafana dashboard's panels), with vLLM's names and help texts.
  const std::tuple<const Histogram*, const char*, const char*> hists[] = {
      {&ttft_, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."},
      {&itl_, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."},
      {&e2e_, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."},
      {&req_prompt_, "vllm:request_prompt_tokens", "Number of prefill tokens processed."},
      {&req_gen_, "vllm:request_generation_tokens", "Number of generation tokens processed."},
      {&queue_, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."},
      {&prefill_, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."},
      {&decode_, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."},
      {&inference_, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."},
      {&req_tpot_, "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request."},
      {&iter_tokens_, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."},
      {&params_n_, "vllm:request_params_n", "Histogram of the n request parameter."},
      {&params_max_tokens_, "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."}};
  for (const auto& [h, name, help] : hists) h->render(o, name, L, help);
  if (!cache_config_.empty())
    o += "# HELP vllm:cache_config_info Information of the KV cache configuration.\n"
         "# TYPE vllm:cache_config_info gauge\n"
         "vllm:cache_config_info{" + L + "," + cache_config_ + "} 1\n";
  // Which server process answered: a client reading counters twice (bench serve's deltas) can tell when a
  // load balancer sent the two reads to different instances.
  o += "# HELP m3serve:instance_info This server process (a random id drawn at start).\n"
       "# TYPE m3serve:instance_info gauge\n";
  o += fmt::format("m3serve:instance_info{{{},instance_id=\"{}\"}} 1\n", L, instance_id_);
  return o;
}

}  // namespace m3::server
