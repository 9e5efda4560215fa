// `m3serve bench serve` implementation: the HTTP streaming client, the random and agentic
// datasets, the arrival process and the report (see serve_bench.h; metrics in metrics.h).
#include "bench/serve_bench.h"

#include <httplib.h>
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

#include "bench/metrics.h"
#include "bench/plot.h"
#include "formats/error.h"
#include "tokenizer/tokenizer.h"

namespace m3::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Endpoint {
  std::string base;
  httplib::Headers headers;
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>(base);
    c->set_connection_timeout(10);
    c->set_read_timeout(3600);
    c->set_write_timeout(600);
    c->set_default_headers(headers);
    return c;
  }
  json get_json(const std::string& path) const {
    auto r = client()->Get(path.c_str());
    if (!r) throw Error("GET " + base + path + ": " + httplib::to_string(r.error()));
    if (r->status != 200) throw Error("GET " + base + path + ": HTTP " + std::to_string(r->status) + ": " + r->body);
    return json::parse(r->body);
  }
  // Returns status and body; throws only when the server cannot be reached.
  std::pair<int, std::string> post(const std::string& path, const json& body) const {
    auto r = client()->Post(path.c_str(), body.dump(), "application/json");
    if (!r) throw Error("POST " + base + path + ": " + httplib::to_string(r.error()));
    return {r->status, r->body};
  }
  std::string get_text(const std::string& path) const {
    auto r = client()->Get(path.c_str());
    return (r && r->status == 200) ? r->body : std::string();
  }
};

// Tokenizer access: a local tokenizer.json, or the server's /tokenize and /detokenize.
class TokenBackend {
 public:
  virtual ~TokenBackend() = default;
  virtual std::vector<int32_t> encode(const std::string& text) = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) = 0;
  // Ids usable in random prompts (special tokens excluded).
  virtual std::vector<int32_t> allowed_ids() = 0;
};

class LocalTokens : public TokenBackend {
 public:
  explicit LocalTokens(const std::string& dir) : tok_(Tokenizer::from_dir(dir)) {}
  std::vector<int32_t> encode(const std::string& t) override { return tok_.encode(t, true); }
  std::string decode(const std::vector<int32_t>& ids) override { return tok_.decode(ids, false); }
  std::vector<int32_t> allowed_ids() override {
    std::vector<int32_t> a;
    for (int32_t i = 0; i < tok_.vocab_size(); ++i)
      if (tok_.is_valid(i) && !tok_.is_special(i)) a.push_back(i);
    return a;
  }

 private:
  Tokenizer tok_;
};

class ServerTokens : public TokenBackend {
 public:
  ServerTokens(const Endpoint& ep, std::string model) : ep_(ep), model_(std::move(model)) {}
  std::vector<int32_t> encode(const std::string& t) override {
    auto [st, body] = ep_.post("/tokenize", {{"model", model_}, {"prompt", t}});
    if (st != 200) throw Error("/tokenize: HTTP " + std::to_string(st) + ": " + body);
    return json::parse(body).at("tokens").get<std::vector<int32_t>>();
  }
  std::string decode(const std::vector<int32_t>& ids) override {
    auto [st, body] = ep_.post("/detokenize", {{"model", model_}, {"tokens", ids}});
    if (st != 200) throw Error("/detokenize: HTTP " + std::to_string(st) + ": " + body);
    return json::parse(body).at("prompt").get<std::string>();
  }
  // The vocabulary size is found by bisection on /detokenize (valid ids answer 200). Hugging Face
  // tokenizers put the added (special) tokens last, so the top 1% (at least 64 ids) is left out;
  // --tokenizer gives the exact set.
  std::vector<int32_t> allowed_ids() override {
    auto valid = [&](int32_t id) { return ep_.post("/detokenize", {{"model", model_}, {"tokens", {id}}}).first == 200; };
    if (!valid(0)) throw Error("/detokenize does not accept token id 0; pass --tokenizer DIR");
    int64_t lo = 0, hi = 1 << 24;  // valid(lo), !valid(hi)
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (valid(int32_t(mid)) ? lo : hi) = mid;
    }
    const int64_t vocab = lo + 1;
    const int64_t keep = std::max<int64_t>(1, vocab - std::max<int64_t>(64, vocab / 100));
    std::vector<int32_t> a(static_cast<size_t>(keep));
    for (int64_t i = 0; i < keep; ++i) a[size_t(i)] = int32_t(i);
    return a;
  }

 private:
  const Endpoint& ep_;
  std::string model_;
};

struct Prompt {
  std::string text;
  int64_t prompt_len = 0, output_len = 0;
};

// docs/serving.md 10.1: lengths uniform in [floor(L(1-r)), ceil(L(1+r))]; a body of consecutive
// allowed ids from a random offset; decoded, re-encoded and trimmed / padded to the target length.
std::vector<Prompt> random_dataset(const ServeBenchOptions& o, TokenBackend& tok) {
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1)) throw Error("--random-range-ratio must be in [0, 1)");
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> allowed = tok.allowed_ids();
  if (allowed.empty()) throw Error("no usable token ids");
  const int64_t n_special = int64_t(tok.encode("").size());
  const int64_t real_in = std::max<int64_t>(1, o.random_input_len - n_special);
  const double r = o.random_range_ratio;
  std::uniform_int_distribution<int64_t> in_len(std::max<int64_t>(1, int64_t(std::floor(real_in * (1 - r)))),
                                                int64_t(std::ceil(real_in * (1 + r))));
  std::uniform_int_distribution<int64_t> out_len(std::max<int64_t>(1, int64_t(std::floor(o.random_output_len * (1 - r)))),
                                                 std::max<int64_t>(1, int64_t(std::ceil(o.random_output_len * (1 + r)))));
  std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
  std::vector<int32_t> prefix(size_t(std::max<int64_t>(0, o.random_prefix_len)));
  for (auto& id : prefix) id = allowed[pick(rng)];
  std::vector<Prompt> out;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    Prompt p;
    const int64_t target = int64_t(prefix.size()) + in_len(rng);
    p.output_len = out_len(rng);
    const size_t offset = pick(rng);
    std::vector<int32_t> ids = prefix;
    for (int64_t j = int64_t(prefix.size()); j < target; ++j) ids.push_back(allowed[(offset + size_t(i) + size_t(j)) % allowed.size()]);
    // Decoding then re-encoding can merge or split tokens: adjust a few times towards the target.
    for (int iter = 0; iter < 4; ++iter) {
      p.text = tok.decode(ids);
      ids = tok.encode(p.text);
      if (int64_t(ids.size()) == target) break;
      if (int64_t(ids.size()) > target) ids.resize(size_t(target));
      while (int64_t(ids.size()) < target) ids.push_back(allowed[pick(rng)]);
    }
    p.prompt_len = int64_t(ids.size());  // verified length of the final text
    out.push_back(std::move(p));
  }
  return out;
}

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
  Clock::time_point last{}, send_at{};
  bool first = true;
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
    out.trace.error = "connection: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    out.trace.error = "HTTP " + std::to_string(res->status) + ": " + raw;
  } else if (out.chunks == 0 && out.trace.error.empty()) {
    out.trace.error = "no non-empty chunk received";
  }
  out.trace.success = out.trace.error.empty();
  if (out.trace.success) {
    out.trace.latency = std::chrono::duration<double>(last - send_at).count();
    out.trace.output_tokens = out.usage_completion >= 0 ? out.usage_completion : out.chunks;
  }
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

double prom_value_after(const Endpoint& ep, const std::string& name) { return prometheus_sum(ep.get_text("/metrics"), name); }

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
  if (o.endpoint != "/v1/completions" && o.endpoint != "/v1/chat/completions")
    throw Error("--endpoint must be /v1/completions or /v1/chat/completions");
  const bool agentic = o.dataset_name == "agentic";
  if (o.dataset_name != "random" && !agentic) throw Error("--dataset-name must be random or agentic");
  const bool chat = agentic || o.endpoint == "/v1/chat/completions";
  const std::string path = agentic ? "/v1/chat/completions" : o.endpoint;

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
  const SpecCounters spec0 = read_spec_counters(ep);
  Clock::time_point t0;
  std::vector<double> e2e_per_token;  // agentic: E2EL_i / OSL_i
  double duration = 0;

  if (!agentic) {
    std::unique_ptr<TokenBackend> tok;
    if (!o.tokenizer_dir.empty()) tok = std::make_unique<LocalTokens>(o.tokenizer_dir);
    else tok = std::make_unique<ServerTokens>(ep, model);
    std::fprintf(stderr, "building %lld random prompts...\n", (long long)o.num_prompts);
    const std::vector<Prompt> prompts = random_dataset(o, *tok);
    traces.resize(prompts.size());
    Progress bar(int64_t(prompts.size()), o.progress);
    std::mt19937_64 arrivals(o.seed ^ 0x9e3779b97f4a7c15ull);
    std::exponential_distribution<double> gap(std::isinf(o.request_rate) ? 1.0 : o.request_rate);
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
        json input = chat ? json::array({{{"role", "user"}, {"content", p.text}}}) : json(p.text);
        StreamOut r = stream_request(ep, path, chat, request_body(o, model, chat, input, p.output_len), {}, t0);
        r.trace.prompt_len = p.prompt_len;
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

  const BenchMetrics m = compute_metrics(traces, duration);
  nlohmann::ordered_json result;
  {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
    result["date"] = date;
  }
  result["backend"] = "openai";
  result["base_url"] = ep.base;
  result["endpoint"] = path;
  result["model_id"] = model;
  result["dataset_name"] = o.dataset_name;
  result["num_prompts"] = agentic ? o.num_sessions * o.turns : o.num_prompts;
  result["request_rate"] = std::isinf(o.request_rate) ? json("inf") : json(o.request_rate);
  result["max_concurrency"] = o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr);
  result["seed"] = o.seed;
  const nlohmann::ordered_json mj = metrics_json(m);
  for (auto it = mj.begin(); it != mj.end(); ++it) result[it.key()] = it.value();
  std::string report = format_report(m, agentic ? "Agentic Benchmark Result" : "Serving Benchmark Result");
  if (agentic) {
    const double hits1 = prom_value_after(ep, "vllm:prefix_cache_hits_total");
    const double queries1 = prom_value_after(ep, "vllm:prefix_cache_queries_total");
    const double dq = queries1 - queries0, dh = hits1 - hits0;
    const bool have = hits0 >= 0 && queries0 >= 0 && hits1 >= 0 && queries1 >= 0 && dq > 0;
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
  size_t shown = 0;
  for (const auto& t : traces)
    if (!t.success && shown++ < 3) std::fprintf(stderr, "failed request: %s\n", t.error.c_str());
  if (!o.save_result.empty()) {
    std::ofstream f(o.save_result);
    if (!f) throw Error("cannot write " + o.save_result);
    f << result.dump(2) << "\n";
  }
  if (!o.plot.empty()) write_latency_svg(o.plot, traces, agentic ? "agentic" : "random");
  return result;
}

}  // namespace m3::bench
