// Pulling a prompt's pages from a prefill engine (see kv_transfer_client.h).
#include "transfer/kv_transfer_client.h"

#include <cstdlib>
#include <vector>

#include "base/error.h"

namespace m3::transfer {

UcxKvFetcher::UcxKvFetcher(std::shared_ptr<UcxContext> ctx, Hello mine, std::chrono::seconds io_timeout, ReadMode mode)
    : ctx_(std::move(ctx)), mine_(std::move(mine)), io_timeout_(io_timeout), mode_(mode) {
  if (const char* m = std::getenv("M3_KV_TRANSFER_MODE")) {
    const std::string v(m);
    if (v == "rma") mode_ = ReadMode::Rma;
    else if (v == "stream") mode_ = ReadMode::Stream;
    else throw Error("M3_KV_TRANSFER_MODE: expected rma or stream, got \"" + v + "\"");
  }
}

// Each range the server announces is read as soon as it is ready; the reads stay in flight together.
// Whatever happens, no read is left running when this returns: `out` and its registration go away after.
std::string UcxKvFetcher::pull_rma(Link& link, RemotePrefill& out, size_t n) {
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  const size_t pb = mine_.page_bytes;
  std::string msg;
  if (std::string e = link.recv_frame(msg, 64 << 10, deadline()); !e.empty()) return "memory offer: " + e;
  const std::optional<RmaOffer> offer = decode_rma_offer(msg);
  if (!offer) return "the prefill engine offered no readable memory";
  if (offer->bytes != n * pb)
    return "the prefill engine offered " + std::to_string(offer->bytes) + " bytes for " + std::to_string(n) +
           " pages of " + std::to_string(pb);
  out.data.resize(n * pb);
  MemRegion mine(*ctx_, out.data.data(), out.data.size());
  RemoteKey key;
  if (std::string e = link.unpack_key(offer->key, key); !e.empty()) return e;
  std::vector<Link::Pending> reads;
  std::string err;
  size_t have = 0;
  while (have < n && err.empty()) {
    uint32_t ready = 0;
    if (std::string e = link.recv(&ready, 4, deadline()); !e.empty()) {
      err = "page " + std::to_string(have) + " of " + std::to_string(n) + ": " + e;
      break;
    }
    if (ready < have || ready > n) {
      err = "the prefill engine announced " + std::to_string(ready) + " pages ready, after " + std::to_string(have) +
            " of " + std::to_string(n);
      break;
    }
    if (ready == have) continue;
    reads.push_back(link.start_get(out.data.data() + have * pb, (ready - have) * pb, offer->addr + have * pb, key, mine));
    have = ready;
  }
  for (Link::Pending& r : reads) {
    std::string e = link.finish_send(r, deadline(), "RMA read");
    if (err.empty() && !e.empty()) err = e;
  }
  return err;
}

std::string UcxKvFetcher::pull_stream(Link& link, RemotePrefill& out, size_t n) {
  const size_t pb = mine_.page_bytes;
  out.data.resize(n * pb);
  for (size_t i = 0; i < n; ++i)
    if (std::string e = link.recv(out.data.data() + i * pb, pb, std::chrono::steady_clock::now() + io_timeout_);
        !e.empty())
      return "page " + std::to_string(i) + " of " + std::to_string(n) + ": " + e;
  return {};
}

FetchResult UcxKvFetcher::fetch(const RemoteKvRef& ref, RemotePrefill& out) {
  const auto t0 = std::chrono::steady_clock::now();
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  auto failed = [&](const std::string& why) {
    ++failed_;
    out.data.clear();
    return FetchResult{FetchStatus::Failed, why};
  };
  auto refused = [&](const std::string& why) {
    ++refused_;
    out.data.clear();
    return FetchResult{FetchStatus::Refused, why};
  };
  ++fetches_;
  out.page_bytes = mine_.page_bytes;
  const size_t n = ref.block_ids.size();
  try {
    UcxWorker w(*ctx_);
    std::unique_ptr<Link> link = Link::connect(w, ref.host, ref.port);
    std::string msg;
    if (std::string e = link->send_frame(encode(mine_), deadline()); !e.empty()) return failed("hello: " + e);
    if (std::string e = link->recv_frame(msg, 4096, deadline()); !e.empty()) return failed("hello: " + e);
    if (!msg.empty()) return refused("the prefill engine has another cache: " + msg);
    if (std::string e = link->send_frame(encode(ReadRequest{ref.request_id, ref.block_ids, mode_}), deadline());
        !e.empty())
      return failed("read request: " + e);
    if (std::string e = link->recv_frame(msg, 4096, deadline()); !e.empty()) return failed("read request: " + e);
    if (!msg.empty()) return refused(msg);
    if (std::string e = mode_ == ReadMode::Rma ? pull_rma(*link, out, n) : pull_stream(*link, out, n); !e.empty())
      return failed(e);
    const char ack = 'K';
    if (std::string e = link->send(&ack, 1, deadline()); !e.empty()) return failed("acknowledgement: " + e);
  } catch (const Error& e) {
    // An address that cannot be resolved (the request's remote_host) is the client's fault; a buffer
    // that UCX cannot register is this engine's.
    if (std::string(e.what()).rfind("UCX:", 0) == 0) return failed(e.what());
    return refused(e.what());
  }
  pages_ += int64_t(n);
  bytes_ += int64_t(n * mine_.page_bytes);
  micros_ += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  return {};
}

KvFetchStats UcxKvFetcher::stats() const {
  KvFetchStats s;
  s.fetches = fetches_;
  s.refused = refused_;
  s.failed = failed_;
  s.pages = pages_;
  s.bytes = bytes_;
  s.seconds = double(micros_.load()) * 1e-6;
  return s;
}

}  // namespace m3::transfer
