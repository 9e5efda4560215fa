// The transfer listener of a prefill engine and its serving threads (see kv_transfer_server.h).
#include "transfer/kv_transfer_server.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace m3::transfer {

namespace {
constexpr size_t kKeepBufferBytes = size_t(512) << 20;  // per serving thread
}

KvTransferServer::KvTransferServer(std::shared_ptr<UcxContext> ctx, Engine& engine, Hello mine, const std::string& host,
                                   int port, int num_threads, std::chrono::seconds io_timeout)
    : ctx_(std::move(ctx)), engine_(engine), leases_(*engine.kv_leases()), mine_(std::move(mine)),
      io_timeout_(io_timeout) {
  if (num_threads < 1)
    throw Error("--kv-transfer-config NixlConnector num_threads: expected at least 1, got " + std::to_string(num_threads));
  // The workers and listener are made here (errors reach the caller); each is used by its thread alone
  // after. A connection request taken by the listener's worker is accepted on a serving thread's worker
  // (UCX lets an endpoint be created on any worker of the context).
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
  for (int i = 0; i < num_threads; ++i) {
    servers_.push_back(std::make_unique<Server>());
    servers_.back()->worker = std::make_unique<UcxWorker>(*ctx_);
  }
  for (auto& s : servers_) s->thread = std::thread([this, p = s.get()] { work(*p); });
  listen_thread_ = std::thread([this] { listen(); });
}

KvTransferServer::~KvTransferServer() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_->signal();
  if (listen_thread_.joinable()) listen_thread_.join();
  for (auto& s : servers_)
    if (s->thread.joinable()) s->thread.join();
  for (ucp_conn_request_h r : queue_) listener_->reject(r);  // no thread progresses the worker now
  listener_.reset();
  for (auto& s : servers_) {
    s->region.reset();
    s->worker.reset();
  }
  worker_.reset();
}

void KvTransferServer::listen() {
  for (;;) {
    ucp_conn_request_h req = nullptr;
    worker_->wait_until([&] { return stop_.load() || (req = listener_->take()) != nullptr; },
                        std::chrono::steady_clock::now() + std::chrono::seconds(1));
    if (stop_) {
      if (req) listener_->reject(req);
      return;
    }
    if (!req) continue;
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(req);
    }
    cv_.notify_one();
  }
}

void KvTransferServer::work(Server& s) {
  for (;;) {
    ucp_conn_request_h req = nullptr;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_.load() || !queue_.empty(); });
      if (stop_) return;
      req = queue_.front();
      queue_.pop_front();
    }
    std::unique_ptr<Link> link = Link::accept(*s.worker, req);
    serve(s, *link);
    // The buffer kept for the next read is bounded: a very long prompt's (GBs on a large model) is let
    // go, once the connection is closed (over TCP this worker answers the client's reads itself, so none
    // may still be waiting for it).
    link.reset();
    if (s.buf.size() > kKeepBufferBytes) {
      s.region.reset();
      s.buf = std::vector<char>();
    }
  }
}

void KvTransferServer::maybe_die(size_t pages_sent) {
  if (die_after_pages_ >= 0 && pages_sent >= size_t(die_after_pages_)) std::_Exit(137);
}

void KvTransferServer::serve(Server& s, Link& link) {
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
  int64_t bytes = 0;
  bool ok = (rd->mode == ReadMode::Rma ? serve_rma(s, link, *rd, chain, &bytes)
                                       : serve_stream(link, *rd, chain, &bytes)).empty();
  // The lease is read once the decode engine says it has every page; until then it may try again.
  char ack = 0;
  ok = ok && link.recv(&ack, 1, deadline()).empty() && ack == 'K';
  leases_.end_read(rd->request_id, ok, ok ? bytes : 0);
}

// The pages are exported into this thread's registered buffer a few at a time, and each time the count
// ready so far is announced: the client reads what is ready while the next ones are exported. Where the
// transport has no one-sided read (TCP), UCX answers the client's reads with messages from this worker,
// so the worker is progressed after every page: the answers go out while the export goes on. The buffer
// is not reused before the client's acknowledgement (or the link broke): its reads may still be landing.
std::string KvTransferServer::serve_rma(Server& s, Link& link, const ReadRequest& rd,
                                        const std::vector<TransferPage>& chain, int64_t* bytes) {
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  const size_t pb = mine_.page_bytes, n = rd.block_ids.size(), total = pb * n;
  try {
    if (s.buf.size() < total) {
      s.region.reset();
      s.buf = std::vector<char>();  // let the old one go before the larger one is taken
      s.buf.resize(total);
      s.region = std::make_unique<MemRegion>(*ctx_, s.buf.data(), s.buf.size());
    }
    RmaOffer offer;
    offer.addr = uint64_t(reinterpret_cast<uintptr_t>(s.buf.data()));
    offer.bytes = total;
    offer.key = s.region->packed_key();
    if (std::string e = link.send_frame(encode(offer), deadline()); !e.empty()) return e;
  } catch (const Error& e) {
    std::fprintf(stderr, "[m3serve] KV transfer: %s\n", e.what());
    link.send_frame("", deadline());  // an empty offer: the client reports the read as failed
    return e.what();
  }
  // About 4 MiB a step: large enough that the announcements cost nothing, small enough to overlap.
  const size_t step = std::max<size_t>(1, (size_t(4) << 20) / std::max<size_t>(pb, 1));
  for (size_t i = 0; i < n;) {
    const size_t end = std::min(n, i + step);
    for (; i < end; ++i) {
      if (die_after_pages_ >= 0 && i >= size_t(die_after_pages_)) {
        const uint32_t ready = uint32_t(i);
        link.send(&ready, 4, deadline());
        maybe_die(i);
      }
      engine_.export_leased_page(rd.block_ids[i], chain[i], s.buf.data() + i * pb);
      s.worker->progress();
    }
    const uint32_t ready = uint32_t(end);
    if (std::string e = link.send(&ready, 4, deadline()); !e.empty()) return e;
  }
  *bytes = int64_t(total);
  return {};
}

std::string KvTransferServer::serve_stream(Link& link, const ReadRequest& rd, const std::vector<TransferPage>& chain,
                                           int64_t* bytes) {
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  // Two buffers: page i+1 is exported (copy + checksum) while page i is on the wire.
  std::string blob[2];
  Link::Pending inflight;
  bool have_inflight = false;
  std::string err;
  for (size_t i = 0; i < rd.block_ids.size() && err.empty(); ++i) {
    std::string& b = blob[i % 2];
    engine_.export_leased_page(rd.block_ids[i], chain[i], b);
    if (have_inflight) err = link.finish_send(inflight, deadline());
    if (!err.empty()) break;
    maybe_die(i);
    inflight = link.start_send(b.data(), b.size());
    have_inflight = true;
    *bytes += int64_t(b.size());
  }
  if (have_inflight && err.empty()) err = link.finish_send(inflight, deadline());
  else if (have_inflight) link.finish_send(inflight, deadline());  // let the buffer go only once it is done
  return err;
}

}  // namespace m3::transfer
