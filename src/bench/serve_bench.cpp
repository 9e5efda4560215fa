// `m3serve bench serve` implementation: the HTTP streaming client, the random and agentic
// datasets, the arrival process and the report (see serve_bench.h; metrics in metrics.h).
#include "bench/serve_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "bench/bench_client.h"
#include "bench/datasets.h"
#include "bench/metrics.h"
#include "bench/plot.h"
#include "base/error.h"
#include "base/http_error_text.h"

namespace m3::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A progress bar on stderr, only when it is a terminal.
class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), on_(enabled && ::isatty(2)) { draw(); }
  void tick() {
    std::lock_guard lk(mu_);
    ++done_;
    draw();
  }
  ~Progress() {
    if (on_) std::fprintf(stderr, "\n");
  }

 private:
  void draw() {
    if (!on_ || total_ <= 0) return;
    const int w = 40, fill = int(w * done_ / total_);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld", std::string(size_t(fill), '#').c_str(), std::string(size_t(w - fill), ' ').c_str(),
                 (long long)done_, (long long)total_);
    std::fflush(stderr);
  }
  std::mutex mu_;
  int64_t total_, done_ = 0;
  bool on_;
};

// Caps the number of requests in flight (0: no cap).
class Limiter {
 public:
  explicit Limiter(int64_t cap) : cap_(cap) {}
  void acquire() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return cap_ <= 0 || used_ < cap_; });
    ++used_;
  }
  void release() {
    {
      std::lock_guard lk(mu_);
      --used_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t cap_, used_ = 0;
};

struct StreamOut {
  RequestTrace trace;
  std::string text;
  int64_t usage_prompt = -1, usage_completion = -1;
  int64_t chunks = 0;
};

// Sends one streamed request and records the chunk times. Times in the trace are relative to t0.
StreamOut stream_request(const Endpoint& ep, const std::string& path, bool chat, const json& body,
                         const httplib::Headers& extra, Clock::time_point t0) {
  StreamOut out;
  auto cli = ep.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = extra;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.body = body.dump();
  std::string buf, raw;
  Clock::time_point last{}, send_at{}, first_choice{}, last_choice{};
  bool first = true, saw_choice = false;
  auto on_line = [&](const std::string& line) {
    if (line.rfind("data:", 0) != 0) return;
    std::string payload = line.substr(5);
    while (!payload.empty() && payload.front() == ' ') payload.erase(0, 1);
    if (payload == "[DONE]") return;
    const json j = json::parse(payload, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      out.trace.error = j["error"].dump();
      return;
    }
    const auto now = Clock::now();
    std::string text;
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      // A chunk with choices, even with no text (a reply that ends at once): the request succeeded, as
      // vLLM's client counts it.
      if (!saw_choice) first_choice = now;
      saw_choice = true;
      last_choice = now;
      const json& c = j["choices"][0];
      if (chat) {
        if (c.contains("delta")) {
          const json& d = c["delta"];
          for (const char* k : {"content", "reasoning_content", "reasoning"})
            if (d.contains(k) && d[k].is_string()) text += d[k].get<std::string>();
        }
      } else if (c.contains("text") && c["text"].is_string()) {
        text = c["text"].get<std::string>();
      }
    }
    if (!text.empty()) {
      if (first) {
        out.trace.ttft = std::chrono::duration<double>(now - send_at).count();
        first = false;
      } else {
        out.trace.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      out.text += text;
      ++out.chunks;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number()) out.usage_prompt = u["prompt_tokens"];
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number()) out.usage_completion = u["completion_tokens"];
    }
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, std::min<size_t>(n, raw.size() < 4096 ? 4096 - raw.size() : 0));
    buf.append(d, n);
    size_t pos;
    while ((pos = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      buf.erase(0, pos + 1);
      on_line(line);
    }
    return true;
  };
  send_at = Clock::now();
  out.trace.send = std::chrono::duration<double>(send_at - t0).count();
  auto res = cli->send(req);
  if (!buf.empty()) on_line(buf);
  if (!res) {
    out.trace.error = "connection: " + http_error_text(res.error());
  } else if (res->status != 200) {
    // The server's error body (cpp-httplib may hand a non-200 body to res rather than to the receiver).
    out.trace.error = "HTTP " + std::to_string(res->status) + ": " + (raw.empty() ? res->body.substr(0, 4096) : raw);
  } else if (!saw_choice && out.trace.error.empty()) {
    out.trace.error = "no chunk with choices received";
  }
  out.trace.success = out.trace.error.empty();
  if (out.trace.success) {
    if (out.chunks == 0) {  // no text at all: the first and last chunks with choices time it
      out.trace.ttft = std::chrono::duration<double>(first_choice - send_at).count();
      last = last_choice;
    }
    out.trace.latency = std::chrono::duration<double>(last - send_at).count();
    out.trace.output_tokens = out.usage_completion >= 0 ? out.usage_completion : out.chunks;
  }
  out.trace.text = out.text;
  return out;
}

json request_body(const ServeBenchOptions& o, const std::string& model, bool chat, const json& input, int64_t max_tokens) {
  json b;
  b["model"] = model;
  if (chat) {
    b["messages"] = input;
    b["max_completion_tokens"] = max_tokens;
  } else {
    b["prompt"] = input;
    b["max_tokens"] = max_tokens;
  }
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  b["temperature"] = 0.0;
  if (o.ignore_eos) b["ignore_eos"] = true;
  return b;
}

// Word list for the agentic workload's synthetic file contents and tool results.
const char* const kWords[] = {"def",    "return", "self",   "import", "class",   "value",  "config", "error",
                              "result", "buffer", "index",  "tokens", "request", "assert", "path",   "file",
                              "main",   "struct", "const",  "int",    "string",  "vector", "if",     "else",
                              "for",    "while",  "update", "cache",  "server",  "client", "test",   "build"};

std::string synthetic_text(std::mt19937_64& rng, int64_t approx_tokens, const std::string& head) {
  std::string s = head;
  std::uniform_int_distribution<size_t> w(0, std::size(kWords) - 1);
  std::uniform_int_distribution<int> num(0, 9999);
  for (int64_t i = 0; i < approx_tokens; ++i) {
    if (i % 12 == 11) s += fmt::format(" {}\n", num(rng));
    else s += std::string(" ") + kWords[w(rng)];
  }
  return s;
}

// vLLM's --backend names for OpenAI-compatible servers, and the endpoint each implies.
struct BackendChoice {
  std::string name;      // as reported in the result JSON
  bool chat = false;     // chat-completions requests
  std::string endpoint;  // the path requests go to
};

BackendChoice choose_backend(const ServeBenchOptions& o) {
  static const char* const kCompletions[] = {"vllm", "openai", "sglang", "lmdeploy", "scalellm"};
  BackendChoice b;
  b.name = o.backend.empty() ? "openai" : o.backend;
  if (o.backend.empty()) {
    b.endpoint = o.endpoint.empty() ? "/v1/completions" : o.endpoint;
    if (b.endpoint != "/v1/completions" && b.endpoint != "/v1/chat/completions")
      throw Error("--endpoint must be /v1/completions or /v1/chat/completions");
    b.chat = b.endpoint == "/v1/chat/completions";
    return b;
  }
  if (o.backend == "openai-chat") {
    b.chat = true;
    b.endpoint = o.endpoint.empty() ? "/v1/chat/completions" : o.endpoint;
    if (b.endpoint != "/v1/chat/completions")
      throw Error("--backend openai-chat sends chat requests: --endpoint must be /v1/chat/completions, got " + b.endpoint);
    return b;
  }
  if (std::find(std::begin(kCompletions), std::end(kCompletions), o.backend) == std::end(kCompletions))
    throw Error("--backend " + o.backend +
                ": not supported by m3serve bench serve, which speaks the OpenAI completions and chat APIs (vllm, "
                "openai, sglang, lmdeploy, scalellm: /v1/completions; openai-chat: /v1/chat/completions)");
  b.endpoint = o.endpoint.empty() ? "/v1/completions" : o.endpoint;
  if (b.endpoint != "/v1/completions")
    throw Error("--backend " + o.backend + " sends completions requests: --endpoint must be /v1/completions (use --backend "
                "openai-chat for /v1/chat/completions), got " + b.endpoint);
  return b;
}

double prom_value_after(const Endpoint& ep, const std::string& name) { return prometheus_sum(ep.get_text("/metrics"), name); }

// The instance_id of m3serve:instance_info in the server's /metrics (empty for servers without it).
std::string server_instance(const Endpoint& ep) {
  const std::string text = ep.get_text("/metrics"), key = "instance_id=\"";
  const size_t at = text.find("m3serve:instance_info{");
  if (at == std::string::npos) return {};
  const size_t id = text.find(key, at), end = id == std::string::npos ? id : text.find('"', id + key.size());
  return end == std::string::npos ? std::string() : text.substr(id + key.size(), end - id - key.size());
}

// The server's speculative-decoding counters (vLLM names), summed over label sets; drafts < 0
// when the server exposes none.
struct SpecCounters {
  double drafts = -1, draft_tokens = 0, accepted = 0;
  std::vector<double> per_pos;
};

SpecCounters read_spec_counters(const Endpoint& ep) {
  SpecCounters c;
  std::string text;
  try {
    text = ep.get_text("/metrics");
  } catch (const std::exception&) {
    return c;
  }
  c.drafts = prometheus_sum(text, "vllm:spec_decode_num_drafts_total");
  c.draft_tokens = prometheus_sum(text, "vllm:spec_decode_num_draft_tokens_total");
  c.accepted = prometheus_sum(text, "vllm:spec_decode_num_accepted_tokens_total");
  std::istringstream in(text);
  std::string line;
  const std::string name = "vllm:spec_decode_num_accepted_tokens_per_pos_total{";
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t at = line.find("position=\"");
    const size_t sp = line.rfind(' ');
    if (at == std::string::npos || sp == std::string::npos) continue;
    const size_t pos = size_t(std::strtoul(line.c_str() + at + 10, nullptr, 10));
    if (pos >= 64) continue;
    if (c.per_pos.size() <= pos) c.per_pos.resize(pos + 1, 0.0);
    c.per_pos[pos] += std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return c;
}

}  // namespace

double prometheus_sum(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  double sum = 0;
  bool found = false;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    sum += std::strtod(line.c_str() + sp + 1, nullptr);
    found = true;
  }
  return found ? sum : -1;
}

nlohmann::ordered_json run_serve_bench(const ServeBenchOptions& o) {
  Endpoint ep;
  ep.base = o.base_url.empty() ? fmt::format("http://{}:{}", o.host, o.port) : o.base_url;
  while (!ep.base.empty() && ep.base.back() == '/') ep.base.pop_back();
  std::string key = o.api_key;
  if (key.empty())
    if (const char* k = std::getenv("OPENAI_API_KEY")) key = k;
  if (!key.empty()) ep.headers.emplace("Authorization", "Bearer " + key);
  const BackendChoice be = choose_backend(o);
  const bool agentic = o.dataset_name == "agentic";
  if (o.dataset_name != "random" && o.dataset_name != "sharegpt" && o.dataset_name != "custom" && !agentic)
    throw Error("--dataset-name " + o.dataset_name + ": m3serve bench serve has random, sharegpt, custom and agentic");
  if (!(o.burstiness > 0)) throw Error("--burstiness must be positive (1: Poisson arrivals)");
  const GoodputSlo slo = parse_goodput(o.goodput);
  const ReportSelection sel = parse_report_selection(o.percentile_metrics, o.metric_percentiles);
  const bool chat = agentic || be.chat;
  const std::string path = agentic ? "/v1/chat/completions" : be.endpoint;

  std::string model = o.model;
  if (model.empty()) {
    const json models = ep.get_json("/v1/models");
    if (!models.contains("data") || models["data"].empty()) throw Error("/v1/models lists no model; pass --model");
    model = models["data"][0]["id"].get<std::string>();
  }
  std::fprintf(stderr, "bench serve: %s%s, model %s, dataset %s\n", ep.base.c_str(), path.c_str(), model.c_str(),
               o.dataset_name.c_str());

  std::vector<RequestTrace> traces;
  std::mutex mu;
  Limiter limiter(o.max_concurrency);
  double hits0 = -1, queries0 = -1;
  std::string instance0;  // m3serve:instance_info at the first read
  const SpecCounters spec0 = read_spec_counters(ep);
  Clock::time_point t0;
  std::vector<double> e2e_per_token;  // agentic: E2EL_i / OSL_i
  double duration = 0;

  if (!agentic) {
    std::unique_ptr<TokenBackend> tok;
    if (!o.tokenizer_dir.empty()) tok = std::make_unique<LocalTokens>(o.tokenizer_dir);
    else tok = std::make_unique<ServerTokens>(ep, model);
    std::fprintf(stderr, "building %lld %s prompts...\n", (long long)o.num_prompts, o.dataset_name.c_str());
    const std::vector<Prompt> prompts = o.dataset_name == "sharegpt" ? sharegpt_dataset(o, *tok)
                                        : o.dataset_name == "custom" ? custom_dataset(o, *tok, chat, ep, model)
                                                                     : random_dataset(o, *tok);
    traces.resize(prompts.size());
    Progress bar(int64_t(prompts.size()), o.progress);
    std::mt19937_64 arrivals(o.seed ^ 0x9e3779b97f4a7c15ull);
    // vLLM's arrival process: gaps drawn from a Gamma distribution of shape `burstiness` and mean
    // 1/rate (shape 1 is the exponential: Poisson arrivals).
    const double rate = std::isinf(o.request_rate) ? 1.0 : o.request_rate;
    std::exponential_distribution<double> poisson_gap(rate);
    std::gamma_distribution<double> gamma_gap(o.burstiness, 1.0 / (rate * o.burstiness));
    auto gap = [&](std::mt19937_64& g) { return o.burstiness == 1.0 ? poisson_gap(g) : gamma_gap(g); };
    std::vector<std::thread> threads;
    t0 = Clock::now();
    double next = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (!std::isinf(o.request_rate)) {
        if (i > 0) next += gap(arrivals);
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(next)));
      }
      limiter.acquire();
      threads.emplace_back([&, i] {
        const Prompt& p = prompts[i];
        json input = chat ? json::array({{{"role", "user"}, {"content", p.text}}}) : p.ids.empty() ? json(p.text) : json(p.ids);
        StreamOut r = stream_request(ep, path, chat, request_body(o, model, chat, input, p.output_len), {}, t0);
        // The server's count where it sent usage (a chat prompt's template tokens included).
        r.trace.prompt_len = chat && r.usage_prompt >= 0 ? r.usage_prompt : p.prompt_len;
        {
          std::lock_guard lk(mu);
          traces[i] = std::move(r.trace);
        }
        limiter.release();
        bar.tick();
      });
    }
    for (auto& t : threads) t.join();
  } else {
    // Agentic: each session is one user running its turns in order; the prompt of turn n+1 is the
    // whole conversation so far (context, replies, tool results), so it extends turn n's prompt.
    instance0 = server_instance(ep);
    hits0 = prom_value_after(ep, "vllm:prefix_cache_hits_total");
    queries0 = prom_value_after(ep, "vllm:prefix_cache_queries_total");
    const int64_t total = o.num_sessions * o.turns;
    Progress bar(total, o.progress);
    std::vector<std::thread> threads;
    t0 = Clock::now();
    for (int64_t s = 0; s < o.num_sessions; ++s) {
      threads.emplace_back([&, s] {
        std::mt19937_64 rng(o.seed * 1000003ull + uint64_t(s));
        const std::string sid = fmt::format("m3bench-{}-{}", o.seed, s);
        httplib::Headers hdr{{o.session_header, sid}};
        json messages = json::array();
        messages.push_back({{"role", "system"},
                            {"content", synthetic_text(rng, o.random_input_len, "You are a coding agent. Repository files:\n")}});
        messages.push_back({{"role", "user"}, {"content", "Fix the failing test in the build and explain the change."}});
        for (int64_t t = 0; t < o.turns; ++t) {
          limiter.acquire();
          StreamOut r = stream_request(ep, path, true, request_body(o, model, true, messages, o.random_output_len), hdr, t0);
          limiter.release();
          r.trace.prompt_len = r.usage_prompt >= 0 ? r.usage_prompt : 0;
          const bool ok = r.trace.success;
          {
            std::lock_guard lk(mu);
            traces.push_back(r.trace);
          }
          bar.tick();
          if (!ok) break;
          messages.push_back({{"role", "assistant"}, {"content", r.text}});
          messages.push_back({{"role", "user"},
                              {"content", synthetic_text(rng, o.tool_result_len, fmt::format("Tool result (step {}):\n", t + 1))}});
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const auto& t : traces)
    if (t.success) duration = std::max(duration, t.send + t.latency);
  double first_send = 1e300;
  for (const auto& t : traces) first_send = std::min(first_send, t.send);
  if (first_send < 1e300) duration -= first_send;
  if (duration <= 0) duration = seconds_since(t0);

  const BenchMetrics m = compute_metrics(traces, duration, slo);
  nlohmann::ordered_json result;
  {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
    result["date"] = date;
  }
  result["backend"] = be.name;
  result["base_url"] = ep.base;
  result["endpoint"] = path;
  result["model_id"] = model;
  result["dataset_name"] = o.dataset_name;
  result["num_prompts"] = agentic ? o.num_sessions * o.turns : o.num_prompts;
  result["request_rate"] = std::isinf(o.request_rate) ? json("inf") : json(o.request_rate);
  result["max_concurrency"] = o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr);
  result["seed"] = o.seed;
  result["tokenizer_id"] = o.tokenizer_dir.empty() ? model : o.tokenizer_dir;
  result["burstiness"] = o.burstiness;
  const nlohmann::ordered_json mj = metrics_json(m, sel);
  for (auto it = mj.begin(); it != mj.end(); ++it) result[it.key()] = it.value();
  // Per request, as vLLM's result file has them (seconds; a failed request has 0 and its error).
  {
    json in_lens = json::array(), out_lens = json::array(), ttfts = json::array(), itls = json::array(),
         texts = json::array(), errors = json::array();
    for (const auto& t : traces) {
      in_lens.push_back(t.prompt_len);
      out_lens.push_back(t.success ? t.output_tokens : 0);
      ttfts.push_back(t.success ? t.ttft : 0.0);
      itls.push_back(t.itl);
      texts.push_back(t.text);
      errors.push_back(t.error);
    }
    result["input_lens"] = in_lens;
    result["output_lens"] = out_lens;
    result["ttfts"] = ttfts;
    result["itls"] = itls;
    result["generated_texts"] = texts;
    result["errors"] = errors;
  }
  std::string report = format_report(m, agentic ? "Agentic Benchmark Result" : "Serving Benchmark Result", sel);
  if (agentic) {
    const double hits1 = prom_value_after(ep, "vllm:prefix_cache_hits_total");
    const double queries1 = prom_value_after(ep, "vllm:prefix_cache_queries_total");
    const double dq = queries1 - queries0, dh = hits1 - hits0;
    // Behind a load balancer the reads before and after may come from different instances (m3serve
    // names itself in m3serve:instance_info): their difference would mean nothing.
    const bool same_instance = instance0 == server_instance(ep);
    const bool have = same_instance && hits0 >= 0 && queries0 >= 0 && hits1 >= 0 && queries1 >= 0 && dq > 0;
    for (const auto& t : traces)
      if (t.success && t.output_tokens > 0) e2e_per_token.push_back(t.latency / double(t.output_tokens));
    const double p90_norm = percentile(e2e_per_token, 90);
    result["num_sessions"] = o.num_sessions;
    result["turns"] = o.turns;
    result["session_header"] = o.session_header;
    result["tok_per_s"] = m.total_token_throughput;
    result["tok_per_s_per_user"] = m.itl.mean > 0 ? 1000.0 / m.itl.mean : 0.0;
    result["p90_ttft_ms"] = m.ttft.p90;
    result["e2e_normalized_interactivity"] = p90_norm > 0 ? 1.0 / p90_norm : 0.0;
    result["prefix_cache_queries"] = have ? json(dq) : json(nullptr);
    result["prefix_cache_hits"] = have ? json(dh) : json(nullptr);
    result["prefix_cache_hit_rate"] = have ? json(dh / dq) : json(nullptr);
    report += fmt::format("{:<40}{:>10}\n", "Sessions x turns:", fmt::format("{}x{}", o.num_sessions, o.turns));
    report += fmt::format("{:<40}{:>10.2f}\n", "Total tok/s:", m.total_token_throughput);
    report += fmt::format("{:<40}{:>10.2f}\n", "Tok/s per user (1/ITL):", result["tok_per_s_per_user"].get<double>());
    report += fmt::format("{:<40}{:>10.2f}\n", "P90 TTFT (ms):", m.ttft.p90);
    report += fmt::format("{:<40}{:>10.2f}\n", "E2E-normalised interactivity (tok/s):",
                          result["e2e_normalized_interactivity"].get<double>());
    report += fmt::format("{:<40}{:>10}\n", "Prefix cache hit rate:",
                          have ? fmt::format("{:.1f}%", 100.0 * dh / dq) : std::string("n/a"));
    if (!same_instance)
      report += "(the /metrics reads before and after the run came from different server instances, as behind a\n"
                " load balancer: read each instance's vllm:prefix_cache_* counters for the hit rate)\n";
  }
  const SpecCounters spec1 = read_spec_counters(ep);
  if (spec0.drafts >= 0 && spec1.drafts > spec0.drafts) {
    // Speculative decoding during the run (deltas of the server's counters), as vLLM reports it.
    const double drafts = spec1.drafts - spec0.drafts, dt = spec1.draft_tokens - spec0.draft_tokens,
                 acc = spec1.accepted - spec0.accepted;
    nlohmann::ordered_json per = nlohmann::ordered_json::array();
    for (size_t i = 0; i < spec1.per_pos.size(); ++i)
      per.push_back((spec1.per_pos[i] - (i < spec0.per_pos.size() ? spec0.per_pos[i] : 0.0)) / drafts);
    result["spec_decode_num_drafts"] = drafts;
    result["spec_decode_num_draft_tokens"] = dt;
    result["spec_decode_num_accepted_tokens"] = acc;
    result["spec_decode_acceptance_length"] = 1.0 + acc / drafts;
    result["spec_decode_acceptance_rate"] = dt > 0 ? acc / dt : 0.0;
    result["spec_decode_acceptance_rate_per_pos"] = per;
    report += fmt::format("{:-^50}\n", "Speculative Decoding");
    report += fmt::format("{:<40}{:>10.2f}\n", "Acceptance rate (%):", dt > 0 ? 100.0 * acc / dt : 0.0);
    report += fmt::format("{:<40}{:>10.2f}\n", "Acceptance length:", 1.0 + acc / drafts);
    report += fmt::format("{:<40}{:>10.0f}\n", "Drafts:", drafts);
    report += fmt::format("{:<40}{:>10.0f}\n", "Draft tokens:", dt);
    report += fmt::format("{:<40}{:>10.0f}\n", "Accepted tokens:", acc);
    std::string pp;
    for (const auto& v : per) pp += fmt::format("{}{:.2f}", pp.empty() ? "" : " ", v.get<double>());
    report += fmt::format("{:<40}{:>10}\n", "Per-position acceptance rate:", pp);
    report += std::string(50, '=') + "\n";
  }
  std::fputs(report.c_str(), stdout);
  std::fflush(stdout);
  size_t shown = 0, failed = 0;
  for (const auto& t : traces) {
    failed += !t.success;
    if (!t.success && shown++ < 3) std::fprintf(stderr, "failed request: %s\n", t.error.c_str());
  }
  if (!o.save_result.empty()) {
    std::ofstream f(o.save_result);
    if (!f) throw Error("cannot write " + o.save_result);
    f << result.dump(2) << "\n";
  }
  if (!o.plot.empty()) write_latency_svg(o.plot, traces, agentic ? "agentic" : "random");
  // Every request failing is not a measurement (vLLM's bench stops there too): exit non-zero with the reason.
  if (!traces.empty() && failed == traces.size())
    throw Error("all " + std::to_string(failed) + " requests failed; the first: " + traces.front().error);
  return result;
}

}  // namespace m3::bench
