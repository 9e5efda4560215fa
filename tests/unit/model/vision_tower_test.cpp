// The vision tower against a float64 PyTorch reference written for the tests from model.md section 9
// (tests/tools/vision_tower_reference.py, Debian's python3-torch), on random towers of two sizes that
// make-model writes in the release layout: the merged embeddings of a batch of two images of different
// grids must agree within 1e-5 of the largest reference magnitude (measured: about 4e-7 with the shared linear kernels, 7-8e-7 on the GEMM of kernels/cpu/gemm.h with its vector exp and erfc) (fp32 activations and accumulations
// against float64; the BF16 / F32 weights are the same values in both). Also: each image's embeddings
// do not depend on the other image in the batch (attention confined per image).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/config.h"
#include "model/vision_tower.h"
#include "test_tmp.h"
#include "tools/make_model.h"

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct TowerCase {
  const char* name;
  int64_t vhidden, vheads, vlayers, vwidth;
};

std::string grids_json(const std::vector<m3::VisionGrid>& grids) {
  std::string s = "[";
  for (size_t i = 0; i < grids.size(); ++i)
    s += (i ? ",[" : "[") + std::to_string(grids[i].t) + "," + std::to_string(grids[i].h) + "," +
         std::to_string(grids[i].w) + "]";
  return s + "]";
}

void check_tower(const TowerCase& tc, const std::vector<m3::VisionGrid>& grids = {{1, 4, 6}, {1, 8, 4}}) {
  const std::string dir = m3test::test_tmp_dir() + "/vt_" + tc.name;
  m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31);
  o.seed = 7;
  o.vision_hidden = tc.vhidden;
  o.vision_heads = tc.vheads;
  o.vision_layers = tc.vlayers;
  o.vision_width = tc.vwidth;
  m3::make_model(o, dir);
  const m3::ModelConfig mc = m3::ModelConfig::from_dir(dir);
  const m3::VisionConfig vc = m3::VisionConfig::from_json_text(slurp(dir + "/config.json"), dir, mc.hidden);
  ASSERT_TRUE(vc.present);
  ASSERT_EQ(vc.hidden, tc.vhidden);
  m3::TensorStore store(dir);
  m3::VisionTower tower(vc, store);

  int64_t T = 0;
  for (auto& g : grids) T += g.patches();
  std::vector<float> patches(size_t(T) * vc.patch_dim());
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : patches) v = nd(rng);
  const std::vector<float> got = tower.forward(patches.data(), grids);
  ASSERT_EQ(got.size(), size_t(T / 4) * size_t(mc.hidden));

  {
    std::ofstream(dir + "/patches.f32", std::ios::binary).write(reinterpret_cast<const char*>(patches.data()),
                                                               std::streamsize(patches.size() * 4));
    std::ofstream(dir + "/grids.json") << grids_json(grids);
  }
  const std::string cmd = "/usr/bin/python3 " M3_TEST_DATA "/../tools/vision_tower_reference.py " + dir + " " + dir +
                          "/patches.f32 " + dir + "/grids.json " + dir + "/ref.f64";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed (python3-torch is needed; make deps)";
  const std::string raw = slurp(dir + "/ref.f64");
  ASSERT_EQ(raw.size(), got.size() * 8);
  const double* ref = reinterpret_cast<const double*>(raw.data());
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - ref[i]));
  }
  std::printf("tower %s (hidden %lld, heads %lld, layers %lld): max |ref| %.4g, max |diff| %.3g (%.2e relative)\n",
              tc.name, (long long)tc.vhidden, (long long)tc.vheads, (long long)tc.vlayers, max_ref, max_diff,
              max_diff / max_ref);
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_diff, 1e-5 * max_ref);

  // The later grids alone give the same embeddings as in the batch (no attention across images).
  const std::vector<float> alone =
      tower.forward(patches.data() + size_t(grids[0].patches()) * vc.patch_dim(), {grids.begin() + 1, grids.end()});
  const size_t off = size_t(grids[0].patches() / 4) * size_t(mc.hidden);
  ASSERT_EQ(alone.size(), got.size() - off);
  double d2 = 0;
  for (size_t i = 0; i < alone.size(); ++i) d2 = std::max(d2, std::fabs(double(alone[i]) - got[off + i]));
  EXPECT_LE(d2, 1e-5 * max_ref);
}

TEST(VisionTower, MatchesFloat64ReferenceTinyTower) { check_tower({"tiny", 64, 4, 2, 128}); }

// head_dim 80 as the real tower: 78 rotated dims and 2 passed through.
TEST(VisionTower, MatchesFloat64ReferenceHeadDim80) { check_tower({"hd80", 160, 2, 3, 320}); }

// Videos: a 4-frame clip (grid t 2, one segment) and a 10-frame clip (t 5: segments of 4 and 1 temporal
// groups under make-model's vision_segment_max_frames 4), batched after an image.
TEST(VisionTower, VideoGridsMatchFloat64Reference) { check_tower({"video", 64, 4, 2, 128}, {{1, 4, 4}, {2, 4, 6}, {5, 4, 4}}); }

// Segmenting is what the tower does: the 10-frame clip's last temporal group is a segment of its own with
// RoPE t 0, so it encodes exactly as that group alone (a grid of t 1); the first four groups likewise.
TEST(VisionTower, VideoSegmentsAttendAlone) {
  const std::string dir = m3test::test_tmp_dir() + "/vt_segments";
  m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31);
  o.seed = 5;
  o.vision_hidden = 64;
  o.vision_heads = 4;
  o.vision_layers = 2;
  o.vision_width = 128;
  m3::make_model(o, dir);
  const m3::ModelConfig mc = m3::ModelConfig::from_dir(dir);
  const m3::VisionConfig vc = m3::VisionConfig::from_json_text(slurp(dir + "/config.json"), dir, mc.hidden);
  ASSERT_EQ(vc.segment_max_frames, 4);
  m3::TensorStore store(dir);
  m3::VisionTower tower(vc, store);
  const m3::VisionGrid clip{5, 4, 4};
  std::vector<float> patches(size_t(clip.patches()) * vc.patch_dim());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : patches) v = nd(rng);
  const std::vector<float> all = tower.forward(patches.data(), {clip});
  const int64_t per_group = 4 * 4;  // patches of one temporal group
  const std::vector<float> head = tower.forward(patches.data(), {{4, 4, 4}});
  const std::vector<float> tail = tower.forward(patches.data() + size_t(4 * per_group) * vc.patch_dim(), {{1, 4, 4}});
  ASSERT_EQ(all.size(), head.size() + tail.size());
  // Equal up to the kernels' row blocking (fp32 sums in another order for another row count).
  double mx = 0, d = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    mx = std::max(mx, std::fabs(double(all[i])));
    d = std::max(d, std::fabs(double(all[i]) - (i < head.size() ? head[i] : tail[i - head.size()])));
  }
  EXPECT_GT(mx, 0.0);
  EXPECT_LE(d, 1e-6 * mx);
  // Without segmenting (one attention over all five groups), the last group would see the others.
  m3::VisionConfig whole = vc;
  whole.segment_max_frames = 0;
  m3::VisionTower one(whole, store);
  const std::vector<float> joint = one.forward(patches.data(), {clip});
  double dj = 0;
  for (size_t i = head.size(); i < all.size(); ++i) dj = std::max(dj, std::fabs(double(all[i]) - joint[i]));
  EXPECT_GT(dj, 1e-3 * mx);
  // A video of more than kPassPatches patches runs a pass of segments at a time: still each segment's own
  // output (9 groups of 32 x 32: segments 4 + 4 + 1, passes of 8192 and 1024 patches).
  const m3::VisionGrid big{9, 32, 32};
  ASSERT_GT(big.patches(), m3::VisionTower::kPassPatches);
  std::vector<float> bp(size_t(big.patches()) * vc.patch_dim());
  for (float& v : bp) v = nd(rng);
  const std::vector<float> ball = tower.forward(bp.data(), {big});
  std::vector<float> bseg;
  for (int t0 = 0; t0 < 9; t0 += 4) {
    const int t = std::min(4, 9 - t0);
    const auto part = tower.forward(bp.data() + size_t(t0) * 1024 * vc.patch_dim(), {{t, 32, 32}});
    bseg.insert(bseg.end(), part.begin(), part.end());
  }
  ASSERT_EQ(ball.size(), bseg.size());
  double bmx = 0, bd = 0;
  for (size_t i = 0; i < ball.size(); ++i) {
    bmx = std::max(bmx, std::fabs(double(bseg[i])));
    bd = std::max(bd, std::fabs(double(ball[i]) - bseg[i]));
  }
  EXPECT_LE(bd, 1e-6 * bmx);
  EXPECT_EQ(m3::attention_segments({{1, 2, 2}, {9, 2, 2}}, 4).size(), 4u);
  EXPECT_EQ(m3::attention_segments({{9, 2, 2}}, 0).size(), 1u);
}

TEST(VisionTower, NoVisionConfigMeansNoTower) {
  const m3::VisionConfig vc = m3::VisionConfig::from_json_text("{\"text_config\": {}}", "config.json", 256);
  EXPECT_FALSE(vc.present);
}

}  // namespace
