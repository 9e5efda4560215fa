// Reasoning parsers (minimax_m3, minimax_m2, minimax_m2_append_think): split model output into
// `reasoning` and `content`, non-streaming and as a streaming state machine over detokenised text
// that still contains the special tokens (docs/serving.md 4 and 6).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace m3::chat {

enum class ReasoningFormat { MiniMaxM3, MiniMaxM2, MiniMaxM2AppendThink };

// Parses "minimax_m3" / "minimax_m2" / "minimax_m2_append_think"; throws m3::Error otherwise.
ReasoningFormat reasoning_format_from_name(const std::string& name);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

struct ReasoningResult {
  std::optional<std::string> reasoning;  // nullopt when there was none
  std::optional<std::string> content;    // nullopt when empty (e.g. stopped while still reasoning)
};

class ReasoningParser {
 public:
  // The initial state comes from the generation prefix, never from scanning the whole prompt: the
  // M3 system prompt itself mentions <mm:think></mm:think> (vLLM #46042).
  ReasoningParser(ReasoningFormat fmt, bool start_in_reasoning);

  // True when the rendered prompt ends with the opening think tag (thinking enabled, or M2's
  // `<think>\n` prefill); trailing whitespace after the tag is allowed.
  static bool prompt_starts_reasoning(ReasoningFormat fmt, std::string_view prompt);
  // True when the rendered prompt ends with the closing think tag (thinking disabled: no reasoning follows).
  static bool prompt_ends_reasoning(ReasoningFormat fmt, std::string_view prompt);
  // The format's opening and closing think tags.
  static std::pair<std::string, std::string> tags(ReasoningFormat fmt);

  // Feeds one detokenised piece; returns what can be emitted now. Text that could be the start of a
  // tag is held back until the next call or finish().
  ReasoningDelta feed(std::string_view delta);
  // End of generation: flushes held-back text.
  ReasoningDelta finish();

  bool in_reasoning() const { return state_ == State::Reasoning; }

  static ReasoningResult parse(ReasoningFormat fmt, bool start_in_reasoning, std::string_view text);

 private:
  enum class State { ContentStart, Reasoning, ReasoningStart, ContentAfterReasoning, Content };
  ReasoningDelta process(bool final);

  ReasoningFormat fmt_;
  State state_;
  std::string buf_;
  std::string open_, close_;
  bool prefix_sent_ = false;  // append_think: "<think>" re-inserted once
};

}  // namespace m3::chat
