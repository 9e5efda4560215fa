// Bad checkpoints at the model level: each case ends in one m3::Error whose message names the
// file, tensor or config key and what was expected (never a crash). Also runs under ASan/UBSan.
#include <gtest/gtest.h>

#include "test_tmp.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "tiny_model_options.h"
#include "tools/make_model.h"
#include "model/model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A small m31-layout checkpoint made once per test binary, copied per test.
const std::string& base_model() {
  static const std::string dir = [] {
    const std::string d = m3test::test_tmp_dir() + "/loader_model_base";
    fs::remove_all(d);
    m3::MakeModelOptions o = m3test::tiny_model_options(m3::ModelLayout::M31, 5);
    o.shards = 2;
    m3::make_model(o, d);
    return d;
  }();
  return dir;
}

std::string fresh_copy(const std::string& name) {
  const std::string d = m3test::test_tmp_dir() + "/loader_model_" + name;
  fs::remove_all(d);
  fs::copy(base_model(), d, fs::copy_options::recursive);
  return d;
}

json read_json(const std::string& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_json(const std::string& p, const json& j) { std::ofstream(p) << j.dump(2); }

// Rewrites the shard holding `tensor` through `edit` (which may drop or change entries).
void rewrite_shard_of(const std::string& dir, const std::string& tensor,
                      const std::function<void(std::vector<m3::TensorData>&)>& edit) {
  auto idx = read_json(dir + "/model.safetensors.index.json");
  const std::string file = idx["weight_map"][tensor];
  std::vector<m3::TensorData> tensors;
  {
    m3::SafetensorsFile f(dir + "/" + file);
    for (const auto& [name, v] : f.tensors()) {
      m3::TensorData td;
      td.spec = {name, v.dtype, v.shape};
      td.bytes.assign(v.data, v.data + v.nbytes);
      tensors.push_back(std::move(td));
    }
  }
  edit(tensors);
  write_safetensors_file(dir + "/" + file, tensors);
}

std::string load_error(const std::string& dir) {
  try {
    m3::Model m(dir);
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

const std::string kQ = "language_model.model.layers.1.self_attn.q_proj.weight";

TEST(LoaderModel, BaseModelLoads) { EXPECT_EQ(load_error(base_model()), ""); }

TEST(LoaderModel, MissingTensorInShard) {
  const auto d = fresh_copy("missing_shard_entry");
  rewrite_shard_of(d, kQ, [](auto& t) { std::erase_if(t, [](auto& x) { return x.spec.name == kQ; }); });
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(kQ), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(LoaderModel, MissingTensorEverywhere) {
  const auto d = fresh_copy("missing_tensor");
  const std::string name = "language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight_scale";
  rewrite_shard_of(d, name, [&](auto& t) { std::erase_if(t, [&](auto& x) { return x.spec.name == name; }); });
  auto idx = read_json(d + "/model.safetensors.index.json");
  idx["weight_map"].erase(name);
  write_json(d + "/model.safetensors.index.json", idx);
  const auto msg = load_error(d);
  EXPECT_NE(msg.find("missing tensor " + name), std::string::npos) << msg;
}

TEST(LoaderModel, MisShapedTensor) {
  const auto d = fresh_copy("misshaped");
  rewrite_shard_of(d, kQ, [](auto& t) {
    for (auto& x : t)
      if (x.spec.name == kQ) {
        // Same bytes, transposed shape.
        std::swap(x.spec.shape[0], x.spec.shape[1]);
      }
  });
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(kQ), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [128, 64]"), std::string::npos) << msg;
}

TEST(LoaderModel, WrongDtype) {
  const auto d = fresh_copy("wrong_dtype");
  const std::string name = "language_model.model.layers.0.self_attn.k_proj.weight_scale_inv";
  rewrite_shard_of(d, name, [&](auto& t) {
    for (auto& x : t)
      if (x.spec.name == name) x.spec.dtype = m3::DType::I8;
  });
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected U8"), std::string::npos) << msg;
}

TEST(LoaderModel, NanScaleByteRejected) {
  const auto d = fresh_copy("nan_scale");
  const std::string name = "language_model.model.layers.0.self_attn.v_proj.weight_scale_inv";
  rewrite_shard_of(d, name, [&](auto& t) {
    for (auto& x : t)
      if (x.spec.name == name) x.bytes[3] = 0xff;
  });
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("NaN"), std::string::npos) << msg;
}

// An E4M3 NaN code among an MXFP8 weight's elements: refused at load, naming the tensor and where the
// code is (the fast kernels would read it as a finite 480 times the block scale).
TEST(LoaderModel, NanElementByteRejected) {
  const auto d = fresh_copy("nan_element");
  const std::string name = "language_model.model.layers.0.self_attn.k_proj.weight";
  int64_t cols = 0;
  rewrite_shard_of(d, name, [&](auto& t) {
    for (auto& x : t)
      if (x.spec.name == name) {
        cols = x.spec.shape[1];
        x.bytes[size_t(cols) + 5] = 0x7f;  // row 1, column 5
      }
  });
  ASSERT_GT(cols, 0);
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(name + ": NaN E4M3 element byte 0x7F at row 1, column 5"), std::string::npos) << msg;
}

TEST(LoaderModel, TruncatedShard) {
  const auto d = fresh_copy("truncated");
  const std::string shard = d + "/model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  const auto msg = load_error(d);
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(LoaderModel, CorruptHeader) {
  const auto d = fresh_copy("corrupt");
  const std::string shard = d + "/model-00001-of-00002.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(10);
  f.write("\x01\x02garbage", 9);
  f.close();
  const auto msg = load_error(d);
  EXPECT_NE(msg.find("model-00001-of-00002.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt header"), std::string::npos) << msg;
}

struct ConfigCase {
  const char* name;
  std::function<void(json&)> edit;
  const char* expect;  // substring of the message
};

class LoaderConfig : public testing::TestWithParam<ConfigCase> {};

TEST_P(LoaderConfig, RejectedWithKeyNamed) {
  const auto& c = GetParam();
  const auto d = fresh_copy(std::string("cfg_") + c.name);
  auto j = read_json(d + "/config.json");
  c.edit(j);
  write_json(d + "/config.json", j);
  const auto msg = load_error(d);
  EXPECT_NE(msg.find(c.expect), std::string::npos) << "message: " << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << "message: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LoaderConfig,
    testing::Values(
        ConfigCase{"no_hidden", [](json& j) { j["text_config"].erase("hidden_size"); }, "hidden_size: missing"},
        ConfigCase{"heads", [](json& j) { j["text_config"]["num_attention_heads"] = 3; }, "num_attention_heads"},
        ConfigCase{"freq_len",
                   [](json& j) { j["text_config"]["sparse_attention_config"]["sparse_attention_freq"] = {1, 1}; },
                   "sparse_attention_freq"},
        ConfigCase{"moe_len", [](json& j) { j["text_config"]["moe_layer_freq"] = {0, 1, 1}; }, "moe_layer_freq"},
        ConfigCase{"score_type",
                   [](json& j) { j["text_config"]["sparse_attention_config"]["sparse_score_type"] = "mean"; },
                   "sparse_score_type"},
        ConfigCase{"index_heads",
                   [](json& j) { j["text_config"]["sparse_attention_config"]["sparse_num_index_heads"] = 1; },
                   "sparse_num_index_heads"},
        ConfigCase{"topk_too_small",
                   [](json& j) { j["text_config"]["sparse_attention_config"]["sparse_topk_blocks"] = 1; },
                   "sparse_topk_blocks"},
        ConfigCase{"quant_method", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; }, "quant_method"},
        ConfigCase{"no_quant_config", [](json& j) { j.erase("quantization_config"); }, "quantization_config"},
        ConfigCase{"experts_per_tok", [](json& j) { j["text_config"]["num_experts_per_tok"] = 99; },
                   "num_experts_per_tok"},
        ConfigCase{"hidden_type", [](json& j) { j["text_config"]["hidden_size"] = "64"; }, "hidden_size"},
        ConfigCase{"dense_layer_with_index",
                   [](json& j) { j["text_config"]["sparse_attention_config"]["sparse_attention_freq"] = {0, 1, 1, 1}; },
                   "sparse_attention_freq[0] = 0"},
        ConfigCase{"hidden_mismatch", [](json& j) { j["text_config"]["hidden_size"] = 96; }, "expected ["}),
    [](const testing::TestParamInfo<ConfigCase>& i) { return std::string(i.param.name); });

TEST(LoaderModel, NotJsonConfig) {
  const auto d = fresh_copy("config_not_json");
  std::ofstream(d + "/config.json") << "{ \"text_config\": ";
  const auto msg = load_error(d);
  EXPECT_NE(msg.find("config.json: not valid JSON"), std::string::npos) << msg;
}

TEST(LoaderModel, MissingDirectory) {
  const auto msg = load_error(m3test::test_tmp_dir() + "/does_not_exist");
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

}  // namespace
