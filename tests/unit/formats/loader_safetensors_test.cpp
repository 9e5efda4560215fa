// Safetensors writer -> m3::TensorStore round trips (single file and sharded), make-model output
// read back through the loader, and malformed files: each must raise an m3::Error whose message
// names the file and, where there is one, the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/block_dequant.h"
#include "base/error.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "tools/make_model.h"

namespace fs = std::filesystem;
using m3::DType;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("m3_st_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static m3::TensorData make(const std::string& name, DType dt, std::vector<int64_t> shape, uint8_t seed) {
    m3::TensorData t{{name, dt, std::move(shape)}, {}};
    t.bytes.resize(t.spec.nbytes());
    for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = uint8_t(seed + i * 7);
    return t;
  }

  // A raw file: 8-byte little-endian length, header text, data.
  void write_raw(const fs::path& p, const std::string& header, size_t data_bytes, uint64_t hlen_override = 0) {
    std::ofstream f(p, std::ios::binary);
    uint64_t hl = hlen_override ? hlen_override : header.size();
    for (int i = 0; i < 8; ++i) f.put(char(hl >> (8 * i)));
    f << header;
    for (size_t i = 0; i < data_bytes; ++i) f.put(char(i));
  }

  // Runs fn, expects an m3::Error, and checks that its message contains every needle.
  template <class F>
  void expect_error(F fn, std::vector<std::string> needles) {
    try {
      fn();
      ADD_FAILURE() << "no m3::Error thrown";
    } catch (const m3::Error& e) {
      const std::string msg = e.what();
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message \"" << msg << "\" lacks " << n;
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(SafetensorsTest, SingleFileRoundTrip) {
  std::vector<m3::TensorData> ts = {make("b.weight", DType::BF16, {3, 5}, 1), make("a.scale", DType::U8, {4, 2}, 2),
                                    make("c.bias", DType::F32, {7}, 3), make("d.q", DType::F8_E4M3, {2, 32}, 4),
                                    make("e.empty", DType::F32, {0}, 5)};
  const fs::path p = dir_ / "model.safetensors";
  m3::write_safetensors_file(p.string(), ts);

  // Header: length multiple of 8, padded with spaces, keys sorted.
  std::ifstream in(p, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i) hl |= uint64_t(len[i]) << (8 * i);
  EXPECT_EQ(hl % 8, 0u);
  std::string header(hl, '\0');
  in.read(header.data(), std::streamsize(hl));
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_LT(header.find("\"a.scale\""), header.find("\"b.weight\""));
  EXPECT_LT(header.find("\"b.weight\""), header.find("\"c.bias\""));

  m3::TensorStore store(dir_.string());
  EXPECT_EQ(store.all().size(), ts.size());
  for (const auto& t : ts) {
    const m3::TensorView& v = store.get(t.spec.name);
    EXPECT_EQ(v.dtype, t.spec.dtype);
    EXPECT_EQ(v.shape, t.spec.shape);
    EXPECT_EQ(v.file, "model.safetensors");
    ASSERT_EQ(v.nbytes, t.bytes.size());
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), v.nbytes), 0) << t.spec.name;
    }
  }
  expect_error([&] { store.get("nope"); }, {"nope"});

  // Read into memory instead of mapped (--no-mmap): the same tensors and bytes, each tensor on a
  // 64-byte boundary (the file's offsets leave them 8-byte aligned at best).
  m3::TensorStore ram(dir_.string(), m3::WeightMemory::Ram);
  EXPECT_EQ(ram.all().size(), ts.size());
  EXPECT_EQ(ram.file_bytes(), size_t(fs::file_size(p)));
  for (const auto& t : ts) {
    const m3::TensorView& v = ram.get(t.spec.name);
    EXPECT_EQ(v.shape, t.spec.shape);
    ASSERT_EQ(v.nbytes, t.bytes.size());
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), v.nbytes), 0) << t.spec.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 64, 0u) << t.spec.name;
    }
  }
}

TEST_F(SafetensorsTest, ShardedRoundTrip) {
  std::vector<m3::TensorData> ts;
  for (int i = 0; i < 10; ++i)
    ts.push_back(make("layer." + std::to_string(i) + ".weight", i % 2 ? DType::BF16 : DType::F32, {4, 8 + i},
                      uint8_t(i)));
  std::vector<m3::TensorSpec> specs;
  for (const auto& t : ts) specs.push_back(t.spec);
  auto names = m3::write_safetensors_checkpoint(dir_.string(), specs, 3, [&](const m3::TensorSpec& s, std::vector<uint8_t>& out) {
    for (const auto& t : ts)
      if (t.spec.name == s.name) out = t.bytes;
  });
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(names[2], "model-00003-of-00003.safetensors");
  std::ifstream idx(dir_ / "model.safetensors.index.json");
  const auto j = nlohmann::json::parse(idx);
  size_t total = 0;
  for (const auto& t : ts) total += t.bytes.size();
  EXPECT_EQ(j["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(j["weight_map"].size(), ts.size());

  m3::TensorStore store(dir_.string());
  std::set<std::string> files;
  for (const auto& t : ts) {
    const m3::TensorView& v = store.get(t.spec.name);
    EXPECT_EQ(v.file, j["weight_map"][t.spec.name].get<std::string>());
    files.insert(v.file);
    EXPECT_EQ(v.shape, t.spec.shape);
    ASSERT_EQ(v.nbytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), v.nbytes), 0);
  }
  EXPECT_EQ(files.size(), 3u);
}

TEST_F(SafetensorsTest, WriterRejectsWrongProducerSize) {
  std::vector<m3::TensorSpec> specs = {{"x", DType::F32, {4}}};
  expect_error(
      [&] {
        m3::write_safetensors_file((dir_ / "a.safetensors").string(), specs,
                                   [](const m3::TensorSpec&, std::vector<uint8_t>& out) { out.resize(3); });
      },
      {"a.safetensors", "x"});
}

TEST_F(SafetensorsTest, TruncatedFile) {
  const fs::path p = dir_ / "t.safetensors";
  m3::write_safetensors_file(p.string(), {make("w", DType::F32, {16}, 0)});
  fs::resize_file(p, fs::file_size(p) - 10);
  for (auto mem : {m3::WeightMemory::Mmap, m3::WeightMemory::Ram})
    expect_error([&] { m3::SafetensorsFile f(p.string(), mem); }, {"t.safetensors", "w", "past the end"});
  fs::resize_file(p, 5);
  for (auto mem : {m3::WeightMemory::Mmap, m3::WeightMemory::Ram})
    expect_error([&] { m3::SafetensorsFile f(p.string(), mem); }, {"t.safetensors", "truncated"});
}

TEST_F(SafetensorsTest, CorruptHeaderBadJson) {
  const fs::path p = dir_ / "bad.safetensors";
  write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], ", 4);
  expect_error([&] { m3::SafetensorsFile f(p.string()); }, {"bad.safetensors", "JSON"});
}

TEST_F(SafetensorsTest, CorruptHeaderLengthPastEof) {
  const fs::path p = dir_ / "len.safetensors";
  write_raw(p, "{}", 0, 1000000);
  for (auto mem : {m3::WeightMemory::Mmap, m3::WeightMemory::Ram})
    expect_error([&] { m3::SafetensorsFile f(p.string(), mem); }, {"len.safetensors", "header length"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  const fs::path p = dir_ / "dt.safetensors";
  write_raw(p, R"({"w.weight":{"dtype":"F4_WHAT","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_error([&] { m3::SafetensorsFile f(p.string()); }, {"dt.safetensors", "w.weight", "F4_WHAT"});
}

TEST_F(SafetensorsTest, DataOffsetsPastEnd) {
  const fs::path p = dir_ / "off.safetensors";
  write_raw(p, R"({"w.weight":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4);
  expect_error([&] { m3::SafetensorsFile f(p.string()); }, {"off.safetensors", "w.weight", "data_offsets"});
}

TEST_F(SafetensorsTest, ShapeByteSizeMismatch) {
  const fs::path p = dir_ / "shape.safetensors";
  write_raw(p, R"({"w.weight":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})", 8);
  expect_error([&] { m3::SafetensorsFile f(p.string()); }, {"shape.safetensors", "w.weight", "[3, 2]"});
}

TEST_F(SafetensorsTest, IndexNamesMissingShard) {
  m3::write_safetensors_file((dir_ / "model-00001-of-00002.safetensors").string(), {make("a", DType::U8, {4}, 0)});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})";
  expect_error([&] { m3::TensorStore s(dir_.string()); }, {"model-00002-of-00002.safetensors", "does not exist"});
}

TEST_F(SafetensorsTest, IndexNamesTensorMissingFromShard) {
  m3::write_safetensors_file((dir_ / "model-00001-of-00001.safetensors").string(), {make("a", DType::U8, {4}, 0)});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00001.safetensors","ghost.weight":"model-00001-of-00001.safetensors"}})";
  expect_error([&] { m3::TensorStore s(dir_.string()); }, {"model-00001-of-00001.safetensors", "ghost.weight"});
}

// make-model's M3.1 tiny output read back through the loader: names, dtypes, shapes, and
// dequantised weights with the intended spread (std 1/sqrt(fan_in)).
TEST_F(SafetensorsTest, MakeModelM31TinyLoads) {
  m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31);
  o.seed = 3;
  o.shards = 2;
  m3::make_model(o, dir_.string());
  m3::TensorStore store(dir_.string());
  const std::string L1 = "language_model.model.layers.1.";
  const auto& q = store.get("language_model.model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::F8_E4M3);
  EXPECT_EQ(q.shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(store.get("language_model.model.layers.0.self_attn.q_proj.weight_scale_inv").shape,
            (std::vector<int64_t>{256, 8}));
  EXPECT_TRUE(store.has("language_model.model.layers.0.self_attn.index_q_proj.weight"));
  EXPECT_TRUE(store.has("language_model.model.layers.0.mlp.down_proj.weight_scale_inv"));
  EXPECT_EQ(store.get(L1 + "block_sparse_moe.gate.weight").dtype, DType::F32);
  EXPECT_EQ(store.get(L1 + "block_sparse_moe.e_score_correction_bias").shape, (std::vector<int64_t>{8}));
  const auto& wp = store.get(L1 + "block_sparse_moe.experts.7.w2.weight_packed");
  const auto& ws = store.get(L1 + "block_sparse_moe.experts.7.w2.weight_scale");
  const auto& wg = store.get(L1 + "block_sparse_moe.experts.7.w2.weight_global_scale");
  EXPECT_EQ(wp.shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(ws.dtype, DType::F8_E4M3);
  EXPECT_EQ(ws.shape, (std::vector<int64_t>{256, 8}));
  EXPECT_EQ(wg.shape, (std::vector<int64_t>{1}));
  float global;
  std::memcpy(&global, wg.data, 4);
  std::vector<float> row(128);
  double s2 = 0;
  for (int r = 0; r < 256; ++r) {
    m3::nvfp4_dequant_row(wp.data + r * 64, ws.data + r * 8, global, 128, row.data());
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      s2 += double(v) * v;
    }
  }
  const double std_nv = std::sqrt(s2 / (256 * 128));
  EXPECT_NEAR(std_nv, 1.0 / std::sqrt(128.0), 0.25 / std::sqrt(128.0));
  const auto& qs = store.get("language_model.model.layers.0.self_attn.q_proj.weight_scale_inv");
  std::vector<float> qrow(256);
  s2 = 0;
  for (int r = 0; r < 256; ++r) {
    m3::mxfp8_dequant_row(q.data + r * 256, qs.data + r * 8, 256, qrow.data());
    for (float v : qrow) s2 += double(v) * v;
  }
  EXPECT_NEAR(std::sqrt(s2 / (256 * 256)), 1.0 / 16, 0.1 / 16);
  EXPECT_TRUE(fs::exists(dir_ / "tokenizer.json"));
  std::ifstream cf(dir_ / "config.json");
  const auto cfg = nlohmann::json::parse(cf);
  EXPECT_EQ(cfg["text_config"]["vocab_size"].get<int64_t>(), store.get("language_model.lm_head.weight").shape[0]);
  EXPECT_EQ(cfg["quantization_config"]["moe_quant_format"], "nvfp4-pack-quantized");
}
