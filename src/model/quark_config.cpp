// Quark quantization_config -> QuarkMxfp4 (see quark_config.h). Key names and values follow Quark's export
// (global_quant_config / layer_quant_config / exclude; weight and input_tensors with dtype "fp4",
// qscheme "per_group", group_size 32, scale_format "e8m0", scale_calculation_mode, is_dynamic), as vLLM's
// Quark OCP-MX scheme reads them.
#include "model/quark_config.h"

#include <fnmatch.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "base/error.h"
#include "model/json_reader.h"

namespace m3 {

using nlohmann::json;

namespace {

bool matches(const std::string& entry, const std::string& name) {
  if (entry.rfind("re:", 0) == 0) {
    const std::regex re(entry.substr(3));
    return std::regex_search(name, re, std::regex_constants::match_continuous);
  }
  if (entry.find_first_of("*?[") != std::string::npos) return fnmatch(entry.c_str(), name.c_str(), 0) == 0;
  return entry == name;
}

std::string str(const json& v) { return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump(); }

// One tensor spec (weight or input_tensors) must be OCP MXFP4: E2M1 elements per 32 along the last axis
// with E8M0 scales. `dynamic`: what is_dynamic must be (weights static, activations dynamic).
void check_mx_spec(const json& spec, const std::string& where, bool dynamic) {
  if (!spec.is_object()) throw Error(where + ": expected an object, got " + spec.dump());
  JsonReader r{spec, where};
  const std::string dtype = r.string_or("dtype", "");
  if (dtype == "mx") {  // older Quark exports: dtype "mx" with the element type beside it
    const std::string el = r.string_or("mx_element_dtype", "");
    if (el != "fp4") r.fail("mx_element_dtype", "unsupported " + str(spec["mx_element_dtype"]) + " (supported: \"fp4\")");
  } else if (dtype != "fp4") {
    r.fail("dtype", "unsupported " + (r.has("dtype") ? str(spec["dtype"]) : std::string("(missing)")) +
                        " (supported: \"fp4\", OCP MXFP4)");
  } else if (r.has("mx_element_dtype") && r.string_or("mx_element_dtype", "") != "fp4") {
    r.fail("mx_element_dtype", "unsupported " + str(spec["mx_element_dtype"]) + " with dtype \"fp4\"");
  }
  if (r.string_or("qscheme", "") != "per_group")
    r.fail("qscheme", "unsupported " + (r.has("qscheme") ? str(spec["qscheme"]) : std::string("(missing)")) +
                          " (supported: \"per_group\")");
  if (r.integer_or("group_size", 0) != 32)
    r.fail("group_size", "unsupported " + (r.has("group_size") ? spec["group_size"].dump() : std::string("(missing)")) +
                             " (OCP MX blocks are 32)");
  if (r.has("ch_axis") && r.integer("ch_axis") != -1)
    r.fail("ch_axis", "unsupported " + spec["ch_axis"].dump() + " (supported: -1, blocks along the input features)");
  if (r.has("scale_format") && r.string_or("scale_format", "") != "e8m0")
    r.fail("scale_format", "unsupported " + str(spec["scale_format"]) + " (supported: \"e8m0\")");
  if (r.has("round_method") && r.string_or("round_method", "") != "half_even")
    r.fail("round_method", "unsupported " + str(spec["round_method"]) + " (supported: \"half_even\")");
  if (r.has("is_scale_quant") && r.boolean_or("is_scale_quant", false))
    r.fail("is_scale_quant", "unsupported true (scales are plain E8M0 bytes)");
  if (r.boolean_or("is_dynamic", dynamic) != dynamic)
    r.fail("is_dynamic", dynamic ? "unsupported false: static activation scales (supported: dynamic per-32 scales)"
                                 : "unsupported true: dynamic weight quantisation (the checkpoint must hold MXFP4 weights)");
}

}  // namespace

bool QuarkMxfp4::excluded(const std::string& name) const {
  const std::string pre = "language_model.", lm = "language_model.model.";
  const std::string inner = name.rfind(pre, 0) == 0 ? name.substr(pre.size()) : name;
  // transformers' newer module path of the same text model (model.language_model.layers...), as an
  // export made from it would name modules.
  const std::string hf = name.rfind(lm, 0) == 0 ? "model.language_model." + name.substr(lm.size()) : name;
  for (const std::string& e : exclude)
    if (matches(e, name) || matches(e, inner) || matches(e, hf)) return true;
  return false;
}

QuarkMxfp4 parse_quark_config(const json& q, const std::string& where) {
  JsonReader r{q, where};
  QuarkMxfp4 out;
  out.on = true;
  if (!r.has("global_quant_config")) r.fail("global_quant_config", "missing (Quark's scheme for every quantised module)");
  const json& g = q["global_quant_config"];
  if (!g.is_object()) r.fail("global_quant_config", "expected an object, got " + g.dump());
  JsonReader gr{g, where + ".global_quant_config"};
  if (!gr.has("weight")) gr.fail("weight", "missing (weight-less schemes are not checkpoints m3serve runs)");
  check_mx_spec(g["weight"], gr.where + ".weight", false);
  if (gr.has("input_tensors")) {
    check_mx_spec(g["input_tensors"], gr.where + ".input_tensors", true);
    JsonReader ir{g["input_tensors"], gr.where + ".input_tensors"};
    // Absent: "even", the mode of vLLM's Quark OCP-MX emulation (quant_dequant_mxfp4's default) and of
    // every Quark MXFP4 export we have seen; stated at load in the model summary.
    const std::string mode = ir.string_or("scale_calculation_mode", "even");
    if (mode == "even") out.act_mode = 0;
    else if (mode == "floor") out.act_mode = 1;
    else ir.fail("scale_calculation_mode", "unsupported \"" + mode + "\" (supported: \"even\", \"floor\")");
    out.act_dynamic = true;
  }
  for (const char* k : {"output_tensors", "bias"})
    if (gr.has(k)) gr.fail(k, "unsupported " + g[k].dump() + " (m3serve runs weight and input quantisation only)");
  // Per-layer schemes: accepted only where they repeat the global one.
  if (r.has("layer_quant_config")) {
    const json& l = q["layer_quant_config"];
    if (!l.is_object()) r.fail("layer_quant_config", "expected an object, got " + l.dump());
    for (auto it = l.begin(); it != l.end(); ++it) {
      const json& v = it.value();
      const bool same = v.is_object() && v.value("weight", json()) == g["weight"] &&
                        v.value("input_tensors", json()) == g.value("input_tensors", json());
      if (!same)
        r.fail("layer_quant_config", "entry \"" + it.key() +
                                         "\" sets a scheme other than global_quant_config's (per-layer schemes are "
                                         "not supported)");
    }
  }
  for (const char* k : {"layer_type_quant_config", "kv_cache_quant_config"})
    if (r.has(k) && !q[k].empty())
      r.fail(k, "unsupported " + q[k].dump() + " (only global_quant_config with exclude is supported)");
  if (r.has("softmax_quant_spec")) r.fail("softmax_quant_spec", "unsupported " + q["softmax_quant_spec"].dump());
  // Algorithms that leave only changed weights behind (GPTQ, AWQ, SmoothQuant folded into the norms) need
  // nothing at run time; rotations (QuaRot, SpinQuant) need online transforms we do not run.
  if (r.has("algo_config")) {
    const json& a = q["algo_config"];
    const json list = a.is_array() ? a : json::array({a});
    for (const json& e : list) {
      const std::string name = e.is_object() ? e.value("name", std::string()) : std::string();
      for (const char* bad : {"rotation", "quarot", "spinquant"})
        if (name.find(bad) != std::string::npos)
          r.fail("algo_config", "unsupported algorithm \"" + name + "\" (it needs online rotations m3serve does not run)");
    }
  }
  if (r.has("export")) {
    JsonReader er{q["export"], where + ".export"};
    if (er.has("weight_format") && er.string_or("weight_format", "") != "real_quantized")
      er.fail("weight_format", "unsupported " + str(q["export"]["weight_format"]) +
                                   " (supported: \"real_quantized\", packed MXFP4 weights)");
    // The E2M1 nibble order: Quark's "reorder" packing, low nibble = even element (docs/formats.md 4).
    if (er.has("pack_method") && er.string_or("pack_method", "") != "reorder")
      er.fail("pack_method", "unsupported " + str(q["export"]["pack_method"]) + " (supported: \"reorder\")");
  }
  if (r.has("exclude")) {
    const json& e = q["exclude"];
    if (!e.is_array()) r.fail("exclude", "expected a list of module names, got " + e.dump());
    for (const json& v : e) {
      if (!v.is_string()) r.fail("exclude", "entries must be strings, got " + v.dump());
      const std::string s = v.get<std::string>();
      if (s.rfind("re:", 0) == 0) {
        try {
          std::regex check(s.substr(3));
        } catch (const std::regex_error& err) {
          r.fail("exclude", "entry \"" + s + "\" is not a valid regular expression (" + err.what() + ")");
        }
      }
      out.exclude.push_back(s);
    }
  }
  return out;
}

}  // namespace m3
