// Structured outputs: JSON Schema (and "any JSON object") to a grammar.
//
// Supported: type (object, array, string, number, integer, boolean, null, and type lists),
// properties, required, additionalProperties (false, true, a schema), enum, const, anyOf, oneOf
// (when its branches provably exclude each other, so the union of the branches is exact: different
// JSON types, distinct const/enum values, or a discriminator, i.e. a property one branch always
// writes with const/enum values the other's schema for it rejects; any other oneOf is refused by
// name, since generating it like anyOf could produce a value matching two branches), allOf with one entry, items, prefixItems, minItems, maxItems, minLength,
// maxLength, pattern (regex.h subset, ECMAScript search semantics), format (date, time, date-time,
// uuid, ipv4, email; see below), minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers
// (exact), minimum/maximum on numbers when both are whole numbers (exact, no exponent then),
// $ref to "#", "#/$defs/..", "#/definitions/.." and any local JSON pointer (recursion included),
// boolean schemas (true; false only where it means "nothing more": items, additionalProperties).
// Annotations are ignored: title, description, default, examples, $schema, $id, $comment,
// deprecated, readOnly, writeOnly, $defs/definitions themselves.
// Refused by name (StructuredError naming the keyword and its JSON pointer): everything else of
// the JSON Schema vocabulary (not, if/then/else, multipleOf, uniqueItems, contains,
// patternProperties, propertyNames, min/maxProperties, dependent*, unevaluated*, $dynamicRef,
// remote $ref, allOf with several entries, keywords beside $ref/anyOf/oneOf/allOf that would need
// an intersection, pattern together with minLength/maxLength or format, non-integral or exclusive
// number bounds, unknown formats, schemas that can match nothing). Unknown non-standard keys
// (x-*, vendor extensions) are ignored, as validators do.
// Choices that restrict (every output still validates; documented so nobody is surprised):
//  - properties come in the schema's order; when a schema lists properties and says nothing about
//    additionalProperties, no other properties are generated (OpenAI/xgrammar strict behaviour).
//    An object schema without properties allows any members.
//  - strings are written with canonical escapes; \u escapes of surrogates are not generated.
//  - integers have at most 18 digits (unless a bound needs more); number fractions at most 16
//    digits, exponents at most 3 digits.
//  - formats: date: days 29-31 only in months that always have them (no Feb 29); time and
//    date-time: seconds 00-59 and a mandatory Z or +hh:mm offset; email: ASCII local part
//    [A-Za-z0-9_+-] with dots, domain labels of letters, digits and inner hyphens.
//  - whitespace between JSON tokens: at most `max_whitespace` bytes of [ \t\n] per gap (default
//    16; 0 = compact), so a model cannot loop on whitespace.
#pragma once
#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace m3::structured {

struct JsonOptions {
  int max_whitespace = 16;
};

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonOptions& opt = {},
                            const Limits& limits = Limits{});
// response_format json_object: any JSON object.
Grammar json_object_grammar(const JsonOptions& opt = {});
// Any JSON value (used for "additionalProperties": true and schemas without constraints).
Grammar json_value_grammar(const JsonOptions& opt = {});

// Pieces shared with the tool-call grammar (tool_grammar.h): integer / number text with bounds
// (a JSON pointer for messages).
ExprPtr json_integer_expr(const nlohmann::ordered_json& schema, const std::string& pointer);
ExprPtr json_number_expr(const nlohmann::ordered_json& schema, const std::string& pointer);
// The regex (regex.h, whole-text) a supported string `format` stands for; null for any other format.
const std::string* json_format_regex(const std::string& format);
// The value a local "$ref" ("#", "#/$defs/x", any JSON pointer into `root`) names; throws StructuredError
// (naming `pointer`) for a remote or dangling one.
const nlohmann::ordered_json& json_resolve_ref(const nlohmann::ordered_json& root, const std::string& ref,
                                               const std::string& pointer);

}  // namespace m3::structured
