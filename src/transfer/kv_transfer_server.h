// The prefill engine's side of the KV transfer: a UCX listener (kv_ip:kv_port) on its own thread that
// answers decode engines: it checks their hello (same model, layout, dtypes, page size), then serves a
// read of a lease's pages by that lease's id and block ids only (KvLeaseTable::begin_read), and marks the
// lease read once the decode engine acknowledged every page. One connection is served at a time.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "transfer/transfer_protocol.h"
#include "transfer/ucx_link.h"

namespace m3::transfer {

class KvTransferServer {
 public:
  // Listens before returning (throws m3::Error naming host:port when it cannot). The engine must have
  // leases enabled and outlive the server.
  KvTransferServer(std::shared_ptr<UcxContext> ctx, Engine& engine, Hello mine, const std::string& host, int port,
                   std::chrono::seconds io_timeout = std::chrono::seconds(30));
  ~KvTransferServer();
  int port() const { return port_; }

 private:
  void run();
  void serve(Link& link);

  std::shared_ptr<UcxContext> ctx_;
  Engine& engine_;
  KvLeaseTable& leases_;
  Hello mine_;
  std::chrono::seconds io_timeout_;
  std::unique_ptr<UcxWorker> worker_;
  std::unique_ptr<Listener> listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  // Fault injection for the failure tests (M3_KV_TRANSFER_FAULT=die-after-pages:N): the process exits
  // after sending N pages of a read, as a prefill engine killed mid-transfer would. -1: off.
  int die_after_pages_ = -1;
  std::thread thread_;
};

}  // namespace m3::transfer
