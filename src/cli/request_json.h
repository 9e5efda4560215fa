// Offline request lines (`generate --input`): {"prompt": "..."} or {"prompt_token_ids": [...]}
// plus vLLM / OpenAI sampling and structured-output fields, parsed with field-level error messages.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace m3::cli {

struct OfflineRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
};

// `where` prefixes messages, e.g. "input.jsonl line 3". Throws m3::Error naming the field: a wrong
// type or range, an unknown field, or a known vLLM field this build does not implement (refused by
// name, see server/request_fields.h). The structured-output fields (response_format,
// structured_outputs, guided_*) are read as the server reads them (structured/request.h) and become
// params.constraint over the model's `vocab` ids; the prompt is raw text, so there is no reasoning
// gate (the constraint applies from the first generated token). Fields a line leaves out take `defaults`
// (generation_defaults: the checkpoint's generation_config.json, as the server's requests do).
OfflineRequest parse_offline_request(const nlohmann::ordered_json& j, const Tokenizer& tok, int64_t vocab,
                                     const std::string& where, const SamplingParams& defaults = SamplingParams{});

}  // namespace m3::cli
