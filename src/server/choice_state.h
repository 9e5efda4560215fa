// ChoiceState: one choice of a response as its engine outputs arrive: runs the engine's text deltas
// (made by the engine's OutputProcessor as choice_text_options asks: special tokens kept when the
// reasoning or tool-call parser reads them, cut at the client's stop strings) through the parsers and
// keeps what the final message needs; each output yields the ChoiceDelta a stream chunk carries.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/reasoning_parser.h"
#include "chat/special_text_filter.h"
#include "chat/tool_parser.h"
#include "engine/engine.h"
#include "engine/output_processor.h"
#include "tokenizer/tokenizer.h"

namespace m3::server {

using ojson = nlohmann::ordered_json;

// How one choice's output text is produced and parsed.
struct ChoiceOptions {
  // The client's skip_special_tokens. Without parsers the engine leaves special tokens out of the
  // text; with them it keeps them for the parsers and ChoiceState takes out what they leave behind.
  bool skip_special = true;
  std::optional<chat::ReasoningFormat> reasoning;
  bool reasoning_start = false;  // the prompt ends inside an open think tag
  // "separate_reasoning": false on a server with a reasoning parser: no reasoning parser runs and
  // content keeps the reasoning with this format's think tags (the opening one put back first when
  // reasoning_start), so a client that sends the message back gives the template its reasoning.
  std::optional<chat::ReasoningFormat> keep_think_tags;
  std::optional<chat::ToolFormat> tool;
  nlohmann::json tools;  // request tools (for typing arguments)
  bool parallel_tool_calls = true;
  std::vector<std::string> stop;  // the request's (SamplingParams::stop); on_text applies them
  bool include_stop_str = false;
  // tool_choice "required" / a named function: the tool-call markup forced into the prompt after
  // the generation prompt, fed to the tool parser before the generated text so it sees whole calls.
  std::string forced_tool_text;
  // Non-empty: calls naming other functions are dropped (tool_choice "required" validates names).
  std::vector<std::string> allowed_tool_names;
};

// How the engine makes a choice's text (EngineRequest::text). The parsers read special tokens (think
// and tool-call tags), so they are kept for them, and the client's stop strings are matched on that
// same text, as vLLM matches them on the text it detokenises for the request. Text that could still
// become a stop string is held back, and the ending token's text is not part of the message.
TextOptions choice_text_options(const ChoiceOptions& o);

// What one engine output adds to a choice.
struct ChoiceDelta {
  std::string content, reasoning;
  std::vector<chat::ToolCallDelta> tool_calls;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty(); }
};

// The state of one choice: its parsers and the accumulated result.
class ChoiceState {
 public:
  // `tok` tells which output tokens are special (for skip_special); null: none are taken out.
  ChoiceState(const Tokenizer* tok, ChoiceOptions opt);
  // An engine output of a request made with choice_text_options(opt).
  ChoiceDelta on_output(const RequestOutput& out);
  // Text-level entry (tests): `raw` is text with special tokens kept, cut at the stop strings as the
  // engine would cut it.
  ChoiceDelta on_text(std::string_view raw, bool finished, FinishReason reason,
                      std::optional<int32_t> stop_token = std::nullopt);

  std::string content, reasoning;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  bool finished = false;
  std::string finish_reason;  // stop | length | tool_calls | abort
  ojson stop_reason = nullptr;
  std::vector<chat::ToolCall> tool_calls() const;
  bool has_reasoning_parser() const { return bool(rp_); }
  bool has_tool_parser() const { return bool(tp_); }

 private:
  ChoiceOptions opt_;
  const Tokenizer* tok_;
  bool filter_specials_;  // the client skips special tokens the engine kept for the parsers
  OutputProcessor raw_text_;  // on_text's stop strings (text only: no detokenisation)
  std::unique_ptr<chat::ReasoningParser> rp_;
  std::unique_ptr<chat::ToolParser> tp_;
  std::vector<chat::ToolCallDelta> forced_deltas_;  // from forced_tool_text, sent with the first output
  std::map<int, int> call_index_;                   // parser index -> output index (-1: dropped name)
  // skip_special after the parsers: the special tokens' text left in content and in reasoning.
  chat::SpecialTextFilter content_specials_, reasoning_specials_;
  std::vector<std::string> kept_specials_;  // keep_think_tags: the tags that stay
  std::string content_prefix_;              // keep_think_tags: the opening tag, sent before the first content
  std::vector<chat::ToolCallDelta> filter_calls(std::vector<chat::ToolCallDelta> in);
  bool name_allowed(const std::string& name) const;
  // Runs released text through the parsers into the choice.
  ChoiceDelta parse(std::string feed, bool finished, FinishReason reason, std::optional<int32_t> stop_token);
};

}  // namespace m3::server
