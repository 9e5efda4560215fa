// Per-request limits (see request_limits.h). Products are computed in 128 bits of headroom (each factor
// is already range-checked by the parser, but n x max_tokens x logprobs could still pass 2^63).
#include "server/request_limits.h"

#include <string>

#include "server/errors.h"

namespace m3::server {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

void check_request_limits(const ParsedRequest& r, const RequestLimits& lim) {
  const std::string prompt_field = r.chat ? "messages" : "prompt";
  const int64_t prompts = int64_t(r.prompts.size());
  if (prompts > lim.max_prompts)
    throw bad_request("the request has " + num(prompts) + " prompts; this server takes at most " +
                          num(lim.max_prompts) + " per request (--max-prompts-per-request)",
                      prompt_field);
  const int64_t choices = prompts * int64_t(r.n);
  if (choices > lim.max_choices)
    throw bad_request("the request asks for " + num(choices) + " completions (" + num(prompts) + " prompt(s) x n=" +
                          num(r.n) + "); this server makes at most " + num(lim.max_choices) +
                          " per request (--max-choices-per-request)",
                      "n");
  const __int128 tokens = __int128(choices) * r.params.max_tokens;
  if (tokens > lim.max_tokens)
    throw bad_request("the request may generate " + num(int64_t(tokens)) + " tokens (" + num(choices) +
                          " completion(s) x max_tokens " + num(r.params.max_tokens) + "); this server allows at most " +
                          num(lim.max_tokens) +
                          " per request (--max-tokens-per-request): lower max_tokens or n",
                      "max_tokens");
  if (int64_t(r.params.stop.size()) > lim.max_stop)
    throw bad_request("'stop' has " + num(int64_t(r.params.stop.size())) + " strings; at most " + num(lim.max_stop) +
                          " are allowed (--max-stop-strings)",
                      "stop");
  for (const auto& s : r.params.stop)
    if (s.size() > lim.max_stop_bytes)
      throw bad_request("a 'stop' string has " + num(int64_t(s.size())) + " bytes; at most " +
                            num(int64_t(lim.max_stop_bytes)) + " are allowed (--max-stop-string-bytes)",
                        "stop");
  if (int64_t(r.params.stop_token_ids.size()) > lim.max_stop)
    throw bad_request("'stop_token_ids' has " + num(int64_t(r.params.stop_token_ids.size())) + " ids; at most " +
                          num(lim.max_stop) + " are allowed (--max-stop-strings)",
                      "stop_token_ids");
  if (r.logprobs) {
    const __int128 entries = tokens * (1 + r.top_logprobs);
    if (entries > lim.max_logprobs)
      throw bad_request("the request may return " + num(int64_t(entries)) + " logprob entries (" +
                            num(int64_t(tokens)) + " tokens x (1 + top_logprobs " + num(r.top_logprobs) +
                            ")); this server returns at most " + num(lim.max_logprobs) +
                            " per request (--max-logprobs-per-request): lower max_tokens, n or top_logprobs",
                        r.chat && r.top_logprobs > 0 ? "top_logprobs" : "logprobs");
  }
}

}  // namespace m3::server
