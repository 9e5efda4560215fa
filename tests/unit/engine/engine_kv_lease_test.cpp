// Prefill/decode disaggregation in the engine, without a network: a prefill engine holds a prompt's
// pages under a lease (do_remote_decode), the pages are exported as blobs the way the transfer server
// sends them, and a decode engine given those blobs (do_remote_prefill) continues from them: its greedy
// output equals one engine doing both, and it computes one prompt token (the last, for its logits), not
// the prompt. The lease table: only the leased ids, by the lease's id, within its time; pages come back
// when read or expired (driven by explicit times, no sleeps).
#include <gtest/gtest.h>

#include <map>

#include "engine_test_util.h"
#include "base/error.h"
#include "engine/block_pool.h"
#include "model/model.h"

namespace {

m3::Model& model() {
  static m3::Model m(m3test::small_engine_model());
  return m;
}

using m3test::greedy;
using Clock = std::chrono::steady_clock;

m3::EngineConfig pool(int64_t pages) {
  m3::EngineConfig c;
  c.num_pages = pages;
  c.max_num_batched_tokens = 64;
  c.watermark = 0;
  return c;
}

std::vector<int32_t> run(m3::Engine& e, const std::string& id, const std::vector<int32_t>& prompt, int n,
                         const m3::RequestKv& kv = {}, std::optional<m3::KvLeaseInfo>* lease = nullptr,
                         m3::FinishReason* reason = nullptr, std::string* error = nullptr) {
  e.add_request(id, prompt, greedy(n), {}, kv);
  std::vector<int32_t> out;
  while (e.has_work())
    for (auto& o : e.step())
      if (o.request_id == id) {
        out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.kv_lease && lease) *lease = o.kv_lease;
        if (o.finished && reason) *reason = o.finish_reason;
        if (o.finished && error) *error = o.error;
      }
  return out;
}

// The prefill leg: one token, pages leased; then the blobs the transfer server would send.
std::shared_ptr<m3::RemotePrefill> prefill(m3::Engine& p, const std::vector<int32_t>& prompt, m3::KvLeaseInfo* info) {
  m3::RequestKv kv;
  kv.hold_for_remote = true;
  std::optional<m3::KvLeaseInfo> lease;
  run(p, "prefill", prompt, 1, kv, &lease);
  EXPECT_TRUE(lease.has_value());
  *info = *lease;
  std::vector<m3::TransferPage> chain;
  EXPECT_EQ(p.kv_leases()->begin_read(lease->request_id, lease->block_ids, chain, Clock::now()), "");
  auto rp = std::make_shared<m3::RemotePrefill>();
  rp->source = "test";
  for (size_t i = 0; i < chain.size(); ++i) {
    std::string blob;
    p.export_leased_page(lease->block_ids[i], chain[i], blob);
    rp->page_bytes = blob.size();
    rp->data += blob;
  }
  p.kv_leases()->end_read(lease->request_id, true, 0);
  return rp;
}

TEST(EngineKvLease, DecodeFromPulledPagesEqualsOneEngine) {
  std::mt19937 rng(5);
  // 16-token pages: 40 tokens end in a partial page, 48 fill three whole pages.
  for (size_t len : {40u, 48u, 5u}) {
    const auto prompt = m3test::random_tokens(rng, len, 256);
    m3::Engine agg(model(), nullptr, pool(32));
    const auto want = run(agg, "agg", prompt, 12);

    m3::Engine p(model(), nullptr, pool(32));
    p.enable_kv_leases(std::chrono::seconds(60));
    m3::KvLeaseInfo info;
    auto rp = prefill(p, prompt, &info);
    EXPECT_EQ(info.block_ids.size(), (len + 15) / 16);
    EXPECT_EQ(p.stats().leases.pages, int64_t(info.block_ids.size()));

    m3::Engine d(model(), nullptr, pool(32));
    m3::RequestKv kv;
    kv.remote = rp;
    EXPECT_EQ(run(d, "dec", prompt, 12, kv), want) << "prompt of " << len << " tokens";
    EXPECT_EQ(d.stats().prompt_tokens_computed, 1);  // the last prompt token only
    EXPECT_EQ(d.stats().remote_pages_loaded, int64_t(info.block_ids.size()));
    EXPECT_EQ(d.stats().prefix_hits, 0);  // pulled pages are not this engine's prefix-cache hits
    EXPECT_EQ(d.stats().free_pages, 32);  // all back (cached or free) once done

    // The read lease gives its pages back at the prefill engine's next pass.
    EXPECT_LT(p.stats().free_pages, 32);
    p.housekeeping();
    EXPECT_EQ(p.stats().free_pages, 32);
    EXPECT_EQ(p.stats().leases.active, 0);
    EXPECT_EQ(p.stats().leases.read, 1);
  }
}

// A P/D request preempted on the decode engine: its pulled prompt pages went into the prefix cache as
// they were imported (the whole pages before the last prompt token's) and the page the decode filled is
// published when full, so re-admission finds them there: no prompt token is computed again, only the
// tokens past the last cached page (the generated ones). Greedy output equals one engine doing both.
TEST(EngineKvLease, PreemptedRemoteRequestResumesFromItsPulledPages) {
  std::mt19937 rng(11);
  const auto px = m3test::random_tokens(rng, 40, 256), pd = m3test::random_tokens(rng, 40, 256);
  m3::Engine agg(model(), nullptr, pool(32));
  const auto want = run(agg, "agg", pd, 40);
  m3::Engine p(model(), nullptr, pool(32));
  p.enable_kv_leases(std::chrono::seconds(60));
  m3::KvLeaseInfo info;
  auto rp = prefill(p, pd, &info);
  // 8 pages of 16 tokens: x (40 + 30 tokens, 5 pages) is admitted first and d (40 + 40, 5 pages) after;
  // when x needs its fifth page the pool is full and d, the last admitted, is preempted.
  for (bool caching : {true, false}) {
    m3::EngineConfig c = pool(8);
    c.enable_prefix_caching = caching;
    m3::Engine d(model(), nullptr, c);
    d.add_request("x", px, greedy(30));
    m3::RequestKv kv;
    kv.remote = rp;
    d.add_request("d", pd, greedy(40), {}, kv);
    std::map<std::string, std::vector<int32_t>> out;
    while (d.has_work())
      for (auto& o : d.step())
        out[o.request_id].insert(out[o.request_id].end(), o.new_tokens.begin(), o.new_tokens.end());
    EXPECT_EQ(out["d"], want) << "prefix caching " << caching;
    EXPECT_EQ(out["x"].size(), 30u);
    EXPECT_EQ(d.stats().preemptions, 1);
    EXPECT_EQ(d.stats().remote_pages_loaded, 3);
    // x's prompt, and d's last prompt token once (for its first logits): with prefix caching nothing of
    // d's prompt again; without it (nothing kept past a preemption) d's whole prompt is recomputed here.
    EXPECT_EQ(d.stats().prompt_tokens_computed, caching ? 40 + 1 : 40 + 1 + 40);
  }
}

TEST(EngineKvLease, PagesOfAnotherPromptAreRefusedAndFollowThePolicy) {
  std::mt19937 rng(6);
  const auto prompt = m3test::random_tokens(rng, 40, 256);
  auto other = prompt;
  other[20] = (other[20] + 1) % 256;  // the same length, one token different
  m3::Engine p(model(), nullptr, pool(32));
  p.enable_kv_leases(std::chrono::seconds(60));
  m3::KvLeaseInfo info;
  auto rp = prefill(p, prompt, &info);

  m3::Engine agg(model(), nullptr, pool(32));
  const auto want = run(agg, "agg", other, 6);
  // recompute: the pages up to the mismatch are kept, the rest recomputed; the output is still right.
  m3::Engine d(model(), nullptr, pool(32));
  m3::RequestKv kv;
  kv.remote = rp;
  EXPECT_EQ(run(d, "dec", other, 6, kv), want);
  EXPECT_EQ(d.stats().remote_load_failures, 1);
  EXPECT_EQ(d.stats().prompt_tokens_computed, 40 - 16);  // page 0 verified, pages 1 and 2 recomputed
  // fail: the request ends with the reason, and its pages go back.
  m3::EngineConfig fc = pool(32);
  fc.kv_load_failure_policy = "fail";
  m3::Engine f(model(), nullptr, fc);
  m3::FinishReason why = m3::FinishReason::None;
  std::string error;
  EXPECT_TRUE(run(f, "dec", other, 6, kv, nullptr, &why, &error).empty());
  EXPECT_EQ(why, m3::FinishReason::Error);
  EXPECT_NE(error.find("does not fit this prompt: another place in the prefix chain"), std::string::npos) << error;
  EXPECT_EQ(f.stats().free_pages, 32);
}

TEST(EngineKvLease, PagesVerifiedOffTheEngineThreadAndACorruptedOneRecomputed) {
  std::mt19937 rng(8);
  const auto prompt = m3test::random_tokens(rng, 40, 256);
  m3::Engine p(model(), nullptr, pool(32));
  p.enable_kv_leases(std::chrono::seconds(60));
  m3::KvLeaseInfo info;
  auto rp = prefill(p, prompt, &info);
  rp->data[2 * rp->page_bytes - 3] ^= 0x40;  // one bit of page 1's payload flipped in transit
  m3::Engine agg(model(), nullptr, pool(32));
  const auto want = run(agg, "agg", prompt, 6);
  m3::Engine d(model(), nullptr, pool(32));
  d.enable_remote_prefill();
  d.verify_remote(prompt, {}, *rp);
  EXPECT_EQ(rp->checksummed, 1u);  // page 0 verified here; page 1 is checked again on admission
  m3::RequestKv kv;
  kv.remote = rp;
  EXPECT_EQ(run(d, "dec", prompt, 6, kv), want);
  EXPECT_EQ(d.stats().remote_load_failures, 1);
  EXPECT_EQ(d.stats().remote_pages_loaded, 1);
  EXPECT_EQ(d.stats().prompt_tokens_computed, 40 - 16);
}

// An image in the prompt (a span of placeholder tokens the embeddings replace): its hash salts the
// pages' transfer names as it salts their prefix-cache hashes. The decode request carries the same image:
// it takes the pulled pages, computes one prompt token, and publishes them where a local request with the
// image finds them. A decode request with the same tokens but another image refuses the pages that hold
// the image and recomputes them with its own.
TEST(EngineKvLease, PagesOfAnImagePromptAreNamedByTheImage) {
  // The image in pages 0 and 1; then in pages 1 and 2, ending the prompt: the decode engine's one computed
  // prompt token is an image placeholder, fed its embedding from the decode request's own image.
  for (const int64_t offset : {10, 24}) {
    SCOPED_TRACE("image at token " + std::to_string(offset));
    std::mt19937 rng(9);
    const int64_t H = model().config().hidden;
    auto prompt = m3test::random_tokens(rng, 40, 256);
    auto image = [&](uint64_t hash) {
      m3::MultimodalSpan s;
      s.offset = offset;
      s.count = 16;
      s.hash = hash;
      std::normal_distribution<float> nd(0.f, 0.02f);
      auto e = std::make_shared<std::vector<float>>(size_t(s.count * H));
      for (float& x : *e) x = nd(rng);
      s.embeds = e;
      return std::vector<m3::MultimodalSpan>{s};
    };
    const auto a = image(0xa11ce), b = image(0xb0b);
    auto run_mm = [](m3::Engine& e, const std::string& id, const std::vector<int32_t>& pr, int n,
                     const m3::RequestKv& kv, const std::vector<m3::MultimodalSpan>& mm,
                     std::optional<m3::KvLeaseInfo>* lease = nullptr) {
      e.add_request(id, pr, greedy(n), {}, kv, mm);
      std::vector<int32_t> out;
      while (e.has_work())
        for (auto& o : e.step())
          if (o.request_id == id) {
            out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end());
            if (o.kv_lease && lease) *lease = o.kv_lease;
          }
      return out;
    };
    m3::Engine agg(model(), nullptr, pool(32));
    const auto want_a = run_mm(agg, "a", prompt, 8, {}, a);
    const auto want_b = run_mm(agg, "b", prompt, 8, {}, b);
    ASSERT_NE(want_a, want_b);  // the image matters to the output

    // The prefill leg with image a; its pages as the transfer server sends them.
    m3::Engine p(model(), nullptr, pool(32));
    p.enable_kv_leases(std::chrono::seconds(60));
    auto pull = [&](const std::string& id) {
      m3::RequestKv hold;
      hold.hold_for_remote = true;
      std::optional<m3::KvLeaseInfo> lease;
      run_mm(p, id, prompt, 1, hold, a, &lease);
      EXPECT_TRUE(lease.has_value());
      std::vector<m3::TransferPage> chain;
      EXPECT_EQ(p.kv_leases()->begin_read(lease->request_id, lease->block_ids, chain, Clock::now()), "");
      auto rp = std::make_shared<m3::RemotePrefill>();
      rp->source = "test";
      for (size_t i = 0; i < chain.size(); ++i) {
        std::string blob;
        p.export_leased_page(lease->block_ids[i], chain[i], blob);
        rp->page_bytes = blob.size();
        rp->data += blob;
      }
      p.kv_leases()->end_read(lease->request_id, true, 0);
      return rp;
    };

    m3::Engine d(model(), nullptr, pool(32));
    d.enable_remote_prefill();
    auto rp = pull("p1");
    d.verify_remote(prompt, a, *rp);
    EXPECT_EQ(rp->checksummed, 3u);  // every page verified under the image's names
    m3::RequestKv kv;
    kv.remote = rp;
    EXPECT_EQ(run_mm(d, "d1", prompt, 8, kv, a), want_a);
    EXPECT_EQ(d.stats().prompt_tokens_computed, 1);
    EXPECT_EQ(d.stats().remote_pages_loaded, 3);
    // The published pages are where a local request with image a looks: two whole pages hit.
    EXPECT_EQ(run_mm(d, "d2", prompt, 8, {}, a), want_a);
    EXPECT_EQ(d.stats().prefix_hits, 32);

    // Another image, the same tokens: the first page holding the image's tokens differs, and all after it.
    const size_t first = size_t(offset / 16);
    m3::Engine d2(model(), nullptr, pool(32));
    d2.enable_remote_prefill();
    auto rp2 = pull("p2");
    d2.verify_remote(prompt, b, *rp2);
    EXPECT_EQ(rp2->checksummed, first);
    kv.remote = rp2;
    EXPECT_EQ(run_mm(d2, "d3", prompt, 8, kv, b), want_b);
    EXPECT_EQ(d2.stats().remote_load_failures, 1);
    EXPECT_EQ(d2.stats().prompt_tokens_computed, 40 - int64_t(first) * 16);
  }
}

TEST(EngineKvLease, RefusesWhatItCannotServe) {
  m3::Engine e(model(), nullptr, pool(8));
  m3::RequestKv hold;
  hold.hold_for_remote = true;
  EXPECT_THROW(e.add_request("a", {1, 2, 3}, greedy(1), {}, hold), m3::Error);  // no leases enabled
  m3::RequestKv kv;
  auto rp = std::make_shared<m3::RemotePrefill>();
  rp->page_bytes = 64;
  rp->data.resize(64);
  kv.remote = rp;
  // 20 tokens fill two pages: one blob is not the prompt's pages.
  EXPECT_THROW(e.add_request("b", std::vector<int32_t>(20, 7), greedy(1), {}, kv), m3::Error);
}

TEST(KvLeaseTable, ReadsOnlyTheLeasedIdsByTheLeaseIdWithinItsTime) {
  m3::KvLeaseTable t(std::chrono::seconds(10));
  const auto t0 = Clock::now();
  const std::string a = t.grant({4, 9, 2}, m3::transfer_chain({1, 2, 3, 4, 5}, 2), t0);
  const std::string b = t.grant({7}, m3::transfer_chain({8}, 2), t0);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  std::vector<m3::TransferPage> chain;
  EXPECT_NE(t.begin_read("0123456789abcdef0123456789abcdef", {4, 9, 2}, chain, t0).find("names no live KV lease"),
            std::string::npos);
  EXPECT_NE(t.begin_read(a, {4, 9, 7}, chain, t0).find("do not match"), std::string::npos);  // b's page
  EXPECT_NE(t.begin_read(b, {4}, chain, t0).find("do not match"), std::string::npos);        // a's page
  EXPECT_NE(t.begin_read(a, {4, 9}, chain, t0).find("do not match"), std::string::npos);     // a subset
  EXPECT_EQ(t.begin_read(a, {4, 9, 2}, chain, t0), "");
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[2].tokens, (std::vector<int32_t>{5, -1}));  // the partial page, padded
  EXPECT_NE(t.begin_read(a, {4, 9, 2}, chain, t0).find("being read"), std::string::npos);
  EXPECT_TRUE(t.take_released(t0).empty());
  t.end_read(a, true, 100);
  EXPECT_EQ(t.take_released(t0), (std::vector<int32_t>{4, 9, 2}));
  EXPECT_NE(t.begin_read(a, {4, 9, 2}, chain, t0).find("names no live KV lease"), std::string::npos);  // stale
  // b expires unread at t0 + 10 s, not before; a read after that is refused.
  EXPECT_EQ(t.next_deadline(), t0 + std::chrono::seconds(10));
  EXPECT_TRUE(t.take_released(t0 + std::chrono::milliseconds(9999)).empty());
  EXPECT_NE(t.begin_read(b, {7}, chain, t0 + std::chrono::seconds(10)).find("expired"), std::string::npos);
  EXPECT_EQ(t.take_released(t0 + std::chrono::seconds(10)), (std::vector<int32_t>{7}));
  const m3::KvLeaseStats s = t.stats();
  EXPECT_EQ(s.granted, 2);
  EXPECT_EQ(s.read, 1);
  EXPECT_EQ(s.expired, 1);
  EXPECT_EQ(s.refused, 7);
  EXPECT_EQ(s.active, 0);
  EXPECT_EQ(s.pages, 0);
  EXPECT_EQ(s.bytes_sent, 100);
  EXPECT_FALSE(t.next_deadline().has_value());
}

TEST(KvLeaseTable, ALeaseBeingReadDoesNotExpireUnderItsReader) {
  m3::KvLeaseTable t(std::chrono::seconds(1));
  const auto t0 = Clock::now();
  const std::string a = t.grant({3}, m3::transfer_chain({1}, 4), t0);
  std::vector<m3::TransferPage> chain;
  ASSERT_EQ(t.begin_read(a, {3}, chain, t0), "");
  EXPECT_TRUE(t.take_released(t0 + std::chrono::seconds(5)).empty());
  t.end_read(a, false, 0);  // the transfer broke: the lease stays until it expires (it has)
  EXPECT_EQ(t.take_released(t0 + std::chrono::seconds(5)), (std::vector<int32_t>{3}));
  EXPECT_EQ(t.stats().expired, 1);
}

TEST(KvLeaseTable, TransferChainOfWholePagesIsThePrefixCacheChain) {
  const std::vector<int32_t> toks{5, 6, 7, 8, 9, 10};
  const auto chain = m3::transfer_chain(toks, 3);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0].hash, m3::hash_block(0, toks.data(), 3));
  EXPECT_EQ(chain[1].parent, chain[0].hash);
  EXPECT_EQ(chain[1].hash, m3::hash_block(chain[0].hash, toks.data() + 3, 3));
}

}  // namespace
