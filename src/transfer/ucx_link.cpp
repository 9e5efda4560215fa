// UCX context, worker, stream link and listener (see ucx_link.h).
#include "transfer/ucx_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace m3::transfer {

namespace {
std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

sockaddr_storage resolve(const std::string& host, int port, socklen_t* len) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string p = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res); rc != 0 || !res)
    throw Error("KV transfer: cannot resolve host \"" + host + "\": " + gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = socklen_t(res->ai_addrlen);
  freeaddrinfo(res);
  return ss;
}
}  // namespace

UcxContext::UcxContext() {
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_STREAM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;  // each thread has its own worker; the context is shared
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) throw Error("UCX: cannot read its configuration: " + status_text(st));
  st = ucp_init(&p, cfg, &ctx_);
  ucp_config_release(cfg);
  if (st != UCS_OK) throw Error("UCX: cannot start (ucp_init): " + status_text(st));
}

UcxContext::~UcxContext() {
  if (ctx_) ucp_cleanup(ctx_);
}

UcxWorker::UcxWorker(const UcxContext& ctx) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucs_status_t st = ucp_worker_create(ctx.get(), &wp, &w_);
  if (st != UCS_OK) throw Error("UCX: cannot create a worker: " + status_text(st));
  if (const char* b = std::getenv("M3_UCX_BUSY_POLL")) busy_poll_ = std::string(b) == "1";
  st = ucp_worker_get_efd(w_, &efd_);
  if (st != UCS_OK) {
    ucp_worker_destroy(w_);
    throw Error("UCX: the worker has no event fd: " + status_text(st));
  }
}

UcxWorker::~UcxWorker() {
  if (w_) ucp_worker_destroy(w_);
}

void UcxWorker::signal() { ucp_worker_signal(w_); }

bool UcxWorker::sleep_once(Deadline deadline) {
  if (ucp_worker_arm(w_) == UCS_ERR_BUSY) return false;  // events came in meanwhile: progress again
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  // At most 100 ms asleep: a bound, not a synchronisation (the fd wakes us when something arrives).
  pollfd pfd{efd_, POLLIN, 0};
  poll(&pfd, 1, int(std::clamp<int64_t>(left.count(), 0, 100)));
  return true;
}

std::unique_ptr<Link> Link::connect(UcxWorker& w, const std::string& host, int port) {
  std::unique_ptr<Link> l(new Link(w));
  socklen_t len = 0;
  const sockaddr_storage ss = resolve(host, port, &len);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  ep.sockaddr.addrlen = len;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Link::on_error;
  ep.err_handler.arg = l.get();
  const ucs_status_t st = ucp_ep_create(w.get(), &ep, &l->ep_);
  if (st != UCS_OK) {
    l->ep_ = nullptr;
    l->failed_ = st;
  }
  return l;
}

std::unique_ptr<Link> Link::accept(UcxWorker& w, ucp_conn_request_h req) {
  std::unique_ptr<Link> l(new Link(w));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Link::on_error;
  ep.err_handler.arg = l.get();
  const ucs_status_t st = ucp_ep_create(w.get(), &ep, &l->ep_);
  if (st != UCS_OK) {
    l->ep_ = nullptr;
    l->failed_ = st;
  }
  return l;
}

void Link::on_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Link*>(arg)->failed_ = status; }

Link::~Link() {
  if (!ep_) return;
  // A link in good order is flushed as it closes (what was sent arrives); a broken one is dropped.
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = broken() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &rp);
  if (r && !UCS_PTR_IS_ERR(r)) {
    w_.wait_until([&] { return ucp_request_check_status(r) != UCS_INPROGRESS; },
                  std::chrono::steady_clock::now() + std::chrono::seconds(2));
    if (ucp_request_check_status(r) == UCS_INPROGRESS) {
      // The peer does not answer the flush: drop the endpoint instead.
      ucp_request_param_t force{};
      force.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      force.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t f = ucp_ep_close_nbx(ep_, &force);
      if (f && !UCS_PTR_IS_ERR(f)) {
        w_.wait_until([&] { return ucp_request_check_status(f) != UCS_INPROGRESS; },
                      std::chrono::steady_clock::now() + std::chrono::seconds(2));
        ucp_request_free(f);
      }
    }
    ucp_request_free(r);
  }
}

std::string Link::wait_request(ucs_status_ptr_t r, Deadline deadline, const char* what) {
  if (r == nullptr) return {};
  if (UCS_PTR_IS_ERR(r)) {
    failed_ = UCS_PTR_STATUS(r);
    return std::string(what) + " failed: " + status_text(UCS_PTR_STATUS(r));
  }
  w_.wait_until([&] { return ucp_request_check_status(r) != UCS_INPROGRESS; }, deadline);
  ucs_status_t st = ucp_request_check_status(r);
  if (st == UCS_INPROGRESS) {
    // Past the deadline: the endpoint is dropped, which completes the request (cancelled).
    failed_ = UCS_ERR_TIMED_OUT;
    ucp_request_param_t force{};
    force.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    force.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t f = ucp_ep_close_nbx(ep_, &force);
    ep_ = nullptr;
    w_.wait_until([&] { return ucp_request_check_status(r) != UCS_INPROGRESS; },
                  std::chrono::steady_clock::now() + std::chrono::seconds(2));
    if (f && !UCS_PTR_IS_ERR(f)) {
      w_.wait_until([&] { return ucp_request_check_status(f) != UCS_INPROGRESS; },
                    std::chrono::steady_clock::now() + std::chrono::seconds(2));
      ucp_request_free(f);
    }
    if (ucp_request_check_status(r) != UCS_INPROGRESS) ucp_request_free(r);
    return std::string(what) + " timed out";
  }
  ucp_request_free(r);
  if (st != UCS_OK) {
    failed_ = st;
    return std::string(what) + " failed: " + status_text(st);
  }
  return {};
}

std::string Link::send(const void* data, size_t n, Deadline deadline) {
  if (!ep_ || broken()) return "the connection is closed (" + status_text(failed_) + ")";
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  rp.cb.send = [](void*, ucs_status_t, void*) {};
  return wait_request(ucp_stream_send_nbx(ep_, data, n, &rp), deadline, "send");
}

Link::Pending Link::start_send(const void* data, size_t n) {
  Pending p;
  if (!ep_ || broken()) {
    p.error = "the connection is closed (" + status_text(failed_) + ")";
    return p;
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  rp.cb.send = [](void*, ucs_status_t, void*) {};
  p.req = ucp_stream_send_nbx(ep_, data, n, &rp);
  return p;
}

std::string Link::finish_send(Pending& p, Deadline deadline, const char* what) {
  if (!p.error.empty()) return p.error;
  const ucs_status_ptr_t r = p.req;
  p.req = nullptr;
  return wait_request(r, deadline, what);
}

std::string Link::recv(void* data, size_t n, Deadline deadline) {
  // Posted even on a link the peer closed: what it sent before closing may still be waiting here.
  if (!ep_) return "the connection is closed (" + status_text(failed_) + ")";
  size_t got = 0;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  rp.cb.recv_stream = [](void*, ucs_status_t, size_t, void*) {};
  return wait_request(ucp_stream_recv_nbx(ep_, data, n, &got, &rp), deadline, "receive");
}

MemRegion::MemRegion(const UcxContext& ctx, void* addr, size_t n) : ctx_(ctx.get()), addr_(addr), n_(n) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = n;
  const ucs_status_t st = ucp_mem_map(ctx_, &mp, &memh_);
  if (st != UCS_OK)
    throw Error("UCX: cannot register " + std::to_string(n) + " bytes for the KV transfer: " + status_text(st));
}

MemRegion::~MemRegion() {
  if (memh_) ucp_mem_unmap(ctx_, memh_);
}

std::string MemRegion::packed_key() const {
  void* buf = nullptr;
  size_t len = 0;
  const ucs_status_t st = ucp_rkey_pack(ctx_, memh_, &buf, &len);
  if (st != UCS_OK) throw Error("UCX: cannot pack the key of a KV transfer buffer: " + status_text(st));
  std::string out(static_cast<const char*>(buf), len);
  ucp_rkey_buffer_release(buf);
  return out;
}

RemoteKey::~RemoteKey() {
  if (rkey_) ucp_rkey_destroy(rkey_);
}

std::string Link::unpack_key(const std::string& packed, RemoteKey& out) {
  if (!ep_ || broken()) return "the connection is closed (" + status_text(failed_) + ")";
  const ucs_status_t st = ucp_ep_rkey_unpack(ep_, packed.data(), &out.rkey_);
  if (st != UCS_OK) {
    out.rkey_ = nullptr;
    return "the peer's memory key does not unpack: " + status_text(st);
  }
  return {};
}

Link::Pending Link::start_get(void* local, size_t n, uint64_t remote_addr, const RemoteKey& key, const MemRegion& mine) {
  Pending p;
  if (!ep_ || broken()) {
    p.error = "the connection is closed (" + status_text(failed_) + ")";
    return p;
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_MEMH;
  rp.cb.send = [](void*, ucs_status_t, void*) {};
  rp.memh = mine.get();
  p.req = ucp_get_nbx(ep_, local, n, remote_addr, key.get(), &rp);
  return p;
}

std::string Link::send_frame(const std::string& body, Deadline deadline) {
  const uint32_t n = uint32_t(body.size());
  std::string buf(reinterpret_cast<const char*>(&n), 4);
  buf += body;
  return send(buf.data(), buf.size(), deadline);
}

std::string Link::recv_frame(std::string& body, size_t max_bytes, Deadline deadline) {
  uint32_t n = 0;
  if (std::string e = recv(&n, 4, deadline); !e.empty()) return e;
  if (n > max_bytes) {
    failed_ = UCS_ERR_MESSAGE_TRUNCATED;
    return "a message of " + std::to_string(n) + " bytes, more than the " + std::to_string(max_bytes) + " expected";
  }
  body.resize(n);
  return n ? recv(body.data(), n, deadline) : std::string();
}

Listener::Listener(UcxWorker& w, const std::string& host, int port) {
  socklen_t len = 0;
  const sockaddr_storage ss = resolve(host, port, &len);
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = len;
  lp.conn_handler.cb = &Listener::on_conn;
  lp.conn_handler.arg = this;
  const ucs_status_t st = ucp_listener_create(w.get(), &lp, &l_);
  if (st != UCS_OK)
    throw Error("KV transfer: cannot listen on " + host + ":" + std::to_string(port) + " (kv_ip / kv_port): " +
                status_text(st));
  ucp_listener_attr_t a{};
  a.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(l_, &a) == UCS_OK)
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&a.sockaddr)->sin_port);
  else
    port_ = port;
}

Listener::~Listener() {
  for (ucp_conn_request_h r : pending_) ucp_listener_reject(l_, r);
  if (l_) ucp_listener_destroy(l_);
}

void Listener::on_conn(ucp_conn_request_h req, void* arg) { static_cast<Listener*>(arg)->pending_.push_back(req); }

ucp_conn_request_h Listener::take() {
  if (pending_.empty()) return nullptr;
  ucp_conn_request_h r = pending_.front();
  pending_.pop_front();
  return r;
}

}  // namespace m3::transfer
