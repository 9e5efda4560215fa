// The prefill engine's side of the KV transfer: a UCX listener (kv_ip:kv_port) on its own thread that
// hands each connection to one of num_threads serving threads (vLLM's NixlConnector num_threads, default
// 4), so that several decode engines, or several requests of one, pull at once. A serving thread checks
// the client's hello (same model, layout, dtypes, page size), then serves a read of a lease's pages by that
// lease's id and block ids only (KvLeaseTable::begin_read): it exports them into its registered buffer
// and the client reads them from there by RMA (or, asked for the stream mode, sends them on the stream).
// The lease is marked read once the decode engine acknowledged every page.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "transfer/transfer_protocol.h"
#include "transfer/ucx_link.h"

namespace m3::transfer {

class KvTransferServer {
 public:
  // Listens before returning (throws m3::Error naming host:port when it cannot). The engine must have
  // leases enabled and outlive the server.
  KvTransferServer(std::shared_ptr<UcxContext> ctx, Engine& engine, Hello mine, const std::string& host, int port,
                   int num_threads = 4, std::chrono::seconds io_timeout = std::chrono::seconds(30));
  ~KvTransferServer();
  int port() const { return port_; }
  int num_threads() const { return int(servers_.size()); }

 private:
  // One serving thread's worker and its export buffer, registered with UCX (kept between reads, grown
  // when a read needs more).
  struct Server {
    std::unique_ptr<UcxWorker> worker;
    std::vector<char> buf;
    std::unique_ptr<MemRegion> region;
    std::thread thread;
  };
  void listen();
  void work(Server& s);
  void serve(Server& s, Link& link);
  std::string serve_rma(Server& s, Link& link, const ReadRequest& rd, const std::vector<TransferPage>& chain,
                        int64_t* bytes);
  std::string serve_stream(Link& link, const ReadRequest& rd, const std::vector<TransferPage>& chain, int64_t* bytes);
  void maybe_die(size_t pages_sent);

  std::shared_ptr<UcxContext> ctx_;
  Engine& engine_;
  KvLeaseTable& leases_;
  Hello mine_;
  std::chrono::seconds io_timeout_;
  std::unique_ptr<UcxWorker> worker_;  // the listener's
  std::unique_ptr<Listener> listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  // Connections accepted by the listener thread, waiting for a serving thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ucp_conn_request_h> queue_;
  std::vector<std::unique_ptr<Server>> servers_;
  // Fault injection for the failure tests (M3_KV_TRANSFER_FAULT=die-after-pages:N): the process exits
  // after sending N pages of a read, as a prefill engine killed mid-transfer would. -1: off.
  int die_after_pages_ = -1;
  std::thread listen_thread_;
};

}  // namespace m3::transfer
