// The prefill/decode proxy (see pd_proxy.h), over cpp-httplib (Debian's), server and client.
#include "proxy/pd_proxy.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/http_error_text.h"

namespace m3::proxy {

namespace {

using json = nlohmann::ordered_json;

std::string error_body(int status, const std::string& msg) {
  json j;
  j["error"] = {{"message", msg}, {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                {"code", status}};
  return j.dump();
}

std::string request_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char b[40];
  std::snprintf(b, sizeof b, "pd-%016llx%016llx", (unsigned long long)rng(), (unsigned long long)rng());
  return b;
}

// What travels from the client to both engines: its key, and one request id for the two legs.
httplib::Headers forward_headers(const httplib::Request& req, const std::string& rid) {
  httplib::Headers h;
  if (req.has_header("Authorization")) h.emplace("Authorization", req.get_header_value("Authorization"));
  h.emplace("X-Request-Id", rid);
  return h;
}

// A decode answer read on its own thread and handed over in pieces, so that the status is known (and
// an error answered with it) before the client's response begins, and a stream is passed on as it comes.
struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> chunks;
  bool have_status = false, done = false, cancelled = false;
  int status = 0;
  std::string content_type, error;
};

void start_decode(std::shared_ptr<Pipe> pipe, EngineUrl u, std::string path, httplib::Headers headers,
                  std::string body, double timeout_s) {
  std::thread([=] {
    httplib::Client c(u.host, u.port);
    c.set_read_timeout(std::chrono::milliseconds(int64_t(timeout_s * 1000)));
    c.set_write_timeout(std::chrono::seconds(30));
    httplib::Request rq;
    rq.method = "POST";
    rq.path = path;
    rq.headers = headers;
    rq.set_header("Content-Type", "application/json");
    rq.body = body;
    rq.response_handler = [&](const httplib::Response& r) {
      std::lock_guard lk(pipe->mu);
      pipe->status = r.status;
      pipe->content_type = r.get_header_value("Content-Type");
      pipe->have_status = true;
      pipe->cv.notify_all();
      return true;
    };
    rq.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      std::lock_guard lk(pipe->mu);
      if (pipe->cancelled) return false;  // the client went away: the decode request is dropped too
      pipe->chunks.emplace_back(d, n);
      pipe->cv.notify_all();
      return true;
    };
    httplib::Response rs;
    httplib::Error err = httplib::Error::Success;
    const bool ok = c.send(rq, rs, err);
    std::lock_guard lk(pipe->mu);
    if (!ok && !pipe->cancelled) pipe->error = http_error_text(err);
    pipe->done = true;
    pipe->cv.notify_all();
  }).detach();
}

struct Proxy {
  ProxyOptions opt;
  std::vector<EngineUrl> prefill, decode;
  std::atomic<uint64_t> next_p{0}, next_d{0};

  void handle(const httplib::Request& req, httplib::Response& res, const std::string& path) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      res.status = 400;
      res.set_content(error_body(400, "the request body is not a JSON object"), "application/json");
      return;
    }
    const EngineUrl p = prefill[next_p++ % prefill.size()];
    const EngineUrl d = decode[next_d++ % decode.size()];
    const std::string rid = request_id();
    const httplib::Headers headers = forward_headers(req, rid);
    const std::string pname = p.host + ":" + std::to_string(p.port), dname = d.host + ":" + std::to_string(d.port);

    // Leg 1: the prefill engine computes the prompt and holds its pages (one token, not streamed).
    json pb = body;
    pb["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false},
                                {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                {"remote_host", nullptr}, {"remote_port", nullptr}};
    pb["stream"] = false;
    pb["max_tokens"] = 1;
    if (pb.contains("max_completion_tokens")) pb["max_completion_tokens"] = 1;
    pb.erase("stream_options");
    httplib::Client pc(p.host, p.port);
    pc.set_read_timeout(std::chrono::milliseconds(int64_t(opt.timeout_s * 1000)));
    auto pr = pc.Post(path, headers, pb.dump(), "application/json");
    if (!pr) {
      res.status = 502;
      res.set_content(error_body(502, "the prefill engine " + pname + " could not be reached: " +
                                          http_error_text(pr.error())),
                      "application/json");
      return;
    }
    if (pr->status != 200) {  // its error, as it gave it
      res.status = pr->status;
      res.set_content(pr->body, "application/json");
      return;
    }
    json pj = json::parse(pr->body, nullptr, false);
    if (pj.is_discarded() || !pj.contains("kv_transfer_params") || !pj["kv_transfer_params"].is_object()) {
      res.status = 502;
      res.set_content(error_body(502, "the prefill engine " + pname +
                                          " returned no kv_transfer_params (is it started with a NixlConnector "
                                          "kv_role kv_producer or kv_both?)"),
                      "application/json");
      return;
    }
    // Leg 2: the decode engine pulls the pages and answers the client's request as it was sent.
    body["kv_transfer_params"] = pj["kv_transfer_params"];
    auto pipe = std::make_shared<Pipe>();
    start_decode(pipe, d, path, headers, body.dump(), opt.timeout_s);
    std::unique_lock lk(pipe->mu);
    pipe->cv.wait(lk, [&] { return pipe->have_status || pipe->done; });
    if (!pipe->have_status) {
      res.status = 502;
      res.set_content(error_body(502, "the decode engine " + dname + " could not be reached: " + pipe->error),
                      "application/json");
      return;
    }
    const std::string ctype = pipe->content_type.empty() ? "application/json" : pipe->content_type;
    if (pipe->status != 200 || ctype.rfind("text/event-stream", 0) != 0) {
      // A whole answer (or an error): passed on with the decode engine's status.
      pipe->cv.wait(lk, [&] { return pipe->done; });
      std::string all;
      for (auto& c : pipe->chunks) all += c;
      if (!pipe->error.empty() && pipe->status == 200) {
        res.status = 502;
        res.set_content(error_body(502, "the decode engine " + dname + " broke off its answer: " + pipe->error),
                        "application/json");
        return;
      }
      res.status = pipe->status;
      res.set_content(all, ctype);
      return;
    }
    lk.unlock();
    res.status = 200;
    res.set_chunked_content_provider(
        ctype,
        [pipe, dname](size_t, httplib::DataSink& sink) {
          std::unique_lock l(pipe->mu);
          pipe->cv.wait(l, [&] { return !pipe->chunks.empty() || pipe->done; });
          while (!pipe->chunks.empty()) {
            std::string c = std::move(pipe->chunks.front());
            pipe->chunks.pop_front();
            l.unlock();
            if (!sink.write(c.data(), c.size())) {
              l.lock();
              pipe->cancelled = true;
              return false;
            }
            l.lock();
          }
          if (pipe->done) {
            if (!pipe->error.empty()) {
              // The decode engine went away mid-stream: an error event, then the stream's end.
              const std::string ev = "data: " + error_body(502, "the decode engine " + dname +
                                                                    " broke off its stream: " + pipe->error) +
                                     "\n\ndata: [DONE]\n\n";
              l.unlock();
              sink.write(ev.data(), ev.size());
            }
            sink.done();
          }
          return true;
        },
        [pipe](bool) {
          std::lock_guard l(pipe->mu);
          pipe->cancelled = true;
        });
  }
};

}  // namespace

EngineUrl parse_engine_url(const std::string& url) {
  std::string s = url;
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  else if (s.find("://") != std::string::npos)
    throw Error("engine URL \"" + url + "\": only http:// is served (engines speak plain HTTP)");
  for (const char* tail : {"/v1/", "/v1", "/"})
    if (s.size() >= std::strlen(tail) && s.compare(s.size() - std::strlen(tail), std::string::npos, tail) == 0)
      s.erase(s.size() - std::strlen(tail));
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || s.find('/') != std::string::npos)
    throw Error("engine URL \"" + url + "\": expected http://HOST:PORT");
  EngineUrl u;
  u.host = s.substr(0, colon);
  try {
    size_t used = 0;
    u.port = std::stoi(s.substr(colon + 1), &used);
    if (used != s.size() - colon - 1 || u.port < 1 || u.port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    throw Error("engine URL \"" + url + "\": the port must be an integer in [1, 65535]");
  }
  return u;
}

void run_proxy(const ProxyOptions& opt) {
  Proxy px;
  px.opt = opt;
  if (opt.prefill.empty()) throw Error("proxy: give at least one --prefill URL");
  if (opt.decode.empty()) throw Error("proxy: give at least one --decode URL");
  for (const auto& u : opt.prefill) px.prefill.push_back(parse_engine_url(u));
  for (const auto& u : opt.decode) px.decode.push_back(parse_engine_url(u));
  httplib::Server svr;
  svr.Post("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) { px.handle(q, r, "/v1/completions"); });
  svr.Post("/v1/chat/completions",
           [&](const httplib::Request& q, httplib::Response& r) { px.handle(q, r, "/v1/chat/completions"); });
  // Ready when at least one prefill and one decode engine answer their own /health (1 s each): a probe
  // must not keep sending traffic to a proxy that can only answer 502.
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& r) {
    auto up = [](const EngineUrl& u) {
      httplib::Client c(u.host, u.port);
      c.set_connection_timeout(1, 0);
      c.set_read_timeout(1, 0);
      auto a = c.Get("/health");
      return bool(a) && a->status == 200;
    };
    size_t p_up = 0, d_up = 0;
    for (const auto& u : px.prefill) p_up += up(u);
    for (const auto& u : px.decode) d_up += up(u);
    const bool ok = p_up > 0 && d_up > 0;
    json j = {{"status", ok ? "ok" : "unavailable"},
              {"prefill_instances", px.prefill.size()}, {"prefill_up", p_up},
              {"decode_instances", px.decode.size()}, {"decode_up", d_up}};
    r.status = ok ? 200 : 503;
    r.set_content(j.dump(), "application/json");
  });
  svr.Get("/v1/models", [&](const httplib::Request& q, httplib::Response& r) {
    const EngineUrl d = px.decode[0];
    httplib::Client c(d.host, d.port);
    httplib::Headers h;
    if (q.has_header("Authorization")) h.emplace("Authorization", q.get_header_value("Authorization"));
    auto a = c.Get("/v1/models", h);
    if (!a) {
      r.status = 502;
      r.set_content(error_body(502, "the decode engine could not be reached"), "application/json");
      return;
    }
    r.status = a->status;
    r.set_content(a->body, "application/json");
  });
  const int port = opt.port == 0 ? svr.bind_to_any_port(opt.host) : (svr.bind_to_port(opt.host, opt.port) ? opt.port : -1);
  if (port < 0) throw Error("proxy: cannot listen on " + opt.host + ":" + std::to_string(opt.port));
  std::fprintf(stderr, "[m3serve] proxy listening on http://%s:%d: %zu prefill, %zu decode engine(s)\n",
               opt.host.c_str(), port, px.prefill.size(), px.decode.size());
  svr.listen_after_bind();
}

}  // namespace m3::proxy
