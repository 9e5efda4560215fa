// POST /v1/responses (the OpenAI Responses API, as vLLM serves it without a response store): the
// request becomes a chat-completions body (input items -> messages, function_call /
// function_call_output items -> tool_calls / tool messages, reasoning.effort -> the template's kwargs)
// served by the chat path; the chat output becomes output items (reasoning, message, function_call)
// and, when streamed, the Responses events with sequence numbers.
#pragma once
#include <memory>
#include <string>

#include "server/api_translate.h"

namespace m3::server {

struct ResponsesRequest {
  ojson chat;  // the chat-completions body
  ojson echo;  // request fields the response object repeats (instructions, tools, ...)
  std::vector<std::string> image_names;  // input_image parts in order ("input[0].content[1]"), for errors
};

// Throws ApiError naming the Responses field.
ResponsesRequest responses_to_chat(const ojson& body);

// Chat field -> Responses field, for errors raised by the chat path.
const FieldNames& responses_field_names();

// count_tokens: the length of a text in tokens (reasoning_tokens in usage).
std::unique_ptr<ApiOutput> make_responses_output(ojson echo, std::string model, int64_t created, IdMaker ids,
                                                 std::function<int64_t(const std::string&)> count_tokens);

}  // namespace m3::server
