// The KV transfer protocol between a decode engine (client) and a prefill engine (server), carried over
// a UCX stream (ucx_link.h). Messages are frames (u32 little-endian length + bytes); pages follow a read
// reply as raw blobs of the agreed size.
//   client -> server  Hello        what the client's cache is (model layout, dtypes, page size)
//   server -> client  HelloReply   "" (the same) or what differs: the client then closes
//   client -> server  ReadRequest  the lease's request id and the block ids it names
//   server -> client  ReadReply    "" then n blobs, or why the read is refused (unknown, stale, foreign)
// Both engines must hold the same model, cache layout, dtypes and page size: a page's bytes are
// copied verbatim into the decode engine's pool (and verified there again by kv_page_codec).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace m3::transfer {

inline constexpr int kProtocolVersion = 1;

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

struct ReadRequest {
  std::string request_id;
  std::vector<int32_t> block_ids;
};
std::string encode(const ReadRequest& r);
std::optional<ReadRequest> decode_read(const std::string& bytes);

}  // namespace m3::transfer
