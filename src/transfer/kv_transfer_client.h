// The decode engine's side of the KV transfer: pulls a prompt's pages from a prefill engine's listener
// over UCX (a worker per call, so that each pulling thread has its own), with the hello that says what
// this engine's cache is. The pages are read by RMA straight into the request's buffer (registered for
// the read), or, in the stream mode (M3_KV_TRANSFER_MODE=stream: the first protocol's, kept as the
// measured baseline and as a fallback should a UCX's RMA fail), received from the stream into it.
// Counts what it moved, for /metrics.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "engine/kv_lease.h"
#include "transfer/transfer_protocol.h"
#include "transfer/ucx_link.h"

namespace m3::transfer {

struct KvFetchStats {
  int64_t fetches = 0, refused = 0, failed = 0;
  int64_t pages = 0, bytes = 0;
  double seconds = 0;  // wall time of successful fetches
};

class UcxKvFetcher : public RemoteKvFetcher {
 public:
  // mode: how pages move; the environment's M3_KV_TRANSFER_MODE (rma|stream), when set, decides instead.
  UcxKvFetcher(std::shared_ptr<UcxContext> ctx, Hello mine, std::chrono::seconds io_timeout = std::chrono::seconds(30),
               ReadMode mode = ReadMode::Rma);
  FetchResult fetch(const RemoteKvRef& ref, RemotePrefill& out) override;
  KvFetchStats stats() const;
  ReadMode mode() const { return mode_; }
  void set_mode(ReadMode m) { mode_ = m; }  // before serving (the benchmark alternates modes)

 private:
  std::string pull_rma(Link& link, RemotePrefill& out, size_t n);
  std::string pull_stream(Link& link, RemotePrefill& out, size_t n);
  std::shared_ptr<UcxContext> ctx_;
  Hello mine_;
  std::chrono::seconds io_timeout_;
  ReadMode mode_;
  std::atomic<int64_t> fetches_{0}, refused_{0}, failed_{0}, pages_{0}, bytes_{0}, micros_{0};
};

}  // namespace m3::transfer
