// AMD Quark MXFP4 checkpoints at load: the module coverage read from quantization_config's exclude list
// (what make-model --layout m31-mxfp4 writes: everything MXFP4 but lm_head, the routers and the index
// projections), the exclude matching rules, and one clear m3::Error naming the key and value for every
// Quark variant we do not run, or naming the tensor when the checkpoint and its config disagree. Also runs
// under ASan/UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/model.h"
#include "model/quark_config.h"
#include "test_tmp.h"
#include "tiny_model_options.h"
#include "tools/make_model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string& base_model() {
  static const std::string dir = [] {
    const std::string d = m3test::test_tmp_dir() + "/loader_quark_base";
    fs::remove_all(d);
    m3::MakeModelOptions o = m3test::tiny_model_options(m3::ModelLayout::M31Mxfp4, 3);
    m3::make_model(o, d);
    return d;
  }();
  return dir;
}

// A copy whose config.json quantization_config went through `edit`.
std::string with_quant(const std::string& name, const std::function<void(json&)>& edit) {
  const std::string d = m3test::test_tmp_dir() + "/loader_quark_" + name;
  fs::remove_all(d);
  fs::copy(base_model(), d, fs::copy_options::recursive);
  json cfg;
  {
    std::ifstream in(d + "/config.json");
    cfg = json::parse(in);
  }
  edit(cfg["quantization_config"]);
  std::ofstream(d + "/config.json") << cfg.dump(2);
  return d;
}

std::string load_error(const std::string& dir, const m3::ModelOptions& mo = {}) {
  try {
    m3::Model m(dir, mo);
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LoaderQuark, CoverageFromExcludeList) {
  m3::Model m(base_model());
  const m3::ModelConfig& c = m.config();
  ASSERT_TRUE(c.quark.on);
  EXPECT_TRUE(c.quark.act_dynamic);
  const m3::Weights& w = m.weights();
  EXPECT_EQ(w.lm_head().kind, m3::LinearKind::BF16);
  int mx = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const m3::LayerWeights& L = w.layer(l);
    EXPECT_EQ(L.attn.q.kind, m3::LinearKind::MXFP4) << l;
    EXPECT_EQ(L.attn.o.kind, m3::LinearKind::MXFP4) << l;
    EXPECT_EQ(L.attn.index_q.kind, m3::LinearKind::BF16) << l;  // excluded: re:.*self_attn\.index_[qk]_proj$
    EXPECT_EQ(L.attn.index_k.kind, m3::LinearKind::BF16) << l;
    if (c.moe_layer[size_t(l)]) {
      EXPECT_EQ(L.experts[0].gate.kind, m3::LinearKind::MXFP4);
      EXPECT_EQ(L.experts[0].down.kind, m3::LinearKind::MXFP4);
      EXPECT_EQ(L.shared.up.kind, m3::LinearKind::MXFP4);
    } else {
      EXPECT_EQ(L.mlp.gate.kind, m3::LinearKind::MXFP4);
    }
    mx += L.attn.q.kind == m3::LinearKind::MXFP4;
  }
  EXPECT_EQ(mx, c.n_layers);
  EXPECT_GT(m.mxfp4_activation_matrices(), 0);
  m3::ModelOptions exact;
  exact.mxfp4_activations = "fp32";
  EXPECT_EQ(m3::Model(base_model(), exact).mxfp4_activation_matrices(), 0);
}

TEST(LoaderQuark, ExcludeMatching) {
  m3::QuarkMxfp4 q;
  q.on = true;
  q.exclude = {"lm_head", "re:.*block_sparse_moe\\.gate$", "model.layers.0.self_attn.q_proj", "*.shared_experts.*"};
  EXPECT_TRUE(q.excluded("language_model.lm_head"));  // without the language_model. prefix
  EXPECT_TRUE(q.excluded("lm_head"));
  EXPECT_TRUE(q.excluded("language_model.model.layers.3.block_sparse_moe.gate"));
  EXPECT_FALSE(q.excluded("language_model.model.layers.3.block_sparse_moe.gate_proj"));  // $ anchors the end
  EXPECT_TRUE(q.excluded("language_model.model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(q.excluded("language_model.model.layers.10.self_attn.q_proj"));  // exact names are exact
  EXPECT_TRUE(q.excluded("language_model.model.layers.5.block_sparse_moe.shared_experts.up_proj"));
  EXPECT_FALSE(q.excluded("language_model.model.layers.5.block_sparse_moe.experts.1.w1"));
  q.exclude = {"model.language_model.layers.2.mlp.down_proj"};  // transformers' newer module path
  EXPECT_TRUE(q.excluded("language_model.model.layers.2.mlp.down_proj"));
  EXPECT_FALSE(q.excluded("language_model.model.layers.2.mlp.up_proj"));
  q.exclude = {"re:self_attn"};  // re.match: anchored at the start of the name
  EXPECT_FALSE(q.excluded("language_model.model.layers.0.self_attn.q_proj"));
}

TEST(LoaderQuark, UnsupportedVariantsNameKeyAndValue) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    std::vector<std::string> want;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"wdtype", [](json& q) { q["global_quant_config"]["weight"]["dtype"] = "fp8_e4m3"; },
       {"quantization_config.global_quant_config.weight.dtype", "\"fp8_e4m3\""}},
      {"group", [](json& q) { q["global_quant_config"]["weight"]["group_size"] = 16; },
       {"global_quant_config.weight.group_size", "16"}},
      {"scalefmt", [](json& q) { q["global_quant_config"]["input_tensors"]["scale_format"] = "e4m3"; },
       {"global_quant_config.input_tensors.scale_format", "\"e4m3\""}},
      {"static_act", [](json& q) { q["global_quant_config"]["input_tensors"]["is_dynamic"] = false; },
       {"global_quant_config.input_tensors.is_dynamic", "static"}},
      {"mode", [](json& q) { q["global_quant_config"]["input_tensors"]["scale_calculation_mode"] = "ceil"; },
       {"input_tensors.scale_calculation_mode", "\"ceil\""}},
      {"output", [](json& q) { q["global_quant_config"]["output_tensors"] = q["global_quant_config"]["weight"]; },
       {"global_quant_config.output_tensors"}},
      {"layer", [](json& q) {
         json other = q["global_quant_config"];
         other["weight"]["group_size"] = 64;
         q["layer_quant_config"] = {{"*.experts.*", other}};
       }, {"quantization_config.layer_quant_config", "*.experts.*"}},
      {"layer_type", [](json& q) { q["layer_type_quant_config"] = {{"Linear", q["global_quant_config"]}}; },
       {"quantization_config.layer_type_quant_config"}},
      {"kv", [](json& q) { q["kv_cache_quant_config"] = {{"*k_proj", {{"dtype", "fp8_e4m3"}}}}; },
       {"quantization_config.kv_cache_quant_config"}},
      {"pack", [](json& q) { q["export"]["pack_method"] = "order"; }, {"export.pack_method", "\"order\""}},
      {"fake", [](json& q) { q["export"]["weight_format"] = "fake_quantized"; },
       {"export.weight_format", "\"fake_quantized\""}},
      {"rotation", [](json& q) { q["algo_config"] = json::array({{{"name", "rotation"}}}); },
       {"quantization_config.algo_config", "rotation"}},
      {"badre", [](json& q) { q["exclude"].push_back("re:(unclosed"); }, {"quantization_config.exclude", "re:(unclosed"}},
  };
  for (const Case& c : cases) {
    const std::string msg = load_error(with_quant(c.name, c.edit));
    ASSERT_FALSE(msg.empty()) << c.name << ": loaded";
    for (const std::string& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(LoaderQuark, ConfigAndTensorsDisagree) {
  // The index projections are BF16 in the checkpoint: without their exclude entry the config makes them MXFP4.
  std::string msg = load_error(with_quant("noidx", [](json& q) { q["exclude"].erase(2); }));
  EXPECT_NE(msg.find("self_attn.index_q_proj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("weight_scale"), std::string::npos) << msg;
  // Excluding an MXFP4 module: its tensors are MXFP4, the config says unquantised.
  msg = load_error(with_quant("exk", [](json& q) { q["exclude"].push_back("re:.*self_attn\\.k_proj$"); }));
  EXPECT_NE(msg.find("self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MXFP4 weight found"), std::string::npos) << msg;
  // A weight-only Quark config (no input_tensors) refuses the W4A4 mode by name, and runs exact by default.
  const std::string wo = with_quant("weight_only", [](json& q) { q["global_quant_config"]["input_tensors"] = nullptr; });
  m3::ModelOptions mo;
  mo.mxfp4_activations = "mxfp4";
  msg = load_error(wo, mo);
  EXPECT_NE(msg.find("--mxfp4-activations mxfp4"), std::string::npos) << msg;
  EXPECT_EQ(m3::Model(wo).mxfp4_activation_matrices(), 0);
  mo.mxfp4_activations = "int4";
  msg = load_error(base_model(), mo);
  EXPECT_NE(msg.find("--mxfp4-activations: unknown value \"int4\""), std::string::npos) << msg;
}
