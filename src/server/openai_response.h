// The OpenAI response layer: message, delta, usage and logprobs JSON, response ids, and the JSON
// dump used for every body (token bytes may be partial UTF-8).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/choice_state.h"

namespace m3::server {

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
