// The OpenAI / vLLM request and response layer: validates /v1/chat/completions and /v1/completions
// bodies into engine prompts and SamplingParams (400 errors name the field), renders chat messages
// through the chat template, turns engine outputs into message / delta JSON (ChoiceState runs the
// reasoning and tool-call parsers over text detokenised with special tokens kept), and builds
// responses, stream chunks and usage.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "chat/reasoning_parser.h"
#include "structured/request.h"
#include "chat/tool_parser.h"
#include "engine/engine.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace m3::server {

using ojson = nlohmann::ordered_json;

// Model-wide settings shared by every request.
struct ServerContext {
  std::vector<std::string> served_names;  // the first is reported in responses
  std::string model_path;
  const Tokenizer* tok = nullptr;
  int64_t max_model_len = 0;
  int64_t vocab = 0;  // model vocabulary (prompt ids must be below it)
  int32_t eos_id = -1;
  std::shared_ptr<const chat::ChatTemplate> chat_template;  // null: no template
  std::string bos_token, eos_token;
  std::optional<chat::ReasoningFormat> reasoning;
  std::optional<chat::ToolFormat> tool;
  bool enable_auto_tool_choice = false;
  // Sampling defaults from generation_config.json (vLLM's behaviour), else OpenAI's.
  float default_temperature = 1.0f, default_top_p = 1.0f;
  int default_top_k = 0;
  float default_min_p = 0.0f, default_repetition_penalty = 1.0f;
};

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

struct ParsedRequest {
  bool chat = true;
  std::string model;  // the name to report
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  SamplingParams params;
  int n = 1;
  bool stream = false, include_usage = false, continuous_usage = false, echo = false;
  bool logprobs = false;
  int top_logprobs = 0;
  ChoiceOptions choice;
  // response_format / structured_outputs / guided_*: the grammar (compiled into params.constraint
  // once the prompt is known).
  std::optional<structured::StructuredRequest> structured;
};

// The generation prefix forced for tool_choice "required" (name empty: the model writes the name)
// or a named function: `parser_text` is the tool-call opener as the model would write it (M3:
// NS<tool_call>\nNS<invoke name=" [+ NAME">]); `prompt_suffix` is what is appended to the rendered
// prompt: the opener, after a think-close tag when the prompt left a think block open.
struct ForcedToolPrefix {
  std::string prompt_suffix, parser_text;
};
ForcedToolPrefix forced_tool_prefix(chat::ToolFormat fmt, const std::string& name, bool close_think);

// Throws ApiError (400 with the field, 404 for an unknown model).
ParsedRequest parse_chat_request(const ojson& body, const ServerContext& ctx);
ParsedRequest parse_completion_request(const ojson& body, const ServerContext& ctx);
// Renders body.messages (+ tools, chat_template_kwargs, add_generation_prompt) through the template.
std::string render_messages(const ojson& body, const ServerContext& ctx, bool default_add_generation_prompt);
// 404 unless body.model is absent or one of the served names; returns the name to report.
std::string check_model(const ojson& body, const ServerContext& ctx);

// What one engine output adds to a choice.
struct ChoiceDelta {
  std::string content, reasoning;
  std::vector<chat::ToolCallDelta> tool_calls;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  bool finished = false;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty(); }
};

// The state of one choice: detokenizer, stop strings, parsers, and the accumulated result.
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
  std::unique_ptr<IncrementalDetokenizer> detok_;
  std::unique_ptr<chat::ReasoningParser> rp_;
  std::unique_ptr<chat::ToolParser> tp_;
  std::string pending_;
  std::vector<chat::ToolCallDelta> forced_deltas_;  // from forced_tool_text, sent with the first output
  std::map<int, int> call_index_;                   // parser index -> output index (-1: dropped name)
  std::vector<chat::ToolCallDelta> filter_calls(std::vector<chat::ToolCallDelta> in);
  bool name_allowed(const std::string& name) const;
  bool stopped_ = false;
  size_t max_stop_ = 0;
};

// JSON pieces.
ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
ojson chat_message_json(const ChoiceState& c);
ojson chat_delta_json(const ChoiceDelta& d);
ojson chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps);
ojson completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, size_t text_offset);
std::string make_id(const char* prefix);
// Dumps compact JSON, replacing invalid UTF-8 (token bytes may be partial sequences).
std::string dump(const ojson& j);

}  // namespace m3::server
