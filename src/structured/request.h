// Structured outputs: the request fields (OpenAI / vLLM) that ask for a constraint, read into a
// grammar, so the server (and `generate --input`) only call this and compile. Fields read:
//   response_format: {"type": "text"} (nothing), {"type": "json_object"},
//     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (always enforced exactly;
//     strict false is accepted and still enforced);
//   structured_outputs: {"json": schema or its text, "regex", "choice", "grammar" (GBNF),
//     "json_object": true, "disable_any_whitespace": true (compact JSON)};
//   guided_json, guided_regex, guided_choice, guided_grammar (the older names);
//   guided_decoding_backend: any value is accepted (one backend here); guided_whitespace_pattern and
//     structural_tag / response_format "structural_tag" are refused by name.
// More than one constraint in one request is refused (naming both fields).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "structured/json_schema.h"

namespace m3 {
class Tokenizer;
}

namespace m3::structured {

struct StructuredRequest {
  Grammar grammar;
  std::string field;  // the field it came from (for messages and logs): "response_format", ...
  std::string kind;   // "json_schema", "json_object", "regex", "choice", "grammar"
};

// Nothing asked: nullopt. Throws StructuredError naming the field (and the keyword / pointer inside a
// schema) for anything malformed or unsupported.
std::optional<StructuredRequest> structured_from_request(const nlohmann::ordered_json& body,
                                                         const JsonOptions& json = {},
                                                         const Limits& limits = Limits{});

class TokenVocab;
struct ConstraintSpec;
// A spec ready for SamplingParams::constraint: compiled grammar, the shared vocabulary, the
// request's stop token ids as end tokens, the tool-call namespace token as text when the tokenizer
// has it, and `start_after` (e.g. "</mm:think>" when the reasoning parser is on and the prompt
// opened reasoning; empty otherwise).
std::shared_ptr<const ConstraintSpec> make_constraint(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                                                      const Tokenizer& tok, std::vector<int32_t> end_tokens,
                                                      std::string start_after, std::string description,
                                                      const Limits& limits = Limits{});

// `spec` (null: none) with a reasoning budget: at most `budget` tokens before `start_after` (the
// reasoning end tag, one token of `tok`), then that tag is the only token allowed. Throws
// StructuredError when the tokenizer has no single token for the tag.
std::shared_ptr<const ConstraintSpec> with_reasoning_budget(std::shared_ptr<const ConstraintSpec> spec,
                                                            std::shared_ptr<const TokenVocab> vocab,
                                                            const Tokenizer& tok, const std::string& start_after,
                                                            int64_t budget);

}  // namespace m3::structured
