// HTTP routes of the OpenAI-compatible server (see http_server.h).
//
// cpp-httplib from Debian is a compiled library built with OpenSSL/zlib/brotli support; its header
// must see the same macros (they change struct layouts), so CMake passes pkg-config's flags.
// The server itself only ever listens on plain HTTP.
#include "server/http_server.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>
#include <unordered_map>

#include "formats/error.h"
#include "server/async_engine.h"
#include "server/errors.h"
#include "server/metrics.h"
#include "server/sse.h"

namespace m3::server {

namespace {

constexpr const char* kVersion = "0.1.0";

void send_json(httplib::Response& res, int status, const ojson& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& param = {}) {
  send_json(res, status, error_body(status, msg, param));
}

ojson parse_body(const httplib::Request& req) {
  try {
    return ojson::parse(req.body);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

int64_t now_s() { return int64_t(std::time(nullptr)); }

// One client request in flight: its engine requests and the per-choice state.
struct Call {
  ParsedRequest pr;
  std::string id, model;
  int64_t created = 0;
  std::vector<std::string> ids;
  std::unordered_map<std::string, size_t> index;
  std::vector<std::unique_ptr<ChoiceState>> choices;
  std::shared_ptr<OutputStream> stream;
  size_t remaining = 0;
  // stream-interval merging
  std::vector<RequestOutput> held;
  std::vector<bool> emitted_first;
  bool started = false, closed = false;
  int idle_waits = 0;
};

std::shared_ptr<Call> start_call(AsyncEngine& ae, const ServerContext& ctx, ParsedRequest pr, const char* prefix) {
  auto c = std::make_shared<Call>();
  c->pr = std::move(pr);
  c->id = make_id(prefix);
  c->model = c->pr.model;
  c->created = now_s();
  std::vector<EngineRequest> reqs;
  for (size_t p = 0; p < c->pr.prompts.size(); ++p) {
    for (int j = 0; j < c->pr.n; ++j) {
      EngineRequest r;
      r.id = c->id + "-" + std::to_string(c->choices.size());
      r.prompt = c->pr.prompts[p];
      r.params = c->pr.params;
      if (r.params.has_seed) r.params.seed += uint64_t(j);  // distinct samples per choice, reproducible
      c->index[r.id] = c->choices.size();
      c->ids.push_back(r.id);
      c->choices.push_back(std::make_unique<ChoiceState>(ctx.tok, c->pr.choice));
      reqs.push_back(std::move(r));
    }
  }
  c->remaining = c->choices.size();
  c->held.resize(c->choices.size());
  c->emitted_first.assign(c->choices.size(), false);
  try {
    c->stream = ae.submit(std::move(reqs));
  } catch (const Error& e) {
    throw bad_request(e.what(), c->pr.chat ? "messages" : "prompt");
  }
  return c;
}

ojson usage_of(const Call& c) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < c.choices.size(); ++i) {
    const ChoiceState& s = *c.choices[i];
    if (i % size_t(c.pr.n) == 0) {
      prompt += int64_t(c.pr.prompts[i / size_t(c.pr.n)].size());
      cached += s.cached_tokens;
    }
    completion += int64_t(s.tokens.size());
  }
  return usage_json(prompt, completion, cached);
}

// Collects outputs until every choice has finished or `budget` has passed; true when finished.
bool collect_for(Call& c, std::chrono::milliseconds budget) {
  const auto end = std::chrono::steady_clock::now() + budget;
  std::vector<RequestOutput> outs;
  while (c.remaining > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    outs.clear();
    if (!c.stream->wait(outs, std::min(left, std::chrono::milliseconds(1000)))) throw ApiError(500, c.stream->error());
    for (auto& o : outs) {
      auto it = c.index.find(o.request_id);
      if (it == c.index.end()) continue;
      c.choices[it->second]->on_output(o);
      if (o.finished) --c.remaining;
    }
  }
  return true;
}

// A whole (non-streamed) response: the envelope and usage are shared; `body` fills choice i's
// object-specific fields (message or text, logprobs).
template <class Body>
ojson full_response(const Call& c, const char* object, Body body) {
  ojson r;
  r["id"] = c.id;
  r["object"] = object;
  r["created"] = c.created;
  r["model"] = c.model;
  ojson choices = ojson::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    const ChoiceState& s = *c.choices[i];
    ojson ch;
    ch["index"] = i;
    body(i, s, ch);
    ch["finish_reason"] = s.finish_reason;
    ch["stop_reason"] = s.stop_reason;
    choices.push_back(ch);
  }
  r["choices"] = choices;
  r["usage"] = usage_of(c);
  return r;
}

ojson chat_response(const Call& c, const Tokenizer& tok) {
  return full_response(c, "chat.completion", [&](size_t, const ChoiceState& s, ojson& ch) {
    ch["message"] = chat_message_json(s);
    ch["logprobs"] = c.pr.logprobs ? chat_logprobs_json(tok, s.logprobs) : ojson(nullptr);
  });
}

ojson completion_response(const Call& c, const Tokenizer& tok) {
  return full_response(c, "text_completion", [&](size_t i, const ChoiceState& s, ojson& ch) {
    const std::string prefix = c.pr.echo ? c.pr.prompt_texts[i / size_t(c.pr.n)] : std::string();
    ch["text"] = prefix + s.content;
    ch["logprobs"] = c.pr.logprobs ? completion_logprobs_json(tok, s.logprobs, prefix.size()) : ojson(nullptr);
  });
}

// One streamed chunk for choice i.
std::string stream_chunk(const Call& c, size_t i, const ChoiceDelta& d, const ChoiceState& s, const Tokenizer& tok,
                         size_t text_offset) {
  ojson j;
  j["id"] = c.id;
  j["object"] = c.pr.chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = c.created;
  j["model"] = c.model;
  ojson ch;
  ch["index"] = i;
  if (c.pr.chat) {
    ch["delta"] = chat_delta_json(d);
    ch["logprobs"] = c.pr.logprobs && !d.logprobs.empty() ? chat_logprobs_json(tok, d.logprobs) : ojson(nullptr);
  } else {
    std::string text = d.content;
    if (c.pr.echo && !c.emitted_first[i]) text = c.pr.prompt_texts[i / size_t(c.pr.n)] + text;
    ch["text"] = text;
    ch["logprobs"] =
        c.pr.logprobs && !d.logprobs.empty() ? completion_logprobs_json(tok, d.logprobs, text_offset) : ojson(nullptr);
  }
  ch["finish_reason"] = d.finished ? ojson(s.finish_reason) : ojson(nullptr);
  if (d.finished) ch["stop_reason"] = s.stop_reason;
  j["choices"] = ojson::array({ch});
  if (c.pr.continuous_usage) j["usage"] = usage_of(c);
  return sse_event(dump(j));
}

void merge_into(RequestOutput& held, RequestOutput&& o) {
  if (held.request_id.empty()) {
    held = std::move(o);
    return;
  }
  held.new_tokens.insert(held.new_tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
  held.new_logprobs.insert(held.new_logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
  held.new_text += o.new_text;
  held.finished = o.finished;
  held.finish_reason = o.finish_reason;
  held.num_prompt_tokens = o.num_prompt_tokens;
  held.num_cached_tokens = o.num_cached_tokens;
}

// Produces the next piece of an SSE stream; false when the client is gone.
bool stream_step(Call& c, const ServerContext& ctx, int interval, httplib::DataSink& sink) {
  std::string out;
  if (!c.started) {
    c.started = true;
    if (c.pr.chat) {
      for (size_t i = 0; i < c.choices.size(); ++i) {
        ojson j;
        j["id"] = c.id;
        j["object"] = "chat.completion.chunk";
        j["created"] = c.created;
        j["model"] = c.model;
        ojson ch;
        ch["index"] = i;
        ch["delta"] = {{"role", "assistant"}, {"content", ""}};
        ch["logprobs"] = nullptr;
        ch["finish_reason"] = nullptr;
        j["choices"] = ojson::array({ch});
        out += sse_event(dump(j));
      }
    }
  }
  std::vector<RequestOutput> outs;
  if (!c.stream->wait(outs, std::chrono::milliseconds(100))) {
    out += sse_event(dump(error_body(500, c.stream->error())));
    out += sse_done();
    c.closed = true;
    c.remaining = 0;
    if (!sink.write(out.data(), out.size())) return false;
    sink.done();
    return true;
  }
  for (auto& o : outs) {
    auto it = c.index.find(o.request_id);
    if (it == c.index.end()) continue;
    const size_t i = it->second;
    merge_into(c.held[i], std::move(o));
    RequestOutput& h = c.held[i];
    if (!h.finished && c.emitted_first[i] && int(h.new_tokens.size()) < interval) continue;
    ChoiceState& s = *c.choices[i];
    const size_t offset = s.content.size();
    ChoiceDelta d = s.on_output(h);
    if (h.finished) --c.remaining;
    h = RequestOutput{};
    if (d.empty() && !d.finished) continue;
    out += stream_chunk(c, i, d, s, *ctx.tok, offset);
    c.emitted_first[i] = true;
  }
  if (c.remaining == 0) {
    if (c.pr.include_usage) {
      ojson j;
      j["id"] = c.id;
      j["object"] = c.pr.chat ? "chat.completion.chunk" : "text_completion";
      j["created"] = c.created;
      j["model"] = c.model;
      j["choices"] = ojson::array();
      j["usage"] = usage_of(c);
      out += sse_event(dump(j));
    }
    out += sse_done();
    c.closed = true;
  }
  if (out.empty()) {
    // Idle (queued or prefilling): a comment now and then finds clients that went away.
    if (++c.idle_waits % 10 == 0) out = ": keep-alive\n\n";
    else return true;
  } else {
    c.idle_waits = 0;
  }
  if (!sink.write(out.data(), out.size())) return false;
  if (c.closed) sink.done();
  return true;
}

void respond(AsyncEngine& ae, const ServerContext& ctx, const HttpOptions& opt, std::shared_ptr<Call> c,
             httplib::Response& res) {
  if (!c->pr.stream) {
    // cpp-httplib 0.11 tells a handler nothing about its connection (no is_connection_closed), so a
    // non-streaming request first gets kDirectWait to finish and is answered normally. A longer one
    // switches to a chunked response whose body starts with whitespace heartbeats (JSON allows
    // leading whitespace): a write to a client that went away fails, and the request is aborted and
    // its pages freed. The status is then already 200, so a later engine failure sends the error JSON
    // as the body.
    constexpr std::chrono::milliseconds kDirectWait{1000}, kHeartbeat{250};
    bool done = false;
    try {
      done = collect_for(*c, kDirectWait);
    } catch (...) {
      ae.abort(c->ids);
      throw;
    }
    auto body = [c, &ctx] {
      return dump(c->pr.chat ? chat_response(*c, *ctx.tok) : completion_response(*c, *ctx.tok));
    };
    if (done) {
      res.status = 200;
      res.set_content(body(), "application/json");
      return;
    }
    res.set_chunked_content_provider(
        "application/json",
        [c, body, kHeartbeat](size_t, httplib::DataSink& sink) {
          std::string out;
          try {
            if (collect_for(*c, kHeartbeat)) out = body();
          } catch (const ApiError& e) {
            out = dump(error_body(e.status, e.what()));
            c->remaining = 0;
          }
          if (out.empty()) return sink.write(" ", 1);  // heartbeat: fails once the client is gone
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        },
        [c, &ae](bool) {
          if (c->remaining > 0) ae.abort(c->ids);  // client gone before the end: free its pages
        });
    return;
  }
  const int interval = std::max(1, opt.stream_interval);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [c, &ctx, interval](size_t, httplib::DataSink& sink) { return stream_step(*c, ctx, interval, sink); },
      [c, &ae](bool) {
        // Client gone (or server stopping) before the end: abort and free the KV pages.
        if (c->remaining > 0) ae.abort(c->ids);
      });
}

}  // namespace

void run_http_server(Engine& engine, const ServerContext& ctx, const HttpOptions& opt) {
  Metrics metrics;
  AsyncEngine ae(engine, metrics);
  httplib::Server svr;
  const int threads = std::max(4, opt.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_payload_max_length(opt.max_body_bytes);
  svr.set_keep_alive_max_count(100);

  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "Not Found"
                      : res.status == 413 ? "the request body is larger than the server's limit"
                      : res.status == 405 ? "Method Not Allowed"
                                          : "request failed";
    send_error(res, res.status, msg);
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, 500, msg);
  });
  svr.set_pre_routing_handler([&opt](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty() || req.path.rfind("/v1", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "Unauthorized: missing or wrong API key (send Authorization: Bearer <key>)");
    return httplib::Server::HandlerResponse::Handled;
  });

  using Fn = std::function<void(const httplib::Request&, httplib::Response&)>;
  auto guarded = [](Fn fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status, e.what(), e.param);
      } catch (const Error& e) {
        send_error(res, 400, e.what());
      } catch (const std::exception& e) {
        send_error(res, 500, e.what());
      }
    };
  };

  svr.Post("/v1/chat/completions", guarded([&](const httplib::Request& req, httplib::Response& res) {
             const ojson body = parse_body(req);
             respond(ae, ctx, opt, start_call(ae, ctx, parse_chat_request(body, ctx), "chatcmpl-"), res);
           }));
  svr.Post("/v1/completions", guarded([&](const httplib::Request& req, httplib::Response& res) {
             const ojson body = parse_body(req);
             respond(ae, ctx, opt, start_call(ae, ctx, parse_completion_request(body, ctx), "cmpl-"), res);
           }));
  svr.Get("/v1/models", guarded([&](const httplib::Request&, httplib::Response& res) {
            ojson data = ojson::array();
            for (auto& n : ctx.served_names) {
              ojson m;
              m["id"] = n;
              m["object"] = "model";
              m["created"] = now_s();
              m["owned_by"] = "vllm";
              m["root"] = ctx.model_path;
              m["parent"] = nullptr;
              m["max_model_len"] = ctx.max_model_len;
              m["permission"] = ojson::array();
              data.push_back(m);
            }
            send_json(res, 200, {{"object", "list"}, {"data", data}});
          }));
  auto health = [&](const httplib::Request&, httplib::Response& res) {
    res.status = ae.alive() ? 200 : 503;
    res.set_content("", "text/plain");
  };
  svr.Get("/health", health);
  svr.Get("/ping", health);
  svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"version", kVersion}});
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(ctx.served_names.front(), ae.stats()), "text/plain; version=0.0.4");
  });
  svr.Post("/tokenize", guarded([&](const httplib::Request& req, httplib::Response& res) {
             const ojson body = parse_body(req);
             if (!body.is_object()) throw bad_request("the request body must be a JSON object");
             check_model(body, ctx);
             std::vector<int32_t> ids;
             if (body.contains("messages")) {
               const std::string text = render_messages(body, ctx, true);
               ids = ctx.tok->encode(text, true);
             } else {
               auto p = body.find("prompt");
               if (p == body.end() || !p->is_string()) throw bad_request("'prompt' (a string) or 'messages' is required", "prompt");
               auto ast = body.find("add_special_tokens");
               if (ast != body.end() && !ast->is_boolean())
                 throw bad_request("'add_special_tokens' must be a boolean", "add_special_tokens");
               // The M3 tokenizers have no post-processor: add_special_tokens adds nothing (as in transformers).
               ids = ctx.tok->encode(p->get<std::string>(), true);
             }
             ojson j;
             j["count"] = ids.size();
             j["max_model_len"] = ctx.max_model_len;
             j["tokens"] = ids;
             send_json(res, 200, j);
           }));
  svr.Post("/detokenize", guarded([&](const httplib::Request& req, httplib::Response& res) {
             const ojson body = parse_body(req);
             if (!body.is_object()) throw bad_request("the request body must be a JSON object");
             check_model(body, ctx);
             auto t = body.find("tokens");
             if (t == body.end() || !t->is_array()) throw bad_request("'tokens' must be a list of integers", "tokens");
             std::vector<int32_t> ids;
             for (auto& x : *t) {
               if (!x.is_number_integer()) throw bad_request("'tokens' must be a list of integers", "tokens");
               const int32_t id = x.get<int32_t>();
               if (!ctx.tok->is_valid(id)) throw bad_request("token id " + std::to_string(id) + " is not valid", "tokens");
               ids.push_back(id);
             }
             send_json(res, 200, {{"prompt", ctx.tok->decode(ids)}});
           }));

  // cpp-httplib 0.11 listens with a backlog of 5, so many clients connecting at once get resets
  // (seen in the soak run). Keep the listening socket and raise its backlog after bind: listen()
  // again on a listening socket only changes the backlog. The options are the library's defaults.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
    listen_fd = sock;
  });
  int port = opt.port;
  if (port == 0) {
    port = svr.bind_to_any_port(opt.host);
    if (port < 0) throw Error("cannot bind to " + opt.host);
  } else if (!svr.bind_to_port(opt.host, port)) {
    throw Error("cannot bind to " + opt.host + ":" + std::to_string(port) + " (in use?)");
  }
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  std::fprintf(stderr, "[m3serve] listening on http://%s:%d\n", opt.host.c_str(), port);
  std::fflush(stderr);

  // SIGTERM / SIGINT (blocked in every thread by the serve command) are taken here: stop accepting,
  // abort what is running so every handler returns, then listen_after_bind() returns.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  std::thread sig([&] {
    int signo = 0;
    sigwait(&set, &signo);
    std::fprintf(stderr, "[m3serve] signal %d: shutting down\n", signo);
    svr.stop();
    ae.stop();
  });
  const bool ok = svr.listen_after_bind();
  if (sig.joinable()) {
    pthread_kill(sig.native_handle(), SIGTERM);  // harmless if it already ran
    sig.join();
  }
  ae.stop();
  if (!ok && svr.is_running()) throw Error("the HTTP server failed");
  std::fprintf(stderr, "[m3serve] stopped\n");
}

}  // namespace m3::server
