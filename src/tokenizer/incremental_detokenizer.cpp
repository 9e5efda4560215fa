// Streaming detokenizer (see incremental_detokenizer.h).
#include "tokenizer/incremental_detokenizer.h"

#include "tokenizer/utf8.h"

namespace m3 {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  const std::string& b = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += b;
  std::string out;
  const size_t used = tok::append_utf8_lossy(out, pending_, /*hold_incomplete_tail=*/true);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  tok::append_utf8_lossy(out, pending_, false);
  pending_.clear();
  return out;
}

}  // namespace m3
