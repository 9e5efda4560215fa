// OutputProcessor: one request's generated text as its tokens arrive: incremental detokenisation and
// stop strings, in one place (as vLLM v1's output processor). It runs only in the engine, which ends a
// request the moment a stop string is matched; every consumer (the server's choices, `generate`)
// reads the engine's text deltas, made as the request's TextOptions ask.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace m3 {

// How a request's text is made: given with each engine request beside its SamplingParams (whose
// stop strings it is matched against). The defaults are `generate --input`'s.
struct TextOptions {
  // Special tokens left out of the text. Stop strings are matched on the text as made (vLLM: on the
  // output detokenised with the request's skip_special_tokens), so with special tokens kept (the
  // server's reasoning / tool-call parsers need their markers) a stop string may match a marker.
  bool skip_special = true;
  bool include_stop_str = false;  // the matched stop string stays in the text
  // Streams to clients hold back what could still become a stop string, so no part of one is sent;
  // otherwise text is released at once.
  bool hold_back = false;
  // The text of the token that ended the request by its id (end-of-sequence or stop_token_ids) is
  // part of the output; the server leaves it out of the message.
  bool stop_token_text = true;
};

// The processor's whole configuration: the text options and the stop strings.
struct OutputOptions : TextOptions {
  std::vector<std::string> stop;
};

class OutputProcessor {
 public:
  // `tok` may be null for text-only use (push_text); it must outlive the processor.
  OutputProcessor(const Tokenizer* tok, OutputOptions opt);

  // Token t's text through the stop strings; returns the text released by it.
  std::string push_token(int32_t t);
  // Already detokenised text; `final`: nothing more comes, so nothing is held back.
  std::string push_text(std::string_view text, bool final);
  // At the end: the detokenizer's held-back bytes (an unfinished character becomes U+FFFD) through
  // the stop strings too, and whatever was held back, released.
  std::string finish();

  const OutputOptions& options() const { return opt_; }
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
