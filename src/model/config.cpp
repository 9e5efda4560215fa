// config.json parsing and validation for the M3 / M3.1 text model (see config.h).
#include "model/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "model/json_reader.h"

namespace m3 {

using nlohmann::json;

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Plain: return "bf16";
    case WeightFormat::MXFP8: return "mxfp8";
    case WeightFormat::NVFP4: return "nvfp4";
    case WeightFormat::MXFP4: return "mxfp4";
  }
  return "?";
}


namespace {

void merge_overrides(json& cfg, const json& over) {
  for (const auto& [key, value] : over.items()) {
    const bool sub_config = key.size() > 7 && key.compare(key.size() - 7, 7, "_config") == 0 &&
                            key != "quantization_config" && value.is_object() && cfg.contains(key) &&
                            cfg[key].is_object();
    if (sub_config) merge_overrides(cfg[key], value);
    else cfg[key] = value;
  }
}

}  // namespace

std::string ModelConfig::merge_config_overrides(const std::string& text, const std::string& overrides,
                                                const std::string& where) {
  json cfg = json::parse(text, nullptr, false);
  if (!cfg.is_object()) throw Error(where + ": expected a JSON object (to apply --hf-overrides to)");
  const json over = json::parse(overrides, nullptr, false);
  if (!over.is_object()) throw Error("--hf-overrides: expected a JSON object, got " + overrides);
  merge_overrides(cfg, over);
  return cfg.dump();
}

ModelConfig ModelConfig::from_dir(const std::string& dir, const std::string& overrides) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open (a model directory needs config.json)");
  std::stringstream ss;
  ss << in.rdbuf();
  ModelConfig c = from_json_text(overrides.empty() ? ss.str() : merge_config_overrides(ss.str(), overrides, path),
                                 overrides.empty() ? path : path + " with --hf-overrides");
  c.dir = dir;
  return c;
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& where) {
  json root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!root.is_object()) throw Error(where + ": expected a JSON object");
  // Multimodal layout keeps the text settings under text_config; a text-only export is flat.
  const bool nested = root.contains("text_config") && root["text_config"].is_object();
  const json& tc = nested ? root["text_config"] : root;
  JsonReader r{tc, where + (nested ? ": text_config" : ":")};
  if (!nested) r.where = where + ": ";
  ModelConfig c;
  c.hidden = r.positive("hidden_size");
  c.n_layers = r.positive("num_hidden_layers");
  c.n_heads = r.positive("num_attention_heads");
  c.n_kv_heads = r.positive("num_key_value_heads");
  c.head_dim = r.has("head_dim") ? r.positive("head_dim") : c.hidden / c.n_heads;
  c.vocab = r.positive("vocab_size");
  c.rope_theta = r.number("rope_theta");
  c.rms_eps = float(r.number_or("rms_norm_eps", 1e-6));
  c.max_position_embeddings = r.has("max_position_embeddings") ? r.positive("max_position_embeddings") : (1 << 20);
  if (r.has("rotary_dim")) {
    c.rotary_dim = r.positive("rotary_dim");
  } else {
    c.rotary_dim = int(c.head_dim * r.number_or("partial_rotary_factor", 1.0));
  }
  if (c.n_heads % c.n_kv_heads != 0)
    r.fail("num_attention_heads", std::to_string(c.n_heads) + " is not a multiple of num_key_value_heads " +
                                      std::to_string(c.n_kv_heads));
  if (c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)
    r.fail("rotary_dim", "expected an even number <= head_dim " + std::to_string(c.head_dim) + ", got " +
                             std::to_string(c.rotary_dim));
  if (c.rope_theta <= 0) r.fail("rope_theta", "expected a positive number");
  if (r.has("rope_scaling"))
    r.fail("rope_scaling", "RoPE scaling is not supported yet (the M3 release uses plain RoPE); got " +
                               tc["rope_scaling"].dump());

  // Features this engine implements exactly; anything else is refused rather than ignored.
  if (!r.boolean_or("use_gemma_norm", true)) r.fail("use_gemma_norm", "only Gemma (1+w) norms are supported");
  if (!r.boolean_or("use_qk_norm", true)) r.fail("use_qk_norm", "expected true (M3 uses per-head QK norm)");
  if (r.string_or("qk_norm_type", "per_head") != "per_head") r.fail("qk_norm_type", "expected \"per_head\"");
  if (r.boolean_or("attention_output_gate", false)) r.fail("attention_output_gate", "an output gate is not supported");
  if (r.string_or("hidden_act", "swigluoai") != "swigluoai") r.fail("hidden_act", "expected \"swigluoai\"");
  if (r.string_or("scoring_func", "sigmoid") != "sigmoid") r.fail("scoring_func", "expected \"sigmoid\"");
  if (r.boolean_or("tie_word_embeddings", false)) r.fail("tie_word_embeddings", "expected false (M3 has an untied lm_head)");

  c.moe_layer = r.flags("moe_layer_freq", c.n_layers);
  const bool any_moe = std::count(c.moe_layer.begin(), c.moe_layer.end(), 1) > 0;
  const bool any_dense = std::count(c.moe_layer.begin(), c.moe_layer.end(), 0) > 0;
  if (any_dense) c.dense_inter = r.positive("dense_intermediate_size");
  if (any_moe) {
    c.moe_inter = r.positive("intermediate_size");
    c.n_experts = r.positive("num_local_experts");
    c.experts_per_tok = r.positive("num_experts_per_tok");
    c.n_shared_experts = int(r.integer_or("n_shared_experts", 0));
    if (c.n_shared_experts < 0 || c.n_shared_experts > 1)
      r.fail("n_shared_experts", "expected 0 or 1, got " + std::to_string(c.n_shared_experts));
    if (c.n_shared_experts) c.shared_inter = r.positive("shared_intermediate_size");
    if (c.experts_per_tok > c.n_experts)
      r.fail("num_experts_per_tok", std::to_string(c.experts_per_tok) + " exceeds num_local_experts " +
                                        std::to_string(c.n_experts));
    c.use_routing_bias = r.boolean_or("use_routing_bias", true);
    c.routed_scaling = float(r.number_or("routed_scaling_factor", 1.0));
  }
  c.swiglu_alpha = float(r.number_or("swiglu_alpha", 1.702));
  c.swiglu_limit = float(r.number_or("swiglu_limit", 7.0));
  c.swiglu_beta = float(r.number_or("swiglu_beta", 1.0));

  // MSA.
  c.sparse_layer.assign(c.n_layers, 0);
  if (r.has("sparse_attention_config")) {
    if (!tc["sparse_attention_config"].is_object()) r.fail("sparse_attention_config", "expected an object");
    JsonReader s{tc["sparse_attention_config"], r.where + ".sparse_attention_config"};
    s.where = r.where + "sparse_attention_config";
    if (nested) s.where = r.where + ".sparse_attention_config";
    if (s.boolean_or("use_sparse_attention", true)) {
      c.sparse_layer = s.flags("sparse_attention_freq", c.n_layers);
    }
    if (c.any_sparse()) {
      c.index_heads = s.positive("sparse_num_index_heads");
      c.index_dim = s.positive("sparse_index_dim");
      c.block_size = s.positive("sparse_block_size");
      c.topk_blocks = s.positive("sparse_topk_blocks");
      c.local_blocks = int(s.integer_or("sparse_local_block", 1));
      c.init_blocks = int(s.integer_or("sparse_init_block", 0));
      if (s.string_or("sparse_score_type", "max") != "max") s.fail("sparse_score_type", "only \"max\" is specified");
      if (c.index_heads != c.n_kv_heads)
        s.fail("sparse_num_index_heads", "expected one index head per KV head (" + std::to_string(c.n_kv_heads) +
                                             "), got " + std::to_string(c.index_heads));
      if (c.index_dim < c.rotary_dim)
        s.fail("sparse_index_dim", "must be >= rotary_dim " + std::to_string(c.rotary_dim));
      if (c.local_blocks < 1) s.fail("sparse_local_block", "expected >= 1 (the query's own block is always kept)");
      if (c.init_blocks < 0) s.fail("sparse_init_block", "expected >= 0");
      if (c.local_blocks + c.init_blocks > c.topk_blocks)
        s.fail("sparse_topk_blocks", std::to_string(c.topk_blocks) + " is smaller than the forced blocks (local " +
                                         std::to_string(c.local_blocks) + " + init " +
                                         std::to_string(c.init_blocks) + ")");
      if (s.has("sparse_disable_index_value")) {
        auto dis = s.flags("sparse_disable_index_value", c.n_layers);
        for (int l = 0; l < c.n_layers; ++l)
          if (c.sparse_layer[l] && !dis[l])
            s.fail("sparse_disable_index_value", "layer " + std::to_string(l) +
                                                     " is sparse with an index value path (0); only "
                                                     "selection-only index branches (1) are specified");
      }
    }
  }

  // Weight formats.
  if (root.contains("quantization_config") && !root["quantization_config"].is_null()) {
    const json& q = root["quantization_config"];
    JsonReader qr{q, where + ": quantization_config"};
    qr.where = where + ": quantization_config";
    const std::string method = qr.string_or("quant_method", "");
    if (method == "mxfp8") {
      c.dense_format = WeightFormat::MXFP8;
      c.expert_format = WeightFormat::MXFP8;
      if (qr.has("weight_block_size")) {
        const json& b = q["weight_block_size"];
        if (!(b.is_array() && b.size() == 2 && b[0] == 1 && b[1] == 32))
          qr.fail("weight_block_size", "expected [1, 32] for MXFP8, got " + b.dump());
      }
      const std::string algo = qr.string_or("moe_quant_algo", "");
      if (algo == "NVFP4" || algo == "nvfp4") {
        const std::string fmt = qr.string_or("moe_quant_format", "nvfp4-pack-quantized");
        if (fmt != "nvfp4-pack-quantized")
          qr.fail("moe_quant_format", "expected \"nvfp4-pack-quantized\", got \"" + fmt + "\"");
        c.expert_format = WeightFormat::NVFP4;
      } else if (!algo.empty() && algo != "mxfp8" && algo != "MXFP8") {
        qr.fail("moe_quant_algo", "unsupported \"" + algo + "\" (expected NVFP4 or absent)");
      }
    } else if (method == "quark") {
      c.quark = parse_quark_config(q, where + ": quantization_config");
      c.dense_format = WeightFormat::MXFP4;
      c.expert_format = WeightFormat::MXFP4;
    } else {
      qr.fail("quant_method", "unsupported \"" + method +
                                  "\" (supported: mxfp8, with optional NVFP4 experts; quark, OCP MXFP4)");
    }
  }

  if (r.has("bos_token_id")) c.bos_id = int(r.integer("bos_token_id"));
  if (r.has("eos_token_id") && tc["eos_token_id"].is_number_integer()) c.eos_id = int(r.integer("eos_token_id"));
  // An id past the vocabulary would never be generated: generation could not stop at the end of text.
  for (auto [key, id] : {std::pair<const char*, int>{"bos_token_id", c.bos_id}, {"eos_token_id", c.eos_id}})
    if (r.has(key) && tc[key].is_number_integer() && (id < 0 || id >= c.vocab))
      r.fail(key, "token id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                      std::to_string(c.vocab) + ")");
  return c;
}

bool ModelConfig::any_sparse() const {
  for (auto s : sparse_layer)
    if (s) return true;
  return false;
}

std::string ModelConfig::summary() const {
  int ns = 0, nm = 0;
  for (int l = 0; l < n_layers; ++l) {
    ns += sparse_layer[l];
    nm += moe_layer[l];
  }
  std::ostringstream o;
  o << "layers " << n_layers << " (" << ns << " MSA, " << nm << " MoE), hidden " << hidden << ", heads " << n_heads
    << "/" << n_kv_heads << "x" << head_dim << ", vocab " << vocab << ", experts " << n_experts << " top-"
    << experts_per_tok << ", weights " << weight_format_name(dense_format) << "/experts "
    << weight_format_name(expert_format);
  if (quark.on)
    o << " (Quark: " << quark.exclude.size() << " exclude entries, input_tensors "
      << (quark.act_dynamic ? (quark.act_mode ? "dynamic MXFP4, floor scales" : "dynamic MXFP4, even scales")
                            : "none (weight-only)")
      << ")";
  if (ns) o << ", MSA block " << block_size << " top-" << topk_blocks << " init " << init_blocks;
  return o.str();
}

}  // namespace m3
