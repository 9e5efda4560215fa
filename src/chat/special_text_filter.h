// SpecialTextFilter: removes special tokens' text from a streamed reply after the reasoning and
// tool-call parsers have read it. The parsers need the special tokens (think and tool-call tags), so
// the engine keeps them in the text; what the parsers leave in content or reasoning is then taken out
// here when the request asks for skip_special_tokens (the default), as vLLM's detokeniser would.
// Only the strings of special tokens the model actually emitted are removed (add() is called with
// each one as its token arrives), so text the model wrote with ordinary tokens, such as a literal
// "<think>" in an answer about tags, stays.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace m3::chat {

class SpecialTextFilter {
 public:
  // A special token's text to remove from now on (repeats are ignored; empty strings too).
  void add(const std::string& special);
  bool active() const { return !specials_.empty(); }
  // One piece of streamed text; returns what can be released now. A suffix that could be the start of
  // a special token's text is held back until the next piece or finish().
  std::string feed(std::string_view piece);
  // End of the stream: releases what is held back.
  std::string finish();

 private:
  std::vector<std::string> specials_;
  std::string held_;
};

}  // namespace m3::chat
