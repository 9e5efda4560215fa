// Pulling a prompt's pages from a prefill engine (see kv_transfer_client.h).
#include "transfer/kv_transfer_client.h"

#include "base/error.h"

namespace m3::transfer {

UcxKvFetcher::UcxKvFetcher(std::shared_ptr<UcxContext> ctx, Hello mine, std::chrono::seconds io_timeout)
    : ctx_(std::move(ctx)), mine_(std::move(mine)), io_timeout_(io_timeout) {}

FetchResult UcxKvFetcher::fetch(const RemoteKvRef& ref, std::vector<std::string>& blobs) {
  const auto t0 = std::chrono::steady_clock::now();
  auto deadline = [&] { return std::chrono::steady_clock::now() + io_timeout_; };
  auto failed = [&](const std::string& why) {
    ++failed_;
    return FetchResult{FetchStatus::Failed, why};
  };
  auto refused = [&](const std::string& why) {
    ++refused_;
    return FetchResult{FetchStatus::Refused, why};
  };
  ++fetches_;
  try {
    UcxWorker w(*ctx_);
    std::unique_ptr<Link> link = Link::connect(w, ref.host, ref.port);
    std::string msg;
    if (std::string e = link->send_frame(encode(mine_), deadline()); !e.empty()) return failed("hello: " + e);
    if (std::string e = link->recv_frame(msg, 4096, deadline()); !e.empty()) return failed("hello: " + e);
    if (!msg.empty()) return refused("the prefill engine has another cache: " + msg);
    if (std::string e = link->send_frame(encode(ReadRequest{ref.request_id, ref.block_ids}), deadline()); !e.empty())
      return failed("read request: " + e);
    if (std::string e = link->recv_frame(msg, 4096, deadline()); !e.empty()) return failed("read request: " + e);
    if (!msg.empty()) return refused(msg);
    blobs.assign(ref.block_ids.size(), std::string());
    for (size_t i = 0; i < blobs.size(); ++i) {
      blobs[i].resize(mine_.page_bytes);
      if (std::string e = link->recv(blobs[i].data(), blobs[i].size(), deadline()); !e.empty())
        return failed("page " + std::to_string(i) + " of " + std::to_string(blobs.size()) + ": " + e);
    }
    const char ack = 'K';
    if (std::string e = link->send(&ack, 1, deadline()); !e.empty()) return failed("acknowledgement: " + e);
  } catch (const Error& e) {
    return refused(e.what());  // an address that cannot be resolved: the request's remote_host
  }
  pages_ += int64_t(blobs.size());
  bytes_ += int64_t(blobs.size() * mine_.page_bytes);
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
