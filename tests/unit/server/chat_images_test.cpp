// The chat image path without HTTP (server/openai_request.h tokenize_chat): on a make-model tiny m31
// checkpoint with its random tower, two PNG parts of different sizes are rendered through the M3
// template, each marker becomes exactly grid_h * grid_w / 4 image tokens, the spans sit on those tokens
// in order, their embeddings are the tower's for that image alone, the count-only path (/tokenize)
// gives the same ids, and the span hashes follow the image bytes. RealTokenizerIds: the same path with
// the real o200k vocabulary and M3's special tokens at their real ids (model.md 7.1), checking the exact
// ids around each image: 200029, N x 200025, 200030.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
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
#include "vision/image_decode.h"

using namespace m3;
using ojson = nlohmann::ordered_json;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A minimal RGB PNG (filter 0 rows, zlib from Debian's zlib) with a deterministic pattern.
std::vector<uint8_t> make_png(int w, int h, int seed) {
  std::vector<uint8_t> raw;
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) raw.push_back(uint8_t((x * 7 + y * 13 + c * 29) * (seed + 1) + seed * 31));
  }
  uLongf zn = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(zn);
  EXPECT_EQ(compress2(z.data(), &zn, raw.data(), uLong(raw.size()), 6), Z_OK);
  z.resize(zn);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto be32 = [](std::vector<uint8_t>& v, uint32_t x) {
    for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
  };
  auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    be32(png, uint32_t(data.size()));
    std::vector<uint8_t> td(type, type + 4);
    td.insert(td.end(), data.begin(), data.end());
    png.insert(png.end(), td.begin(), td.end());
    be32(png, uint32_t(crc32(0, td.data(), uInt(td.size()))));
  };
  std::vector<uint8_t> ihdr;
  be32(ihdr, uint32_t(w));
  be32(ihdr, uint32_t(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  chunk("IHDR", ihdr);
  chunk("IDAT", z);
  chunk("IEND", {});
  return png;
}

std::string data_url(const std::vector<uint8_t>& b) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s = "data:image/png;base64,";
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t v = uint32_t(b[i]) << 16 | (i + 1 < b.size() ? uint32_t(b[i + 1]) << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t(b[i + 2]) : 0);
    s += k[v >> 18 & 63];
    s += k[v >> 12 & 63];
    s += i + 1 < b.size() ? k[v >> 6 & 63] : '=';
    s += i + 2 < b.size() ? k[v & 63] : '=';
  }
  return s;
}

ojson image_part(const std::vector<uint8_t>& png) {
  return {{"type", "image_url"}, {"image_url", {{"url", data_url(png)}}}};
}

}  // namespace

TEST(ChatImages, MarkersExpandToTheTowersEmbeddings) {
  const std::string dir = m3test::test_tmp_dir() + "/chat_images";
  m3test::ChatMediaSetup setup(dir, 5, false);
  const ModelConfig& mc = setup.mc;
  const ImageEncoder& enc = *setup.enc;
  server::ServerContext& ctx = setup.ctx;

  // 112 x 56 -> grid 4 x 8 -> 8 tokens; 84 x 84 -> grid 6 x 6 -> 9 tokens.
  const auto a = make_png(112, 56, 1), b = make_png(84, 84, 2);
  ojson body = {{"messages", ojson::array({{{"role", "user"},
                                            {"content", ojson::array({image_part(a),
                                                                      {{"type", "text"}, {"text", "and"}},
                                                                      image_part(b)})}}})}};
  std::vector<server::ImageInput> images;
  const std::string text = server::render_messages(body, ctx, true, &images);
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].where, "messages[0].content[0]");
  EXPECT_EQ(images[1].where, "messages[0].content[2]");
  const server::ChatTokens ct = server::tokenize_chat(text, images, ctx, true);
  ASSERT_EQ(ct.mm.size(), 2u);
  EXPECT_EQ(ct.mm[0].count, 8);
  EXPECT_EQ(ct.mm[1].count, 9);
  EXPECT_LT(ct.mm[0].offset + ct.mm[0].count, ct.mm[1].offset);
  const int32_t img = enc.config().image_token_id;
  int64_t n_img = 0;
  for (int32_t id : ct.ids) n_img += id == img;
  EXPECT_EQ(n_img, 17);
  for (const auto& s : ct.mm)
    for (int64_t i = s.offset; i < s.offset + s.count; ++i) EXPECT_EQ(ct.ids[size_t(i)], img);

  // Each span holds the tower's output for its image alone.
  const VisionConfig vc = VisionConfig::from_json_text(slurp(dir + "/config.json"), dir, mc.hidden);
  TensorStore store(dir);
  const VisionTower tower(vc, store);
  vision::ProcessorConfig pc;
  for (int k = 0; k < 2; ++k) {
    const auto& png = k == 0 ? a : b;
    const auto pt = vision::preprocess_image(vision::decode_image(png.data(), png.size()), pc);
    const auto want = tower.forward(pt.values.data(), {VisionGrid{pt.grid_t, pt.grid_h, pt.grid_w}});
    ASSERT_TRUE(ct.mm[k].embeds);
    EXPECT_EQ(*ct.mm[k].embeds, want) << "image " << k;
    EXPECT_EQ(ct.mm[k].hash, hash_bytes(png.data(), png.size()));
  }
  EXPECT_NE(ct.mm[0].hash, ct.mm[1].hash);

  // /tokenize's count-only path: the same ids, no spans.
  const server::ChatTokens counted = server::tokenize_chat(text, images, ctx, false);
  EXPECT_EQ(counted.ids, ct.ids);
  EXPECT_TRUE(counted.mm.empty());

  // The same bytes again come from the encoder's cache (the tower does not run: the very same
  // embeddings), and the cache's byte bound holds.
  const int64_t hits0 = enc.cache_hits();
  const server::ChatTokens again = server::tokenize_chat(text, images, ctx, true);
  EXPECT_EQ(enc.cache_hits(), hits0 + 2);
  ASSERT_EQ(again.mm.size(), 2u);
  EXPECT_EQ(again.mm[0].embeds.get(), ct.mm[0].embeds.get());
  EXPECT_EQ(again.ids, ct.ids);
  ImageEncoder small(dir, mc.hidden);
  small.set_cache_bytes(ct.mm[1].embeds->size() * sizeof(float));  // room for one of the two
  const auto e1 = small.encode(a.data(), a.size(), {}, true);
  const auto e2 = small.encode(b.data(), b.size(), {}, true);  // evicts a
  EXPECT_EQ(small.cache_hits(), 0);
  EXPECT_EQ(small.encode(b.data(), b.size(), {}, true).embeds.get(), e2.embeds.get());
  EXPECT_EQ(small.cache_hits(), 1);
  const auto e1b = small.encode(a.data(), a.size(), {}, true);  // recomputed: equal values, a new buffer
  EXPECT_EQ(small.cache_hits(), 1);
  EXPECT_NE(e1b.embeds.get(), e1.embeds.get());
  EXPECT_EQ(*e1b.embeds, *e1.embeds);
  small.set_cache_bytes(0);
  EXPECT_NE(small.encode(a.data(), a.size(), {}, true).embeds.get(), e1b.embeds.get());
  EXPECT_EQ(small.cache_hits(), 1);

  // Over the limit: a 400 naming both numbers, before anything is decoded.
  ctx.media.limit_image = 1;
  images.clear();
  try {
    server::render_messages(body, ctx, true, &images);
    ADD_FAILURE() << "two images accepted with a limit of 1";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("2 images in the prompt; this server takes at most 1"), std::string::npos);
  }
}

namespace {

// M3's special tokens (spec model.md 7.1) on the o200k vocabulary: the real M3 tokenizer.json is not
// in the project, but its BPE is o200k's and its specials are these, so this tokenizer gives the real
// ids for every chat-template token and image placeholder.

}  // namespace

TEST(ChatImages, RealTokenizerIds) {
  const std::string dir = m3test::test_tmp_dir() + "/chat_images_real_tok";
  m3test::ChatMediaSetup setup(dir, 6, true);
  const ImageEncoder& enc = *setup.enc;
  const Tokenizer& tok = *setup.tok;
  server::ServerContext& ctx = setup.ctx;
  ASSERT_EQ(enc.config().image_token_id, 200025);
  ASSERT_EQ(tok.token_to_id("]<]image[>["), 200025);
  ASSERT_EQ(tok.token_to_id("]<]start of image[>["), 200029);
  ASSERT_EQ(tok.token_to_id("]<]end of image[>["), 200030);

  // 112 x 56 -> grid 4 x 8 -> 8 tokens; 84 x 84 -> grid 6 x 6 -> 9 tokens.
  const auto a = make_png(112, 56, 3), b = make_png(84, 84, 4);
  ojson body = {{"messages", ojson::array({{{"role", "user"},
                                            {"content", ojson::array({{{"type", "text"}, {"text", "Compare"}},
                                                                      image_part(a),
                                                                      {{"type", "text"}, {"text", " with "}},
                                                                      image_part(b)})}}})}};
  std::vector<server::ImageInput> images;
  const std::string text = server::render_messages(body, ctx, true, &images);
  ASSERT_EQ(images.size(), 2u);
  const server::ChatTokens ct = server::tokenize_chat(text, images, ctx, true);

  // The template renders each image as the one marker token: tokenizing the rendered text whole gives
  // 200025 once per image. Expanding each into 200029 + N x 200025 + 200030 must give the prompt's ids
  // exactly (the text around the images tokenized the same, BOS and role tokens included).
  const std::vector<int32_t> whole = tok.encode(text);
  ASSERT_EQ(std::count(whole.begin(), whole.end(), 200025), 2);
  EXPECT_EQ(whole.front(), 200034);  // ]~!b[
  std::vector<int32_t> want;
  const int64_t n_img[2] = {8, 9};
  int k = 0;
  for (int32_t id : whole) {
    if (id != 200025) {
      want.push_back(id);
      continue;
    }
    want.push_back(200029);
    want.insert(want.end(), size_t(n_img[k++]), 200025);
    want.push_back(200030);
  }
  size_t diff = 0;
  while (diff < std::min(ct.ids.size(), want.size()) && ct.ids[diff] == want[diff]) ++diff;
  EXPECT_EQ(ct.ids, want) << "first difference at " << diff << " of " << ct.ids.size() << " / " << want.size() << ": "
                          << (diff < ct.ids.size() ? ct.ids[diff] : -1) << " vs " << (diff < want.size() ? want[diff] : -1);
  ASSERT_EQ(ct.mm.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& s = ct.mm[size_t(i)];
    EXPECT_EQ(s.count, n_img[i]);
    EXPECT_EQ(ct.ids[size_t(s.offset - 1)], 200029) << "image " << i;
    for (int64_t j = s.offset; j < s.offset + s.count; ++j) EXPECT_EQ(ct.ids[size_t(j)], 200025);
    EXPECT_EQ(ct.ids[size_t(s.offset + s.count)], 200030) << "image " << i;
  }
  // The text between the images: "Compare" before the first, " with " between them.
  EXPECT_EQ(tok.decode({ct.ids.begin() + ct.mm[0].offset + 9, ct.ids.begin() + ct.mm[1].offset - 1}), " with ");
  // /tokenize's count-only path gives the same ids.
  EXPECT_EQ(server::tokenize_chat(text, images, ctx, false).ids, ct.ids);
}
