// SpecialTextFilter (see special_text_filter.h).
#include "chat/special_text_filter.h"

#include <algorithm>
#include <utility>

#include "chat/text_scan.h"

namespace m3::chat {

void SpecialTextFilter::add(const std::string& special) {
  if (special.empty() || std::find(specials_.begin(), specials_.end(), special) != specials_.end()) return;
  specials_.push_back(special);
}

std::string SpecialTextFilter::feed(std::string_view piece) {
  held_.append(piece);
  if (specials_.empty()) return std::exchange(held_, {});
  std::string out;
  out.reserve(held_.size());
  size_t i = 0;
  while (i < held_.size()) {
    size_t matched = 0;
    for (const auto& s : specials_)
      if (held_.compare(i, s.size(), s) == 0) {
        matched = s.size();
        break;
      }
    if (matched) {
      i += matched;
      continue;
    }
    out.push_back(held_[i]);
    ++i;
  }
  // A tail that may still become a special token's text waits for the next piece.
  const size_t keep = partial_suffix(out, specials_);
  held_ = out.substr(out.size() - keep);
  out.resize(out.size() - keep);
  return out;
}

std::string SpecialTextFilter::finish() { return std::exchange(held_, {}); }

}  // namespace m3::chat
