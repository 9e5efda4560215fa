// The OpenAI / vLLM request layer: validates /v1/chat/completions and /v1/completions bodies into
// engine prompts and SamplingParams (400 errors name the field) and renders chat messages through
// the chat template.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "server/choice_state.h"
#include "structured/request.h"

namespace m3::server {

// Model-wide settings shared by every request.
struct ServerContext {
  std::vector<std::string> served_names;  // the first is reported in responses
  std::string model_path;
  const Tokenizer* tok = nullptr;
  int64_t max_model_len = 0;
  int64_t vocab = 0;  // model vocabulary (prompt ids must be below it)
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

}  // namespace m3::server
