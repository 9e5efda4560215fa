// OutputProcessor: one request's generated text as its tokens arrive: incremental detokenisation and
// stop strings, in one place for every consumer. The engine ends a request on a stop string with it;
// the server's choices (server/choice_state) stream their text through it, with the client's options;
// `generate --prompt` prints through it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace m3 {

struct OutputOptions {
  bool skip_special = true;
  std::vector<std::string> stop;
  bool include_stop_str = false;  // the matched stop string stays in the text
  // Streams to clients hold back what could still become a stop string, so no part of one is sent;
  // the engine releases text at once (its deltas are what `generate --input` writes).
  bool hold_back = false;
};

class OutputProcessor {
 public:
  // `tok` may be null for text-only use (push_text); it must outlive the processor.
  OutputProcessor(const Tokenizer* tok, OutputOptions opt);

  // Token t's text through the stop strings; returns the text released by it.
  std::string push_token(int32_t t);
  // Already detokenised text; `final`: nothing more comes, so nothing is held back.
  std::string push_text(std::string_view text, bool final);
  // The detokenizer's held-back bytes at the end (an unfinished character becomes U+FFFD), released.
  // `match_stop`: looked for stop strings in too (the server's choices); the engine has decided the
  // finish reason already and releases them as they are.
  std::string finish(bool match_stop);

  bool stopped() const { return stop_ != nullptr; }
  const std::string* stop_string() const { return stop_; }  // the stop string that ended the text

 private:
  OutputOptions opt_;
  std::unique_ptr<IncrementalDetokenizer> detok_;
  size_t max_stop_ = 0;
  // The text not yet released, after as much released text as a stop string may start in.
  std::string buf_;
  size_t released_ = 0;  // bytes of buf_ already released
  const std::string* stop_ = nullptr;
};

}  // namespace m3
