// Byte-pair encoding by merge rank (Hugging Face BPE semantics): start from one symbol per byte,
// then repeatedly merge the adjacent pair with the lowest rank (leftmost first on ties) until no
// ranked pair is left. Works directly on token ids; the byte-level mapping is folded into the ids
// of the 256 single-byte tokens.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace m3::tok {

class Bpe {
 public:
  Bpe() { byte_ids_.fill(-1); }

  // Id of the token for single byte `b` (-1: none; such bytes are dropped, as HF does without unk).
  void set_byte_id(uint8_t b, int32_t id) { byte_ids_[b] = id; }
  // Pair (left, right) merges into `merged` with priority `rank` (lower merges first). A repeated
  // pair keeps its first (lowest) rank.
  void add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank);
  void reserve(size_t merges) { merges_.reserve(merges); }
  size_t merge_count() const { return merges_.size(); }

  // Appends the ids for one pre-tokenized piece (raw bytes) to `out`.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find(int32_t a, int32_t b) const {
    auto it = merges_.find(key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::array<int32_t, 256> byte_ids_;
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace m3::tok
