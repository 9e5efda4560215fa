// Parsing of offline request lines (see request_json.h); the sampling fields are read by
// server/sampling_fields, as the API reads them.
#include "cli/request_json.h"

#include <cstdint>

#include "base/error.h"
#include "server/request_fields.h"
#include "server/sampling_fields.h"
#include "structured/matcher.h"
#include "structured/request.h"

namespace m3::cli {

using json = nlohmann::ordered_json;

namespace {

// The fields structured_from_request reads (it reports their errors).
bool is_structured_field(const std::string& k) {
  for (const char* f : {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                        "guided_grammar", "guided_decoding_backend"})
    if (k == f) return true;
  return false;
}

}  // namespace

OfflineRequest parse_offline_request(const json& j, const Tokenizer& tok, int64_t vocab, const std::string& where,
                                     const SamplingParams& defaults) {
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  OfflineRequest r;
  r.params = defaults;
  SamplingParams& p = r.params;
  bool have_prompt = false;
  server::FieldStyle style;
  style.api = false;
  style.where = where;
  if (auto r = server::refused_field(j, server::Endpoint::Offline)) style.refuse(r->name, {}, r->message);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "prompt") {
      if (!v.is_string()) style.refuse(k, {}, "expected a string");
      r.prompt_ids = tok.encode(v.get<std::string>());
      have_prompt = true;
    } else if (k == "prompt_token_ids") {
      if (!v.is_array()) style.refuse(k, {}, "expected an array of token ids");
      for (const auto& x : v) r.prompt_ids.push_back(server::read_token_id(k, x, "", style));
      have_prompt = true;
    } else if (k == "max_tokens") {
      p.max_tokens = server::read_int32(k, v, 1, style);
    } else if (k == "logprobs") {
      if (!v.is_null()) p.logprobs = server::read_int32(k, v, 0, style);
    } else if (is_structured_field(k)) {
      continue;  // read below, once the stop token ids are known
    } else if (!server::read_sampling_field(k, v, p, style) &&
               !server::is_refused_field_name(k, server::Endpoint::Offline)) {  // a refused one sent with its default
      throw Error(where + ": unknown field \"" + k + "\"");
    }
  }
  if (!have_prompt) throw Error(where + ": needs \"prompt\" or \"prompt_token_ids\"");
  if (j.contains("prompt") && j.contains("prompt_token_ids"))
    throw Error(where + ": \"prompt\" and \"prompt_token_ids\" are alternatives; give one");
  server::check_token_ids_in_vocab(p, vocab, style);
  try {
    if (auto sr = structured::structured_from_request(j))
      p.constraint = structured::make_constraint(sr->grammar, structured::TokenVocab::shared(tok, vocab), tok,
                                                 p.stop_token_ids, "", sr->kind);
  } catch (const structured::StructuredError& e) {
    throw Error(where + ": " + e.what());
  }
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  return r;
}

}  // namespace m3::cli
