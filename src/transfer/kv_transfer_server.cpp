// The transfer listener of a prefill engine (see kv_transfer_server.h).
#include "transfer/kv_transfer_server.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace m3::transfer {

KvTransferServer::KvTransferServer(std::shared_ptr<UcxContext> ctx, Engine& engine, Hello mine, const std::string& host,
                                   int port, std::chrono::seconds io_timeout)
    : ctx_(std::move(ctx)), engine_(engine), leases_(*engine.kv_leases()), mine_(std::move(mine)),
      io_timeout_(io_timeout) {
  // The worker and listener are made here (errors reach the caller) and used by the thread alone after.
  worker_ = std::make_unique<UcxWorker>(*ctx_);
  listener_ = std::make_unique<Listener>(*worker_, host, port);
  port_ = listener_->port();
  if (const char* f = std::getenv("M3_KV_TRANSFER_FAULT")) {
    if (std::strncmp(f, "die-after-pages:", 16) != 0)
      throw Error(std::string("M3_KV_TRANSFER_FAULT: expected die-after-pages:N, got \"") + f + "\"");
    die_after_pages_ = std::atoi(f + 16);
    std::fprintf(stderr, "[m3serve] M3_KV_TRANSFER_FAULT: this engine exits after sending %d KV pages (tests)\n",
                 die_after_pages_);
  }
  thread_ = std::thread([this] { run(); });
}

KvTransferServer::~KvTransferServer() {
  stop_ = true;
  worker_->signal();
  if (thread_.joinable()) thread_.join();
  listener_.reset();
  worker_.reset();
}

void KvTransferServer::run() {
  for (;;) {
    ucp_conn_request_h req = nullptr;
    worker_->wait_until([&] { return stop_.load() || (req = listener_->take()) != nullptr; },
                        std::chrono::steady_clock::now() + std::chrono::seconds(1));
    if (stop_) return;  // a request taken now is rejected as the listener closes
    if (!req) continue;
    std::unique_ptr<Link> link = Link::accept(*worker_, req);
    serve(*link);
  }
}

void KvTransferServer::serve(Link& link) {
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  // After a refusal the client closes first: closing here at once could cut the refusal off in flight
  // (the client would see a broken transfer, not the reason). The wait ends when the client has gone.
  auto refuse_and_wait = [&](const std::string& why) {
    if (!link.send_frame(why, deadline()).empty()) return;
    char c = 0;
    link.recv(&c, 1, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  };
  std::string msg;
  if (!link.recv_frame(msg, 4096, deadline()).empty()) return;
  const std::optional<Hello> theirs = decode_hello(msg);
  std::string why = theirs ? check_hello(mine_, *theirs) : "not a KV transfer hello";
  if (!why.empty()) {
    std::fprintf(stderr, "[m3serve] KV transfer: refused a decode engine: %s\n", why.c_str());
    return refuse_and_wait(why);
  }
  if (!link.send_frame(why, deadline()).empty()) return;
  if (!link.recv_frame(msg, size_t(8) << 20, deadline()).empty()) return;
  const std::optional<ReadRequest> rd = decode_read(msg);
  std::vector<TransferPage> chain;
  why = rd ? leases_.begin_read(rd->request_id, rd->block_ids, chain, std::chrono::steady_clock::now())
           : "malformed read request";
  if (!why.empty()) return refuse_and_wait(why);
  if (!link.send_frame(why, deadline()).empty()) {
    leases_.end_read(rd->request_id, false, 0);
    return;
  }
  // Two buffers: page i+1 is exported (copy + checksum) while page i is on the wire.
  std::string blob[2];
  Link::Pending inflight;
  bool have_inflight = false;
  int64_t bytes = 0;
  bool ok = true;
  for (size_t i = 0; i < rd->block_ids.size() && ok; ++i) {
    std::string& b = blob[i % 2];
    engine_.export_leased_page(rd->block_ids[i], chain[i], b);
    if (have_inflight) ok = link.finish_send(inflight, deadline()).empty();
    if (!ok) break;
    if (die_after_pages_ >= 0 && int(i) >= die_after_pages_) std::_Exit(137);
    inflight = link.start_send(b.data(), b.size());
    have_inflight = true;
    bytes += int64_t(b.size());
  }
  if (have_inflight && ok) ok = link.finish_send(inflight, deadline()).empty();
  else if (have_inflight) link.finish_send(inflight, deadline());  // let the buffer go only once it is done
  // The lease is read once the decode engine says it has every page; until then it may try again.
  char ack = 0;
  ok = ok && link.recv(&ack, 1, deadline()).empty() && ack == 'K';
  leases_.end_read(rd->request_id, ok, ok ? bytes : 0);
}

}  // namespace m3::transfer
