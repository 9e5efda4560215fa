// UCX underneath the KV transfer: a context (shared by the threads of a process), a worker per thread,
// and a Link: one endpoint connected by socket address (client) or accepted from a listener (server),
// carrying a byte stream (UCX's stream API: RDMA or shared memory where the host has them, TCP
// otherwise; UCX_TLS chooses). Every operation waits with a deadline, sleeping on the worker's event
// fd between progress calls, and a peer that dies surfaces as a failed operation (UCX's peer error
// handling), never a hang. Pages move by RMA: the side that has them registers a buffer (MemRegion) and
// hands its address and packed key to the peer, which reads it with Link::start_get (zero-copy where the
// transport can: CMA/KNEM/RDMA; over TCP, UCX emulates the read with messages).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include <ucp/api/ucp.h>

namespace m3::transfer {

using Deadline = std::chrono::steady_clock::time_point;

class UcxContext {
 public:
  UcxContext();  // throws m3::Error when UCX cannot start
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  ucp_context_h get() const { return ctx_; }

 private:
  ucp_context_h ctx_ = nullptr;
};

class UcxWorker {
 public:
  explicit UcxWorker(const UcxContext& ctx);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;
  ucp_worker_h get() const { return w_; }
  // Progresses until `done()` or the deadline (false), sleeping on the event fd when idle.
  template <class F>
  bool wait_until(F done, Deadline deadline);
  // Progresses what is ready now, without waiting.
  void progress() {
    while (ucp_worker_progress(w_) != 0) {
    }
  }
  // Wakes a thread sleeping in wait_until (another thread may call it).
  void signal();

 private:
  bool sleep_once(Deadline deadline);
  ucp_worker_h w_ = nullptr;
  int efd_ = -1;
  bool busy_poll_ = false;  // M3_UCX_BUSY_POLL=1: never sleep between progress calls (latency probes)
};

// A buffer registered with UCX, so that a peer can read it (its packed key travels to the peer) or a read
// can land in it.
class MemRegion {
 public:
  MemRegion(const UcxContext& ctx, void* addr, size_t n);  // throws m3::Error
  ~MemRegion();
  MemRegion(const MemRegion&) = delete;
  MemRegion& operator=(const MemRegion&) = delete;
  ucp_mem_h get() const { return memh_; }
  void* addr() const { return addr_; }
  size_t size() const { return n_; }
  std::string packed_key() const;  // what a peer unpacks (Link::unpack_key) to read this region

 private:
  ucp_context_h ctx_;
  ucp_mem_h memh_ = nullptr;
  void* addr_;
  size_t n_;
};

// A peer's region key unpacked on one endpoint; destroyed before that endpoint closes.
class RemoteKey {
 public:
  RemoteKey() = default;
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ucp_rkey_h get() const { return rkey_; }

 private:
  friend class Link;
  ucp_rkey_h rkey_ = nullptr;
};

// One connection's byte stream.
class Link {
 public:
  // Client: connects to host:port (resolves names). Throws m3::Error on a bad address.
  static std::unique_ptr<Link> connect(UcxWorker& w, const std::string& host, int port);
  // Server: accepts a connection request handed out by a Listener.
  static std::unique_ptr<Link> accept(UcxWorker& w, ucp_conn_request_h req);
  ~Link();  // closes the endpoint (forcibly: everything that mattered was waited for)

  // Each returns "" or why it failed (the peer went away, the deadline passed).
  std::string send(const void* data, size_t n, Deadline deadline);
  std::string recv(void* data, size_t n, Deadline deadline);
  std::string send_frame(const std::string& body, Deadline deadline);
  // A send left in flight (the bytes must stay unchanged until finish_send), so that the caller can
  // prepare the next buffer meanwhile; sends arrive in the order they were started.
  struct Pending {
    ucs_status_ptr_t req = nullptr;
    std::string error;  // failed at once
  };
  Pending start_send(const void* data, size_t n);
  std::string finish_send(Pending& p, Deadline deadline, const char* what = "send");
  std::string recv_frame(std::string& body, size_t max_bytes, Deadline deadline);
  // RMA: `packed` (MemRegion::packed_key of the peer) made usable on this link. "" or why not.
  std::string unpack_key(const std::string& packed, RemoteKey& out);
  // RMA read of n bytes at the peer's `remote_addr` into `local` (inside `mine`, registered here), left in
  // flight: finish_send waits for it as for a send. Reads complete in any order.
  Pending start_get(void* local, size_t n, uint64_t remote_addr, const RemoteKey& key, const MemRegion& mine);
  bool broken() const { return failed_ != UCS_OK; }

 private:
  Link(UcxWorker& w) : w_(w) {}
  std::string wait_request(ucs_status_ptr_t r, Deadline deadline, const char* what);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  UcxWorker& w_;
  ucp_ep_h ep_ = nullptr;
  ucs_status_t failed_ = UCS_OK;
};

// Accepts connections on host:port (port 0: any free port, port() says which).
class Listener {
 public:
  Listener(UcxWorker& w, const std::string& host, int port);
  ~Listener();
  int port() const { return port_; }
  // A connection request received since the last call (progress the worker to receive them), or null.
  ucp_conn_request_h take();
  // Refuses a request taken but never accepted (on the listener's thread, or once no thread progresses).
  void reject(ucp_conn_request_h r) { ucp_listener_reject(l_, r); }

 private:
  static void on_conn(ucp_conn_request_h req, void* arg);
  ucp_listener_h l_ = nullptr;
  int port_ = 0;
  std::deque<ucp_conn_request_h> pending_;
};

template <class F>
bool UcxWorker::wait_until(F done, Deadline deadline) {
  for (;;) {
    while (ucp_worker_progress(w_) != 0) {
    }
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (busy_poll_ || !sleep_once(deadline)) continue;
  }
}

}  // namespace m3::transfer
