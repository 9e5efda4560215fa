// HTTP layer of the OpenAI-compatible server (see http_server.h).
//
// Boost.Beast over Asio (Debian's header-only libboost-dev), not cpp-httplib (used before): cpp-httplib
// 0.11 gives every connection a thread from a fixed pool and has no header timeout, so a few hundred
// slow clients starved the server; it sets SO_REUSEPORT, answers only the first of pipelined requests,
// inflates gzip bodies without a cap and lets chunked bodies past its size limit, and none of that can
// be changed from outside. Beast parses HTTP/1.1 strictly (conflicting Content-Length values, or
// Content-Length together with Transfer-Encoding, are errors), applies its body limit to the
// de-chunked bytes, and Asio's asynchronous sockets let two I/O threads hold thousands of connections,
// each read phase with its own deadline.
//
// Threads: `io_threads` run every socket operation (accept, reads, writes, deadlines) and answer the
// cheap routes themselves (/health, /ping, /metrics, /version, /v1/models, every error before a
// handler), so those never wait on the engine or on busy workers. Requests that need the tokenizer or
// the engine run on a worker thread each (at most `threads`; past that 503): the worker writes through
// the connection's strand and waits for each write (bounded by write_timeout_s), so a stream follows
// the engine at its own pace and a client that went away is seen as a failed write (its engine
// requests are aborted and their KV pages freed).
//
// One request at a time per connection: the next one (pipelined or not) is parsed only after the
// previous response is written, so pipelined requests are answered in order. Request bodies with
// Content-Encoding gzip or deflate are inflated with zlib, counting the inflated bytes against
// max_body_bytes (413 past it); any other encoding is refused with 415.
#include "server/http_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <fmt/format.h>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "chat/json_depth.h"
#include "base/error.h"
#include "base/version.h"
#include "server/api_translate.h"
#include "server/async_engine.h"
#include "server/errors.h"
#include "server/messages_api.h"
#include "server/metrics.h"
#include "server/responses_api.h"
#include "server/sse.h"

namespace m3::server {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

ojson parse_body(const std::string& body) {
  try {
    return chat::parse_json_limited<ojson>(body);
  } catch (const chat::JsonTooDeep& e) {
    throw bad_request(std::string("the request body is refused: ") + e.what());
  } catch (const std::exception& e) {
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what());
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
  // Responses / Messages: the chat output rewritten into that API's body and events (null: chat / completions).
  std::unique_ptr<ApiOutput> api;
  // do_remote_decode: the lease on the prompt's pages, from the finished output.
  std::optional<KvLeaseInfo> lease;
};

// The kv_transfer_params of a response (vLLM's NixlConnector fields): where a decode engine pulls the
// prompt's pages from, or null (not leased: the request failed, or did not ask).
ojson kv_params_json(const Call& c, const ServerContext& ctx) {
  if (!c.lease) return nullptr;
  ojson j;
  j["do_remote_prefill"] = true;
  j["do_remote_decode"] = false;
  j["remote_engine_id"] = ctx.kv_engine_id;
  j["remote_block_ids"] = c.lease->block_ids;
  j["remote_host"] = ctx.kv_host;
  j["remote_port"] = ctx.kv_port;
  j["remote_request_id"] = c.lease->request_id;
  j["tp_size"] = 1;
  return j;
}

// do_remote_prefill: pulls the prompt's pages from the prefill engine before the request is submitted
// (on this worker thread, off the engine's). A refusal is the client's fault (400); a broken transfer
// follows kv_load_failure_policy: recompute the prompt here, or fail the request.
std::shared_ptr<const RemotePrefill> pull_remote_prefill(AsyncEngine& ae, const ServerContext& ctx, const RemoteKvRef& ref,
                                                         const std::vector<int32_t>& prompt,
                                                         const std::vector<MultimodalSpan>& mm) {
  auto rp = std::make_shared<RemotePrefill>();
  rp->source = ref.host + ":" + std::to_string(ref.port);
  const FetchResult r = ctx.kv_fetcher->fetch(ref, *rp);
  if (r.status == FetchStatus::Ok) {
    ae.verify_remote(prompt, mm, *rp);  // here, on this worker thread: the engine thread only copies
    return rp;
  }
  if (r.status == FetchStatus::Refused)
    throw bad_request("kv_transfer_params: the prefill engine at " + rp->source + " refused the KV read: " + r.why,
                      "kv_transfer_params");
  if (ctx.kv_fail_on_load_error)
    throw ApiError(500, "the KV transfer from the prefill engine at " + rp->source + " failed: " + r.why +
                            " (kv_load_failure_policy \"fail\")");
  std::fprintf(stderr, "[m3serve] KV transfer from %s failed (%s): the prompt is recomputed here "
               "(kv_load_failure_policy \"recompute\")\n", rp->source.c_str(), r.why.c_str());
  return nullptr;
}

// --enable-log-requests: the request as the engine receives it, in one line on stderr (as vLLM's "Received
// request"): its id, prompts and their token counts, the sampling parameters, and the start of the first
// prompt as a JSON string (at most 500 bytes).
void log_request(const Call& c) {
  const SamplingParams& p = c.pr.params;
  std::string tokens;
  for (const auto& pr : c.pr.prompts) tokens += (tokens.empty() ? "" : ",") + std::to_string(pr.size());
  std::string text = c.pr.prompt_texts.empty() ? std::string() : c.pr.prompt_texts[0].substr(0, 500);
  text = ojson(text).dump(-1, ' ', false, ojson::error_handler_t::replace);
  std::fprintf(stderr,
               "[m3serve] request %s: %s, %zu prompt(s) of %s tokens, n %d, max_tokens %d, temperature %g, top_p %g, "
               "top_k %d, min_p %g, seed %s, stop %zu string(s) / %zu id(s), logit_bias %zu, %s; prompt %s\n",
               c.id.c_str(), c.pr.chat ? "chat" : "completion", c.pr.prompts.size(), tokens.c_str(), c.pr.n,
               p.max_tokens, double(p.temperature), double(p.top_p), p.top_k, double(p.min_p),
               p.has_seed ? std::to_string(p.seed).c_str() : "none", p.stop.size(), p.stop_token_ids.size(),
               p.logit_bias.size(), c.pr.stream ? "streamed" : "not streamed", text.c_str());
}

std::shared_ptr<Call> start_call(AsyncEngine& ae, const ServerContext& ctx, ParsedRequest pr, const char* prefix) {
  auto c = std::make_shared<Call>();
  c->pr = std::move(pr);
  c->id = make_id(prefix);
  c->model = c->pr.model;
  c->created = now_s();
  std::shared_ptr<const RemotePrefill> remote;
  if (c->pr.kv_remote) remote = pull_remote_prefill(ae, ctx, *c->pr.kv_remote, c->pr.prompts.at(0), c->pr.mm);
  std::vector<EngineRequest> reqs;
  for (size_t p = 0; p < c->pr.prompts.size(); ++p) {
    for (int j = 0; j < c->pr.n; ++j) {
      EngineRequest r;
      r.id = c->id + "-" + std::to_string(c->choices.size());
      r.prompt = c->pr.prompts[p];
      r.params = c->pr.params;
      r.text = choice_text_options(c->pr.choice);
      r.kv.hold_for_remote = c->pr.kv_hold;
      r.kv.remote = remote;
      if (p == 0) r.mm = c->pr.mm;
      if (r.params.has_seed) r.params.seed += uint64_t(j);  // distinct samples per choice, reproducible
      c->index[r.id] = c->choices.size();
      c->ids.push_back(r.id);
      c->choices.push_back(std::make_unique<ChoiceState>(ctx.tok, c->pr.choice));
      reqs.push_back(std::move(r));
    }
  }
  if (ctx.log_requests) log_request(*c);
  ae.observe_request_params(c->pr.n, c->pr.params.max_tokens);
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
      // The engine could not serve this choice (a KV cache page that failed to load under
      // kv_load_failure_policy "fail"): the whole request fails with its reason.
      if (o.finish_reason == FinishReason::Error) throw ApiError(500, o.error);
      if (o.kv_lease) c.lease = o.kv_lease;
      c.choices[it->second]->on_output(o);
      if (o.finished) --c.remaining;
    }
  }
  return true;
}

// A whole (non-streamed) response: the envelope and usage are shared; `body` fills choice i's
// object-specific fields (message or text, logprobs).
template <class Body>
ojson full_response(const Call& c, const ServerContext& ctx, const char* object, Body body) {
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
  if (c.pr.kv_params) r["kv_transfer_params"] = kv_params_json(c, ctx);
  return r;
}

ojson chat_response(const Call& c, const ServerContext& ctx) {
  const Tokenizer& tok = *ctx.tok;
  return full_response(c, ctx, "chat.completion", [&](size_t, const ChoiceState& s, ojson& ch) {
    ch["message"] = chat_message_json(s);
    ch["logprobs"] = c.pr.logprobs ? chat_logprobs_json(tok, s.logprobs) : ojson(nullptr);
  });
}

ojson completion_response(const Call& c, const ServerContext& ctx) {
  const Tokenizer& tok = *ctx.tok;
  return full_response(c, ctx, "text_completion", [&](size_t i, const ChoiceState& s, ojson& ch) {
    const std::string prefix = c.pr.echo ? c.pr.prompt_texts[i / size_t(c.pr.n)] : std::string();
    ch["text"] = prefix + s.content;
    ch["logprobs"] = c.pr.logprobs ? completion_logprobs_json(tok, s.logprobs, prefix.size()) : ojson(nullptr);
  });
}

// One streamed chunk for choice i.
std::string stream_chunk(const Call& c, size_t i, const ChoiceDelta& d, const ChoiceState& s, const ServerContext& ctx,
                         size_t text_offset) {
  const Tokenizer& tok = *ctx.tok;
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
  if (d.finished && c.pr.kv_params) j["kv_transfer_params"] = kv_params_json(c, ctx);
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
  held.stop_string = o.stop_string;
  held.stop_token = o.stop_token;
  held.num_prompt_tokens = o.num_prompt_tokens;
  held.num_cached_tokens = o.num_cached_tokens;
}

// An engine failure mid-stream, in the call's API: the error event, then the stream's end.
std::string stream_error_events(const Call& c, const std::string& msg) {
  return c.api ? c.api->stream_error(500, msg) : sse_event(dump(error_body(500, msg))) + sse_done();
}

// The next piece of an SSE stream (empty when there is nothing to send yet); sets c.closed once it
// holds the final [DONE].
std::string stream_step(Call& c, const ServerContext& ctx, int interval) {
  std::string out;
  if (!c.started) {
    c.started = true;
    if (c.api) {
      out += c.api->begin(int64_t(c.pr.prompts[0].size()));
    } else if (c.pr.chat) {
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
    out += stream_error_events(c, c.stream->error());
    c.closed = true;
    c.remaining = 0;
    return out;
  }
  for (auto& o : outs) {
    auto it = c.index.find(o.request_id);
    if (it == c.index.end()) continue;
    if (o.finish_reason == FinishReason::Error) {
      // As an engine failure mid-stream: the error event, then [DONE]; the caller aborts the rest.
      out += stream_error_events(c, o.error);
      c.closed = true;
      return out;
    }
    const size_t i = it->second;
    if (o.kv_lease) c.lease = o.kv_lease;
    merge_into(c.held[i], std::move(o));
    RequestOutput& h = c.held[i];
    if (!h.finished && c.emitted_first[i] && int(h.new_tokens.size()) < interval) continue;
    ChoiceState& s = *c.choices[i];
    const size_t offset = s.content.size();
    ChoiceDelta d = s.on_output(h);
    if (h.finished) --c.remaining;
    h = RequestOutput{};
    if (d.empty() && !d.finished) continue;
    out += c.api ? c.api->delta(d) : stream_chunk(c, i, d, s, ctx, offset);
    c.emitted_first[i] = true;
  }
  if (c.remaining == 0 && c.api) {
    out += c.api->end(*c.choices[0], usage_of(c));
    c.closed = true;
  } else if (c.remaining == 0) {
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
  } else {
    c.idle_waits = 0;
  }
  return out;
}

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(int64_t(s * 1000)); }

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

Response make_response(int status, std::string body, const char* content_type, unsigned version, bool keep_alive) {
  Response r{http::status(status), version};
  r.set(http::field::server, "m3serve");
  r.set(http::field::content_type, content_type);
  if (status == 503) r.set(http::field::retry_after, "1");
  r.keep_alive(keep_alive);
  r.body() = std::move(body);
  r.prepare_payload();
  return r;
}

// Inflates a gzip / deflate request body with zlib; the inflated size counts against `limit`.
void inflate_body(std::string& body, const std::string& encoding, size_t limit) {
  const bool gzip = beast::iequals(encoding, "gzip") || beast::iequals(encoding, "x-gzip");
  // "deflate" is zlib-wrapped by the RFC; some clients send raw deflate: told apart by the zlib header.
  const bool zlib_header = body.size() >= 2 && (uint8_t(body[0]) & 0x0f) == 8 &&
                           ((uint8_t(body[0]) << 8) | uint8_t(body[1])) % 31 == 0;
  z_stream zs{};
  if (inflateInit2(&zs, gzip ? 16 + MAX_WBITS : zlib_header ? MAX_WBITS : -MAX_WBITS) != Z_OK)
    throw ApiError(500, "zlib: cannot initialise");
  std::string out;
  zs.next_in = reinterpret_cast<Bytef*>(body.data());
  zs.avail_in = uInt(body.size());
  int rc = Z_OK;
  std::array<char, 64 << 10> buf;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf.data());
    zs.avail_out = uInt(buf.size());
    rc = inflate(&zs, Z_NO_FLUSH);
    const size_t got = buf.size() - zs.avail_out;
    if (out.size() + got > limit) {
      inflateEnd(&zs);
      throw ApiError(413, "the request body inflates (Content-Encoding " + encoding + ") to more than the server's limit of " +
                              std::to_string(limit) + " bytes (--max-request-bytes)");
    }
    out.append(buf.data(), got);
    if (rc == Z_STREAM_END && gzip && zs.avail_in > 0) {  // concatenated gzip members
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK || (zs.avail_in == 0 && got == 0)) {
      inflateEnd(&zs);
      throw bad_request("the request body is not valid " + encoding + " data (Content-Encoding)" +
                        (rc == Z_OK || rc == Z_BUF_ERROR ? ": it ends early" : ""));
    }
  }
  const bool trailing = zs.avail_in > 0;
  inflateEnd(&zs);
  if (trailing) throw bad_request("the request body has data after the end of its " + encoding + " stream");
  body = std::move(out);
}

// Compares without an early exit, so the time taken does not tell how much of a guessed key was right.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

class Conn;

// Server-wide state shared by the connections, the workers and the shutdown sequence.
struct Server {
  Server(AsyncEngine& ae, Metrics& metrics, const ServerContext& ctx, const HttpOptions& opt)
      : ae(ae), metrics(metrics), ctx(ctx), opt(opt) {}
  AsyncEngine& ae;
  Metrics& metrics;
  const ServerContext& ctx;
  const HttpOptions& opt;
  std::atomic<int> connections{0};
  std::atomic<bool> draining{false};
  // Bytes of request bodies reserved by connections receiving or handling them (see reserve_body).
  std::atomic<int64_t> body_bytes{0};
  std::mutex mu;
  std::condition_variable cv;                             // workers went down
  int workers = 0;                                        // guarded by mu
  std::unordered_map<Conn*, std::weak_ptr<Conn>> conns;   // guarded by mu
  // What the HTTP limits refused or cut, for /metrics (m3serve:http_refused_total{reason}).
  enum Reason { kConnectionCap, kEvicted, kTimeout, kTooLarge, kBusy, kMalformed, kReasons };
  std::array<std::atomic<int64_t>, kReasons> refused{};
  void count(Reason r) { refused[r].fetch_add(1, std::memory_order_relaxed); }
  std::string render_http_metrics() const {
    static const char* names[kReasons] = {"connection_cap", "evicted", "timeout", "too_large", "busy", "malformed"};
    std::string out =
        "# HELP m3serve:http_connections Open HTTP connections.\n# TYPE m3serve:http_connections gauge\n"
        "m3serve:http_connections " + std::to_string(connections.load()) +
        "\n# HELP m3serve:http_request_body_bytes Bytes of request bodies reserved by requests being received or "
        "handled (--max-request-bytes-in-flight).\n# TYPE m3serve:http_request_body_bytes gauge\n"
        "m3serve:http_request_body_bytes " + std::to_string(body_bytes.load()) +
        "\n# HELP m3serve:http_refused_total Connections and requests refused or cut by the server's limits "
        "(connection_cap: 503 at --max-connections; evicted: closed for a new connection at the cap; timeout: "
        "header or body deadline; too_large: 413; busy: 503 from --http-threads or --max-waiting-requests; "
        "malformed: HTTP framing errors).\n# TYPE m3serve:http_refused_total counter\n";
    for (int r = 0; r < kReasons; ++r)
      out += std::string("m3serve:http_refused_total{reason=\"") + names[r] + "\"} " + std::to_string(refused[r].load()) + "\n";
    return out;
  }
  net::io_context ioc;  // declared last: destroyed first, with the handlers that still hold connections
};

enum class Route { Health, Version, Models, Metrics, Chat, Completions, Tokenize, Detokenize, Responses, Messages, CountTokens };

// Responses / Messages: the translated chat body parsed, limited and submitted as a chat request is, its
// errors naming the API's fields; make_output(model) makes the translator of its output.
template <class MakeOutput>
std::shared_ptr<Call> start_api_call(AsyncEngine& ae, const ServerContext& ctx, const RequestLimits& lim,
                                     const ojson& chat, const std::vector<std::string>& image_names,
                                     const FieldNames& names, const char* prefix, MakeOutput make_output) {
  try {
    ParsedRequest pr = parse_chat_request(chat, ctx, &image_names);
    check_request_limits(pr, lim);
    std::unique_ptr<ApiOutput> api = make_output(pr.model);
    std::shared_ptr<Call> c = start_call(ae, ctx, std::move(pr), prefix);
    c->api = std::move(api);  // before respond() reads any output
    return c;
  } catch (const ApiError& e) {
    throw rename_error(e, names);
  }
}

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(tcp::socket s, Server& srv) : stream_(std::move(s)), srv_(srv), opt_(srv.opt) {
    waiting_since_ = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  ~Conn() {
    release_body();
    if (!counted_) return;
    srv_.connections.fetch_sub(1);
    std::lock_guard lk(srv_.mu);
    srv_.conns.erase(this);
  }

  // A new connection (acceptor's strand): counted and registered at once, so that a burst of accepts
  // cannot pass the cap; served on its own strand. At the cap, the connection that has waited longest
  // for a request (idle keep-alive, or a header or body still trickling in) is closed to make room:
  // slow clients go first, and a client that sends its request at once is served while hundreds
  // trickle. Only when every connection is answering a request is the new one refused (503).
  void launch() {
    bool admit = srv_.connections.load() < opt_.max_connections;
    if (!admit) {
      // References taken under the lock are dropped after it: the last one runs ~Conn, which locks too.
      std::vector<std::shared_ptr<Conn>> all;
      {
        std::lock_guard lk(srv_.mu);
        all.reserve(srv_.conns.size());
        for (auto& [p, w] : srv_.conns)
          if (auto c = w.lock()) all.push_back(std::move(c));
      }
      Conn* victim = nullptr;
      int64_t oldest = std::numeric_limits<int64_t>::max();
      for (auto& c : all)
        if (!c->busy_.load() && c->waiting_since_.load() < oldest) {
          oldest = c->waiting_since_.load();
          victim = c.get();
        }
      if (victim) {
        srv_.count(Server::kEvicted);
        victim->waiting_since_ = std::numeric_limits<int64_t>::max();  // not chosen twice (one acceptor strand)
        victim->close_if_idle();
        admit = true;
      }
    }
    if (admit) {
      counted_ = true;
      srv_.connections.fetch_add(1);
      std::lock_guard lk(srv_.mu);
      srv_.conns[this] = weak_from_this();
    }
    net::post(stream_.get_executor(), [self = shared_from_this(), admit] {
      if (admit) return self->read_next();
      self->srv_.count(Server::kConnectionCap);
      self->reply_and_close(503, "the server has its limit of " + std::to_string(self->opt_.max_connections) +
                                     " connections open, all answering requests (--max-connections); retry later");
    });
  }

  // Draining, or room for a new connection: closed now unless it is answering a request.
  void close_if_idle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->busy_) self->close();
    });
  }

 private:
  // --- reading (strand) ---
  void read_next() {
    busy_ = false;
    release_body();  // the previous request's body is gone
    if (failed_) return close();  // a worker's write to this client failed
    waiting_since_ = std::chrono::steady_clock::now().time_since_epoch().count();
    if (srv_.draining.load() || !keep_alive_) return close();
    if (buf_.size() > 0) return read_header();  // pipelined: the next request is already here
    stream_.expires_after(ms(first_ ? opt_.header_timeout_s : opt_.idle_timeout_s));
    stream_.async_read_some(buf_.prepare(8192), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->close();
      self->buf_.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    first_ = false;
    anthropic_ = false;  // set again by handle() from the new request's path
    parser_.emplace();
    parser_->header_limit(uint32_t(opt_.max_header_bytes));
    parser_->body_limit(opt_.max_body_bytes);  // counts de-chunked bytes as well
    stream_.expires_after(ms(opt_.header_timeout_s));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  static bool gone(beast::error_code ec) {
    return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
           ec == net::error::operation_aborted || ec == net::error::broken_pipe || ec == beast::error::timeout;
  }

  void on_header(beast::error_code ec) {
    // A deadline that passed closed the socket already: nothing can be answered.
    if (ec == beast::error::timeout) srv_.count(Server::kTimeout);
    if (gone(ec)) return close();
    if (ec == http::error::body_limit) return too_large();  // Content-Length over the limit
    if (ec == http::error::header_limit)
      return reply_and_close(431, "the request header is larger than " + std::to_string(opt_.max_header_bytes) +
                                      " bytes");
    if (ec) {
      srv_.count(Server::kMalformed);
      return reply_and_close(400, "malformed HTTP request: " + ec.message());
    }
    const auto& h = parser_->get();
    version_ = h.version();
    keep_alive_ = h.keep_alive();
    // Framing: only plain chunked transfer coding (Beast already refuses Content-Length with it, and
    // conflicting Content-Length values).
    if (h.count(http::field::transfer_encoding) > 0 &&
        (h.count(http::field::transfer_encoding) > 1 || !beast::iequals(h[http::field::transfer_encoding], "chunked"))) {
      srv_.count(Server::kMalformed);
      return reply_and_close(400, "Transfer-Encoding '" + std::string(h[http::field::transfer_encoding]) +
                                      "' is not supported (only a single 'chunked')");
    }
    if (auto cl = parser_->content_length(); cl && *cl > opt_.max_body_bytes) return too_large();
    if (!reserve_body(h)) {
      srv_.count(Server::kBusy);
      return reply_and_close(503, "the server is receiving its limit of " + std::to_string(body_budget()) +
                                      " bytes of request bodies at once (--max-request-bytes-in-flight); retry later");
    }
    if (auto ex = h.find(http::field::expect); ex != h.end()) {
      if (!beast::iequals(ex->value(), "100-continue"))
        return reply_and_close(417, "Expect: only 100-continue is supported");
      static const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(ms(opt_.write_timeout_s));
      net::async_write(stream_, net::buffer(cont), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // Memory for request bodies is bounded across connections, not only per request: a body reserves what
  // it may grow to (its Content-Length; chunked: max_body_bytes; compressed: plus max_body_bytes for the
  // inflated copy) until its request is answered. Small bodies (64 KiB) are free, so ordinary traffic
  // never waits on this.
  int64_t body_budget() const {
    return int64_t(opt_.max_body_bytes_in_flight ? opt_.max_body_bytes_in_flight : 8 * opt_.max_body_bytes);
  }
  bool reserve_body(const http::fields& h) {
    constexpr int64_t kFree = 64 << 10;
    int64_t need = parser_->content_length() ? int64_t(*parser_->content_length())
                                             : parser_->chunked() ? int64_t(opt_.max_body_bytes) : 0;
    if (auto ce = h.find(http::field::content_encoding); ce != h.end() && !beast::iequals(ce->value(), "identity"))
      need += int64_t(opt_.max_body_bytes);
    if (need <= kFree) return true;
    if (srv_.body_bytes.fetch_add(need) + need > body_budget()) {
      srv_.body_bytes.fetch_sub(need);
      return false;
    }
    reserved_ = need;
    return true;
  }
  void release_body() {
    if (reserved_ > 0) srv_.body_bytes.fetch_sub(reserved_);
    reserved_ = 0;
  }

  void read_body() {
    stream_.expires_after(ms(opt_.body_timeout_s));
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void too_large() {
    srv_.count(Server::kTooLarge);
    reply_and_close(413, "the request body is larger than the server's limit of " +
                             std::to_string(opt_.max_body_bytes) + " bytes (--max-request-bytes)");
  }

  void on_body(beast::error_code ec) {
    if (ec == http::error::body_limit) return too_large();
    if (ec == beast::error::timeout) srv_.count(Server::kTimeout);
    if (gone(ec)) return close();
    if (ec) {
      srv_.count(Server::kMalformed);
      return reply_and_close(400, "malformed HTTP request body: " + ec.message());
    }
    busy_ = true;
    Request req = parser_->release();
    parser_.reset();
    try {
      handle(req);
    } catch (const ApiError& e) {
      reply(error(e.status, e.what(), e.param), e.status == 413);
    } catch (const std::exception& e) {
      reply(error(500, e.what()), false);
    }
  }

  // --- routing (strand) ---
  // Anthropic's error shape on /v1/messages*, OpenAI's elsewhere.
  ojson error_json(int status, const std::string& msg, const std::string& param = {}) const {
    return anthropic_ ? anthropic_error_body(status, msg) : error_body(status, msg, param);
  }
  Response error(int status, const std::string& msg, const std::string& param = {}) const {
    return make_response(status, dump(error_json(status, msg, param)), "application/json", version_,
                         keep_alive_ && !srv_.draining.load());
  }
  Response json(int status, const ojson& j) const {
    return make_response(status, dump(j), "application/json", version_, keep_alive_ && !srv_.draining.load());
  }

  void handle(Request& req) {
    // CORS first, as vLLM's middleware: every answer below (errors included) carries its headers, and a
    // browser's preflight is answered here, before the API key (browsers send preflights without it).
    const std::string origin(req[http::field::origin]);
    cors_ = cors_response_headers(opt_.cors, origin, req.find(http::field::cookie) != req.end());
    if (req.method() == http::verb::options && !origin.empty() &&
        req.find(http::field::access_control_request_method) != req.end()) {
      const PreflightAnswer pa = cors_preflight(opt_.cors, origin, std::string(req[http::field::access_control_request_method]),
                                                std::string(req[http::field::access_control_request_headers]));
      cors_ = pa.headers;
      return reply(make_response(pa.status, pa.body, "text/plain; charset=utf-8", version_, keep_alive_), false);
    }
    if (srv_.draining.load()) return reply(error(503, "the server is shutting down"), true);
    std::string path(req.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    // HEAD: a GET route's answer without its body (load balancers and uptime checks probe with it).
    head_ = req.method() == http::verb::head;
    const bool get = req.method() == http::verb::get || head_, post = req.method() == http::verb::post;
    anthropic_ = path.rfind("/v1/messages", 0) == 0;
    const bool protected_path = path.rfind("/v1", 0) == 0 || path == "/tokenize" || path == "/detokenize";
    // The key as OpenAI clients send it, or as Anthropic's do (x-api-key).
    if (protected_path && !opt_.api_key.empty() &&
        !same_secret(std::string(req[http::field::authorization]), "Bearer " + opt_.api_key) &&
        !same_secret(std::string(req["x-api-key"]), opt_.api_key))
      return reply(error(401, "Unauthorized: missing or wrong API key (send Authorization: Bearer <key> or x-api-key: <key>)"),
                   false);
    struct R {
      const char* path;
      Route route;
      bool get, post;
    };
    static const R routes[] = {{"/health", Route::Health, true, false},       {"/ping", Route::Health, true, true},
                               {"/version", Route::Version, true, false},     {"/v1/models", Route::Models, true, false},
                               {"/metrics", Route::Metrics, true, false},     {"/v1/chat/completions", Route::Chat, false, true},
                               {"/v1/completions", Route::Completions, false, true}, {"/tokenize", Route::Tokenize, false, true},
                               {"/detokenize", Route::Detokenize, false, true}, {"/v1/responses", Route::Responses, false, true},
                               {"/v1/messages", Route::Messages, false, true},
                               {"/v1/messages/count_tokens", Route::CountTokens, false, true}};
    const R* r = nullptr;
    for (auto& x : routes)
      if (path == x.path) r = &x;
    if (!r) return reply(error(404, "Not Found"), false);
    if (!((get && r->get) || (post && r->post))) return reply(error(405, "Method Not Allowed"), false);
    // Compressed bodies are inflated by the worker (it takes CPU time the I/O threads must not spend).
    if (auto ce = req.find(http::field::content_encoding); ce != req.end() && !beast::iequals(ce->value(), "identity")) {
      const std::string enc(ce->value());
      if (!(beast::iequals(enc, "gzip") || beast::iequals(enc, "x-gzip") || beast::iequals(enc, "deflate")))
        return reply(error(415, "Content-Encoding '" + enc + "' is not supported (gzip, deflate or identity)"), false);
    }
    switch (r->route) {
      case Route::Health:
        return reply(make_response(srv_.ae.alive() && !srv_.draining.load() ? 200 : 503, "", "text/plain", version_,
                                   keep_alive_),
                     false);
      case Route::Version: return reply(json(200, {{"version", kVersion}}), false);
      case Route::Metrics:
        return reply(make_response(200,
                                   srv_.metrics.render(srv_.ctx.served_names.front(), srv_.ae.stats()) +
                                       srv_.render_http_metrics() +
                                       (srv_.opt.extra_metrics ? srv_.opt.extra_metrics() : std::string()),
                                   "text/plain; version=0.0.4", version_, keep_alive_ && !srv_.draining.load()),
                     false);
      case Route::Models: {
        ojson data = ojson::array();
        for (auto& n : srv_.ctx.served_names) {
          ojson m;
          m["id"] = n;
          m["object"] = "model";
          m["created"] = now_s();
          m["owned_by"] = "vllm";
          m["root"] = srv_.ctx.model_path;
          m["parent"] = nullptr;
          m["max_model_len"] = srv_.ctx.max_model_len;
          m["permission"] = ojson::array();
          data.push_back(m);
        }
        return reply(json(200, {{"object", "list"}, {"data", data}}), false);
      }
      default: return spawn(r->route, std::move(req));
    }
  }

  // Writes a response from the strand; then the next request, or close.
  void reply(Response r, bool close_after) {
    if (close_after) r.keep_alive(false);
    add_cors(r);
    if (head_) {  // the headers of the GET answer, Content-Length included, and no body
      const std::string len = std::to_string(r.body().size());
      r.body().clear();
      r.set(http::field::content_length, len);
      head_ = false;
    }
    auto sp = std::make_shared<Response>(std::move(r));
    stream_.expires_after(ms(opt_.write_timeout_s));
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (ec) return self->close();
      if (!sp->keep_alive()) return self->linger();
      self->read_next();
    });
  }

  void reply_and_close(int status, const std::string& msg) {
    busy_ = true;
    keep_alive_ = false;
    cors_.clear();  // no request was read: no Origin to answer (not the previous request's)
    reply(error(status, msg), true);
  }

  // After a response that ends the connection: stop sending, read and drop what the client still
  // sends for a moment (closing with unread data would reset the connection and could lose the
  // response), then close.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    drain_input(std::make_shared<std::array<char, 4096>>());
  }
  void drain_input(std::shared_ptr<std::array<char, 4096>> scratch) {
    stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_input(scratch);
    });
  }

  void close() {
    release_body();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // --- workers ---
  void spawn(Route route, Request req) {
    {
      std::lock_guard lk(srv_.mu);
      if (srv_.workers >= opt_.threads) {
        srv_.count(Server::kBusy);
        return reply(error(503, "the server is handling its limit of " + std::to_string(opt_.threads) +
                                    " requests at once (--http-threads); retry later"),
                     false);
      }
      ++srv_.workers;
    }
    auto work = [conn = shared_from_this(), route, req = std::move(req)]() mutable {
      Server& srv = conn->srv_;
      conn->work(route, req);
      req = Request{};
      conn->release_body();  // the strand is idle until the post below
      // Hand the connection back to its strand, then drop every reference here before the count goes
      // down: the shutdown sequence may free the server as soon as it reads zero.
      auto exec = conn->stream_.get_executor();
      net::post(exec, [conn = std::move(conn)] { conn->read_next(); });
      std::lock_guard lk(srv.mu);
      --srv.workers;
      srv.cv.notify_all();
    };
    try {
      std::thread(std::move(work)).detach();
    } catch (const std::system_error& e) {  // no thread to be had (EAGAIN): the request is refused
      {
        std::lock_guard lk(srv_.mu);
        --srv_.workers;
        srv_.cv.notify_all();
      }
      reply(error(503, std::string("the server cannot start a worker thread (") + e.what() + "); retry later"), false);
    }
  }

  // Runs one asynchronous operation on the strand and waits for it (worker threads only).
  template <class Start>
  bool sync(Start start) {
    if (failed_) return false;
    // Shared with the handler: the promise must outlive set_value(), which may still be running when
    // this thread wakes up.
    auto done = std::make_shared<std::promise<beast::error_code>>();
    auto fut = done->get_future();
    net::dispatch(stream_.get_executor(), [&] {
      stream_.expires_after(ms(opt_.write_timeout_s));
      start([done](beast::error_code ec, size_t) { done->set_value(ec); });
    });
    if (fut.get()) failed_ = true;
    return !failed_;
  }

  // Whether the client closed (or reset) the connection: a peek that reads nothing and takes nothing (a
  // pipelined next request stays for the reader).
  bool client_gone() {
    char b;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  bool write_full(Response r) {
    add_cors(r);
    if (srv_.draining.load()) r.keep_alive(false);
    keep_alive_ = keep_alive_ && r.keep_alive();
    return sync([&](auto&& h) { http::async_write(stream_, r, std::move(h)); });
  }
  bool write_error(int status, const std::string& msg, const std::string& param = {}) {
    return write_full(error(status, msg, param));
  }

  // A response whose length is not known in advance: chunked (HTTP/1.0: ended by closing).
  bool write_stream_head(const char* content_type, bool no_cache) {
    http::response<http::empty_body> head{http::status::ok, version_};
    head.set(http::field::server, "m3serve");
    head.set(http::field::content_type, content_type);
    if (no_cache) head.set(http::field::cache_control, "no-cache");
    add_cors(head);
    chunked_ = version_ >= 11;
    if (chunked_) head.chunked(true);
    else keep_alive_ = false;
    if (srv_.draining.load()) keep_alive_ = false;
    head.keep_alive(keep_alive_);
    http::response_serializer<http::empty_body> sr{head};
    return sync([&](auto&& h) { http::async_write_header(stream_, sr, std::move(h)); });
  }
  bool write_chunk(const std::string& data) {
    if (chunked_) return sync([&](auto&& h) { net::async_write(stream_, http::make_chunk(net::buffer(data)), std::move(h)); });
    return sync([&](auto&& h) { net::async_write(stream_, net::buffer(data), std::move(h)); });
  }
  bool write_stream_end() {
    if (chunked_) return sync([&](auto&& h) { net::async_write(stream_, http::make_chunk_last(), std::move(h)); });
    return true;
  }

  void work(Route route, Request& req) {
    const ServerContext& ctx = srv_.ctx;
    try {
      if (auto ce = req.find(http::field::content_encoding); ce != req.end() && !beast::iequals(ce->value(), "identity"))
        inflate_body(req.body(), std::string(ce->value()), opt_.max_body_bytes);
      switch (route) {
        case Route::Chat:
        case Route::Completions: {
          const bool chat = route == Route::Chat;
          const ojson body = parse_body(req.body());
          ParsedRequest pr = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
          check_request_limits(pr, opt_.limits);
          respond(start_call(srv_.ae, ctx, std::move(pr), chat ? "chatcmpl-" : "cmpl-"));
          return;
        }
        case Route::Responses: {
          ResponsesRequest rr = responses_to_chat(parse_body(req.body()));
          const Tokenizer* tok = ctx.tok;
          respond(start_api_call(srv_.ae, ctx, opt_.limits, rr.chat, rr.image_names, responses_field_names(), "resp_",
                                 [&](std::string model) {
            return make_responses_output(std::move(rr.echo), std::move(model), now_s(), random_ids(),
                                         [tok](const std::string& t) { return int64_t(tok->encode(t, false).size()); });
          }));
          return;
        }
        case Route::Messages: {
          std::vector<std::string> image_names;
          const ojson chat = messages_to_chat(parse_body(req.body()), false, &image_names);
          respond(start_api_call(srv_.ae, ctx, opt_.limits, chat, image_names, messages_field_names(), "msg_",
                                 [](std::string model) { return make_messages_output(std::move(model), random_ids()); }));
          return;
        }
        case Route::CountTokens: {
          // The prompt exactly as /v1/messages would serve it (a forced tool-call opener included): the
          // request parsed as chat, not run.
          std::vector<std::string> image_names;
          const ojson chat = messages_to_chat(parse_body(req.body()), true, &image_names);
          ParsedRequest pr;
          try {
            pr = parse_chat_request(chat, ctx, &image_names);
          } catch (const ApiError& e) {
            throw rename_error(e, messages_field_names());
          }
          write_full(json(200, {{"input_tokens", pr.prompts.at(0).size()}}));
          return;
        }
        case Route::Tokenize: {
          const ojson body = parse_body(req.body());
          if (!body.is_object()) throw bad_request("the request body must be a JSON object");
          // vLLM's tokenize request fields; those this server does not serve are refused by name.
          check_api_fields(body,
                           {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                            "return_token_strs", "tools", "chat_template_kwargs", "reasoning_effort"},
                           {{"continue_final_message", json_null_or_false, "continuing the final message"},
                            {"chat_template", json_null, "a per-request chat template (the server's template is used)"},
                            {"mm_processor_kwargs", json_null_or_empty, "multimodal processor options"}},
                           "/tokenize");
          check_model(body, ctx);
          auto rts = body.find("return_token_strs");
          if (rts != body.end() && !rts->is_null() && !rts->is_boolean())
            throw bad_request("'return_token_strs' must be a boolean", "return_token_strs");
          const bool token_strs = rts != body.end() && rts->is_boolean() && rts->get<bool>();
          std::vector<int32_t> ids;
          if (body.contains("messages")) {
            // Images count as their expanded placeholder tokens (decoded and resized, not encoded).
            std::vector<ImageInput> images;
            const std::string text = render_messages(body, ctx, true, &images);
            ids = tokenize_chat(text, images, ctx, false).ids;
          } else {
            auto p = body.find("prompt");
            if (p == body.end() || !p->is_string())
              throw bad_request("'prompt' (a string) or 'messages' is required", "prompt");
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
          if (token_strs) {
            ojson strs = ojson::array();
            for (int32_t id : ids) strs.push_back(ctx.tok->token_string(id));
            j["token_strs"] = std::move(strs);
          }
          write_full(json(200, j));
          return;
        }
        case Route::Detokenize: {
          const ojson body = parse_body(req.body());
          if (!body.is_object()) throw bad_request("the request body must be a JSON object");
          check_model(body, ctx);
          auto t = body.find("tokens");
          if (t == body.end() || !t->is_array()) throw bad_request("'tokens' must be a list of integers", "tokens");
          std::vector<int32_t> ids;
          for (auto& x : *t) {
            if (!x.is_number_integer()) throw bad_request("'tokens' must be a list of integers", "tokens");
            // Range first: get<int32_t> would wrap 2^32 + 104 to 104.
            const bool in_range = x.is_number_unsigned() ? x.get<uint64_t>() <= uint64_t(INT32_MAX)
                                                         : x.get<int64_t>() >= INT32_MIN && x.get<int64_t>() <= INT32_MAX;
            const int64_t id = in_range ? x.get<int64_t>() : -1;
            if (!in_range || !ctx.tok->is_valid(int32_t(id)))
              throw bad_request("token id " + x.dump() + " is not valid", "tokens");
            ids.push_back(int32_t(id));
          }
          write_full(json(200, {{"prompt", ctx.tok->decode(ids)}}));
          return;
        }
        default: write_error(500, "unexpected route"); return;
      }
    } catch (const ApiError& e) {
      if (e.status == 503) srv_.count(Server::kBusy);
      if (e.status == 413) srv_.count(Server::kTooLarge);
      write_error(e.status, e.what(), e.param);
    } catch (const Error& e) {
      write_error(400, e.what());
    } catch (const std::exception& e) {
      write_error(500, e.what());
    }
  }

  void respond(const std::shared_ptr<Call>& c) {
    AsyncEngine& ae = srv_.ae;
    auto abort = [&] {
      if (c->remaining > 0) ae.abort(c->ids);  // client gone before the end: free its pages
    };
    if (!c->pr.stream) {
      // A non-streaming request is answered once its result is known, with that result's status (an
      // engine failure is a 4xx/5xx, so a proxy can retry it elsewhere). While it runs, the connection is
      // peeked every 250 ms: a client that went away (EOF or reset; vLLM treats a half-close the same) is
      // noticed and the request aborted, its pages freed.
      constexpr std::chrono::milliseconds kPoll{250};
      try {
        while (!collect_for(*c, kPoll))
          if (client_gone()) return abort();
      } catch (...) {
        ae.abort(c->ids);
        throw;
      }
      const std::string body = c->api ? dump(c->api->full(*c->choices[0], usage_of(*c)))
                                      : dump(c->pr.chat ? chat_response(*c, srv_.ctx) : completion_response(*c, srv_.ctx));
      write_full(make_response(200, body, "application/json", version_, keep_alive_));
      return;
    }
    const int interval = std::max(1, opt_.stream_interval);
    if (!write_stream_head("text/event-stream", true)) return abort();
    while (!c->closed) {
      const std::string out = stream_step(*c, srv_.ctx, interval);
      if (!out.empty() && !write_chunk(out)) return abort();
    }
    abort();  // a stream ended by an engine error: its other choices stop too (no-op otherwise)
    write_stream_end();
  }

  beast::tcp_stream stream_;
  Server& srv_;
  const HttpOptions& opt_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
  bool keep_alive_ = true, first_ = true, counted_ = false;
  bool head_ = false;  // the request being answered is a HEAD
  HeaderList cors_;  // the current request's CORS response headers
  bool anthropic_ = false;  // the current request is /v1/messages*: errors in Anthropic's shape

  template <class Message>
  void add_cors(Message& m) const {
    for (const auto& [name, value] : cors_) m.set(name, value);
  }
  int64_t reserved_ = 0;  // body bytes reserved in srv_.body_bytes (strand, or the worker while it owns the request)
  // A request is being answered (written on the strand; read by launch() on the acceptor's strand).
  std::atomic<bool> busy_{false};
  std::atomic<int64_t> waiting_since_{0};  // when it began to wait for its current request (steady clock)
  bool chunked_ = false;  // worker
  bool failed_ = false;   // worker: a write failed or timed out
};

void accept_next(Server& srv, tcp::acceptor& acc) {
  acc.async_accept(net::make_strand(srv.ioc), [&srv, &acc](beast::error_code ec, tcp::socket s) {
    if (!acc.is_open() || ec == net::error::operation_aborted) return;  // closed: draining
    if (!ec) {
      beast::error_code ig;
      s.set_option(tcp::no_delay(true), ig);
      std::make_shared<Conn>(std::move(s), srv)->launch();
      return accept_next(srv, acc);
    }
    // Out of descriptors or similar: try again shortly instead of spinning.
    std::fprintf(stderr, "[m3serve] accept failed: %s\n", ec.message().c_str());
    auto t = std::make_shared<net::steady_timer>(acc.get_executor(), std::chrono::milliseconds(100));
    t->async_wait([&srv, &acc, t](beast::error_code) { accept_next(srv, acc); });
  });
}

}  // namespace

namespace {
// Binds (and with `listen`, listens on) host:port. SO_REUSEADDR only: a restart may bind over TIME_WAIT;
// no SO_REUSEPORT, so a second server cannot share the port and a busy port is an error here.
void bind_listener(tcp::acceptor& acc, net::io_context& ioc, const std::string& host, int port, bool listen) {
  const std::string where = host + ":" + std::to_string(port);
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto eps = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || eps.empty()) throw Error("cannot listen on " + where + ": " + (ec ? ec.message() : "no address"));
  const tcp::endpoint ep = eps.begin()->endpoint();
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec && listen) acc.listen(1024, ec);
  if (ec) throw Error("cannot listen on " + where + ": " + ec.message());
}
}  // namespace

void check_listen_address(const std::string& host, int port) {
  if (port == 0) return;
  net::io_context ioc;
  tcp::acceptor acc(ioc);
  bind_listener(acc, ioc, host, port, false);
}

void run_http_server(Engine& engine, const ServerContext& ctx, const HttpOptions& options) {
  HttpOptions opt = options;
  // Each connection holds a descriptor: raise the soft limit toward the hard one, and keep the cap under
  // what is left (else accept() would fail with EMFILE while the cap still admits connections).
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    const rlim_t reserve = 256;  // listener, model and log files, pipes, the engine's own
    const rlim_t want = rlim_t(opt.max_connections) + reserve;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = std::min(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want) {
      const int cap = int(std::max<rlim_t>(16, rl.rlim_cur > reserve ? rl.rlim_cur - reserve : 16));
      std::fprintf(stderr, "[m3serve] --max-connections %d lowered to %d (the descriptor limit is %llu)\n",
                   opt.max_connections, cap, static_cast<unsigned long long>(rl.rlim_cur));
      opt.max_connections = cap;
    }
  }
  Metrics metrics;
  {
    const EngineConfig& ec = engine.config();
    metrics.set_cache_config(fmt::format(
        "block_size=\"{}\",cache_dtype=\"{}\",enable_prefix_caching=\"{}\",num_gpu_blocks=\"{}\",num_cpu_blocks=\"0\"",
        engine.block_size(), ec.kv_cache_dtype, ec.enable_prefix_caching ? "True" : "False", engine.stats().total_pages));
  }
  AsyncEngine ae(engine, metrics, opt.max_waiting);
  Server srv(ae, metrics, ctx, opt);

  tcp::acceptor acc(net::make_strand(srv.ioc));
  bind_listener(acc, srv.ioc, opt.host, opt.port, true);
  const int port = acc.local_endpoint().port();
  const bool v6 = opt.host.find(':') != std::string::npos;  // an IPv6 literal goes in brackets in a URL
  std::fprintf(stderr, "[m3serve] listening on http://%s%s%s:%d\n", v6 ? "[" : "", opt.host.c_str(), v6 ? "]" : "", port);
  std::fflush(stderr);

  // SIGTERM / SIGINT (blocked in every thread by the serve command) are taken by this thread: the
  // first starts the drain below, a second exits at once.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  std::mutex sig_mu;
  std::condition_variable sig_cv;
  int signals = 0;
  std::atomic<bool> finished{false};
  std::thread sig([&] {
    for (;;) {
      int signo = 0;
      sigwait(&set, &signo);
      if (finished.load()) return;
      std::unique_lock lk(sig_mu);
      if (signals++ > 0) {
        std::fprintf(stderr, "[m3serve] second signal %d: exiting now\n", signo);
        std::fflush(stderr);
        _exit(1);
      }
      std::fprintf(stderr,
                   "[m3serve] signal %d: shutting down (running requests have %s to finish; a second signal exits "
                   "at once)\n",
                   signo, secs(opt.shutdown_timeout_s).c_str());
      sig_cv.notify_all();
    }
  });

  accept_next(srv, acc);
  std::vector<std::thread> io;
  for (int i = 0; i < std::max(1, opt.io_threads); ++i) io.emplace_back([&srv] { srv.ioc.run(); });
  auto guard = net::make_work_guard(srv.ioc);

  {
    std::unique_lock lk(sig_mu);
    sig_cv.wait(lk, [&] { return signals > 0; });
  }
  // Drain: stop accepting, close idle connections, let running requests finish within the timeout.
  srv.draining = true;
  net::post(acc.get_executor(), [&acc] {
    beast::error_code ig;
    acc.close(ig);
  });
  {
    std::vector<std::shared_ptr<Conn>> live;
    {
      std::lock_guard lk(srv.mu);
      for (auto& [p, w] : srv.conns)
        if (auto s = w.lock()) live.push_back(std::move(s));
    }
    for (auto& c : live) c->close_if_idle();
  }
  auto wait_workers = [&](double seconds) {
    std::unique_lock lk(srv.mu);
    return srv.cv.wait_for(lk, ms(seconds), [&] { return srv.workers == 0; });
  };
  if (!wait_workers(opt.shutdown_timeout_s)) {
    int n = 0;
    {
      std::lock_guard lk(srv.mu);
      n = srv.workers;
    }
    std::fprintf(stderr, "[m3serve] ending %d request(s) still running after %s (finish_reason abort)\n", n,
                 secs(opt.shutdown_timeout_s).c_str());
  }
  ae.stop();  // what still runs ends with finish_reason abort; streams get their final chunk and [DONE]
  if (!wait_workers(opt.write_timeout_s + 2)) {
    std::fprintf(stderr, "[m3serve] requests still writing after the write timeout; exiting\n");
    std::fflush(stderr);
    _exit(1);
  }
  guard.reset();
  srv.ioc.stop();
  for (auto& t : io) t.join();
  finished = true;
  pthread_kill(sig.native_handle(), SIGTERM);
  sig.join();
  std::fprintf(stderr, "[m3serve] stopped\n");
}

}  // namespace m3::server
