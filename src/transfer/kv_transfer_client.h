// The decode engine's side of the KV transfer: pulls a prompt's pages from a prefill engine's listener
// over UCX (a worker per call, so that each HTTP worker thread pulls on its own), with the hello that
// says what this engine's cache is. Counts what it moved, for /metrics.
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
  UcxKvFetcher(std::shared_ptr<UcxContext> ctx, Hello mine, std::chrono::seconds io_timeout = std::chrono::seconds(30));
  FetchResult fetch(const RemoteKvRef& ref, std::vector<std::string>& blobs) override;
  KvFetchStats stats() const;

 private:
  std::shared_ptr<UcxContext> ctx_;
  Hello mine_;
  std::chrono::seconds io_timeout_;
  std::atomic<int64_t> fetches_{0}, refused_{0}, failed_{0}, pages_{0}, bytes_{0}, micros_{0};
};

}  // namespace m3::transfer
