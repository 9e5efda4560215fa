// Which request fields of the OpenAI / vLLM APIs m3serve honours, per endpoint. A field that vLLM or
// OpenAI defines but this build does not implement is refused by name (400 with `param`) whenever it
// asks for something (a value other than its default: `"min_tokens": 0` passes, `"min_tokens": 5` is
// refused), so no request is ever served with a field silently dropped. A field that neither defines
// is ignored with one warning in the log, as vLLM does. `generate --input` lines follow the same table.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace m3::server {

enum class Endpoint { Chat, Completion, Offline };

struct RefusedField {
  std::string name;     // the field, for `param`
  std::string message;  // names the field, what it asks for, and what to send instead
};

// The first field of the body (an object) that asks for something not implemented here, if any.
std::optional<RefusedField> refused_field(const nlohmann::ordered_json& body, Endpoint ep);

// Whether `name` is one of the refused fields of this endpoint (sent with its default, it is accepted).
bool is_refused_field_name(const std::string& name, Endpoint ep);

// The body's fields that neither vLLM nor OpenAI define for this endpoint, in body order.
std::vector<std::string> unknown_fields(const nlohmann::ordered_json& body, Endpoint ep);

// Logs "ignored field" once per distinct name for the life of the process (a client cannot flood
// the log: at most 64 names are remembered, then one line says further names are not logged).
void warn_unknown_fields(const std::vector<std::string>& names, const char* endpoint);

}  // namespace m3::server
