// Request fields -> grammar (see request.h).
#include "structured/request.h"

#include <optional>

#include "structured/gbnf.h"
#include "structured/matcher.h"
#include "structured/tool_grammar.h"
#include "tokenizer/tokenizer.h"

namespace m3::structured {

namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw StructuredError("structured output: '" + field + "' " + why);
}

ojson schema_value(const ojson& v, const std::string& field) {
  if (v.is_string()) {
    ojson j = ojson::parse(v.get<std::string>(), nullptr, false);
    if (j.is_discarded()) bad(field, "is a string that is not JSON (expected a JSON schema)");
    return j;
  }
  if (!v.is_object() && !v.is_boolean()) bad(field, "must be a JSON schema (an object)");
  return v;
}

std::vector<std::string> choices(const ojson& v, const std::string& field) {
  if (!v.is_array() || v.empty()) bad(field, "must be a non-empty array of strings");
  std::vector<std::string> out;
  for (auto& c : v) {
    if (!c.is_string()) bad(field, "must list strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::string text_of(const ojson& v, const std::string& field) {
  if (!v.is_string()) bad(field, "must be a string");
  return v.get<std::string>();
}

}  // namespace

std::optional<StructuredRequest> structured_from_request(const ojson& body, const JsonOptions& json0, const Limits& limits) {
  if (!body.is_object()) return std::nullopt;
  std::optional<StructuredRequest> out;
  JsonOptions json = json0;
  auto set = [&](const std::string& field, const std::string& kind, auto&& make) {
    if (out) bad(field, "and '" + out->field + "' both ask for a constraint; send one");
    out = StructuredRequest{make(), field, kind};
  };
  auto present = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };
  for (const char* k : {"guided_whitespace_pattern", "structural_tag"})
    if (present(k)) bad(k, "is not supported (whitespace is bounded JSON whitespace; see src/structured/json_schema.h)");
  if (present("response_format")) {
    const ojson& rf = body["response_format"];
    if (!rf.is_object()) bad("response_format", "must be an object");
    const std::string t = rf.contains("type") && rf["type"].is_string() ? rf["type"].get<std::string>() : "text";
    if (t == "json_object") {
      set("response_format", "json_object", [&] { return json_object_grammar(json); });
    } else if (t == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) bad("response_format", "of type json_schema needs a 'json_schema' object");
      const ojson& js = rf["json_schema"];
      if (!js.contains("schema")) bad("response_format", "json_schema has no 'schema'");
      const ojson s = schema_value(js["schema"], "response_format.json_schema.schema");
      set("response_format", "json_schema", [&] { return json_schema_grammar(s, json, limits); });
    } else if (t != "text") {
      bad("response_format", "type '" + t + "' is not supported (text, json_object or json_schema)");
    }
  }
  if (present("structured_outputs")) {
    const ojson& so = body["structured_outputs"];
    if (!so.is_object()) bad("structured_outputs", "must be an object");
    if (so.contains("disable_any_whitespace") && so["disable_any_whitespace"].is_boolean() && so["disable_any_whitespace"].get<bool>())
      json.max_whitespace = 0;
    for (auto& [k, v] : so.items()) {
      if (v.is_null()) continue;
      const std::string f = "structured_outputs." + k;
      if (k == "json") {
        const ojson s = schema_value(v, f);
        set(f, "json_schema", [&] { return json_schema_grammar(s, json, limits); });
      } else if (k == "json_object") {
        if (v.is_boolean() && v.get<bool>()) set(f, "json_object", [&] { return json_object_grammar(json); });
      } else if (k == "regex") {
        const std::string r = text_of(v, f);
        set(f, "regex", [&] { return regex_grammar(r, limits); });
      } else if (k == "choice") {
        const auto c = choices(v, f);
        set(f, "choice", [&] { return choice_grammar(c); });
      } else if (k == "grammar") {
        const std::string g = text_of(v, f);
        set(f, "grammar", [&] { return gbnf_grammar(g, limits); });
      } else if (k == "disable_any_whitespace" || k == "disable_fallback" || k == "disable_additional_properties") {
        // Accepted: whitespace handled above; there is no fallback backend; additional properties
        // are already not generated when a schema lists properties.
      } else {
        bad(f, "is not supported (json, regex, choice, grammar, json_object)");
      }
    }
  }
  if (present("guided_json")) {
    const ojson s = schema_value(body["guided_json"], "guided_json");
    set("guided_json", "json_schema", [&] { return json_schema_grammar(s, json, limits); });
  }
  if (present("guided_regex")) {
    const std::string r = text_of(body["guided_regex"], "guided_regex");
    set("guided_regex", "regex", [&] { return regex_grammar(r, limits); });
  }
  if (present("guided_choice")) {
    const auto c = choices(body["guided_choice"], "guided_choice");
    set("guided_choice", "choice", [&] { return choice_grammar(c); });
  }
  if (present("guided_grammar")) {
    const std::string g = text_of(body["guided_grammar"], "guided_grammar");
    set("guided_grammar", "grammar", [&] { return gbnf_grammar(g, limits); });
  }
  return out;
}

std::shared_ptr<const ConstraintSpec> make_constraint(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                                                      const Tokenizer& tok, std::vector<int32_t> end_tokens,
                                                      std::string start_after, std::string description,
                                                      const Limits& limits) {
  auto s = std::make_shared<ConstraintSpec>();
  s->grammar = compile(g, limits);
  s->vocab = std::move(vocab);
  s->end_tokens = std::move(end_tokens);
  if (auto ns = tok.token_to_id(kToolNamespaceText)) s->text_specials.push_back(*ns);
  // The tool-call block's own tags are special tokens in the M3 tokenizers: the model emits them as such,
  // and a grammar that only let it spell them letter by letter kept it from closing the block (tool_choice
  // required ran on to max_tokens, one call after another).
  if (description == "tool_call")
    for (const char* tag : {"<tool_call>", "</tool_call>"})
      if (auto id = tok.token_to_id(tag); id && tok.is_special(*id)) s->text_specials.push_back(*id);
  s->start_after = std::move(start_after);
  s->description = std::move(description);
  return s;
}

std::shared_ptr<const ConstraintSpec> with_reasoning_budget(std::shared_ptr<const ConstraintSpec> spec,
                                                            std::shared_ptr<const TokenVocab> vocab,
                                                            const Tokenizer& tok, const std::string& start_after,
                                                            int64_t budget) {
  const std::optional<int32_t> id = tok.token_to_id(start_after);
  if (!id) throw StructuredError("the tokenizer has no single token for the reasoning end tag " + start_after);
  auto s = spec ? std::make_shared<ConstraintSpec>(*spec) : std::make_shared<ConstraintSpec>();
  if (!spec) {
    s->vocab = std::move(vocab);
    s->description = "thinking_token_budget";
  }
  // A grammar that applies after the reasoning waits for the same tag (attach_constraint set it).
  s->start_after = start_after;
  s->start_after_budget = budget;
  s->start_after_token = *id;
  return s;
}

}  // namespace m3::structured
