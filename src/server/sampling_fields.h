// The one reader of request fields into SamplingParams, for the OpenAI endpoints and for
// `generate --input` lines. What a field means (its JSON type, range and where it goes) is decided
// here once; the two callers keep their own wording and leniency, which clients and scripts rely on:
// the API answers 400 with `param` ("'top_p' must be a number") and takes null as absent and 5.0 as
// an integer; an offline line says "input.jsonl line 3: \"top_p\": expected a number, got \"x\"".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace m3::server {

struct FieldStyle {
  bool api = true;
  std::string where;  // offline: what the message starts with, e.g. "input.jsonl line 3"
  // Throws: ApiError 400 (param `key`) with api_why, or m3::Error "WHERE: \"key\": offline_why".
  [[noreturn]] void refuse(const std::string& key, const std::string& api_why, const std::string& offline_why) const;
};

double read_number(const std::string& key, const nlohmann::ordered_json& v, const FieldStyle& s);
int64_t read_integer(const std::string& key, const nlohmann::ordered_json& v, const FieldStyle& s);
bool read_bool(const std::string& key, const nlohmann::ordered_json& v, const FieldStyle& s);
// An integer in [lo, 2^31) (offline lines: max_tokens, logprobs).
int32_t read_int32(const std::string& key, const nlohmann::ordered_json& v, int64_t lo, const FieldStyle& s);
// A token id (also a stop token id): an integer in [0, 2^31), checked before narrowing (2^32 + 104
// must not become 104). `api_shape` is the API's message for a value that is not an integer.
int32_t read_token_id(const std::string& key, const nlohmann::ordered_json& x, const std::string& api_shape,
                      const FieldStyle& s);

// The sampling fields both callers read the same way, in the order the API reads them.
const std::vector<std::string>& sampling_field_names();
// Reads `key` into p when it is one of sampling_field_names(); false for any other key.
bool read_sampling_field(const std::string& key, const nlohmann::ordered_json& v, SamplingParams& p,
                         const FieldStyle& s);
// The token ids of stop_token_ids and logit_bias against the model's vocabulary (an id past it would
// never match or never be biased, silently).
void check_token_ids_in_vocab(const SamplingParams& p, int64_t vocab, const FieldStyle& s);
// The API's range checks, in its wording (offline lines get SamplingParams::validate's).
void check_sampling_ranges(const SamplingParams& p);

}  // namespace m3::server
