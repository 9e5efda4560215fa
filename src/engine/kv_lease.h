// Prefill/decode disaggregation, engine side: the pages of a prompt computed for another engine
// (kv_transfer_params do_remote_decode) are held under a lease until that engine has read them or
// the lease expires, and the pages a decode engine pulled (do_remote_prefill) are handed to the
// scheduler as a verified prefix. Transfers name pages by the prompt's transfer chain: the prefix-cache
// hash chain, with the last, partial page hashed over its tokens padded with -1, so that every page
// (full or not) has one identity that both engines compute from the same prompt alone.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

// One page of a prompt's transfer chain.
struct TransferPage {
  uint64_t hash = 0, parent = 0;
  std::vector<int32_t> tokens;  // block_size ids, -1 past the prompt's end
};
// The pages holding positions [0, n_tokens) of `tokens`, block_size each. page_salts (mm_page_salts: the
// images' hashes of each page, 0 for none) salt the hashes as the prefix cache does (Scheduler::page_hash),
// so a page of image tokens is named by its image too: pulled pages are published under the hash a
// local request with the same image looks up, and a decode request with another image never takes them.
std::vector<TransferPage> transfer_chain(const std::vector<int32_t>& tokens, int block_size,
                                         const std::vector<uint64_t>& page_salts = {});

// The pages a decode engine pulled from a prefill engine, one blob per page of the prompt (kv_page_codec
// format), back to back in one buffer (the transfer reads them into it in place), handed to
// Engine::add_request.
struct RemotePrefill {
  std::string data;       // pages() blobs of page_bytes each
  size_t page_bytes = 0;
  size_t pages() const { return page_bytes ? data.size() / page_bytes : 0; }
  std::string_view blob(size_t i) const { return std::string_view(data).substr(i * page_bytes, page_bytes); }
  std::string source;  // "host:port" for messages
  // Pages [0, checksummed) passed KvPageCodec::verify already (Engine::verify_remote, on the thread that
  // pulled them): the engine thread then checks only their headers before copying them in.
  size_t checksummed = 0;
};

// Where a decode engine pulls a prompt's pages from: kv_transfer_params of the prefill response.
struct RemoteKvRef {
  std::string engine_id, host;
  int port = 0;
  std::string request_id;          // remote_request_id: the lease's id
  std::vector<int32_t> block_ids;  // remote_block_ids
};

// Pulls a prompt's pages from a prefill engine (the transport lives in src/transfer). Ok: `out` holds
// one blob per block id, in order (data and page_bytes set). Refused: the prefill engine said no (an id that is unknown,
// expired, or not this lease's; another model or layout): the client's request is at fault. Failed:
// the transfer broke (engine gone, connection cut, timeout): kv_load_failure_policy decides.
enum class FetchStatus { Ok, Refused, Failed };
struct FetchResult {
  FetchStatus status = FetchStatus::Ok;
  std::string why;
};
class RemoteKvFetcher {
 public:
  virtual ~RemoteKvFetcher() = default;
  virtual FetchResult fetch(const RemoteKvRef& ref, RemotePrefill& out) = 0;
};

// What the prefill engine returns for a leased prompt (the server adds engine id, host, port).
struct KvLeaseInfo {
  std::string request_id;       // the lease's id: the decode engine names it to read the pages
  std::vector<int32_t> block_ids;
};

struct KvLeaseStats {
  int64_t active = 0, pages = 0;      // leases held now and their pages
  int64_t granted = 0, read = 0, expired = 0;
  int64_t refused = 0;                // read requests refused (unknown, stale, not leased)
  int64_t bytes_sent = 0;
};

// Leases of pages, shared by the engine thread (grant, release) and the transfer server (reads). The
// engine thread alone touches the block pool: a read only marks its lease done, and the engine thread
// takes the pages back (take_released) at its next pass.
class KvLeaseTable {
 public:
  using Clock = std::chrono::steady_clock;
  explicit KvLeaseTable(std::chrono::milliseconds duration) : duration_(duration) {}
  std::chrono::milliseconds duration() const { return duration_; }

  // Engine thread: a new lease on `pages` (already referenced for it). Returns its id, 128 random bits
  // in hex: it is the capability to read them, so it cannot be guessed.
  std::string grant(std::vector<int32_t> pages, std::vector<TransferPage> chain, Clock::time_point now);
  // Engine thread: the pages of leases read or expired by `now`, removed from the table (their
  // references are the engine's to drop). A lease being read is not expired under the reader.
  std::vector<int32_t> take_released(Clock::time_point now);
  // When the next lease expires (none: nullopt), for the engine loop's timer.
  std::optional<Clock::time_point> next_deadline() const;

  // Transfer thread: checks that `id` is a live lease and that `block_ids` are exactly its pages, in
  // order; then marks it being read and fills `chain` (what each page must be). Returns "" or why not.
  std::string begin_read(const std::string& id, const std::vector<int32_t>& block_ids,
                         std::vector<TransferPage>& chain, Clock::time_point now);
  // Transfer thread: the read ended. ok: the lease is done (pages released at the engine's next pass);
  // not ok: it stays until it expires (the reader may retry).
  void end_read(const std::string& id, bool ok, int64_t bytes);
  // Called after a lease became releasable from another thread (wakes the engine loop).
  void set_notify(std::function<void()> f);
  KvLeaseStats stats() const;

 private:
  struct Lease {
    std::vector<int32_t> pages;
    std::vector<TransferPage> chain;
    Clock::time_point expiry;
    bool reading = false, done = false;
  };
  std::chrono::milliseconds duration_;
  mutable std::mutex mu_;
  std::map<std::string, Lease> leases_;
  std::function<void()> notify_;
  KvLeaseStats st_;
};

}  // namespace m3
