// Streaming detokenizer: turns ids into text one at a time for token streaming. Bytes of a UTF-8
// sequence that is still incomplete are held back, so no chunk ends in a broken sequence; the
// chunks concatenate to Tokenizer::decode of all ids.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace m3 {

class IncrementalDetokenizer {
 public:
  // `tok` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special);

  // Adds one id; returns the text completed by it (possibly empty). Unknown ids throw m3::Error.
  std::string push(int32_t id);
  // Emits whatever is held back (an unfinished sequence becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete trailing UTF-8 sequence
};

}  // namespace m3
