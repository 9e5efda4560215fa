// `m3serve proxy`: the front of a prefill/decode-disaggregated deployment for clients that speak plain
// OpenAI. Each /v1/completions or /v1/chat/completions request goes first to a prefill engine with
// kv_transfer_params {"do_remote_decode": true}, max_tokens 1 and no streaming; the kv_transfer_params
// of its answer (where the prompt's pages wait) go with the original request to a decode engine, whose
// answer (streamed or not, with its usage) is passed through. Engines are taken round-robin. An error
// from either engine reaches the client with that engine's status and body; an engine that cannot be
// reached is a 502 naming it. The same flow as vLLM's example proxy; at scale, Dynamo or llm-d go here.
#pragma once
#include <string>
#include <vector>

namespace m3::proxy {

struct ProxyOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> prefill, decode;  // base URLs, http://HOST:PORT
  double timeout_s = 600;                    // one engine request, whole
};

struct EngineUrl {
  std::string host;
  int port = 0;
};
// "http://HOST:PORT" (a trailing / or /v1 is allowed); throws m3::Error naming the URL.
EngineUrl parse_engine_url(const std::string& url);

// Serves until the process is stopped. Throws m3::Error for bad URLs or a busy port.
void run_proxy(const ProxyOptions& opt);

}  // namespace m3::proxy
