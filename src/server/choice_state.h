// ChoiceState: one choice of a response as its engine outputs arrive: detokenises them (special
// tokens kept when the reasoning or tool-call parser reads them), applies the client's stop strings,
// runs the parsers and keeps what the final message needs; each output yields the ChoiceDelta a
// stream chunk carries.
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
#include "chat/tool_parser.h"
#include "engine/engine.h"
#include "engine/output_processor.h"
#include "tokenizer/tokenizer.h"

namespace m3::server {

using ojson = nlohmann::ordered_json;

// How one choice's output text is produced and parsed.
struct ChoiceOptions {
  bool skip_special = true;  // without parsers: what the client asked for
  std::optional<chat::ReasoningFormat> reasoning;
  bool reasoning_start = false;  // the prompt ends inside an open think tag
  std::optional<chat::ToolFormat> tool;
  nlohmann::json tools;  // request tools (for typing arguments)
  bool parallel_tool_calls = true;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  int32_t eos_id = -1;
  bool include_stop_str = false;
  // tool_choice "required" / a named function: the tool-call markup forced into the prompt after
  // the generation prompt, fed to the tool parser before the generated text so it sees whole calls.
  std::string forced_tool_text;
  // Non-empty: calls naming other functions are dropped (tool_choice "required" validates names).
  std::vector<std::string> allowed_tool_names;
};

// What one engine output adds to a choice.
struct ChoiceDelta {
  std::string content, reasoning;
  std::vector<chat::ToolCallDelta> tool_calls;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty(); }
};

// The state of one choice: its text (OutputProcessor), parsers, and the accumulated result.
class ChoiceState {
 public:
  ChoiceState(const Tokenizer* tok, ChoiceOptions opt);
  ChoiceDelta on_output(const RequestOutput& out);
  // Text-level entry (also for tests): `raw` is detokenised text with special tokens kept.
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
  const Tokenizer* tok_;
  ChoiceOptions opt_;
  OutputProcessor text_;  // detokenisation and the client's stop strings
  std::unique_ptr<chat::ReasoningParser> rp_;
  std::unique_ptr<chat::ToolParser> tp_;
  std::vector<chat::ToolCallDelta> forced_deltas_;  // from forced_tool_text, sent with the first output
  std::map<int, int> call_index_;                   // parser index -> output index (-1: dropped name)
  std::vector<chat::ToolCallDelta> filter_calls(std::vector<chat::ToolCallDelta> in);
  bool name_allowed(const std::string& name) const;
  // Runs text released by text_ through the parsers into the choice.
  ChoiceDelta parse(std::string feed, bool finished, FinishReason reason, std::optional<int32_t> stop_token);
};

}  // namespace m3::server
