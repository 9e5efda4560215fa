// The KV transfer protocol between a decode engine (client) and a prefill engine (server), carried over
// a UCX stream (ucx_link.h). Messages are frames (u32 little-endian length + bytes); pages follow a read
// reply as raw blobs of the agreed size.
//   client -> server  Hello        what the client's cache is (model layout, dtypes, page size)
//   server -> client  HelloReply   "" (the same) or what differs: the client then closes
//   client -> server  ReadRequest  the lease's request id, the block ids it names, and how to move them
//   server -> client  ReadReply    "" or why the read is refused (unknown, stale, foreign); then
//     mode rma (the default): an RmaOffer (where the exported blobs lie in the server's registered
//       memory, and its packed key), then u32 counts of the pages ready so far as the server exports
//       them (the last one is n); the client reads each ready range with an RMA get as it is announced
//     mode stream (the first protocol's, kept as the measured baseline and a fallback for a UCX whose
//       RMA fails: M3_KV_TRANSFER_MODE=stream on the decode engine): the n blobs on the stream
//   client -> server  'K'          every page arrived: the lease is read (until then it may retry)
// Both engines must hold the same model, cache layout, dtypes and page size: a page's bytes are
// copied verbatim into the decode engine's pool (and verified there again by kv_page_codec).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace m3::transfer {

inline constexpr int kProtocolVersion = 2;

struct Hello {
  int version = kProtocolVersion;
  uint64_t layout_id = 0;     // model_layout_id: config.json, weights' headers, KV dtypes, block size, draft
  int block_size = 0;
  std::string dtypes;         // Engine::kv_dtypes(), e.g. "kv bf16 ik bf16"
  uint64_t page_bytes = 0;    // one page blob
  std::string engine_id;
};
std::string encode(const Hello& h);
// nullopt when the bytes are not a hello of this protocol.
std::optional<Hello> decode_hello(const std::string& bytes);
// "" when a page of `theirs` can be copied into `mine`; else what differs, naming both values.
std::string check_hello(const Hello& mine, const Hello& theirs);

enum class ReadMode { Rma, Stream };
struct ReadRequest {
  std::string request_id;
  std::vector<int32_t> block_ids;
  ReadMode mode = ReadMode::Rma;
};
std::string encode(const ReadRequest& r);
std::optional<ReadRequest> decode_read(const std::string& bytes);

// Where the blobs of a read lie on the server: `bytes` from `addr`, readable with `key`.
struct RmaOffer {
  uint64_t addr = 0, bytes = 0;
  std::string key;  // MemRegion::packed_key, binary
};
std::string encode(const RmaOffer& o);
std::optional<RmaOffer> decode_rma_offer(const std::string& bytes);

}  // namespace m3::transfer
