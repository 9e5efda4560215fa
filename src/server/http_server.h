// The OpenAI-compatible HTTP server (Boost.Beast over Asio): routes, API-key check, body and header
// limits, timeouts, a connection cap, JSON errors, streaming, and a draining shutdown on SIGTERM / SIGINT.
#pragma once
#include <functional>
#include <string>

#include "engine/engine.h"
#include "server/cors.h"
#include "server/openai_protocol.h"
#include "server/request_limits.h"

namespace m3::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // empty: no authentication
  CorsOptions cors;     // --allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials
  int stream_interval = 1;
  size_t max_body_bytes = 32u << 20;  // after de-chunking and decompression
  // Request bodies being received or handled at once, in bytes (a chunked or compressed body counts
  // max_body_bytes, the most it may become); a body that would pass it gets 503. Bodies up to 64 KiB
  // are not counted. 0: 8 x max_body_bytes.
  size_t max_body_bytes_in_flight = 0;
  size_t max_header_bytes = 16u << 10;
  int threads = 512;             // requests handled at once (each holds a worker thread); more get 503
  int io_threads = 2;            // threads doing all socket I/O (never block)
  int max_connections = 1024;    // open connections; more get 503 and are closed
  size_t max_waiting = 256;      // engine requests waiting for the batch; more get 503 (0: no limit)
  double header_timeout_s = 10;  // the whole request header, from connect (later requests: their first byte)
  double body_timeout_s = 30;    // the whole body, after the header
  double idle_timeout_s = 5;     // a keep-alive connection waiting for its next request
  double write_timeout_s = 30;   // one write to a client that does not read
  double shutdown_timeout_s = 5; // SIGTERM: how long running requests may finish before they are ended
  RequestLimits limits;
  // More Prometheus lines for /metrics (e.g. the KV events publisher's counters); may be empty.
  std::function<std::string()> extra_metrics;
};

// Serves until SIGTERM / SIGINT: then stops accepting, lets running requests finish within
// shutdown_timeout_s, ends the rest (finish_reason "abort", streams with [DONE]) and returns. A second
// signal exits at once. Prints the listening address on stderr once bound; a busy port is an m3::Error
// naming host:port.
// Fails (m3::Error naming host:port) when host:port cannot be bound, as the server's own bind would:
// serve checks it before it spends minutes loading a model. Port 0 always passes.
void check_listen_address(const std::string& host, int port);

void run_http_server(Engine& engine, const ServerContext& ctx, const HttpOptions& opt);

}  // namespace m3::server
