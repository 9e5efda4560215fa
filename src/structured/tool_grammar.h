// Structured outputs: the whole MiniMax-M3 tool-call block as a grammar, for tool_choice
// "required" (one or more calls of any listed tool) or a named tool (exactly one call of it).
// The block is the one src/chat/tool_parser.cpp accepts for minimax_m3 and the chat template
// renders (NS is the namespace token "]<]minimax[>[", a special token the constraint lets through):
//   NS<tool_call>\n ( NS<invoke name="NAME"> PARAMS NS</invoke>\n )+ NS</tool_call>
// PARAMS per the tool's `parameters` schema, in its property order, required ones always, others
// optional: NS<key>VALUE NS</key>. VALUE by the property's schema: string: text without '&' and
// without "]<" (so no NS can start inside it); enum/const of strings: those strings; integer /
// number (bounds as in json_schema.h), boolean, null: their JSON text; object: nested NS<key>
// elements; array: NS<item>VALUE NS</item> repeated (minItems/maxItems). A nullable [T, "null"]
// or anyOf [T, {type: null}] is generated as T. Anything else (pattern, format, anyOf of several
// types, additionalProperties schemas) is refused by name, never loosened.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "structured/grammar.h"

namespace m3::structured {

// `tools`: the request's OpenAI `tools` array, parsed keeping key order (parameters come in that order). `only`: empty for "required", else the named tool
// (refused when not listed). `parallel`: several invokes allowed ("required" only).
Grammar tool_call_grammar(const nlohmann::ordered_json& tools, const std::string& only, bool parallel = true,
                          const Limits& limits = Limits{});

// The namespace token's text, for ConstraintSpec::text_specials (look its id up in the tokenizer).
inline const char* kToolNamespaceText = "]<]minimax[>[";

}  // namespace m3::structured
