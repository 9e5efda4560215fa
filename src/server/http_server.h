// The OpenAI-compatible HTTP server (cpp-httplib): routes, API-key check, body limit, JSON errors,
// streaming, and a clean shutdown on SIGTERM / SIGINT.
#pragma once
#include <string>

#include "engine/engine.h"
#include "server/openai_protocol.h"

namespace m3::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // empty: no authentication
  int stream_interval = 1;
  size_t max_body_bytes = 32u << 20;
  int threads = 128;
};

// Serves until SIGTERM / SIGINT; returns after running requests were aborted and the engine stopped.
// Prints the listening address on stderr once bound.
void run_http_server(Engine& engine, const ServerContext& ctx, const HttpOptions& opt);

}  // namespace m3::server
