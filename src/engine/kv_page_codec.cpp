// KV page blobs (see kv_page_codec.h). Layout: magic "M3KVPG01", layout id, block size, hash, parent,
// payload bytes, payload checksum (u64 each, little-endian as in memory), the block's token ids
// (int32 x block size), then the payload: the pool's page runs in KVPool::for_each_page_run order,
// then the draft pool's.
#include "engine/kv_page_codec.h"

#include "engine/hash64.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace m3 {

namespace {
constexpr char kMagic[8] = {'M', '3', 'K', 'V', 'P', 'G', '0', '1'};
constexpr size_t kFixed = 8 + 6 * 8;

uint64_t get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace

uint64_t checksum64(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = mix64(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix64(h ^ tail ^ 0xa5a5a5a5ull);
}

uint64_t model_layout_id(const std::string& dir, const std::string& extra) {
  namespace fs = std::filesystem;
  uint64_t h = checksum64(extra.data(), extra.size());
  auto add_file = [&](const fs::path& p, size_t limit) {
    std::ifstream f(p, std::ios::binary);
    std::string buf(limit, '\0');
    f.read(buf.data(), std::streamsize(limit));
    buf.resize(size_t(f.gcount()));
    const std::string name = p.filename().string();
    h = mix64(h ^ checksum64(name.data(), name.size()));
    std::error_code ec;
    h = mix64(h ^ uint64_t(fs::file_size(p, ec)));
    h = mix64(h ^ checksum64(buf.data(), buf.size()));
  };
  add_file(fs::path(dir) / "config.json", size_t(1) << 20);
  std::vector<fs::path> shards;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  for (const auto& p : shards) add_file(p, size_t(1) << 20);
  return h;
}

KvPageCodec::KvPageCodec(KVPool& target, KVPool* draft, uint64_t layout_id)
    : target_(target), draft_(draft), layout_id_(layout_id), block_size_(target.block_size()) {
  target_.for_each_page_run(0, [&](const uint8_t*, size_t n) { payload_ += n; });
  if (draft_) draft_->for_each_page_run(0, [&](const uint8_t*, size_t n) { payload_ += n; });
}

size_t KvPageCodec::header_bytes() const { return kFixed + size_t(block_size_) * sizeof(int32_t); }

void KvPageCodec::export_page(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens, std::string& out) {
  out.resize(blob_bytes());
  export_page_to(page, hash, parent, tokens, out.data());
}

void KvPageCodec::export_page_to(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens, char* out) {
  std::memcpy(out, kMagic, 8);
  const uint64_t head[6] = {layout_id_, uint64_t(block_size_), hash, parent, payload_, 0};  // checksum below
  std::memcpy(out + 8, head, sizeof head);
  const size_t tok = size_t(block_size_) * sizeof(int32_t);
  std::memcpy(out + 8 + sizeof head, tokens, tok);
  const size_t start = 8 + sizeof head + tok;
  size_t at = start;
  auto append = [&](const uint8_t* p, size_t n) {
    std::memcpy(out + at, p, n);
    at += n;
  };
  target_.for_each_page_run(page, append);
  if (draft_) draft_->for_each_page_run(page, append);
  const uint64_t sum = checksum64(out + start, at - start);
  std::memcpy(out + 8 + 5 * 8, &sum, 8);
}

bool KvPageCodec::peek(std::string_view blob, uint64_t* hash, uint64_t* parent) const {
  if (blob.size() != blob_bytes() || std::memcmp(blob.data(), kMagic, 8) != 0) return false;
  const char* p = blob.data() + 8;
  if (get64(p) != layout_id_ || get64(p + 8) != uint64_t(block_size_) || get64(p + 32) != payload_) return false;
  *hash = get64(p + 16);
  *parent = get64(p + 24);
  return true;
}

std::string KvPageCodec::check_header(std::string_view blob, uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  if (blob.size() != blob_bytes())
    return "size " + std::to_string(blob.size()) + " bytes, expected " + std::to_string(blob_bytes());
  if (std::memcmp(blob.data(), kMagic, 8) != 0) return "not a KV page";
  const char* p = blob.data() + 8;
  if (get64(p) != layout_id_) return "made by another model or cache layout";
  if (get64(p + 8) != uint64_t(block_size_) || get64(p + 32) != payload_) return "another page size";
  if (get64(p + 16) != hash || get64(p + 24) != parent) return "another place in the prefix chain";
  if (std::memcmp(blob.data() + kFixed, tokens, size_t(block_size_) * sizeof(int32_t)) != 0) return "other tokens";
  return {};
}

std::string KvPageCodec::verify(std::string_view blob, uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  if (std::string why = check_header(blob, hash, parent, tokens); !why.empty()) return why;
  if (checksum64(blob.data() + header_bytes(), payload_) != get64(blob.data() + 8 + 40)) return "checksum mismatch (corrupted)";
  return {};
}

std::string KvPageCodec::import_page(std::string_view blob, int32_t page, uint64_t hash, uint64_t parent,
                                     const int32_t* tokens, bool checksum_known_good) {
  if (std::string why = check_header(blob, hash, parent, tokens); !why.empty()) return why;
  const char* p = blob.data() + 8;
  const char* payload = blob.data() + header_bytes();
  if (!checksum_known_good && checksum64(payload, payload_) != get64(p + 40)) return "checksum mismatch (corrupted)";
  size_t off = 0;
  auto scatter = [&](uint8_t* dst, size_t n) {
    std::memcpy(dst, payload + off, n);
    off += n;
  };
  target_.for_each_page_run(page, scatter);
  if (draft_) draft_->for_each_page_run(page, scatter);
  return {};
}

}  // namespace m3
