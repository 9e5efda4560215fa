// Detokenisation and stop strings for one request (see output_processor.h).
#include "engine/output_processor.h"

#include <algorithm>

namespace m3 {

OutputProcessor::OutputProcessor(const Tokenizer* tok, OutputOptions opt) : opt_(std::move(opt)) {
  if (tok) detok_ = std::make_unique<IncrementalDetokenizer>(*tok, opt_.skip_special);
  for (auto& s : opt_.stop) max_stop_ = std::max(max_stop_, s.size());
}

std::string OutputProcessor::push_token(int32_t t) { return push_text(detok_->push(t), false); }

std::string OutputProcessor::finish() { return push_text(detok_ ? detok_->flush() : std::string(), true); }

std::string OutputProcessor::push_text(std::string_view text, bool final) {
  if (stopped()) return {};
  const size_t old = buf_.size();
  buf_.append(text);
  // The earliest stop string that ends in the new text (earlier ones would have ended it before).
  size_t best = std::string::npos;
  for (const auto& st : opt_.stop) {
    const size_t at = buf_.find(st, old >= st.size() ? old - st.size() + 1 : 0);
    if (at != std::string::npos && at < best) {
      best = at;
      stop_ = &st;
    }
  }
  size_t end = buf_.size();
  if (stop_) {
    end = std::max(released_, best + (opt_.include_stop_str ? stop_->size() : 0));
  } else if (opt_.hold_back && !final && max_stop_ > 1) {
    // Hold back what could still become a stop string, on a UTF-8 boundary.
    end = buf_.size() - released_ > max_stop_ - 1 ? buf_.size() - (max_stop_ - 1) : released_;
    while (end > released_ && (uint8_t(buf_[end]) & 0xC0) == 0x80) --end;
  }
  std::string out = buf_.substr(released_, end - released_);
  released_ = end;
  // Keep only what a stop string ending in later text may start in.
  const size_t keep = max_stop_ > 0 ? max_stop_ - 1 : 0;
  if (released_ > keep) {
    buf_.erase(0, released_ - keep);
    released_ = keep;
  }
  return out;
}

}  // namespace m3
