// Limits on what one request may ask for, checked on the parsed request before anything is submitted:
// the fan-out (prompts, n), the tokens it may generate, stop strings and the logprob volume. Each keeps
// one request from taking gigabytes (1M stop strings copied into 24 choices; n=32 x 3800 tokens x 21
// logprobs rendered as JSON) or the engine for minutes. Every violation is a 400 naming the field.
#pragma once
#include <cstddef>
#include <cstdint>

#include "server/openai_protocol.h"

namespace m3::server {

struct RequestLimits {
  int max_prompts = 64;             // prompts in one /v1/completions request ("prompt")
  int max_choices = 128;            // prompts x n ("n")
  int64_t max_tokens = 1 << 20;     // prompts x n x max_tokens ("max_tokens")
  int max_stop = 64;                // stop strings; also stop_token_ids ("stop", "stop_token_ids")
  size_t max_stop_bytes = 1024;     // bytes of one stop string ("stop")
  int64_t max_logprobs = 1 << 18;   // prompts x n x max_tokens x (1 + top_logprobs) ("logprobs"/"top_logprobs")
};

// Throws ApiError(400) naming the first limit the request passes.
void check_request_limits(const ParsedRequest& r, const RequestLimits& lim);

}  // namespace m3::server
