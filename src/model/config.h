// ModelConfig: every number the forward pass needs, read from a checkpoint's config.json
// (M3 / M3.1 layouts: top level + text_config + sparse_attention_config + quantization_config).
// Nothing is inferred from the model name; missing optional keys take the spec's defaults
// (docs/model.md 2.7) and inconsistent values are rejected with the key named.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/quark_config.h"

namespace m3 {

// Plain = BF16 / F16 / F32 as stored; MXFP4 = OCP MXFP4 from AMD Quark (quark_config.h).
enum class WeightFormat { Plain, MXFP8, NVFP4, MXFP4 };
const char* weight_format_name(WeightFormat f);

struct ModelConfig {
  // Core shape.
  int hidden = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  int rotary_dim = 0;
  double rope_theta = 0;
  float rms_eps = 1e-6f;
  int64_t max_position_embeddings = 0;

  // FFN.
  int dense_inter = 0;   // dense_intermediate_size
  int moe_inter = 0;     // intermediate_size (each routed expert)
  int shared_inter = 0;  // shared_intermediate_size
  int n_experts = 0;
  int experts_per_tok = 0;
  int n_shared_experts = 0;
  bool use_routing_bias = true;
  float routed_scaling = 1.0f;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  float swiglu_beta = 1.0f;

  // Layer plan (one entry per layer).
  std::vector<uint8_t> moe_layer;     // moe_layer_freq
  std::vector<uint8_t> sparse_layer;  // sparse_attention_freq

  // MSA.
  int index_heads = 0;
  int index_dim = 0;
  int block_size = 0;
  int topk_blocks = 0;
  int local_blocks = 1;
  int init_blocks = 0;

  // Weight formats from quantization_config.
  WeightFormat dense_format = WeightFormat::Plain;   // attention, index, dense MLP, shared expert
  WeightFormat expert_format = WeightFormat::Plain;  // routed experts
  // quant_method "quark": MXFP4 for every linear its exclude list does not name (both formats above are
  // then MXFP4; format_of applies the exclude list).
  QuarkMxfp4 quark;
  // The format of linear `name` (tensor base name) whose category's format is `category`: Plain for a
  // module a Quark exclude list names, else `category`.
  WeightFormat format_of(const std::string& name, WeightFormat category) const {
    return quark.on && quark.excluded(name) ? WeightFormat::Plain : category;
  }

  int bos_id = -1;
  int eos_id = -1;

  std::string dir;  // checkpoint directory

  // `overrides`: a JSON object merged into config.json before it is read (vLLM's --hf-overrides; see
  // merge_config_overrides); empty: none.
  static ModelConfig from_dir(const std::string& dir, const std::string& overrides = "");
  // Parses config.json text; `where` names the file in messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& where);
  // config.json text with `overrides` (a JSON object's text) merged in, as vLLM applies hf_overrides:
  // a key naming a sub-config (text_config, vision_config, ...: an object under a key ending in
  // "_config", except quantization_config, a plain dict in transformers) is merged key by key,
  // recursively; any other key is replaced whole.
  static std::string merge_config_overrides(const std::string& text, const std::string& overrides,
                                            const std::string& where);

  bool any_sparse() const;
  int group_size() const { return n_heads / n_kv_heads; }
  std::string summary() const;
};

}  // namespace m3
