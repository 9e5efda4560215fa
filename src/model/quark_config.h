// AMD Quark OCP-MX FP4 checkpoints (amd/MiniMax-M3-MXFP4, the MiniMax-M3.1 Quark-MXFP4 variant):
// config.json quantization_config with quant_method "quark" read into the one scheme m3serve runs
// (docs/formats.md section 4): static MXFP4 weights (E2M1, one E8M0 scale per 32 along K) with dynamic
// MXFP4 activations (input_tensors) or none (weight-only), and the module coverage from its exclude list.
// Every key that would change the math and that we do not run is refused naming the key and the value.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace m3 {

struct QuarkMxfp4 {
  bool on = false;                   // quantization_config.quant_method == "quark"
  std::vector<std::string> exclude;  // as written: exact module names, "re:" regular expressions, globs
  bool act_dynamic = false;          // input_tensors: dynamic MXFP4 per 32 (W4A4); false: weight-only
  uint8_t act_mode = 0;              // input_tensors.scale_calculation_mode: 0 "even", 1 "floor"

  // Whether module `name` (a tensor base name such as language_model.model.layers.0.self_attn.q_proj)
  // is in exclude: an entry matches the name as the checkpoint writes it, without its leading
  // "language_model." (the text model's own module path, as vLLM's Quark loader sees it after its prefix
  // mapping), or with "language_model.model." written "model.language_model." (transformers' newer path). Entries: "re:<regex>" matched from the start of the name (Python re.match, as vLLM's
  // should_ignore_layer), a glob when it holds * ? or [ (fnmatch), else the exact name.
  bool excluded(const std::string& name) const;
};

// Parses quantization_config (quant_method "quark"); `where` names the object in messages
// ("config.json: quantization_config").
QuarkMxfp4 parse_quark_config(const nlohmann::json& q, const std::string& where);

}  // namespace m3
