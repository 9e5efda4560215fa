// POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API, as vLLM serves it):
// the request becomes a chat-completions body (system, text / tool_use / tool_result blocks, tools
// with input_schema, tool_choice auto/any/tool/none, thinking -> the template's thinking_mode) served
// by the chat path; the chat output becomes content blocks (thinking, text, tool_use) and, when
// streamed, Anthropic's named events. Errors take Anthropic's shape.
#pragma once
#include <memory>
#include <string>

#include "server/api_translate.h"

namespace m3::server {

// Throws ApiError naming the Messages field. count_only: /v1/messages/count_tokens (no max_tokens).
// image_names: the image blocks in order ("messages[0].content[1]"), for parse_chat_request's errors.
ojson messages_to_chat(const ojson& body, bool count_only = false, std::vector<std::string>* image_names = nullptr);

// Chat field -> Messages field, for errors raised by the chat path.
const FieldNames& messages_field_names();

std::unique_ptr<ApiOutput> make_messages_output(std::string model, IdMaker ids);

// {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}
ojson anthropic_error_body(int status, const std::string& message);

}  // namespace m3::server
