// Sequence helpers (see sequence.h).
#include "engine/sequence.h"

#include "engine/hash64.h"

namespace m3 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "";
}

std::vector<int32_t> Sequence::all_tokens() const {
  std::vector<int32_t> t = prompt;
  t.insert(t.end(), output.begin(), output.end());
  return t;
}

uint64_t Sequence::mm_salt(int64_t first, int64_t n) const { return m3::mm_salt(mm, first, n); }

std::vector<uint64_t> mm_page_salts(const std::vector<MultimodalSpan>& mm, int64_t n_tokens, int B) {
  std::vector<uint64_t> out;
  if (mm.empty()) return out;
  for (int64_t first = 0; first < n_tokens; first += B) out.push_back(mm_salt(mm, first, B));
  return out;
}

uint64_t mm_salt(const std::vector<MultimodalSpan>& mm, int64_t first, int64_t n) {
  uint64_t salt = 0;
  for (const auto& m : mm)
    if (m.offset < first + n && first < m.offset + m.count) salt = mix64(salt ^ m.hash ^ uint64_t(m.offset));
  return salt;
}

const float* Sequence::mm_embed(int64_t i, int64_t hidden) const {
  for (const auto& m : mm)
    if (i >= m.offset && i < m.offset + m.count) return m.embeds->data() + size_t(i - m.offset) * size_t(hidden);
  return nullptr;
}

}  // namespace m3
