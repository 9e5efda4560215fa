// DSpark speculative decoding in the engine, on the shipped demo model and its dspark/ draft:
// the draft's block pass equals the PyTorch draft (tests/data/demo/dspark_golden.*); greedy outputs
// are token-for-token identical with and without speculation, alone and in a batch of 16 mixed
// requests, also under prefix-cache hits, preemption and aborts, and whatever number of drafts adaptive
// speculation verifies; sampled outputs follow the target's distribution (chi-square on the joint law
// of 4 tokens, also with adaptive speculation cutting the drafts); the counters add up; synthetic
// acceptance reaches its configured length; bad configurations fail at start with clear messages; the
// draft's per-query slot counts and batched Markov rows match the one-by-one results, and a draft with
// BF16 activations keeps greedy output and losslessness; adaptive verification with the demo draft's
// confidence head cuts drafts and keeps greedy output and the chi-square checks (block and standard), and
// its bad configurations (a non-boolean, without adaptive speculation, a draft without a head or with the
// head's tensors missing) are refused by name; dspark_draft_topk's candidate-pruned Markov bias equals the
// full bias on its candidates and keeps greedy output and the chi-square check; its bad values are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "chi_square.h"
#include "engine_test_util.h"
#include "base/error.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "formats/quantize.h"
#include "kernels/cpu/linear.h"
#include "engine/speculator.h"
#include "model/dspark.h"
#include "model/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace {

using m3::Engine;
using m3::EngineConfig;
using m3::SamplingParams;

const std::string kModel = std::string(M3_TEST_DATA) + "/../../models/demo";
const std::string kData = std::string(M3_TEST_DATA) + "/demo";

m3::Model& demo() {
  static m3::Model m(kModel);
  return m;
}
const m3::Tokenizer& demo_tok() {
  static m3::Tokenizer t = m3::Tokenizer::from_dir(kModel);
  return t;
}

EngineConfig spec_config(int k, const std::string& rejection, const std::string& draft_sample = "probabilistic") {
  EngineConfig c;
  c.num_pages = 64;
  c.spec = m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":)" + std::to_string(k) +
                                        R"(,"rejection_sample_method":")" + rejection + R"(","draft_sample_method":")" +
                                        draft_sample + R"("})");
  return c;
}

// Prompts of assorted kinds and lengths (some beyond the MSA selection span of 8 x 32 tokens).
std::vector<std::vector<int32_t>> demo_prompts() {
  const std::vector<std::string> texts = {
      "In the beginning God created",
      "What is 37 * 12?",
      "And Jesus said unto them",
      "Genesis 1:1",
      "The LORD is my shepherd; I shall not want.",
      "Convert 12 miles to kilometers.",
  };
  std::vector<std::vector<int32_t>> out;
  for (const auto& t : texts) out.push_back(demo_tok().encode(t, true));
  // Long ones from the held-out passages.
  std::ifstream f(kData + "/heldout_tokens.txt");
  std::string line;
  while (out.size() < 10 && std::getline(f, line)) {
    std::istringstream ss(line);
    std::vector<int32_t> ids;
    int32_t x;
    while (ss >> x) ids.push_back(x);
    ids.resize(std::min<size_t>(ids.size(), 140 + 40 * (out.size() - 6)));
    out.push_back(ids);
  }
  return out;
}

// The first 6 demo prompts, greedy, 48 tokens each, through an engine of config `c` (with the step cost
// model `cost` when given); its stats in *st.
std::map<std::string, m3test::Finished> run_six_greedy(const EngineConfig& c, m3::StepCostModel* cost,
                                                       m3::EngineStats* st) {
  const auto prompts = demo_prompts();
  Engine e(demo(), &demo_tok(), c);
  if (cost) e.set_step_cost_model(cost);
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 48;
    p.ignore_eos = true;
    e.add_request("g" + std::to_string(i), prompts[size_t(i)], p);
  }
  auto out = m3test::drain(e);
  *st = e.stats();
  return out;
}

// The six greedy requests without speculation and with two speculative configs (7 drafts, block
// verification, each changed by its setter, with its step cost model or none): both outputs must be
// the plain engine's, token for token. Returns the two speculative runs' stats.
std::pair<m3::EngineStats, m3::EngineStats> expect_six_greedy_unchanged(
    const std::function<void(EngineConfig&)>& set_a, m3::StepCostModel* cost_a,
    const std::function<void(EngineConfig&)>& set_b, m3::StepCostModel* cost_b) {
  m3::EngineStats st_plain, st_a, st_b;
  EngineConfig c0 = spec_config(7, "block"), ca = c0, cb = c0;
  c0.spec = m3::SpeculativeConfig{};
  const auto plain = run_six_greedy(c0, nullptr, &st_plain);
  set_a(ca);
  set_b(cb);
  const auto a = run_six_greedy(ca, cost_a, &st_a), b = run_six_greedy(cb, cost_b, &st_b);
  for (const auto& [id, f] : plain) {
    EXPECT_EQ(a.at(id).tokens, f.tokens) << id;
    EXPECT_EQ(b.at(id).tokens, f.tokens) << id;
  }
  return {st_a, st_b};
}

// 16 mixed greedy requests: different prompts, lengths, max_tokens, penalties, stop tokens.
std::map<std::string, m3test::Finished> run_mixed(const EngineConfig& cfg, int n = 16, bool abort_some = false,
                                                  m3::EngineStats* stats = nullptr, int extra_tokens = 0) {
  Engine e(demo(), &demo_tok(), cfg);
  const auto prompts = demo_prompts();
  for (int i = 0; i < n; ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 12 + 6 * (i % 5) + extra_tokens;
    p.ignore_eos = i % 3 == 0;
    if (i % 4 == 1) p.repetition_penalty = 1.3f;
    if (i % 5 == 2) p.frequency_penalty = 0.5f;
    if (i % 7 == 3) p.stop_token_ids = {demo_tok().encode(" the", false).at(0)};
    e.add_request("r" + std::to_string(i), prompts[size_t(i) % prompts.size()], p);
  }
  std::map<std::string, m3test::Finished> out;
  if (!abort_some) {
    out = m3test::drain(e);
    if (stats) *stats = e.stats();
    return out;
  }
  int steps = 0;
  while (e.has_work()) {
    for (auto& o : e.step()) {
      auto& f = out[o.request_id];
      f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finished) f.reason = o.finish_reason;
    }
    if (++steps == 4)
      for (int i = 0; i < n; i += 5) e.abort("r" + std::to_string(i));
  }
  return out;
}

TEST(SpecEngine, DraftBlockPassMatchesPyTorch) {
  std::ifstream jf(kData + "/dspark_golden.json");
  ASSERT_TRUE(jf.good());
  const auto g = nlohmann::json::parse(jf);
  const int64_t V = g["vocab"];
  std::ifstream bf(kData + "/dspark_golden.f32", std::ios::binary);
  std::vector<float> ref;
  bf.seekg(0, std::ios::end);
  const size_t bytes = size_t(bf.tellg());
  bf.seekg(0);
  ref.resize(bytes / 4);
  bf.read(reinterpret_cast<char*>(ref.data()), std::streamsize(bytes));
  const std::vector<int32_t> toks = g["tokens"].get<std::vector<int32_t>>();
  const std::vector<int> slots = g["slots"].get<std::vector<int>>();

  m3::Model& m = demo();
  m3::DSparkDraft draft(kModel + "/dspark", m);
  m.set_tap_layers(draft.config().target_layers);
  const int64_t T = int64_t(toks.size());
  std::vector<float> taps(static_cast<size_t>(T * draft.taps_width())), logits(static_cast<size_t>(V));
  m3::SeqCache cache = m.new_cache(T);
  m3::BatchItem it{&cache, toks.data(), T, 0, T - 1};
  m.forward_batch(&it, 1, logits.data(), m3::AttentionPath::Sparse, taps.data());
  m.set_tap_layers({});
  size_t off = 0;
  double worst = 0;
  for (const auto& c : g["cases"]) {
    const int64_t p = c["pos"];
    m3::SeqCache dkv(draft.config().kv_layout(), p + 1);
    m3::DraftContextRows rows{&dkv, taps.data(), 0, p};
    draft.write_context(&rows, 1);
    dkv.n_tokens = p;
    const int S = draft.config().block_size;
    std::vector<float> z(size_t(S * V));
    m3::DraftQuery q{&dkv, int32_t(c["anchor"]), p};
    draft.propose(&q, 1, S, z.data());
    for (int j : slots) {
      double md = 0;
      for (int64_t v = 0; v < V; ++v) md = std::max(md, double(std::fabs(z[size_t(j * V + v)] - ref[off + size_t(v)])));
      off += size_t(V);
      EXPECT_LT(md, 2e-3) << "position " << p << " slot " << j;
      worst = std::max(worst, md);
    }
    std::vector<float> mk(size_t(V), 0.0f);
    draft.add_markov(int32_t(c["anchor"]), mk.data());
    double md = 0;
    for (int64_t v = 0; v < V; ++v) md = std::max(md, double(std::fabs(mk[size_t(v)] - ref[off + size_t(v)])));
    off += size_t(V);
    EXPECT_LT(md, 1e-5) << "Markov bias at position " << p;
  }
  EXPECT_EQ(off, ref.size());
  std::printf("draft block logits vs PyTorch: max-abs %.3g\n", worst);
}

// draft_weights "mxfp8": the draft's copies of its wide matrices (its fc, the target's BF16 lm_head)
// hold, row for row, what the checkpoints' MXFP8 rule makes of the originals (33/32 bytes a weight);
// write_context() fuses the taps through the fc copy (the slots' states move, a little, against the
// draft without copies) and propose() multiplies the slots with the lm_head copy: each logit is the
// slot's final-normed state times the copy's row, with fp32 activations (a float sum over 256 products:
// 1e-4) and with BF16 activations (each activation rounded to BF16 first: 1e-3, either rounding of a tie).
TEST(SpecEngine, DraftMxfp8CopiesAreTheQuantisedMatrices) {
  m3::Model& m = demo();
  const m3::Linear& t = m.weights().lm_head();
  ASSERT_EQ(t.kind, m3::LinearKind::BF16);
  const int64_t V = t.N, H = t.K;
  const auto prompts = demo_prompts();
  const std::vector<int32_t>& toks = prompts[6];
  const int64_t T = int64_t(toks.size());
  m3::DSparkDraft plain(kModel + "/dspark", m);
  ASSERT_EQ(plain.fc().kind, m3::LinearKind::BF16);
  const int64_t TW = plain.taps_width();
  EXPECT_EQ(&plain.lm_head(), &t) << "without copies, the target's matrix";
  std::vector<float> taps(static_cast<size_t>(T * TW)), logits(static_cast<size_t>(V));
  m.set_tap_layers(plain.config().target_layers);
  m3::SeqCache cache = m.new_cache(T);
  m3::BatchItem it{&cache, toks.data(), T, 0, T - 1};
  m.forward_batch(&it, 1, logits.data(), m3::AttentionPath::Sparse, taps.data());
  m.set_tap_layers({});
  const int S = 3;
  auto slots = [&](m3::DSparkDraft& d, std::vector<float>& z) {  // the first S slots' logits after the prompt
    m3::SeqCache dkv(d.config().kv_layout(), T);
    m3::DraftContextRows rows{&dkv, taps.data(), 0, T - 1};
    d.write_context(&rows, 1);
    dkv.n_tokens = T - 1;
    z.resize(size_t(S * V));
    m3::DraftQuery dq{&dkv, toks.back(), T - 1};
    d.propose(&dq, 1, S, z.data());
  };
  std::vector<float> z0;
  slots(plain, z0);
  const std::vector<float> h0(plain.slot_hidden(0), plain.slot_hidden(0) + S * H);
  // A copy's row r decodes to the MXFP8 quantisation of the original's row r.
  auto expect_quantised = [](const m3::Linear& src, const m3::Linear& q) {
    ASSERT_EQ(q.kind, m3::LinearKind::MXFP8);
    ASSERT_EQ(q.N, src.N);
    ASSERT_EQ(q.K, src.K);
    const int64_t K = src.K;
    std::vector<float> sr(static_cast<size_t>(K)), qr(static_cast<size_t>(K)), want(static_cast<size_t>(K));
    std::vector<uint8_t> codes(static_cast<size_t>(K)), scales(static_cast<size_t>(K / 32));
    for (int64_t r : {int64_t(0), int64_t(1), int64_t(5), src.N / 2, src.N - 5, src.N - 1}) {
      m3::linear_decode_rows(src, r, 1, sr.data());
      m3::mxfp8_quantize_row(sr.data(), K, codes.data(), scales.data());
      m3::Linear one;
      one.kind = m3::LinearKind::MXFP8;
      one.N = 1;
      one.K = K;
      one.w = codes.data();
      one.scales = scales.data();
      m3::linear_decode_rows(one, 0, 1, want.data());
      m3::linear_decode_rows(q, r, 1, qr.data());
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(qr[size_t(k)], want[size_t(k)]) << src.name << " row " << r << " element " << k;
    }
  };
  for (bool bf16_act : {false, true}) {
    m3::DSparkDraft draft(kModel + "/dspark", m);
    ASSERT_EQ(draft.quantize_wide_weights(bf16_act), size_t((V * H + H * TW) / 32 * 33));
    EXPECT_EQ(draft.quantize_wide_weights(bf16_act), 0u) << "the copies are made once";
    const m3::Linear& q = draft.lm_head();
    expect_quantised(t, q);
    expect_quantised(plain.fc(), draft.fc());
    EXPECT_EQ(q.act_bf16, bf16_act);
    EXPECT_EQ(draft.fc().act_bf16, bf16_act);
    std::vector<float> z;
    slots(draft, z);
    // The context went through the fc copy: the slots' states moved, by a little.
    double d2 = 0, n2 = 0;
    for (int64_t i = 0; i < S * H; ++i) {
      d2 += std::pow(double(draft.slot_hidden(0)[i]) - double(h0[size_t(i)]), 2);
      n2 += std::pow(double(h0[size_t(i)]), 2);
    }
    EXPECT_GT(d2, 0.0);
    EXPECT_LT(std::sqrt(d2 / n2), 0.1);
    // The logits went through the lm_head copy.
    std::vector<float> x(static_cast<size_t>(H)), qr(static_cast<size_t>(H));
    double worst = 0;
    for (int j = 0; j < S; ++j) {
      std::copy_n(draft.slot_hidden(j), H, x.data());
      if (bf16_act)
        for (float& v : x) {
          uint32_t u;
          std::memcpy(&u, &v, 4);
          u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
          std::memcpy(&v, &u, 4);
        }
      for (int64_t r = 0; r < V; ++r) {
        m3::linear_decode_rows(q, r, 1, qr.data());
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < H; ++k) {
          ref += double(x[size_t(k)]) * double(qr[size_t(k)]);
          mag += std::fabs(double(x[size_t(k)]) * double(qr[size_t(k)]));
        }
        worst = std::max(worst, std::fabs(double(z[size_t(j * V + r)]) - ref) / std::max(mag, 1e-30));
      }
    }
    EXPECT_LT(worst, bf16_act ? 1e-3 : 1e-4) << (bf16_act ? "bf16" : "fp32") << " activations";
    std::printf("draft with MXFP8 copies (%s activations): slot states %.3g from the plain draft's (relative L2); "
                "logits against the lm_head copy: worst error / sum |products| %.3g\n",
                bf16_act ? "bf16" : "fp32", std::sqrt(d2 / n2), worst);
  }
}

// The draft's block pass with a slot count per query writes each query's first rows as the pass with
// the whole block does, and the Markov bias of several rows at once equals that of each row alone.
TEST(SpecEngine, DraftSlotsPerQueryAndMarkovRowsMatchOneByOne) {
  m3::Model& m = demo();
  m3::DSparkDraft draft(kModel + "/dspark", m);
  const int64_t V = m.config().vocab;
  const int S = draft.config().block_size;
  m.set_tap_layers(draft.config().target_layers);
  const auto prompts = demo_prompts();
  std::vector<m3::SeqCache> dkv;
  dkv.reserve(3);
  std::vector<m3::DraftQuery> qs;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t>& toks = prompts[size_t(6 + i)];
    const int64_t T = int64_t(toks.size());
    std::vector<float> taps(static_cast<size_t>(T * draft.taps_width())), logits(static_cast<size_t>(V));
    m3::SeqCache cache = m.new_cache(T);
    m3::BatchItem it{&cache, toks.data(), T, 0, T - 1};
    m.forward_batch(&it, 1, logits.data(), m3::AttentionPath::Sparse, taps.data());
    dkv.emplace_back(draft.config().kv_layout(), T);
    m3::DraftContextRows rows{&dkv.back(), taps.data(), 0, T - 1};
    draft.write_context(&rows, 1);
    dkv.back().n_tokens = T - 1;
  }
  m.set_tap_layers({});
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t>& toks = prompts[size_t(6 + i)];
    qs.push_back({&dkv[size_t(i)], toks.back(), int64_t(toks.size()) - 1});
  }
  std::vector<float> whole(size_t(3 * S * V));
  draft.propose(qs.data(), 3, S, whole.data());
  const int slots[3] = {2, S, 1};
  std::vector<float> part(size_t((2 + S + 1) * V));
  draft.propose(qs.data(), 3, slots, part.data());
  int64_t row = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < slots[i]; ++j, ++row) {
      double md = 0;
      for (int64_t v = 0; v < V; ++v)
        md = std::max(md, double(std::fabs(part[size_t(row * V + v)] - whole[size_t((i * S + j) * V + v)])));
      EXPECT_LT(md, 1e-4) << "query " << i << " slot " << j;
    }
  // Markov rows: three previous tokens at once against one at a time, bit for bit.
  const int32_t prev[3] = {5, 17, int32_t(V - 1)};
  std::vector<float> one = whole, many = whole;
  float* rows[3] = {&many[0], &many[size_t(4 * V)], &many[size_t(9 * V)]};
  draft.add_markov(prev, rows, 3);
  draft.add_markov(prev[0], &one[0]);
  draft.add_markov(prev[1], &one[size_t(4 * V)]);
  draft.add_markov(prev[2], &one[size_t(9 * V)]);
  EXPECT_EQ(one, many);
  EXPECT_NE(one, whole);
}

TEST(SpecEngine, GreedyIdenticalAloneAndInBatch) {
  EngineConfig base;
  base.num_pages = 64;
  const auto ref_single = [&] {
    Engine e(demo(), &demo_tok(), base);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 64;
    p.ignore_eos = true;
    e.add_request("a", demo_prompts()[0], p);
    return m3test::drain(e)["a"].tokens;
  }();
  const auto ref_batch = run_mixed(base);
  struct Case {
    int k;
    const char* rej;
    const char* ds;
  };
  for (const Case& cs : {Case{1, "standard", "probabilistic"}, Case{3, "block", "probabilistic"},
                         Case{7, "block", "probabilistic"}, Case{7, "standard", "greedy"}}) {
    const int k = cs.k;
    const char* rej = cs.rej;
    const char* ds = cs.ds;
    {
      {
        const EngineConfig c = spec_config(k, rej, ds);
        Engine e(demo(), &demo_tok(), c);
        SamplingParams p;
        p.temperature = 0;
        p.max_tokens = 64;
        p.ignore_eos = true;
        e.add_request("a", demo_prompts()[0], p);
        EXPECT_EQ(m3test::drain(e)["a"].tokens, ref_single) << "k=" << k << " " << rej << " " << ds;
        const auto st = e.stats();
        EXPECT_GT(st.spec_drafts, 0);
        EXPECT_GT(st.spec_accepted_tokens, 0) << "the trained draft accepts some tokens";
        const auto got = run_mixed(c);
        ASSERT_EQ(got.size(), ref_batch.size());
        for (const auto& [id, f] : ref_batch) {
          EXPECT_EQ(got.at(id).tokens, f.tokens) << id << " k=" << k << " " << rej << " " << ds;
          EXPECT_EQ(got.at(id).reason, f.reason) << id;
        }
      }
    }
  }
}

// The draft's anchor input: a given anchor embedding replaces the anchor token's row, exactly. (An image
// placeholder anchor is given its image embedding, as the target is.)
TEST(SpecEngine, DraftAnchorTakesItsInputEmbedding) {
  m3::Model& m = demo();
  m3::DSparkDraft draft(kModel + "/dspark", m);
  m.set_tap_layers(draft.config().target_layers);
  const std::vector<int32_t> toks = demo_tok().encode("In the beginning God created the heaven", true);
  const int64_t T = int64_t(toks.size()), V = m.config().vocab, H = m.config().hidden;
  std::vector<float> taps(static_cast<size_t>(T * draft.taps_width())), logits(static_cast<size_t>(V));
  m3::SeqCache cache = m.new_cache(T);
  m3::BatchItem it{&cache, toks.data(), T, 0, T - 1};
  m.forward_batch(&it, 1, logits.data(), m3::AttentionPath::Sparse, taps.data());
  m.set_tap_layers({});
  const int64_t p = T - 1;
  m3::SeqCache dkv(draft.config().kv_layout(), p + 1);
  m3::DraftContextRows rows{&dkv, taps.data(), 0, p};
  draft.write_context(&rows, 1);
  dkv.n_tokens = p;
  const int S = draft.config().block_size;
  const int32_t x = toks[size_t(p)], y = demo_tok().encode(" earth", false).at(0);
  std::vector<float> row_x(static_cast<size_t>(H)), row_y(static_cast<size_t>(H));
  m3::embedding_row(m.weights().embed(), x, H, row_x.data());
  m3::embedding_row(m.weights().embed(), y, H, row_y.data());
  auto block = [&](int32_t anchor, const float* embed) {
    std::vector<float> z(size_t(S * V));
    m3::DraftQuery q{&dkv, anchor, p, embed};
    draft.propose(&q, 1, S, z.data());
    return z;
  };
  const auto zx = block(x, nullptr), zy = block(y, nullptr);
  ASSERT_NE(zx, zy);
  EXPECT_EQ(block(y, row_x.data()), zx);  // the embedding, not the id, is what the draft reads
  EXPECT_EQ(block(x, row_y.data()), zy);
}

// Greedy output is the same with and without speculation when the prompt ends in an image: the second
// request finds all but the last prompt token cached, so its first decode step's anchor is the image's
// last placeholder (the draft gets the image embedding there); the first request drafts after a full
// prefill over the image embeddings.
TEST(SpecEngine, GreedyIdenticalWithAnImagePrompt) {
  const int64_t H = demo().config().hidden;
  std::vector<int32_t> prompt = demo_prompts().back();
  EngineConfig base;
  base.num_pages = 64;
  Engine probe(demo(), &demo_tok(), base);
  const int64_t B = probe.block_size();
  prompt.resize(size_t(2 * B + 1));  // two whole pages and the last token
  m3::MultimodalSpan span;
  span.offset = 2 * B - 5;  // the image ends the prompt: 6 placeholders over the page boundary
  span.count = 6;
  span.hash = 0x1a2b3c;
  auto embeds = std::make_shared<std::vector<float>>(size_t(span.count * H));
  for (int64_t t = 0; t < span.count; ++t)  // rows of other tokens, scaled: realistic magnitudes, not any token's
    m3::embedding_row(demo().weights().embed(), int32_t(1000 + 37 * t), H, embeds->data() + t * H);
  for (float& v : *embeds) v *= 1.5f;
  span.embeds = embeds;
  for (int64_t t = span.offset; t < span.offset + span.count; ++t) prompt[size_t(t)] = 5;  // placeholder id
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  auto twice = [&](const EngineConfig& cfg, m3::EngineStats* st) {
    Engine e(demo(), &demo_tok(), cfg);
    std::vector<std::vector<int32_t>> outs;
    for (const char* id : {"first", "again"}) {
      e.add_request(id, prompt, sp, {}, {span});
      outs.push_back(m3test::drain(e).at(id).tokens);
    }
    *st = e.stats();
    return outs;
  };
  m3::EngineStats plain_st, spec_st;
  const auto want = twice(base, &plain_st);
  EngineConfig spec = spec_config(3, "block");
  spec.num_pages = 64;
  const auto got = twice(spec, &spec_st);
  ASSERT_EQ(want[0], want[1]);
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[0]);
  EXPECT_EQ(spec_st.prefix_hits, 2 * B);  // the second request computed only the image's last placeholder
  EXPECT_GT(spec_st.spec_drafts, 0);
  // Without the image (the placeholder's own row) the answer differs: the embedding was used.
  Engine e(demo(), &demo_tok(), base);
  e.add_request("text", prompt, sp);
  EXPECT_NE(m3test::drain(e).at("text").tokens, want[0]);
}

TEST(SpecEngine, GreedyIdenticalUnderPreemptionPrefixCacheAndAborts) {
  EngineConfig base;
  base.step_latency_factor = 0;  // token budgets only: the preemption asserted below must not hang on measured step times
  base.num_pages = 11;  // 352 tokens for 10 requests (the longest alone needs 336): forces preemption
  base.max_num_batched_tokens = 96;
  EngineConfig spec = spec_config(7, "block");
  spec.num_pages = base.num_pages;
  spec.max_num_batched_tokens = base.max_num_batched_tokens;
  const auto ref = run_mixed(base, 10, false, nullptr, 40);
  m3::EngineStats st;
  const auto got = run_mixed(spec, 10, false, &st, 40);
  for (const auto& [id, f] : ref) EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix_hits, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  // Aborts mid-flight leave the other requests' outputs unchanged.
  const auto ref_ab = run_mixed(base, 10, true);
  const auto got_ab = run_mixed(spec, 10, true);
  for (const auto& [id, f] : ref_ab)
    if (f.reason != m3::FinishReason::Abort && f.reason != m3::FinishReason::None) {
      EXPECT_EQ(got_ab.at(id).tokens, f.tokens) << id;
    }
}

// Losslessness through the whole engine (draft, Markov head, distributions, verification, KV
// rollback): with temperature 1 and top-k 3 every step has 3 candidates, so the joint law of the
// first 4 generated tokens has at most 81 cells and is computed exactly by enumerating prefixes
// with the plain forward pass. The speculative engine's samples must fit it (Pearson chi-square,
// alpha = 1e-3, cells under 5 expected pooled). Tokens 2-4 come from speculative steps.
void check_lossless(const char* rejection, const m3::StepCostModel* cost = nullptr, bool bf16_draft = false,
                    bool confidence = false, int draft_topk = 0) {
  const int64_t V = demo().config().vocab;
  const std::vector<int32_t> prompt = demo_tok().encode("And God said, Let", true);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  // Exact joint law by enumeration (fp32 KV in both paths).
  std::map<std::vector<int32_t>, double> exact;
  std::vector<float> logits(static_cast<size_t>(V)), probs(static_cast<size_t>(V));
  std::function<void(std::vector<int32_t>, double)> walk = [&](std::vector<int32_t> out, double pr) {
    if (out.size() == 4) {
      exact[out] = pr;
      return;
    }
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    m3::SeqCache cache = demo().new_cache(int64_t(all.size()));
    demo().forward(all.data(), int64_t(all.size()), cache, logits.data());
    m3::Sampler smp(sp);
    smp.distribution(logits.data(), V, prompt, out, probs.data());
    const std::vector<float> dist = probs;
    for (int64_t t = 0; t < V; ++t)
      if (dist[size_t(t)] > 0) {
        std::vector<int32_t> next = out;
        next.push_back(int32_t(t));
        walk(next, pr * double(dist[size_t(t)]));
      }
  };
  walk({}, 1.0);
  ASSERT_LE(exact.size(), 81u);
  EngineConfig c = spec_config(3, rejection);
  if (bf16_draft) {
    c.spec.draft_activations = "bf16";
    c.spec.draft_weights = "mxfp8";  // and the draft's MXFP8 copies: another q, the same law
    c.spec.adaptive = false;  // every step verifies its drafts: tokens 2-4 all from speculative steps
  } else {
    c.spec.draft_activations = "fp32";  // the exact draft ("auto", the default, is bf16 on AVX512-BF16)
    c.spec.draft_weights = "checkpoint";
  }
  c.spec.adaptive_verification = confidence;
  if (draft_topk > 0) {
    c.spec.draft_topk = draft_topk;
    c.spec.adaptive = false;  // every step verifies its drafts: tokens 2-4 all from speculative steps
  }
  // With the head, 4 requests at a time: steps of a few rows, where adaptive speculation chooses 2-3
  // drafts and the head cuts some of them (in batches of hundreds every draft but the first is dear).
  if (confidence) c.max_num_seqs = 4;
  c.kv_cache_dtype = "fp32";
  c.indexer_kv_dtype = "fp32";
  c.max_num_batched_tokens = 4096;
  Engine e(demo(), &demo_tok(), c);
  if (cost) e.set_step_cost_model(cost);
  auto [p, counts] = m3test::sample_cells(e, prompt, sp, exact, 1500, 17u);
  const auto st = e.stats();
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(counts.back(), 0) << "samples outside the exact support";
  counts.pop_back();
  const m3test::ChiSquare r = m3test::chi_square(counts, p, rejection);
  EXPECT_TRUE(r.pass()) << rejection << ": chi2 " << r.stat << " > critical " << r.critical;
  if (confidence) {
    EXPECT_GT(st.spec_cut_by_confidence, 0) << "the confidence head never cut a draft";
  }
  std::printf("%s: acceptance length %.3f over %lld drafts, %lld drafts cut by the confidence head\n", rejection,
              1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts), (long long)st.spec_drafts,
              (long long)st.spec_cut_by_confidence);
}

TEST(SpecEngine, SampledOutputFollowsTargetBlock) { check_lossless("block"); }
TEST(SpecEngine, SampledOutputFollowsTargetStandard) { check_lossless("standard"); }
// The draft with BF16 activations proposes from a slightly different q; verification against that q
// keeps the output's law the target's.
TEST(SpecEngine, SampledOutputFollowsTargetBlockBf16Draft) { check_lossless("block", nullptr, true); }

// Adaptive speculation against step costs that make verified rows dear (a fake: 1 s + 10 ms per
// decode row + 1 ms per prefill token), so that the number of drafts verified changes from step to
// step with each request's measured acceptance.
struct DearRows : m3::StepCostModel {
  double predict_ms(int64_t p, int64_t d) const override { return 1000.0 + 10.0 * double(d) + 1.0 * double(p); }
};

TEST(SpecEngine, SampledOutputFollowsTargetBlockAdaptive) {
  DearRows cost;
  check_lossless("block", &cost);
}

// Adaptive verification (enable_adaptive_verification) with the demo draft's trained confidence head,
// against step costs where a verified row is dear (a fake: 1 s + 0.15 s per decode row + 10 ms per
// prefill token, so that the measured draft pass and draft context weigh nothing next to them and the
// decisions do not depend on the host's load), so that the head's survival probabilities cut drafts:
// the cut is a stopping rule, and the samples still follow the target's law.
struct ThirdRows : m3::StepCostModel {
  double predict_ms(int64_t p, int64_t d) const override { return 1000.0 + 150.0 * double(d) + 10.0 * double(p); }
};

// dspark_draft_topk: drafts drawn among the k best base logits with the Markov bias on those only.
TEST(SpecEngine, SampledOutputFollowsTargetBlockDraftTopk) { check_lossless("block", nullptr, false, false, 8); }

TEST(SpecEngine, SampledOutputFollowsTargetBlockAdaptiveVerification) {
  ThirdRows cost;
  check_lossless("block", &cost, false, true);
}
TEST(SpecEngine, SampledOutputFollowsTargetStandardAdaptiveVerification) {
  ThirdRows cost;
  check_lossless("standard", &cost, false, true);
}

// dspark_draft_topk: the candidate-pruned bias equals the full bias on the k best base logits (ties by
// lowest id) and is -infinity elsewhere; greedy output with it is the target's, alone and in the mixed
// batch, and the drafts are still kept.
TEST(SpecEngine, DraftTopkMarkovMatchesTheFullBiasOnItsCandidates) {
  m3::DSparkDraft draft(kModel + "/dspark", demo());
  const int64_t V = demo().config().vocab;
  std::vector<float> base(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) base[size_t(v)] = float(std::sin(double(v) * 0.37) * 4.0);  // assorted logits
  base[5] = base[9] = 10.0f;  // a tie at the top: both are candidates
  for (int k : {1, 2, 16, 300}) {
    std::vector<float> full = base, top = base;
    draft.add_markov(1234, full.data());
    draft.add_markov_topk(1234, top.data(), k);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ids[size_t(v)] = int32_t(v);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return base[size_t(a)] > base[size_t(b)]; });
    std::vector<char> cand(static_cast<size_t>(V), 0);
    for (int i = 0; i < k; ++i) cand[size_t(ids[size_t(i)])] = 1;
    int n = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (cand[size_t(v)]) {
        EXPECT_NEAR(top[size_t(v)], full[size_t(v)], 1e-5) << "k " << k << " id " << v;
        ++n;
      } else {
        EXPECT_TRUE(std::isinf(top[size_t(v)]) && top[size_t(v)] < 0) << "k " << k << " id " << v;
      }
    }
    EXPECT_EQ(n, k);
  }
  EXPECT_EQ(base[5], 10.0f);
  // Greedy output unchanged with the pruned head.
  EngineConfig plain;
  plain.num_pages = 64;
  const auto ref = run_mixed(plain);
  EngineConfig c = spec_config(7, "block");
  c.spec.draft_topk = 8;
  m3::EngineStats st;
  const auto got = run_mixed(c, 16, false, &st);
  for (const auto& [id, f] : ref) EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
  EXPECT_GT(st.spec_accepted_tokens, 0);
  std::printf("draft top-8: acceptance length %.3f over %lld drafts\n",
              1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts), (long long)st.spec_drafts);
}

// Greedy output with adaptive verification on is the target's, token for token, and the head did cut
// (DearRows: speculation keeps paying at the demo's greedy acceptance, and the survival a verified row
// must beat is about 1%, which the head's products fall below within a few drafts).
TEST(SpecEngine, AdaptiveVerificationNeverChangesGreedyOutput) {
  DearRows cost;
  const auto [st_adaptive, st_conf] = expect_six_greedy_unchanged(
      [](EngineConfig&) {}, &cost, [](EngineConfig& c) { c.spec.adaptive_verification = true; }, &cost);
  EXPECT_GT(st_conf.spec_accepted_tokens, 0);
  EXPECT_GT(st_conf.spec_cut_by_confidence, 0);
  EXPECT_EQ(st_adaptive.spec_cut_by_confidence, 0);
  std::printf("greedy, 6 requests: adaptive verified %lld drafts (%lld kept) in %lld steps; with the head %lld "
              "(%lld kept) in %lld steps, %lld cut\n",
              (long long)st_adaptive.spec_draft_tokens, (long long)st_adaptive.spec_accepted_tokens,
              (long long)st_adaptive.spec_drafts, (long long)st_conf.spec_draft_tokens,
              (long long)st_conf.spec_accepted_tokens, (long long)st_conf.spec_drafts,
              (long long)st_conf.spec_cut_by_confidence);
}

// draft_activations "bf16" (the demo draft is MXFP8) and the draft's MXFP8 copies: greedy output
// is the target's, token for token, alone and in the mixed batch, and the draft still proposes tokens
// the target keeps.
TEST(SpecEngine, Bf16DraftActivationsKeepGreedyOutput) {
  EngineConfig base;
  base.num_pages = 64;
  const auto ref = run_mixed(base);
  EngineConfig c = spec_config(7, "block");
  c.spec.draft_activations = "bf16";
  c.spec.draft_weights = "mxfp8";
  m3::EngineStats st;
  const auto got = run_mixed(c, 16, false, &st);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [id, f] : ref) {
    EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
    EXPECT_EQ(got.at(id).reason, f.reason) << id;
  }
  EXPECT_GT(st.spec_accepted_tokens, 0);
  std::printf("bf16 draft: acceptance length %.3f over %lld drafts\n",
              1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts), (long long)st.spec_drafts);
}

TEST(SpecEngine, AdaptiveDraftCountNeverChangesGreedyOutput) {
  DearRows cost;
  // The same 6 greedy requests without speculation, with 7 drafts verified every step, and adaptive.
  const auto [st_fixed, st_adaptive] = expect_six_greedy_unchanged(
      [](EngineConfig& c) { c.spec.adaptive = false; }, nullptr, [](EngineConfig&) {}, &cost);
  EXPECT_GT(st_adaptive.spec_accepted_tokens, 0);
  // The decision did cut the drafts: fewer verified than with the fixed length for the same tokens.
  EXPECT_LT(st_adaptive.spec_draft_tokens, st_fixed.spec_draft_tokens);
  std::printf("drafts verified: fixed %lld in %lld steps, adaptive %lld in %lld steps\n",
              (long long)st_fixed.spec_draft_tokens, (long long)st_fixed.spec_drafts,
              (long long)st_adaptive.spec_draft_tokens, (long long)st_adaptive.spec_drafts);
}

// Sampled requests draw on their own random streams while the engine samples several requests at once
// on the worker pool (plain rows, the draft's distributions and the verification of each speculative
// chunk): seeded outputs are the same token for token with one thread and with two, with speculation
// (every step verifies its drafts) and without.
TEST(SpecEngine, SeededSampledOutputIndependentOfThreads) {
  const auto prompts = demo_prompts();
  auto run = [&](int threads, bool spec) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    EngineConfig c = spec ? spec_config(3, "block") : EngineConfig{};
    c.num_pages = 64;
    if (spec) c.spec.adaptive = false;
    Engine e(demo(), &demo_tok(), c);
    for (int i = 0; i < 6; ++i) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.top_p = 0.9f;
      p.has_seed = true;
      p.seed = 77 + uint64_t(i);
      p.max_tokens = 24;
      p.ignore_eos = true;
      e.add_request("r" + std::to_string(i), prompts[size_t(i)], p);
    }
    auto out = m3test::drain(e);
    const auto st = e.stats();
    omp_set_num_threads(saved);
    if (spec) EXPECT_GT(st.spec_drafts, 0);
    return out;
  };
  for (bool spec : {false, true}) {
    const auto one = run(1, spec), two = run(2, spec);
    ASSERT_EQ(one.size(), 6u);
    for (const auto& [id, f] : one) {
      EXPECT_EQ(two.at(id).tokens, f.tokens) << id << (spec ? " speculative" : " plain");
      EXPECT_EQ(f.tokens.size(), 24u) << id;
    }
  }
}

// Rows so dear (a fake: 10 ms + 1 s per decode row) that no draft can pay: the first request speculates
// (it measures the costs), and once they are measured a new request starts without speculation, no
// draft context and no draft pass, until the 8th next one explores again. With rows cheap (DearRows:
// a 1 s step, 10 ms per row) every request drafts. Greedy output is the plain engine's either way.
struct DearestRows : m3::StepCostModel {
  double predict_ms(int64_t p, int64_t d) const override { return 10.0 + 1000.0 * double(d) + 1.0 * double(p); }
};

// A verified row costs more than the whole one-row step (rows cost their count squared): speculation
// cannot pay even if every draft were accepted.
struct SquaredRows : m3::StepCostModel {
  double predict_ms(int64_t p, int64_t d) const override { return 10.0 + 1000.0 * double(d * d) + 1.0 * double(p); }
};

TEST(SpecEngine, AdmissionSkipsSpeculationThatCannotPay) {
  const auto prompts = demo_prompts();
  DearestRows dearest;
  DearRows dear;
  SquaredRows squared;
  // After each request: the verification steps so far, and the tokens with draft context so far.
  auto run = [&](m3::StepCostModel* cost, std::vector<std::pair<int64_t, int64_t>>* after) {
    EngineConfig c = cost ? spec_config(7, "block") : EngineConfig{};
    c.num_pages = 64;
    Engine e(demo(), &demo_tok(), c);
    if (cost) e.set_step_cost_model(cost);
    std::map<std::string, m3test::Finished> out;
    for (int i = 0; i < 10; ++i) {  // one at a time: request i is admitted after request i-1 ended
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = 24;
      p.ignore_eos = true;
      e.add_request("a" + std::to_string(i), prompts[size_t(i) % prompts.size()], p);
      for (auto& [id, f] : m3test::drain(e)) out[id] = f;
      if (after) after->emplace_back(e.stats().spec_drafts, e.stats().spec_context_tokens);
    }
    return out;
  };
  const auto plain = run(nullptr, nullptr);
  std::vector<std::pair<int64_t, int64_t>> dearest_after, dear_after, squared_after;
  const auto a = run(&dearest, &dearest_after), b = run(&dear, &dear_after), sq = run(&squared, &squared_after);
  for (const auto& [id, f] : plain) {
    EXPECT_EQ(a.at(id).tokens, f.tokens) << id;
    EXPECT_EQ(b.at(id).tokens, f.tokens) << id;
    EXPECT_EQ(sq.at(id).tokens, f.tokens) << id;
  }
  ASSERT_EQ(dearest_after.size(), 10u);
  // The first request verified drafts and wrote the draft's context (the costs were not measured yet).
  EXPECT_GT(dearest_after[0].first, 0);
  EXPECT_GT(dearest_after[0].second, 0);
  // Requests 2-8: no verification, and not one token of draft context (prompt or output).
  for (size_t i = 1; i < 8; ++i) {
    EXPECT_EQ(dearest_after[i].first, dearest_after[0].first) << "request " << i << " drafted";
    EXPECT_EQ(dearest_after[i].second, dearest_after[0].second) << "request " << i << " wrote draft context";
  }
  // The 9th request (the 8th after the first) explores: it writes its draft context again.
  EXPECT_GT(dearest_after[8].second, dearest_after[7].second);
  // Unless the costs rule speculation out at any acceptance: after the first request, no request
  // drafts or writes draft context, the explorers included.
  ASSERT_EQ(squared_after.size(), 10u);
  EXPECT_GT(squared_after[0].second, 0);
  for (size_t i = 1; i < 10; ++i) {
    EXPECT_EQ(squared_after[i].first, squared_after[0].first) << "request " << i << " drafted";
    EXPECT_EQ(squared_after[i].second, squared_after[0].second) << "request " << i << " wrote draft context";
  }
  // Cheap rows: every request drafts and writes its context.
  for (size_t i = 1; i < 10; ++i) {
    EXPECT_GT(dear_after[i].first, dear_after[i - 1].first) << "request " << i << " did not draft";
    EXPECT_GT(dear_after[i].second, dear_after[i - 1].second) << "request " << i;
  }
}

// The draft pass's cost is priced per request and per drafted slot: the first (cold) pass is not
// timed, passes that all drafted the same slots per request leave it unmeasured (their split is a
// guess), and one pass of another count separates the two. Here a = 2 ms, b = 1 ms per slot.
TEST(SpecEngine, DraftCostSplitPerRequestAndPerSlot) {
  m3::Speculator s(spec_config(7, "block").spec, demo(), m3::KVDtype::BF16);
  EXPECT_LT(s.draft_ms(3), 0);
  s.observe_draft(50.0, 1, 7);  // cold: not counted
  s.observe_draft(9.0, 1, 7);
  s.observe_draft(18.0, 2, 14);
  EXPECT_LT(s.draft_ms(3), 0) << "one slot count per request cannot split the cost";
  s.observe_draft(3.0, 1, 1);
  EXPECT_NEAR(s.draft_ms(3), 5.0, 0.01);
  EXPECT_NEAR(s.draft_ms(7), 9.0, 0.01);
  EXPECT_NEAR(s.draft_ms(0), 2.0, 0.01);
}

TEST(SpecEngine, CountersAddUp) {
  // Every step verifies its drafts (adaptive speculation off), so that the tokens add up as below.
  EngineConfig c = spec_config(7, "standard");
  c.spec.adaptive = false;
  Engine e(demo(), &demo_tok(), c);
  const auto prompts = demo_prompts();
  int64_t emitted = 0;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p;
    p.temperature = 0.7f;
    p.seed = uint64_t(i);
    p.has_seed = true;
    p.max_tokens = 48;
    p.ignore_eos = true;
    e.add_request("c" + std::to_string(i), prompts[size_t(i)], p);
  }
  for (auto& [id, f] : m3test::drain(e)) emitted += int64_t(f.tokens.size());
  const auto st = e.stats();
  ASSERT_EQ(st.spec_accepted_per_pos.size(), 7u);
  int64_t sum = 0;
  for (size_t i = 0; i < 7; ++i) {
    sum += st.spec_accepted_per_pos[i];
    if (i) {
      EXPECT_LE(st.spec_accepted_per_pos[i], st.spec_accepted_per_pos[i - 1]);
    }
  }
  EXPECT_EQ(sum, st.spec_accepted_tokens);
  EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens);
  // Every token after each request's first comes from a verification step (accepted drafts + 1),
  // except the last one of a request when no draft fits under max_tokens (a plain decode step).
  const int64_t plain = emitted - (4 + st.spec_drafts + st.spec_accepted_tokens);
  EXPECT_GE(plain, 0);
  EXPECT_LE(plain, 4);
  EXPECT_EQ(st.generated_tokens, emitted);
}

TEST(SpecEngine, SyntheticAcceptanceReachesConfiguredLength) {
  EngineConfig c;
  c.num_pages = 64;
  c.spec = m3::SpeculativeConfig::parse(
      R"({"method":"dspark","num_speculative_tokens":7,"rejection_sample_method":"synthetic","synthetic_acceptance_length":3.5,)"
      R"("adaptive_num_speculative_tokens":false})");  // every draft verified: the length is the rule's alone
  Engine e(demo(), &demo_tok(), c);
  const auto prompts = demo_prompts();
  for (int i = 0; i < 8; ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = uint64_t(100 + i);
    p.has_seed = true;
    p.max_tokens = 200;
    p.ignore_eos = true;
    e.add_request("s" + std::to_string(i), prompts[size_t(i) % prompts.size()], p);
  }
  m3test::drain(e);
  const auto st = e.stats();
  const double al = 1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts);
  // vLLM's minimum-variance schedule for 3.5: the first two drafts always, the third half the time;
  // only the last steps (capped by max_tokens) can be shorter.
  EXPECT_NEAR(al, 3.5, 0.15) << st.spec_drafts << " drafts";
}

TEST(SpecEngine, BadConfigurationsFailAtStart) {
  auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const m3::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg([] { m3::SpeculativeConfig::parse(R"({"method":"eagle3","num_speculative_tokens":3})"); })
                .find("\"eagle3\" is not supported"),
            std::string::npos);
  EXPECT_NE(msg([] { m3::SpeculativeConfig::parse(R"({"method":"dspark"})"); }).find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(msg([] {
              m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"rejection_sample_method":"tree"})");
            }).find("rejection_sample_method"),
            std::string::npos);
  EXPECT_NE(msg([] { m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"foo":1})"); })
                .find("foo: unknown key"),
            std::string::npos);
  EXPECT_NE(msg([] { Engine e(demo(), &demo_tok(), spec_config(8, "block")); }).find("exceeds the draft's dspark_block_size 7"),
            std::string::npos);
  EXPECT_NE(msg([] {
              m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"draft_activations":"int8"})");
            }).find("draft_activations: \"int8\" is not supported (expected one of \"auto\", \"fp32\", \"bf16\")"),
            std::string::npos);
  EXPECT_EQ(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"draft_activations":"bf16"})")
                .draft_activations,
            "bf16");
  EXPECT_NE(msg([] {
              m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"draft_weights":"nvfp4"})");
            }).find("draft_weights: \"nvfp4\" is not supported (expected one of \"auto\", \"checkpoint\", \"mxfp8\")"),
            std::string::npos);
  EXPECT_EQ(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3})").draft_weights, "auto");
  EXPECT_EQ(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"draft_weights":"mxfp8"})")
                .draft_weights,
            "mxfp8");
  // enable_adaptive_verification: a boolean, with adaptive speculation (its step costs), and a draft
  // with a confidence head; dspark_draft_topk is refused by name.
  EXPECT_NE(msg([] {
              m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":"yes"})");
            }).find("enable_adaptive_verification: expected true or false, got \"yes\""),
            std::string::npos);
  EXPECT_NE(msg([] {
              m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":true,)"
                                           R"("adaptive_num_speculative_tokens":false})");
            }).find("enable_adaptive_verification: needs adaptive_num_speculative_tokens true"),
            std::string::npos);
  EXPECT_TRUE(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":true})")
                  .adaptive_verification);
  EXPECT_FALSE(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":false})")
                   .adaptive_verification);
  for (const char* bad : {"0", "-3", "2.5", "\"8\""})
    EXPECT_NE(msg([&] {
                m3::SpeculativeConfig::parse(std::string(R"({"method":"dspark","num_speculative_tokens":3,"dspark_draft_topk":)") +
                                             bad + "}");
              }).find("dspark_draft_topk: expected a positive integer"),
              std::string::npos)
        << bad;
  EXPECT_EQ(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"dspark_draft_topk":8})").draft_topk, 8);
  EXPECT_EQ(m3::SpeculativeConfig::parse(R"({"method":"dspark","num_speculative_tokens":3,"dspark_draft_topk":null})").draft_topk, 0);
  {
    // The demo draft without its head: config.json says none (refused by name), or says one but the
    // tensors are missing (the loader names the tensor).
    const std::string dir = m3test::test_tmp_dir() + "/dspark_no_head";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kModel + "/dspark/config.json"));
    nlohmann::json& tc = cfg.contains("text_config") ? cfg["text_config"] : cfg;
    tc["enable_confidence_head"] = false;
    std::ofstream(dir + "/config.json") << cfg.dump();
    std::vector<m3::TensorData> kept;
    {
      m3::TensorStore st(kModel + "/dspark");
      for (const auto& [name, v] : st.all()) {
        if (name.find("confidence_head") != std::string::npos) continue;
        kept.push_back({{name, v->dtype, v->shape}, std::vector<uint8_t>(v->data, v->data + v->nbytes)});
      }
    }
    m3::write_safetensors_file(dir + "/model.safetensors", kept);
    EngineConfig c = spec_config(3, "block");
    c.spec.adaptive_verification = true;
    c.spec.model = dir;
    std::string m = msg([&] { Engine e(demo(), &demo_tok(), c); });
    EXPECT_NE(m.find("enable_adaptive_verification: the draft in " + dir + " has no confidence head"), std::string::npos) << m;
    c.spec.adaptive_verification = false;  // a draft without a head serves without the feature
    EXPECT_EQ(msg([&] { Engine e(demo(), &demo_tok(), c); }), "(no error)");
    tc["enable_confidence_head"] = true;
    std::ofstream(dir + "/config.json") << cfg.dump();
    c.spec.adaptive_verification = true;
    m = msg([&] { Engine e(demo(), &demo_tok(), c); });
    EXPECT_NE(m.find("missing tensor language_model.model.dspark.confidence_head.proj.weight"), std::string::npos) << m;
  }
  // A checkpoint without dspark/: the engine names the folder it looked for.
  m3::Model tiny(m3test::small_engine_model());
  EngineConfig c = spec_config(3, "block");
  const std::string m = msg([&] { Engine e(tiny, nullptr, c); });
  EXPECT_NE(m.find("/dspark"), std::string::npos) << m;
  EXPECT_NE(m.find("needs the draft model"), std::string::npos) << m;
}

}  // namespace
