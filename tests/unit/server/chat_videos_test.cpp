// The chat video path without HTTP (server/openai_request.h tokenize_chat): a 5-frame FFV1 clip made with
// the ffmpeg CLI, after an image part, on make-model's tiny m31 checkpoint. The video marker becomes, per
// temporal group, the timestamp text and grid_h * grid_w / 4 video tokens (the start/end markers where the
// tokenizer has them); each group is a span holding its slice of the tower's output for the whole clip, salted
// per group; the count-only path gives the same ids; the encoder's cache serves the clip again; the video
// limit is a 400 with the numbers. RealTokenizerIds: with the o200k vocabulary and M3's specials at their
// real ids, the exact ids vLLM's M3 processor gives: per group the timestamp text, 200029, M x 200026, 200030.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/image_encoder.h"
#include "model/vision_tower.h"
#include "server/errors.h"
#include "server/openai_request.h"
#include "m3_tokenizer.h"
#include "chat_media_setup.h"
#include "test_tmp.h"
#include "tokenizer/tokenizer.h"
#include "tools/make_model.h"
#include "vision/video_preprocess.h"

using namespace m3;
using ojson = nlohmann::ordered_json;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string base64(const std::string& b) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(b[i])) << 16 | (i + 1 < b.size() ? uint32_t(uint8_t(b[i + 1])) << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t(uint8_t(b[i + 2])) : 0);
    s += k[v >> 18 & 63];
    s += k[v >> 12 & 63];
    s += i + 1 < b.size() ? k[v >> 6 & 63] : '=';
    s += i + 2 < b.size() ? k[v & 63] : '=';
  }
  return s;
}

// `frames` RGB frames of w x h at 1 fps, FFV1 in Matroska (lossless), through the ffmpeg CLI.
std::string make_clip(const std::string& dir, int w, int h, int frames, int seed) {
  const std::string raw = dir + "/clip" + std::to_string(seed) + ".rgb", out = dir + "/clip" + std::to_string(seed) + ".mkv";
  {
    std::ofstream f(raw, std::ios::binary);
    for (int k = 0; k < frames; ++k)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
          for (int c = 0; c < 3; ++c) f.put(char(uint8_t((x * 7 + y * 13 + c * 29 + k * 41) * (seed + 1))));
  }
  const std::string cmd = "ffmpeg -hide_banner -loglevel error -y -f rawvideo -pix_fmt rgb24 -s " + std::to_string(w) +
                          "x" + std::to_string(h) + " -r 1 -i " + raw + " -c:v ffv1 -pix_fmt bgr0 " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "ffmpeg is needed (make deps)";
  return slurp(out);
}

}  // namespace

TEST(ChatVideos, GroupsExpandToTimestampsAndTheTowersEmbeddings) {
  const std::string dir = m3test::test_tmp_dir() + "/chat_videos";
  m3test::ChatMediaSetup setup(dir, 5, false);
  const ModelConfig& mc = setup.mc;
  const ImageEncoder& enc = *setup.enc;
  const Tokenizer& tok = *setup.tok;
  server::ServerContext& ctx = setup.ctx;

  // 84 x 56 -> grid 4 x 6 per frame, 6 tokens a temporal group; 5 frames -> 3 groups (the last frame repeated).
  const std::string clip = make_clip(dir, 84, 56, 5, 1);
  ASSERT_FALSE(clip.empty());
  const std::string url = "data:video/x-matroska;base64," + base64(clip);
  ojson body = {{"messages", ojson::array({{{"role", "user"},
                                            {"content", ojson::array({{{"type", "text"}, {"text", "see"}},
                                                                      {{"type", "video_url"}, {"video_url", {{"url", url}}}},
                                                                      {{"type", "text"}, {"text", "now"}}})}}})}};
  std::vector<server::ImageInput> inputs;
  const std::string text = server::render_messages(body, ctx, true, &inputs);
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_TRUE(inputs[0].video);
  EXPECT_EQ(inputs[0].where, "messages[0].content[1]");
  EXPECT_NE(text.find("]<]video[>["), std::string::npos);
  const server::ChatTokens ct = server::tokenize_chat(text, inputs, ctx, true);
  ASSERT_EQ(ct.mm.size(), 3u);
  const int32_t vid = enc.config().video_token_id;
  int64_t n_vid = 0;
  for (int32_t id : ct.ids) n_vid += id == vid;
  EXPECT_EQ(n_vid, 18);
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(ct.mm[g].count, 6);
    for (int64_t i = ct.mm[g].offset; i < ct.mm[g].offset + ct.mm[g].count; ++i) EXPECT_EQ(ct.ids[size_t(i)], vid);
    // The timestamp text right before the group (no start marker: the tiny tokenizer has none).
    char ts[64];
    std::snprintf(ts, sizeof ts, "]<]%.1f seconds[>[", 2.0 * double(g));
    const std::vector<int32_t> want = tok.encode(ts, true);
    ASSERT_GE(ct.mm[g].offset, int64_t(want.size()));
    EXPECT_EQ(std::vector<int32_t>(ct.ids.begin() + ct.mm[g].offset - int64_t(want.size()), ct.ids.begin() + ct.mm[g].offset),
              want)
        << "group " << g;
  }
  // The groups' embeddings are the tower's output for the whole clip (one attention segment), in order.
  const VisionConfig vc = VisionConfig::from_json_text(slurp(dir + "/config.json"), dir, mc.hidden);
  TensorStore store(dir);
  const VisionTower tower(vc, store);
  const auto pv = vision::preprocess_video(reinterpret_cast<const uint8_t*>(clip.data()), clip.size(), {}, {}, {}, true);
  const auto want = tower.forward(pv.patches.values.data(), {VisionGrid{pv.patches.grid_t, pv.patches.grid_h, pv.patches.grid_w}});
  std::vector<float> got;
  for (const auto& s : ct.mm) {
    ASSERT_TRUE(s.embeds);
    got.insert(got.end(), s.embeds->begin(), s.embeds->end());
  }
  EXPECT_EQ(got, want);
  EXPECT_NE(ct.mm[0].hash, ct.mm[1].hash);
  EXPECT_NE(ct.mm[1].hash, ct.mm[2].hash);

  // /tokenize's count-only path: the same ids, no spans; the same bytes again: one cache hit.
  const server::ChatTokens counted = server::tokenize_chat(text, inputs, ctx, false);
  EXPECT_EQ(counted.ids, ct.ids);
  EXPECT_TRUE(counted.mm.empty());
  const int64_t hits0 = enc.cache_hits();
  const server::ChatTokens again = server::tokenize_chat(text, inputs, ctx, true);
  EXPECT_EQ(enc.cache_hits(), hits0 + 1);
  EXPECT_EQ(again.ids, ct.ids);
  ASSERT_EQ(again.mm.size(), 3u);
  EXPECT_EQ(*again.mm[2].embeds, *ct.mm[2].embeds);

  // Another clip of the same size: the same ids, other hashes.
  const std::string other = make_clip(dir, 84, 56, 5, 2);
  body["messages"][0]["content"][1]["video_url"]["url"] = "data:video/x-matroska;base64," + base64(other);
  inputs.clear();
  const server::ChatTokens ct2 = server::tokenize_chat(server::render_messages(body, ctx, true, &inputs), inputs, ctx, false);
  EXPECT_EQ(ct2.ids, ct.ids);

  // The video limit: a 400 with both numbers.
  ctx.media.limit_video = 0;
  inputs.clear();
  try {
    server::render_messages(body, ctx, true, &inputs);
    ADD_FAILURE() << "a video accepted with a limit of 0";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("1 videos in the prompt; this server takes at most 0"), std::string::npos) << e.what();
  }
}

TEST(ChatVideos, RealTokenizerIds) {
  const std::string dir = m3test::test_tmp_dir() + "/chat_videos_real_tok";
  m3test::ChatMediaSetup setup(dir, 6, true);
  const ImageEncoder& enc = *setup.enc;
  const Tokenizer& tok = *setup.tok;
  server::ServerContext& ctx = setup.ctx;
  ASSERT_EQ(enc.config().video_token_id, 200026);
  ASSERT_EQ(tok.token_to_id("]<]video[>["), 200026);

  // 5 frames of 84 x 56 at 1 fps: 3 groups of 6 tokens, at 0, 2 and 4 seconds.
  const std::string clip = make_clip(dir, 84, 56, 5, 3);
  ojson body = {{"messages", ojson::array({{{"role", "user"},
                                            {"content", ojson::array({{{"type", "text"}, {"text", "Watch"}},
                                                                      {{"type", "video_url"},
                                                                       {"video_url", {{"url", "data:video/x-matroska;base64," + base64(clip)}}}},
                                                                      {{"type", "text"}, {"text", " closely"}}})}}})}};
  std::vector<server::ImageInput> inputs;
  const std::string text = server::render_messages(body, ctx, true, &inputs);
  const server::ChatTokens ct = server::tokenize_chat(text, inputs, ctx, true);
  // The rendered text holds the one video marker token; expanding it as vLLM does must give the prompt's
  // ids exactly (the text around it tokenized the same, BOS and role tokens included).
  const std::vector<int32_t> whole = tok.encode(text);
  ASSERT_EQ(std::count(whole.begin(), whole.end(), 200026), 1);
  std::vector<int32_t> want;
  for (int32_t id : whole) {
    if (id != 200026) {
      want.push_back(id);
      continue;
    }
    for (int g = 0; g < 3; ++g) {
      const std::vector<int32_t> ts = tok.encode("]<]" + std::to_string(2 * g) + ".0 seconds[>[");
      want.insert(want.end(), ts.begin(), ts.end());
      want.push_back(200029);
      want.insert(want.end(), 6, 200026);
      want.push_back(200030);
    }
  }
  EXPECT_EQ(ct.ids, want);
  ASSERT_EQ(ct.mm.size(), 3u);
  for (const auto& s : ct.mm) {
    EXPECT_EQ(ct.ids[size_t(s.offset - 1)], 200029);
    EXPECT_EQ(ct.ids[size_t(s.offset + s.count)], 200030);
  }
  // The timestamp is ordinary text, no special token inside it.
  for (int32_t id : tok.encode("]<]2.0 seconds[>[")) EXPECT_LT(id, 200000);
  EXPECT_EQ(server::tokenize_chat(text, inputs, ctx, false).ids, ct.ids);
}
