// Random-weight checkpoint generator behind `m3serve make-model`: writes a directory in the
// real Hugging Face release layout of MiniMax-M3 (BF16 or MXFP8) or MiniMax-M3.1 (MXFP8 +
// NVFP4 routed experts, or the AMD Quark MXFP4 export) with exactly the release tensor names, dtypes and config.json keys,
// plus a trained byte-level BPE tokenizer. Deterministic for a given seed and independent of
// thread count; tensors are generated and written one at a time (streaming).
#pragma once
#include <cstdint>
#include <string>

namespace m3 {

// M31Mxfp4: the M3.1 model plan as an AMD Quark OCP-MXFP4 export (the recipe's
// amd/MiniMax-M3.1-Flash-Quark-MXFP4 variant): every linear MXFP4 (weight U8 + weight_scale E8M0) except
// those the quantization_config's exclude list names (lm_head, the routers, the MSA index projections),
// dynamic MXFP4 activations.
enum class ModelLayout { M3Bf16, M3Mxfp8, M31, M31Mxfp4 };

// Parses "m3-bf16" | "m3-mxfp8" | "m31" | "m31-mxfp4"; throws m3::Error otherwise.
ModelLayout parse_model_layout(const std::string& s);
const char* model_layout_name(ModelLayout l);

struct MakeModelOptions {
  ModelLayout layout = ModelLayout::M31;
  uint64_t seed = 0;
  int shards = 1;
  int64_t hidden = 256;
  int64_t layers = 4;
  int64_t heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 32;
  int64_t rotary_dim = 16;
  int64_t vocab = 0;  // 0: 256 + merges learned + specials; larger: padded with filler tokens
  int64_t experts = 8;
  int64_t top_k = 2;
  int64_t moe_width = 128;
  int64_t shared_width = 128;
  int64_t dense_width = 512;
  int64_t dense_layers = 1;  // leading layers with a dense MLP (and, for M3 layouts, dense attention)
  int64_t index_heads = 2;
  int64_t index_dim = 32;
  int64_t block_size = 128;
  int64_t topk_blocks = 16;
  int64_t init_block = 0;
  int64_t local_block = 1;
  int64_t merges = 164;
  // > 0: also write a random-weight DSpark draft with this many layers into <out>/dspark/ (the
  // real folder's layout: BF16 fc / norms / Markov head, MXFP8 layers; block of 7, taps spread
  // over the target's layers), for timing speculative decoding on a model of any size.
  int64_t dspark_layers = 0;
  // The vision tower and projectors (model.md 3.6, the release's names and dtypes: FP32 patch embedding,
  // BF16 elsewhere; projector_hidden_size = hidden). vision_layers 0: a text-only checkpoint.
  int64_t vision_hidden = 64;
  int64_t vision_layers = 2;
  int64_t vision_heads = 4;
  int64_t vision_width = 128;  // intermediate_size
};

// Preset sizes ("tiny" = the golden tiny shapes, "small", "mid" ~1B parameters) for a layout.
MakeModelOptions make_model_preset(const std::string& preset, ModelLayout layout);

// Checks the options for consistency (divisibility, index heads == kv heads, ...); throws
// m3::Error naming the offending flag.
void validate_make_model_options(const MakeModelOptions& o);

struct MakeModelStats {
  int64_t num_tensors = 0;
  int64_t num_params = 0;  // logical weights (before quantisation)
  int64_t bytes = 0;       // safetensors data bytes
  int64_t vocab_size = 0;
};

// Writes the checkpoint into out_dir (created if needed).
MakeModelStats make_model(const MakeModelOptions& o, const std::string& out_dir);

}  // namespace m3
