// --hf-overrides (vLLM's hf_overrides) merged into config.json before ModelConfig reads it: sub-configs
// merged key by key, other keys replaced whole, the result read by from_dir.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "model/config.h"

TEST(ConfigOverrides, SubConfigsMergedOtherKeysReplaced) {
  const std::string cfg =
      R"({"text_config": {"hidden_size": 8, "num_hidden_layers": 4}, "quantization_config": {"a": 1, "b": 2},
          "rope_scaling": {"type": "x", "factor": 2}, "vocab_size": 10})";
  const auto out = nlohmann::json::parse(m3::ModelConfig::merge_config_overrides(
      cfg,
      R"({"text_config": {"num_hidden_layers": 2}, "quantization_config": {"a": 3}, "rope_scaling": {"factor": 4},
          "new_key": true})",
      "config.json"));
  EXPECT_EQ(out["text_config"]["hidden_size"], 8);  // merged: the other keys stay
  EXPECT_EQ(out["text_config"]["num_hidden_layers"], 2);
  EXPECT_EQ(out["quantization_config"], nlohmann::json::parse(R"({"a": 3})"));  // a plain dict: replaced
  EXPECT_EQ(out["rope_scaling"], nlohmann::json::parse(R"({"factor": 4})"));
  EXPECT_EQ(out["vocab_size"], 10);
  EXPECT_EQ(out["new_key"], true);
}

TEST(ConfigOverrides, FromDirReadsTheOverriddenConfig) {
  const std::string dir = std::string(M3_TEST_DATA) + "/golden/m31-tiny/hf";
  const m3::ModelConfig plain = m3::ModelConfig::from_dir(dir);
  const m3::ModelConfig over =
      m3::ModelConfig::from_dir(dir, R"({"text_config": {"max_position_embeddings": 1536}})");
  EXPECT_NE(plain.max_position_embeddings, 1536);
  EXPECT_EQ(over.max_position_embeddings, 1536);
  EXPECT_EQ(over.hidden, plain.hidden);  // the rest of text_config kept
  EXPECT_THROW(m3::ModelConfig::from_dir(dir, "[1]"), m3::Error);
}
