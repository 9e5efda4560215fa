// Sequence helpers (see sequence.h).
#include "engine/sequence.h"

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

}  // namespace m3
