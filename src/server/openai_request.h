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
#include "engine/kv_lease.h"
#include "engine/sequence.h"
#include "model/image_encoder.h"
#include "server/image_inputs.h"
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
  bool log_requests = false;  // --enable-log-requests: one line per request as it arrives
  // Sampling defaults from generation_config.json (vLLM's behaviour), else OpenAI's.
  float default_temperature = 1.0f, default_top_p = 1.0f;
  int default_top_k = 0;
  float default_min_p = 0.0f, default_repetition_penalty = 1.0f;
  // Prefill/decode disaggregation (--kv-transfer-config NixlConnector): which kv_transfer_params this
  // server honours (kv_role), what it answers a do_remote_decode request with (engine id, the transfer
  // listener's host and port), how it pulls pages for do_remote_prefill, and the load-failure policy.
  bool kv_producer = false, kv_consumer = false;
  std::string kv_engine_id, kv_host;
  int kv_port = 0;
  RemoteKvFetcher* kv_fetcher = nullptr;
  bool kv_fail_on_load_error = false;
  // Chat images: the model's encoder (null: no tower, or --language-model-only) and the media options.
  const ImageEncoder* images = nullptr;
  MediaOptions media;
};

struct ParsedRequest {
  bool chat = true;
  std::string model;  // the name to report
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  std::vector<MultimodalSpan> mm;         // chat: the images' embeddings in prompts[0]
  SamplingParams params;
  int n = 1;
  bool stream = false, include_usage = false, continuous_usage = false, echo = false;
  bool logprobs = false;
  int top_logprobs = 0;
  ChoiceOptions choice;
  // response_format / structured_outputs / guided_*: the grammar (compiled into params.constraint
  // once the prompt is known).
  std::optional<structured::StructuredRequest> structured;
  // kv_transfer_params: given at all (the response then carries kv_transfer_params), do_remote_decode
  // (hold the prompt's pages for a decode engine), do_remote_prefill (pull them from a prefill engine).
  bool kv_params = false, kv_hold = false;
  std::optional<RemoteKvRef> kv_remote;
};

// The generation prefix forced for tool_choice "required" (name empty: the model writes the name)
// or a named function: `parser_text` is the tool-call opener as the model would write it (M3:
// NS<tool_call>\nNS<invoke name=" [+ NAME">]); `prompt_suffix` is what is appended to the rendered
// prompt: the opener, after a think-close tag when the prompt left a think block open.
struct ForcedToolPrefix {
  std::string prompt_suffix, parser_text;
};
ForcedToolPrefix forced_tool_prefix(chat::ToolFormat fmt, const std::string& name, bool close_think);

// Throws ApiError (400 with the field, 404 for an unknown model). image_names: what the k-th image part
// is called in errors, for a body translated from another API (Responses' "input[0].content[1]",
// Messages' "messages[0].content[1]"); null: the chat body's own "messages[i].content[j]".
ParsedRequest parse_chat_request(const ojson& body, const ServerContext& ctx,
                                 const std::vector<std::string>* image_names = nullptr);
ParsedRequest parse_completion_request(const ojson& body, const ServerContext& ctx);
// Renders body.messages (+ tools, chat_template_kwargs, add_generation_prompt) through the template.
// With `images`, image_url parts are collected (in order; --limit-mm-per-prompt checked) and rendered as
// the template's image marker; without, they are refused by name.
std::string render_messages(const ojson& body, const ServerContext& ctx, bool default_add_generation_prompt,
                            std::vector<ImageInput>* images = nullptr,
                            const std::vector<std::string>* image_names = nullptr);
// Tokenizes a rendered chat prompt, expanding each image marker into the image's placeholder tokens;
// embed: run the tower and return the spans (else only the token count is computed, for /tokenize).
// Bad images are 400s naming the content part.
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<MultimodalSpan> mm;
};
ChatTokens tokenize_chat(const std::string& text, const std::vector<ImageInput>& images, const ServerContext& ctx,
                         bool embed);
// 404 unless body.model is absent or one of the served names; returns the name to report.
std::string check_model(const ojson& body, const ServerContext& ctx);

}  // namespace m3::server
