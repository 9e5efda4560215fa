// make-model: deterministic random-weight MiniMax-M3 / M3.1 checkpoints (see make_model.h).
// Every tensor's values depend only on (seed, tensor name, row), so the output is independent of
// thread count and of sharding; normals come from a hand-written Box-Muller transform because
// std::normal_distribution is not specified bit-exactly across standard libraries.
#include "tools/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "formats/dtype.h"
#include "base/error.h"
#include "formats/quantize.h"
#include "formats/safetensors_writer.h"
#include "tools/bpe_trainer.h"

namespace m3 {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

ModelLayout parse_model_layout(const std::string& s) {
  if (s == "m3-bf16") return ModelLayout::M3Bf16;
  if (s == "m3-mxfp8") return ModelLayout::M3Mxfp8;
  if (s == "m31") return ModelLayout::M31;
  if (s == "m31-mxfp4") return ModelLayout::M31Mxfp4;
  throw Error("--layout: unknown layout \"" + s + "\" (expected m3-bf16, m3-mxfp8, m31 or m31-mxfp4)");
}

const char* model_layout_name(ModelLayout l) {
  switch (l) {
    case ModelLayout::M3Bf16: return "m3-bf16";
    case ModelLayout::M3Mxfp8: return "m3-mxfp8";
    case ModelLayout::M31: return "m31";
    case ModelLayout::M31Mxfp4: return "m31-mxfp4";
  }
  return "?";
}

MakeModelOptions make_model_preset(const std::string& preset, ModelLayout layout) {
  MakeModelOptions o;
  o.layout = layout;
  const bool m31 = layout == ModelLayout::M31 || layout == ModelLayout::M31Mxfp4;
  o.init_block = m31 ? 1 : 0;
  if (preset == "tiny") {
    o.topk_blocks = m31 ? 3 : 16;  // as in the golden m31-tiny / m3-tiny
  } else if (preset == "small") {
    o.hidden = 512; o.layers = 4; o.heads = 8; o.kv_heads = 2; o.head_dim = 64; o.rotary_dim = 32;
    o.experts = 16; o.top_k = 2; o.moe_width = 256; o.shared_width = 256; o.dense_width = 1536;
    o.dense_layers = 1; o.index_heads = 2; o.index_dim = 64; o.topk_blocks = m31 ? 4 : 16;
    o.vocab = 4096; o.merges = 4096;
    o.vision_hidden = 256; o.vision_layers = 2; o.vision_heads = 4; o.vision_width = 1024;
  } else if (preset == "mid") {
    o.hidden = 2048; o.layers = 8; o.heads = 16; o.kv_heads = 4; o.head_dim = 128; o.rotary_dim = 64;
    o.experts = 32; o.top_k = 4; o.moe_width = 512; o.shared_width = 512; o.dense_width = 6144;
    o.dense_layers = 1; o.index_heads = 4; o.index_dim = 128; o.topk_blocks = 16;
    o.vocab = 32768; o.merges = 32768;
    // head_dim 80 as the real tower (78 RoPE dims + 2 passed through); the real dimensions are
    // --vision-hidden 1280 --vision-heads 16 --vision-layers 32 --vision-width 5120.
    o.vision_hidden = 640; o.vision_layers = 8; o.vision_heads = 8; o.vision_width = 2560;
  } else {
    throw Error("--preset: unknown preset \"" + preset + "\" (expected tiny, small or mid)");
  }
  return o;
}

void validate_make_model_options(const MakeModelOptions& o) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw Error("make-model: " + msg);
  };
  need(o.hidden > 0 && o.layers > 0 && o.heads > 0 && o.kv_heads > 0 && o.head_dim > 0 && o.experts > 0 &&
           o.top_k > 0 && o.moe_width > 0 && o.shared_width > 0 && o.dense_width > 0 && o.index_heads > 0 &&
           o.index_dim > 0 && o.block_size > 0 && o.topk_blocks > 0 && o.local_block >= 0 && o.init_block >= 0,
       "all sizes must be positive");
  need(o.vision_layers >= 0 && (o.vision_layers == 0 || (o.vision_hidden > 0 && o.vision_heads > 0 && o.vision_width > 0)),
       "--vision-hidden, --vision-heads and --vision-width must be positive (or --vision-layers 0 for no tower)");
  need(o.vision_layers == 0 || (o.vision_hidden % o.vision_heads == 0 && o.vision_hidden / o.vision_heads >= 6 &&
                                (o.vision_hidden / o.vision_heads) % 2 == 0),
       "--vision-hidden must be --vision-heads times an even head size of at least 6 (3-D RoPE)");
  need(o.heads % o.kv_heads == 0, "--heads must be a multiple of --kv-heads");
  need(o.index_heads == o.kv_heads, "--index-heads must equal --kv-heads (one index head per GQA group)");
  need(o.rotary_dim > 0 && o.rotary_dim <= o.head_dim && o.rotary_dim % 2 == 0,
       "--rotary-dim must be even and in (0, head_dim]");
  need(o.rotary_dim <= o.index_dim, "--rotary-dim must not exceed --index-dim (index q/k use the same RoPE)");
  need(o.top_k <= o.experts, "--top-k must not exceed --experts");
  need(o.dense_layers >= 0 && o.dense_layers <= o.layers, "--dense-layers must be in [0, layers]");
  need(o.shards >= 1, "--shards must be >= 1");
  need(o.merges >= 0, "--merges must be >= 0");
  need(o.dspark_layers >= 0, "--dspark-layers must be >= 0");
  need(o.dspark_layers == 0 || o.layout != ModelLayout::M3Bf16, "--dspark-layers needs a quantised layout (MXFP8 draft)");
  if (o.layout != ModelLayout::M3Bf16) {
    // Every quantised linear's input dimension is blocked by 32 (MXFP8) or 16 (NVFP4).
    for (auto [v, flag] : {std::pair{o.hidden, "--hidden"}, {o.heads * o.head_dim, "--heads x --head-dim"},
                           {o.dense_width, "--dense-width"}, {o.moe_width, "--moe-width"},
                           {o.shared_width, "--shared-width"}})
      need(v % 32 == 0, std::string(flag) + " must be a multiple of 32 for quantised layouts");
  }
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Fills out[n] with N(0, std^2) samples from a mt19937_64 seeded by (seed, name, row).
void gaussian_row(uint64_t seed, uint64_t name_hash, int64_t row, float stddev, float* out, int64_t n) {
  std::mt19937_64 rng(splitmix64(splitmix64(seed ^ name_hash) + uint64_t(row)));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    // u1 in (0, 1] so log(u1) is finite; u2 in [0, 1).
    const double u1 = (double((rng() >> 11) + 1)) * 0x1.0p-53;
    const double u2 = double(rng() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = float(r * std::cos(kTwoPi * u2) * stddev);
    if (i + 1 < n) out[i + 1] = float(r * std::sin(kTwoPi * u2) * stddev);
  }
}

enum class Fmt { BF16, F32, MXFP8, NVFP4, MXFP4 };

// Tensors smaller than this are generated on one thread (thread start-up would dominate).
constexpr int64_t kParallelMin = int64_t(1) << 18;

// One logical weight: a plain tensor (BF16 / F32) or a linear, possibly quantised into several
// checkpoint tensors.
struct Item {
  std::string base;  // linear: name without ".weight"; plain: full name
  Fmt fmt;
  int64_t rows, cols;  // cols = 0 for a vector
  float stddev;
};

void put_bf16(const float* x, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = float_to_bf16(x[i]);
    out[2 * i] = uint8_t(v);
    out[2 * i + 1] = uint8_t(v >> 8);
  }
}

// Little-endian host assumed for F32 payloads (x86-64 / aarch64), as in the reader.
class Generator {
 public:
  Generator(uint64_t seed, std::vector<Item> items) : seed_(seed), items_(std::move(items)) {
    for (size_t i = 0; i < items_.size(); ++i) {
      const Item& it = items_[i];
      const int64_t R = it.rows, C = it.cols;
      auto add = [&](const std::string& name, DType dt, std::vector<int64_t> shape, int part) {
        specs_.push_back({name, dt, std::move(shape)});
        where_[name] = {i, part};
      };
      std::vector<int64_t> shape = C ? std::vector<int64_t>{R, C} : std::vector<int64_t>{R};
      switch (it.fmt) {
        case Fmt::BF16: add(it.base, DType::BF16, shape, 0); break;
        case Fmt::F32: add(it.base, DType::F32, shape, 0); break;
        case Fmt::MXFP8:
          add(it.base + ".weight", DType::F8_E4M3, {R, C}, 0);
          add(it.base + ".weight_scale_inv", DType::U8, {R, C / 32}, 1);
          break;
        case Fmt::MXFP4:  // Quark OCP MXFP4: packed E2M1, E8M0 per 32
          add(it.base + ".weight", DType::U8, {R, C / 2}, 0);
          add(it.base + ".weight_scale", DType::U8, {R, C / 32}, 1);
          break;
        case Fmt::NVFP4:
          add(it.base + ".weight_packed", DType::U8, {R, C / 2}, 0);
          add(it.base + ".weight_scale", DType::F8_E4M3, {R, C / 16}, 1);
          add(it.base + ".weight_global_scale", DType::F32, {1}, 2);
          break;
      }
    }
  }

  const std::vector<TensorSpec>& specs() const { return specs_; }

  // A plain tensor written with another shape of the same element count (the vision Conv3d weight).
  void reshape(const std::string& name, std::vector<int64_t> shape) {
    for (auto& s : specs_)
      if (s.name == name) s.shape = std::move(shape);
  }
  // A plain tensor's values shifted by `offset` (LayerNorm weights around 1).
  void set_offset(const std::string& name, float offset) { offset_[name] = offset; }

  void produce(const TensorSpec& spec, std::vector<uint8_t>& out) {
    const auto [idx, part] = where_.at(spec.name);
    const Item& it = items_[idx];
    out.resize(spec.nbytes());
    if (it.fmt == Fmt::BF16 || it.fmt == Fmt::F32) {
      const int64_t R = it.cols ? it.rows : 1, C = it.cols ? it.cols : it.rows;
      const uint64_t h = hash_name(it.base);
      const bool bf16 = it.fmt == Fmt::BF16;
      const auto off_it = offset_.find(it.base);
      const float offset = off_it == offset_.end() ? 0.0f : off_it->second;
#pragma omp parallel if (R * C >= kParallelMin)
      {
        std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; ++r) {
          gaussian_row(seed_, h, r, it.stddev, row.data(), C);
          if (offset != 0.0f)
            for (float& x : row) x += offset;
          if (bf16) put_bf16(row.data(), C, out.data() + 2 * r * C);
          else std::memcpy(out.data() + 4 * r * C, row.data(), 4 * size_t(C));
        }
      }
      return;
    }
    if (cached_ != int64_t(idx)) quantize_item(idx);
    out = parts_[size_t(part)];
  }

 private:
  // Generates the BF16 master weight of a linear and quantises it into all its parts (the
  // scales are derived from BF16 weights, as in the golden checkpoints).
  void quantize_item(size_t idx) {
    const Item& it = items_[idx];
    const int64_t R = it.rows, C = it.cols;
    std::vector<float> w(size_t(R * C));
    const uint64_t h = hash_name(it.base + ".weight");
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
    for (int64_t r = 0; r < R; ++r) {
      float* row = w.data() + r * C;
      gaussian_row(seed_, h, r, it.stddev, row, C);
      for (int64_t c = 0; c < C; ++c) row[c] = bf16_to_float(float_to_bf16(row[c]));
    }
    parts_.assign(it.fmt == Fmt::NVFP4 ? 3 : 2, {});
    if (it.fmt == Fmt::MXFP4) {
      // Quark's weight rule: scale_calculation_mode "even", E2M1 round half to even.
      parts_[0].resize(size_t(R * (C / 2)));
      parts_[1].resize(size_t(R * (C / 32)));
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
      for (int64_t r = 0; r < R; ++r)
        mxfp4_quantize_row(w.data() + r * C, C, Mxfp4ScaleMode::Even, parts_[0].data() + r * (C / 2),
                           parts_[1].data() + r * (C / 32));
    } else if (it.fmt == Fmt::MXFP8) {
      parts_[0].resize(size_t(R * C));
      parts_[1].resize(size_t(R * (C / 32)));
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
      for (int64_t r = 0; r < R; ++r)
        mxfp8_quantize_row(w.data() + r * C, C, parts_[0].data() + r * C, parts_[1].data() + r * (C / 32));
    } else {
      parts_[0].resize(size_t(R * (C / 2)));
      parts_[1].resize(size_t(R * (C / 16)));
      float amax = 0.0f;
      for (float v : w) amax = std::max(amax, std::fabs(v));
      const float global = nvfp4_global_scale(amax);
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
      for (int64_t r = 0; r < R; ++r)
        nvfp4_quantize_row(w.data() + r * C, C, global, parts_[0].data() + r * (C / 2),
                           parts_[1].data() + r * (C / 16));
      parts_[2].resize(4);
      std::memcpy(parts_[2].data(), &global, 4);
    }
    cached_ = int64_t(idx);
  }

  uint64_t seed_;
  std::vector<Item> items_;
  std::vector<TensorSpec> specs_;
  std::map<std::string, std::pair<size_t, int>> where_;
  std::map<std::string, float> offset_;
  int64_t cached_ = -1;
  std::vector<std::vector<uint8_t>> parts_;
};

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(p.string() + ": cannot open for writing");
  f << s;
  if (!f) throw Error(p.string() + ": write failed");
}

ojson int_list(const std::vector<int>& v) {
  ojson a = ojson::array();
  for (int x : v) a.push_back(x);
  return a;
}

// The DSpark draft folder (docs/model.md 3.8 names and config keys), random weights.
void write_dspark(const MakeModelOptions& o, const TrainedTokenizer& tok, int64_t V, const fs::path& dir) {
  const int64_t H = o.hidden, R = 32, S = 7, F = o.dense_width, L = o.dspark_layers;
  std::vector<int> taps;
  const int64_t ntaps = std::min<int64_t>(5, o.layers);
  for (int64_t i = 0; i < ntaps; ++i) taps.push_back(int(o.layers == 1 ? 0 : i * (o.layers - 1) / std::max<int64_t>(1, ntaps - 1)));
  int noise = int(V - 1);
  const auto tj = nlohmann::json::parse(tok.tokenizer_json);
  for (const auto& a : tj["added_tokens"])
    if (a["content"] == "]<]minimax[>[") noise = a["id"].get<int>();
  std::vector<Item> items;
  const std::string P = "language_model.model.dspark.";
  auto lin = [&](const std::string& base, int64_t n, int64_t k) { items.push_back({base, Fmt::MXFP8, n, k, 1.0f / std::sqrt(float(k))}); };
  auto norm = [&](const std::string& name, int64_t n) { items.push_back({name, Fmt::BF16, n, 0, 0.1f}); };
  items.push_back({P + "fc.weight", Fmt::BF16, H, ntaps * H, 1.0f / std::sqrt(float(ntaps * H))});
  norm(P + "hidden_norm.weight", H);
  norm(P + "final_norm.weight", H);
  items.push_back({P + "markov_head.markov_w1.weight", Fmt::BF16, V, R, 0.02f});
  items.push_back({P + "markov_head.markov_w2.weight", Fmt::BF16, V, R, 0.02f});
  items.push_back({P + "confidence_head.proj.weight", Fmt::BF16, 1, H + R, 0.02f});
  items.push_back({P + "confidence_head.proj.bias", Fmt::BF16, 1, 0, 0.02f});
  for (int64_t l = 0; l < L; ++l) {
    const std::string B = P + "layers." + std::to_string(l) + ".decoder_layer.";
    norm(B + "input_layernorm.weight", H);
    norm(B + "post_attention_layernorm.weight", H);
    norm(B + "self_attn.q_norm.weight", o.head_dim);
    norm(B + "self_attn.k_norm.weight", o.head_dim);
    lin(B + "self_attn.q_proj", o.heads * o.head_dim, H);
    lin(B + "self_attn.k_proj", o.kv_heads * o.head_dim, H);
    lin(B + "self_attn.v_proj", o.kv_heads * o.head_dim, H);
    lin(B + "self_attn.o_proj", H, o.heads * o.head_dim);
    lin(B + "mlp.gate_proj", F, H);
    lin(B + "mlp.up_proj", F, H);
    lin(B + "mlp.down_proj", H, F);
  }
  Generator gen(o.seed ^ 0xd5a7c0ffee11ull, std::move(items));
  fs::create_directories(dir);
  write_safetensors_checkpoint(dir.string(), gen.specs(), 1,
                               [&](const TensorSpec& s, std::vector<uint8_t>& out) { gen.produce(s, out); });
  ojson tc;
  tc["num_hidden_layers"] = L;
  tc["layer_types"] = ojson::array();
  for (int64_t l = 0; l < L; ++l) tc["layer_types"].push_back("sliding_attention");
  tc["sliding_window"] = 4096;
  tc["hidden_size"] = H;
  tc["vocab_size"] = V;
  tc["num_attention_heads"] = o.heads;
  tc["num_key_value_heads"] = o.kv_heads;
  tc["head_dim"] = o.head_dim;
  tc["rotary_dim"] = o.rotary_dim;
  tc["partial_rotary_factor"] = double(o.rotary_dim) / double(o.head_dim);
  tc["rope_theta"] = 5000000;
  tc["rms_norm_eps"] = 1e-06;
  tc["hidden_act"] = "swigluoai";
  tc["swiglu_alpha"] = 1.702;
  tc["swiglu_limit"] = 7.0;
  tc["dense_intermediate_size"] = F;
  tc["dspark_ffn_hidden_size"] = F;
  tc["moe_layer_freq"] = ojson::array();
  for (int64_t l = 0; l < L; ++l) tc["moe_layer_freq"].push_back(0);
  tc["use_gemma_norm"] = true;
  tc["use_qk_norm"] = true;
  tc["qk_norm_type"] = "per_head";
  tc["sparse_attention_config"] = nullptr;
  tc["dspark_block_size"] = S;
  tc["dspark_noise_token_id"] = noise;
  tc["dspark_target_layer_ids"] = int_list(taps);
  tc["dspark_markov_rank"] = R;
  tc["dspark_markov_head_type"] = "vanilla";
  tc["enable_confidence_head"] = true;
  tc["confidence_head_with_markov"] = true;
  tc["dspark_config"] = ojson{{"hybrid_context_fusion", false}};
  ojson cfg;
  cfg["architectures"] = ojson::array({"DSparkMiniMaxDraftModel"});
  cfg["model_type"] = "dspark_minimax_m3";
  cfg["text_config"] = tc;
  cfg["torch_dtype"] = "bfloat16";
  cfg["quantization_config"] = ojson{{"quant_method", "mxfp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                     {"weight_block_size", ojson::array({1, 32})}};
  write_text(dir / "config.json", cfg.dump(2) + "\n");
}

// quantization_config as AMD Quark's export writes it for OCP MXFP4 (W4A4, dynamic activations), the keys
// in Quark's order.
ojson quark_mxfp4_config() {
  auto spec = [](bool dynamic) {
    ojson s;
    s["dtype"] = "fp4";
    s["is_dynamic"] = dynamic;
    s["qscheme"] = "per_group";
    s["ch_axis"] = -1;
    s["group_size"] = 32;
    s["block_size"] = nullptr;
    s["symmetric"] = nullptr;
    s["round_method"] = "half_even";
    s["scale_type"] = "float";
    s["scale_format"] = "e8m0";
    s["scale_calculation_mode"] = "even";
    s["mx_element_dtype"] = nullptr;
    s["observer_cls"] = "PerBlockMXObserver";
    s["is_scale_quant"] = false;
    return s;
  };
  ojson g;
  g["input_tensors"] = spec(true);
  g["output_tensors"] = nullptr;
  g["weight"] = spec(false);
  g["bias"] = nullptr;
  g["target_device"] = nullptr;
  ojson q;
  q["global_quant_config"] = g;
  q["exclude"] = ojson::array({"language_model.lm_head", "re:.*block_sparse_moe\\.gate$",
                               "re:.*self_attn\\.index_[qk]_proj$",
                               // the vision tower and its projectors stay unquantised, as in the other layouts
                               "re:^vision_tower\\..*", "re:^multi_modal_projector\\..*",
                               "re:^patch_merge_mlp\\..*"});
  q["algo_config"] = nullptr;
  q["softmax_quant_spec"] = nullptr;
  q["quant_method"] = "quark";
  q["layer_type_quant_config"] = ojson::object();
  q["layer_quant_config"] = ojson::object();
  q["kv_cache_quant_config"] = ojson::object();
  q["kv_cache_post_rope"] = false;
  q["quant_mode"] = "eager_mode";
  q["export"] = ojson{{"kv_cache_group", ojson::array()}, {"min_kv_scale", 0.0}, {"pack_method", "reorder"},
                      {"weight_format", "real_quantized"}, {"weight_merge_groups", nullptr}};
  return q;
}

}  // namespace

MakeModelStats make_model(const MakeModelOptions& o, const std::string& out_dir) {
  validate_make_model_options(o);
  const bool quark = o.layout == ModelLayout::M31Mxfp4;
  const bool m31 = o.layout == ModelLayout::M31 || quark;
  const Fmt lin = o.layout == ModelLayout::M3Bf16 ? Fmt::BF16 : quark ? Fmt::MXFP4 : Fmt::MXFP8;
  const Fmt expert = quark ? Fmt::MXFP4 : m31 ? Fmt::NVFP4 : lin;
  // The Quark layout keeps the MSA index projections BF16 (its exclude list names them): they pick the
  // attended blocks, and docs/model.md 3.7 warns against quantising them below the checkpoint's precision.
  const Fmt index_fmt = quark ? Fmt::BF16 : lin;

  const TrainedTokenizer tok = train_byte_bpe(o.merges, o.vocab);
  const int64_t V = tok.vocab_size, H = o.hidden;

  // Layer plan: the leading dense_layers have a dense MLP; M3 layouts also use dense attention
  // there, M3.1 runs MSA on every layer.
  std::vector<int> moe_freq, sparse_freq;
  for (int64_t l = 0; l < o.layers; ++l) {
    moe_freq.push_back(l < o.dense_layers ? 0 : 1);
    sparse_freq.push_back(m31 || l >= o.dense_layers ? 1 : 0);
  }

  std::vector<Item> items;
  auto linear = [&](const std::string& base, int64_t n, int64_t k, Fmt f) {
    // BF16 linears are plain tensors named <base>.weight.
    if (f == Fmt::BF16) items.push_back({base + ".weight", Fmt::BF16, n, k, 1.0f / std::sqrt(float(k))});
    else items.push_back({base, f, n, k, 1.0f / std::sqrt(float(k))});
  };
  auto norm = [&](const std::string& name, int64_t n) { items.push_back({name, Fmt::BF16, n, 0, 0.1f}); };
  const std::string P = "language_model.model.";
  items.push_back({P + "embed_tokens.weight", Fmt::BF16, V, H, 0.5f});
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string L = P + "layers." + std::to_string(l) + ".";
    norm(L + "input_layernorm.weight", H);
    linear(L + "self_attn.q_proj", o.heads * o.head_dim, H, lin);
    linear(L + "self_attn.k_proj", o.kv_heads * o.head_dim, H, lin);
    linear(L + "self_attn.v_proj", o.kv_heads * o.head_dim, H, lin);
    linear(L + "self_attn.o_proj", H, o.heads * o.head_dim, lin);
    norm(L + "self_attn.q_norm.weight", o.head_dim);
    norm(L + "self_attn.k_norm.weight", o.head_dim);
    if (sparse_freq[size_t(l)]) {
      linear(L + "self_attn.index_q_proj", o.index_heads * o.index_dim, H, index_fmt);
      linear(L + "self_attn.index_k_proj", o.index_dim, H, index_fmt);
      norm(L + "self_attn.index_q_norm.weight", o.index_dim);
      norm(L + "self_attn.index_k_norm.weight", o.index_dim);
    }
    norm(L + "post_attention_layernorm.weight", H);
    if (!moe_freq[size_t(l)]) {
      linear(L + "mlp.gate_proj", o.dense_width, H, lin);
      linear(L + "mlp.up_proj", o.dense_width, H, lin);
      linear(L + "mlp.down_proj", H, o.dense_width, lin);
    } else {
      const std::string M = L + "block_sparse_moe.";
      items.push_back({M + "gate.weight", Fmt::F32, o.experts, H, 1.0f / std::sqrt(float(H))});
      items.push_back({M + "e_score_correction_bias", Fmt::F32, o.experts, 0, 0.01f});
      for (int64_t e = 0; e < o.experts; ++e) {
        const std::string E = M + "experts." + std::to_string(e) + ".";
        linear(E + "w1", o.moe_width, H, expert);
        linear(E + "w2", H, o.moe_width, expert);
        linear(E + "w3", o.moe_width, H, expert);
      }
      linear(M + "shared_experts.gate_proj", o.shared_width, H, lin);
      linear(M + "shared_experts.up_proj", o.shared_width, H, lin);
      linear(M + "shared_experts.down_proj", H, o.shared_width, lin);
    }
  }
  norm(P + "norm.weight", H);
  items.push_back({"language_model.lm_head.weight", Fmt::BF16, V, H, 1.0f / std::sqrt(float(H))});
  if (o.vision_layers > 0) {
    const int64_t VH = o.vision_hidden, VI = o.vision_width;
    const std::string VM = "vision_tower.vision_model.";
    auto vlin = [&](const std::string& base, int64_t n, int64_t k) {
      items.push_back({base + ".weight", Fmt::BF16, n, k, 1.0f / std::sqrt(float(k))});
      items.push_back({base + ".bias", Fmt::BF16, n, 0, 0.02f});
    };
    auto ln = [&](const std::string& base, int64_t n) {
      items.push_back({base + ".weight", Fmt::BF16, n, 0, 0.1f});  // 1 + N(0, 0.1^2): set_offset below
      items.push_back({base + ".bias", Fmt::BF16, n, 0, 0.02f});
    };
    // The Conv3d weight [VH, 3, 2, 14, 14] is written as [VH, 1176] rows (same bytes), then reshaped.
    items.push_back({VM + "embeddings.patch_embedding.weight", Fmt::F32, VH, 3 * 2 * 14 * 14,
                     1.0f / std::sqrt(1176.0f)});
    ln(VM + "pre_layrnorm", VH);
    for (int64_t l = 0; l < o.vision_layers; ++l) {
      const std::string L = VM + "encoder.layers." + std::to_string(l) + ".";
      ln(L + "layer_norm1", VH);
      ln(L + "layer_norm2", VH);
      vlin(L + "self_attn.q_proj", VH, VH);
      vlin(L + "self_attn.k_proj", VH, VH);
      vlin(L + "self_attn.v_proj", VH, VH);
      vlin(L + "self_attn.out_proj", VH, VH);
      vlin(L + "mlp.fc1", VI, VH);
      vlin(L + "mlp.fc2", VH, VI);
    }
    vlin("multi_modal_projector.linear_1", H, VH);
    vlin("multi_modal_projector.linear_2", H, H);
    vlin("patch_merge_mlp.linear_1", H, 4 * H);
    vlin("patch_merge_mlp.linear_2", H, H);
  }

  MakeModelStats st;
  st.vocab_size = V;
  for (const auto& it : items) st.num_params += it.rows * (it.cols ? it.cols : 1);

  Generator gen(o.seed, std::move(items));
  if (o.vision_layers > 0) {
    const std::string VM = "vision_tower.vision_model.";
    gen.reshape(VM + "embeddings.patch_embedding.weight", {o.vision_hidden, 3, 2, 14, 14});
    gen.set_offset(VM + "pre_layrnorm.weight", 1.0f);
    for (int64_t l = 0; l < o.vision_layers; ++l)
      for (const char* n : {"layer_norm1.weight", "layer_norm2.weight"})
        gen.set_offset(VM + "encoder.layers." + std::to_string(l) + "." + n, 1.0f);
  }
  for (const auto& s : gen.specs()) st.bytes += int64_t(s.nbytes());
  st.num_tensors = int64_t(gen.specs().size());

  const fs::path dir(out_dir);
  fs::create_directories(dir);
  // Remove checkpoint files of an earlier run so a re-run with other --shards stays consistent.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || n == "model.safetensors.index.json") fs::remove(e.path());
  }
  write_safetensors_checkpoint(out_dir, gen.specs(), o.shards,
                               [&](const TensorSpec& s, std::vector<uint8_t>& out) { gen.produce(s, out); });

  // config.json, with the key order of the release files.
  ojson sac;
  sac["use_sparse_attention"] = true;
  sac["sparse_index_dim"] = o.index_dim;
  sac["sparse_num_index_heads"] = o.index_heads;
  sac["sparse_topk_blocks"] = o.topk_blocks;
  sac["sparse_block_size"] = o.block_size;
  sac["sparse_disable_index_value"] = int_list(sparse_freq);
  sac["sparse_score_type"] = "max";
  sac["sparse_init_block"] = o.init_block;
  sac["sparse_local_block"] = o.local_block;
  sac["sparse_attention_freq"] = int_list(sparse_freq);
  ojson tc;
  tc["hidden_size"] = H;
  tc["intermediate_size"] = o.moe_width;
  tc["num_hidden_layers"] = o.layers;
  tc["num_attention_heads"] = o.heads;
  tc["num_key_value_heads"] = o.kv_heads;
  tc["head_dim"] = o.head_dim;
  tc["vocab_size"] = V;
  tc["max_position_embeddings"] = 1048576;
  tc["rms_norm_eps"] = 1e-06;
  tc["use_gemma_norm"] = true;
  tc["attention_output_gate"] = false;
  tc["rope_theta"] = 5000000;
  tc["rotary_dim"] = o.rotary_dim;
  tc["partial_rotary_factor"] = double(o.rotary_dim) / double(o.head_dim);
  tc["hidden_act"] = "swigluoai";
  tc["use_qk_norm"] = true;
  tc["tie_word_embeddings"] = false;
  tc["dense_intermediate_size"] = o.dense_width;
  tc["shared_intermediate_size"] = o.shared_width;
  tc["num_local_experts"] = o.experts;
  tc["num_experts_per_tok"] = o.top_k;
  tc["n_shared_experts"] = 1;
  tc["scoring_func"] = "sigmoid";
  tc["use_routing_bias"] = true;
  tc["moe_layer_freq"] = int_list(moe_freq);
  tc["qk_norm_type"] = "per_head";
  tc["num_mtp_modules"] = 0;
  tc["num_nextn_predict_layers"] = 0;
  tc["swiglu_alpha"] = 1.702;
  tc["swiglu_limit"] = 7.0;
  tc["routed_scaling_factor"] = 2.0;
  tc["sparse_attention_config"] = sac;
  tc["bos_token_id"] = tok.bos_id;
  tc["eos_token_id"] = tok.eos_id;
  tc["torch_dtype"] = "bfloat16";
  tc["architectures"] = ojson::array({"MiniMaxM3SparseForCausalLM"});
  tc["model_type"] = "minimax_m3";
  ojson cfg;
  cfg["architectures"] = ojson::array({"MiniMaxM3SparseForConditionalGeneration"});
  cfg["model_type"] = "minimax_m3_vl";
  cfg["text_config"] = tc;
  cfg["torch_dtype"] = "bfloat16";
  if (o.vision_layers > 0) {
    const ojson comp = {{"image_token_compression_method", "patch_merge"}, {"spatial_merge_size", 2},
                        {"temporal_patch_size", 2}};
    // The real placeholder ids when the vocabulary reaches them. A small vocabulary has no image tokens,
    // so two specials no chat template renders (the M2 role markers ]!p~[ and ]!d~[) stand in: the
    // server puts image embeddings at those positions, and the template's own text never holds them.
    int image_id = 200025, video_id = 200026;
    if (V <= 200026) {
      const auto tj = nlohmann::json::parse(tok.tokenizer_json);
      for (const auto& a : tj["added_tokens"]) {
        if (a["content"] == "]!p~[") image_id = a["id"].get<int>();
        if (a["content"] == "]!d~[") video_id = a["id"].get<int>();
      }
    }
    cfg["image_token_index"] = image_id;
    cfg["video_token_index"] = video_id;
    cfg["projector_hidden_size"] = H;
    cfg["projector_hidden_act"] = "gelu";
    cfg["multimodal_projector_bias"] = true;
    cfg["vision_feature_layer"] = -1;
    cfg["vision_feature_select_strategy"] = "full";
    cfg["img_token_compression_config"] = comp;
    cfg["image_seq_length"] = 576;
    ojson vc;
    vc["model_type"] = "clip_vision_model";
    vc["hidden_size"] = o.vision_hidden;
    vc["num_attention_heads"] = o.vision_heads;
    vc["num_hidden_layers"] = o.vision_layers;
    vc["intermediate_size"] = o.vision_width;
    vc["patch_size"] = 14;
    vc["image_size"] = 2016;
    vc["num_channels"] = 3;
    vc["hidden_act"] = "gelu";
    vc["layer_norm_eps"] = 1e-5;
    vc["position_embedding_type"] = "rope";
    vc["rope_mode"] = "3d";
    vc["rope_theta"] = 10000.0;
    vc["projection_dim"] = H;
    vc["vision_segment_max_frames"] = 4;
    vc["img_token_compression_config"] = comp;
    cfg["vision_config"] = vc;
  }
  if (quark) {
    cfg["quantization_config"] = quark_mxfp4_config();
  } else if (o.layout != ModelLayout::M3Bf16) {
    ojson q;
    q["quant_method"] = "mxfp8";
    q["fmt"] = "e4m3";
    q["activation_scheme"] = "dynamic";
    q["weight_block_size"] = ojson::array({1, 32});
    if (m31) {
      q["moe_quant_algo"] = "NVFP4";
      q["moe_quant_format"] = "nvfp4-pack-quantized";
      q["moe_group_size"] = 16;
    }
    q["modules_to_not_convert"] = ojson::array({"language_model.lm_head", "language_model.model.embed_tokens",
                                   "re:.*block_sparse_moe\\.gate$"});
    cfg["quantization_config"] = q;
  }
  write_text(dir / "config.json", cfg.dump(2) + "\n");
  ojson gc;
  gc["bos_token_id"] = tok.bos_id;
  gc["eos_token_id"] = tok.eos_id;
  gc["do_sample"] = false;
  write_text(dir / "generation_config.json", gc.dump() + "\n");
  write_text(dir / "tokenizer.json", tok.tokenizer_json);
  write_text(dir / "tokenizer_config.json", tok.tokenizer_config_json);
  write_text(dir / "special_tokens_map.json", tok.special_tokens_map_json);
  if (o.dspark_layers > 0) write_dspark(o, tok, V, dir / "dspark");
  return st;
}

}  // namespace m3
