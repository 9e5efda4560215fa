// --speculative-config parsing and validation (see spec_config.h).
#include "engine/spec_config.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/json_flag.h"

namespace m3 {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw Error("--speculative-config: " + key + ": " + why);
}

std::string str(const json& o, const char* k) {
  if (!o[k].is_string()) bad(k, "expected a string, got " + o[k].dump());
  return o[k].get<std::string>();
}

std::string one_of(const json& o, const char* k, std::initializer_list<const char*> ok) {
  const std::string v = str(o, k);
  std::string list;
  for (const char* x : ok) {
    if (v == x) return v;
    list += std::string(list.empty() ? "" : ", ") + "\"" + x + "\"";
  }
  bad(k, "\"" + v + "\" is not supported (expected one of " + list + ")");
}

}  // namespace

SpeculativeConfig SpeculativeConfig::parse(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  const json o = parse_json_flag(text, "--speculative-config");
  for (auto it = o.begin(); it != o.end(); ++it) {
    static const char* known[] = {"method", "model", "num_speculative_tokens", "draft_sample_method",
                                  "rejection_sample_method", "kv_cache_dtype", "attention_backend",
                                  "synthetic_acceptance_length", "synthetic_acceptance_rates",
                                  "enable_adaptive_verification", "dspark_draft_topk",
                                  "adaptive_num_speculative_tokens", "draft_activations", "draft_weights"};
    bool ok = false;
    for (const char* k : known) ok |= it.key() == k;
    if (!ok) bad(it.key(), "unknown key");
  }
  if (!o.contains("method")) bad("method", "missing (m3serve supports \"dspark\")");
  c.method = one_of(o, "method", {"dspark"});
  if (o.contains("model") && !o["model"].is_null()) c.model = str(o, "model");
  if (!o.contains("num_speculative_tokens")) bad("num_speculative_tokens", "missing (expected a positive integer)");
  if (!o["num_speculative_tokens"].is_number_integer() || o["num_speculative_tokens"].get<int64_t>() < 1 ||
      o["num_speculative_tokens"].get<int64_t>() > 64)
    bad("num_speculative_tokens", "expected a positive integer, got " + o["num_speculative_tokens"].dump());
  c.num_speculative_tokens = o["num_speculative_tokens"].get<int>();
  if (o.contains("draft_sample_method")) c.draft_sample_method = one_of(o, "draft_sample_method", {"probabilistic", "greedy"});
  if (o.contains("rejection_sample_method"))
    c.rejection_sample_method = one_of(o, "rejection_sample_method", {"block", "standard", "synthetic"});
  if (o.contains("kv_cache_dtype") && !o["kv_cache_dtype"].is_null()) c.kv_cache_dtype = str(o, "kv_cache_dtype");
  if (o.contains("attention_backend") && !o["attention_backend"].is_null()) c.attention_backend = str(o, "attention_backend");
  if (o.contains("enable_adaptive_verification")) {
    if (!o["enable_adaptive_verification"].is_boolean())
      bad("enable_adaptive_verification", "expected true or false, got " + o["enable_adaptive_verification"].dump());
    c.adaptive_verification = o["enable_adaptive_verification"].get<bool>();
  }
  if (o.contains("adaptive_num_speculative_tokens")) {
    if (!o["adaptive_num_speculative_tokens"].is_boolean())
      bad("adaptive_num_speculative_tokens", "expected true or false, got " + o["adaptive_num_speculative_tokens"].dump());
    c.adaptive = o["adaptive_num_speculative_tokens"].get<bool>();
  }
  if (o.contains("draft_activations")) c.draft_activations = one_of(o, "draft_activations", {"auto", "fp32", "bf16"});
  if (o.contains("draft_weights")) c.draft_weights = one_of(o, "draft_weights", {"auto", "checkpoint", "mxfp8"});
  // vLLM's dspark_draft_topk (its markov_topk): the Markov bias on the k best base logits only, the
  // draft drawn among them (verification compares with that q, so output stays exact).
  if (o.contains("dspark_draft_topk") && !o["dspark_draft_topk"].is_null()) {
    const json& v = o["dspark_draft_topk"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t(1) << 30))
      bad("dspark_draft_topk", "expected a positive integer (candidates per draft position), got " + v.dump());
    c.draft_topk = v.get<int>();
  }
  if (o.contains("synthetic_acceptance_length")) {
    if (!o["synthetic_acceptance_length"].is_number()) bad("synthetic_acceptance_length", "expected a number");
    c.synthetic_acceptance_length = o["synthetic_acceptance_length"].get<double>();
    if (!(c.synthetic_acceptance_length >= 1.0 && c.synthetic_acceptance_length <= 1.0 + c.num_speculative_tokens))
      bad("synthetic_acceptance_length", "must be in [1, 1 + num_speculative_tokens]");
  }
  if (o.contains("synthetic_acceptance_rates")) {
    const json& a = o["synthetic_acceptance_rates"];
    if (!a.is_array() || int(a.size()) != c.num_speculative_tokens)
      bad("synthetic_acceptance_rates", "expected a list of num_speculative_tokens rates in [0, 1]");
    for (const auto& v : a) {
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
        bad("synthetic_acceptance_rates", "entries must be numbers in [0, 1], got " + v.dump());
      c.synthetic_acceptance_rates.push_back(v.get<double>());
    }
  }
  if (c.adaptive_verification && !c.adaptive)
    bad("enable_adaptive_verification", "needs adaptive_num_speculative_tokens true (the measured step costs the "
                                        "confidence head's expected acceptance is weighed against)");
  if (c.rejection_sample_method == "synthetic" && c.synthetic_acceptance_length == 0 &&
      c.synthetic_acceptance_rates.empty())
    bad("rejection_sample_method", "\"synthetic\" needs synthetic_acceptance_length or synthetic_acceptance_rates");
  if (c.rejection_sample_method != "synthetic" &&
      (c.synthetic_acceptance_length != 0 || !c.synthetic_acceptance_rates.empty()))
    bad("synthetic_acceptance_length", "only used with rejection_sample_method \"synthetic\"");
  c.enabled = true;
  return c;
}

std::string SpeculativeConfig::describe() const {
  if (!enabled) return "speculative decoding off";
  std::ostringstream o;
  o << "speculative decoding: " << method << ", " << num_speculative_tokens << " draft tokens, draft sampling "
    << draft_sample_method << ", verification " << rejection_sample_method
    << (adaptive ? ", drafts verified per request as measured acceptance and step costs pay" : ", every draft verified")
    << (adaptive_verification ? ", then cut where the draft's confidence head says the next one will not pay" : "");
  if (draft_activations != "fp32") o << ", draft activations " << draft_activations;
  if (draft_weights != "checkpoint") o << ", draft weights " << draft_weights;
  if (draft_topk > 0) o << ", Markov bias on the " << draft_topk << " best draft logits per position";
  if (rejection_sample_method == "synthetic") {
    if (synthetic_acceptance_length > 0) o << " (acceptance length " << synthetic_acceptance_length << ")";
    else o << " (per-position rates)";
  }
  if (!attention_backend.empty()) o << "; attention_backend " << attention_backend << " is a GPU backend name, the CPU draft attention is used";
  return o.str();
}

}  // namespace m3
