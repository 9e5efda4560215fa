// One KV page as bytes, for the tiers beyond the pool (and transfers between engines): every lane of
// the page (K, V per layer and head, index keys; the DSpark draft's K/V when it runs) behind a header
// that says what the bytes mean: the layout identity (model, KV dtypes, page size, draft), the page's
// place in the prefix hash chain (hash, parent, token ids) and a checksum of the payload. A page is
// only ever imported into the pool when all of these match what the pool expects at that place:
// wrong or corrupted KV is refused, never used.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/kv_pool.h"

namespace m3 {

// 64-bit checksum of bytes (splitmix64 over 8-byte words); not cryptographic, catches corruption.
uint64_t checksum64(const void* data, size_t n);

// Identity of a checkpoint's weights for KV that outlives the process or leaves it: config.json and,
// for every *.safetensors file, its name, size and first MiB (the header with every tensor's name,
// shape and offset, and the first weights), plus `extra` (KV dtypes, page size, draft).
uint64_t model_layout_id(const std::string& model_dir, const std::string& extra);

class KvPageCodec {
 public:
  // `layout_id` identifies the model and cache layout; pages made under another id are refused.
  KvPageCodec(KVPool& target, KVPool* draft, uint64_t layout_id);

  size_t blob_bytes() const { return header_bytes() + payload_; }
  uint64_t layout_id() const { return layout_id_; }

  // The page's bytes with their header.
  void export_page(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens, std::string& out);
  // The same into `out`, which holds blob_bytes() (the transfer exports into memory the peer reads).
  void export_page_to(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens, char* out);
  // Checks the blob against (layout, hash, parent, tokens) and its checksum, then copies it into
  // `page`. Returns an empty string on success, else what did not match (the page is left unchanged).
  // `checksum_known_good`: the payload's checksum was already verified (verify() on another thread),
  // so only the header is checked here.
  std::string import_page(std::string_view blob, int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens,
                          bool checksum_known_good = false);
  // import_page's checks without the copy: "" or what did not match. Reads only the blob and the codec's
  // fixed fields, so any thread may call it (P/D: pulled pages are verified off the engine thread).
  std::string verify(std::string_view blob, uint64_t hash, uint64_t parent, const int32_t* tokens) const;
  // The header's hash and parent, if the blob has a valid header of this layout (for rebuilding an
  // index of stored pages); false otherwise.
  bool peek(std::string_view blob, uint64_t* hash, uint64_t* parent) const;

 private:
  size_t header_bytes() const;
  std::string check_header(std::string_view blob, uint64_t hash, uint64_t parent, const int32_t* tokens) const;
  KVPool& target_;
  KVPool* draft_;
  uint64_t layout_id_;
  int block_size_;
  size_t payload_ = 0;
};

}  // namespace m3
