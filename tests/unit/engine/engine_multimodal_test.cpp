// Multimodal spans through the engine: embeddings replacing a run of prompt tokens (an image's
// placeholders) reach the model in prefill, also when chunked prefill splits them across steps; the
// prefix cache keys pages holding those tokens by the span's hash, so the same text with other
// embeddings never shares KV while the same image does.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "formats/dtype.h"
#include "model/model.h"

namespace {

using m3test::drain;
using m3test::greedy;

std::shared_ptr<const std::vector<float>> random_embeds(uint32_t seed, int64_t count, int64_t hidden) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto v = std::make_shared<std::vector<float>>(size_t(count * hidden));
  for (float& x : *v) x = nd(rng);
  return v;
}

m3::MultimodalSpan span(int64_t off, int64_t count, uint64_t hash, std::shared_ptr<const std::vector<float>> e) {
  m3::MultimodalSpan s;
  s.offset = off;
  s.count = count;
  s.hash = hash;
  s.embeds = std::move(e);
  return s;
}

struct Fixture {
  m3::Model model{m3test::small_engine_model()};
  int64_t H = model.config().hidden;
  std::vector<int32_t> prompt;
  Fixture() {
    std::mt19937 rng(3);
    prompt = m3test::random_tokens(rng, 48, model.config().vocab);
    for (int i = 8; i < 28; ++i) prompt[size_t(i)] = 7;  // the placeholders
  }
  m3::EngineConfig config(int64_t batched = 4096) const {
    m3::EngineConfig c;
    c.num_pages = 40;
    c.block_size = 16;
    c.max_num_batched_tokens = batched;
    c.long_prefill_token_threshold = batched < 4096 ? batched : 0;
    return c;
  }
};

TEST(EngineMultimodal, SpanEmbeddingsReplaceTokenEmbeddings) {
  Fixture f;
  // Embeddings equal to the placeholder token's own row: the same output as no span at all.
  const m3::TensorView& emb = f.model.weights().embed();
  auto own = std::make_shared<std::vector<float>>(size_t(20 * f.H));
  for (int64_t r = 0; r < 20; ++r)
    for (int64_t h = 0; h < f.H; ++h) {
      uint16_t b;
      std::memcpy(&b, emb.data + 2 * (size_t(7) * size_t(f.H) + size_t(h)), 2);
      (*own)[size_t(r * f.H + h)] = m3::bf16_to_float(b);
    }
  ASSERT_EQ(emb.dtype, m3::DType::BF16);
  m3::Engine e(f.model, nullptr, f.config());
  e.add_request("plain", f.prompt, greedy(12));
  e.add_request("own", f.prompt, greedy(12), {}, {span(8, 20, 1, own)});
  e.add_request("img1", f.prompt, greedy(12), {}, {span(8, 20, 11, random_embeds(1, 20, f.H))});
  e.add_request("img2", f.prompt, greedy(12), {}, {span(8, 20, 22, random_embeds(2, 20, f.H))});
  auto out = drain(e);
  EXPECT_EQ(out["own"].tokens, out["plain"].tokens);
  EXPECT_NE(out["img1"].tokens, out["plain"].tokens);
  EXPECT_NE(out["img1"].tokens, out["img2"].tokens);
}

TEST(EngineMultimodal, PrefixCacheKeysImagePagesByTheImageHash) {
  Fixture f;
  auto e1 = random_embeds(1, 20, f.H), e2 = random_embeds(2, 20, f.H);
  m3::Engine e(f.model, nullptr, f.config());
  e.add_request("a", f.prompt, greedy(4), {}, {span(8, 20, 11, e1)});
  auto a = drain(e);
  // Same tokens, another image: page 0 already holds image tokens, so nothing is shared.
  e.add_request("b", f.prompt, greedy(4), {}, {span(8, 20, 22, e2)});
  auto b = drain(e);
  EXPECT_EQ(b["b"].cached, 0);
  // Same tokens, no image at all: no hit either.
  e.add_request("t", f.prompt, greedy(4));
  auto t = drain(e);
  EXPECT_EQ(t["t"].cached, 0);
  // The first image again: its two full pages are found, and the output is the first one's.
  e.add_request("c", f.prompt, greedy(4), {}, {span(8, 20, 11, e1)});
  auto c = drain(e);
  EXPECT_EQ(c["c"].cached, 32);
  EXPECT_EQ(c["c"].tokens, a["a"].tokens);
}

TEST(EngineMultimodal, ChunkedPrefillSplitsAnImageAcrossSteps) {
  Fixture f;
  auto e1 = random_embeds(1, 20, f.H);
  m3::Engine whole(f.model, nullptr, f.config());
  whole.add_request("w", f.prompt, greedy(8), {}, {span(8, 20, 11, e1)});
  auto w = drain(whole);
  m3::Engine chunked(f.model, nullptr, f.config(16));  // 16-token steps: the image spans two
  chunked.add_request("c", f.prompt, greedy(8), {}, {span(8, 20, 11, e1)});
  auto c = drain(chunked);
  EXPECT_EQ(c["c"].tokens, w["w"].tokens);
}

TEST(EngineMultimodal, BadSpansAreRefused) {
  Fixture f;
  m3::Engine e(f.model, nullptr, f.config());
  EXPECT_THROW(e.add_request("x", f.prompt, greedy(2), {}, {span(40, 20, 1, random_embeds(1, 20, f.H))}), m3::Error);
  EXPECT_THROW(e.add_request("y", f.prompt, greedy(2), {}, {span(8, 20, 1, random_embeds(1, 19, f.H))}), m3::Error);
  EXPECT_THROW(e.add_request("z", f.prompt, greedy(2), {},
                             {span(8, 10, 1, random_embeds(1, 10, f.H)), span(12, 4, 2, random_embeds(2, 4, f.H))}),
               m3::Error);
}

}  // namespace
