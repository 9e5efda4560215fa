// The KV transfer over real UCX on loopback, between a prefill engine's KvTransferServer and a decode
// side's UcxKvFetcher in one process: a lease's pages arrive byte for byte as the engine exports them,
// by RMA read and by the stream; the lease is read once; and with num_threads 2 a second pull is served
// while a first connection holds a serving thread (with one thread it would wait behind it).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "transfer/kv_transfer_client.h"
#include "transfer/kv_transfer_server.h"

namespace {

using namespace m3::transfer;

m3::Model& model() {
  static m3::Model m(m3test::small_engine_model());
  return m;
}

m3::EngineConfig pool(int64_t pages) {
  m3::EngineConfig c;
  c.num_pages = pages;
  c.max_num_batched_tokens = 64;
  c.watermark = 0;
  return c;
}

// The prefill leg of `prompt` (one token), its pages left under a lease.
m3::KvLeaseInfo prefill(m3::Engine& e, const std::string& id, const std::vector<int32_t>& prompt) {
  m3::RequestKv kv;
  kv.hold_for_remote = true;
  e.add_request(id, prompt, m3test::greedy(1), {}, kv);
  std::optional<m3::KvLeaseInfo> lease;
  while (e.has_work())
    for (auto& o : e.step())
      if (o.request_id == id && o.kv_lease) lease = o.kv_lease;
  EXPECT_TRUE(lease.has_value());
  return lease.value_or(m3::KvLeaseInfo{});
}

// What the transfer must deliver: the lease's pages as the engine exports them, back to back.
std::string exported(const m3::Engine& e, const m3::KvLeaseInfo& l, const std::vector<int32_t>& prompt) {
  const auto chain = m3::transfer_chain(prompt, e.block_size());
  std::string all, blob;
  for (size_t i = 0; i < l.block_ids.size(); ++i) {
    e.export_leased_page(l.block_ids[i], chain[i], blob);
    all += blob;
  }
  return all;
}

Hello hello_of(m3::Engine& e) {
  Hello h;
  h.layout_id = e.kv_layout_id();
  h.block_size = e.block_size();
  h.dtypes = e.kv_dtypes();
  h.page_bytes = e.kv_page_blob_bytes();
  h.engine_id = "test";
  return h;
}

m3::RemoteKvRef ref_of(const KvTransferServer& srv, const m3::KvLeaseInfo& l) {
  m3::RemoteKvRef r;
  r.engine_id = "test";
  r.host = "127.0.0.1";
  r.port = srv.port();
  r.request_id = l.request_id;
  r.block_ids = l.block_ids;
  return r;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(1 + (i * 7 + salt) % 200);
  return p;
}

TEST(KvTransfer, RmaAndStreamDeliverTheExportedPagesOnce) {
  m3::Engine p(model(), nullptr, pool(32));
  p.enable_kv_leases(std::chrono::seconds(60));
  const auto pa = prompt_of(40, 1), pb = prompt_of(33, 2);
  const m3::KvLeaseInfo la = prefill(p, "a", pa), lb = prefill(p, "b", pb);
  const std::string want_a = exported(p, la, pa), want_b = exported(p, lb, pb);
  auto ctx = std::make_shared<UcxContext>();
  KvTransferServer srv(ctx, p, hello_of(p), "127.0.0.1", 0, 2);
  EXPECT_EQ(srv.num_threads(), 2);
  UcxKvFetcher f(ctx, hello_of(p), std::chrono::seconds(30), ReadMode::Rma);
  m3::RemotePrefill got;
  m3::FetchResult r = f.fetch(ref_of(srv, la), got);
  ASSERT_EQ(r.status, m3::FetchStatus::Ok) << r.why;
  EXPECT_EQ(got.page_bytes, p.kv_page_blob_bytes());
  EXPECT_EQ(got.pages(), la.block_ids.size());
  EXPECT_TRUE(got.data == want_a);
  // Read once: the lease is done, a second read of it is refused.
  m3::RemotePrefill again;
  r = f.fetch(ref_of(srv, la), again);
  EXPECT_EQ(r.status, m3::FetchStatus::Refused);
  f.set_mode(ReadMode::Stream);
  m3::RemotePrefill got_b;
  r = f.fetch(ref_of(srv, lb), got_b);
  ASSERT_EQ(r.status, m3::FetchStatus::Ok) << r.why;
  EXPECT_TRUE(got_b.data == want_b);
  EXPECT_EQ(p.kv_leases()->stats().read, 2);
}

TEST(KvTransfer, TwoPullsAreServedAtOnce) {
  m3::Engine p(model(), nullptr, pool(32));
  p.enable_kv_leases(std::chrono::seconds(60));
  const auto pa = prompt_of(20, 3), pb = prompt_of(50, 4);
  const m3::KvLeaseInfo la = prefill(p, "a", pa), lb = prefill(p, "b", pb);
  const std::string want_b = exported(p, lb, pb);
  auto ctx = std::make_shared<UcxContext>();
  KvTransferServer srv(ctx, p, hello_of(p), "127.0.0.1", 0, 2);
  // A first decode engine connects and is greeted, then holds its serving thread: the server waits for
  // its read request.
  UcxWorker w(*ctx);
  std::unique_ptr<Link> first = Link::connect(w, "127.0.0.1", srv.port());
  auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(30); };
  std::string msg = "unset";
  ASSERT_EQ(first->send_frame(encode(hello_of(p)), deadline()), "");
  ASSERT_EQ(first->recv_frame(msg, 4096, deadline()), "");
  EXPECT_EQ(msg, "");  // greeted
  // A second one pulls a whole lease meanwhile, on the other serving thread.
  UcxKvFetcher f(ctx, hello_of(p));
  m3::RemotePrefill got;
  const m3::FetchResult r = f.fetch(ref_of(srv, lb), got);
  ASSERT_EQ(r.status, m3::FetchStatus::Ok) << r.why;
  EXPECT_TRUE(got.data == want_b);
  // The first one completes its read too (by RMA, on its held connection).
  ASSERT_EQ(first->send_frame(encode(ReadRequest{la.request_id, la.block_ids, ReadMode::Rma}), deadline()), "");
  ASSERT_EQ(first->recv_frame(msg, 4096, deadline()), "");
  EXPECT_EQ(msg, "");  // the lease and its ids are accepted
  ASSERT_EQ(first->recv_frame(msg, 64 << 10, deadline()), "");
  const auto offer = decode_rma_offer(msg);
  ASSERT_TRUE(offer.has_value());
  EXPECT_EQ(offer->bytes, la.block_ids.size() * p.kv_page_blob_bytes());
  std::string data(offer->bytes, '\0');
  MemRegion mine(*ctx, data.data(), data.size());
  RemoteKey key;
  ASSERT_EQ(first->unpack_key(offer->key, key), "");
  uint32_t ready = 0;
  while (ready < la.block_ids.size()) ASSERT_EQ(first->recv(&ready, 4, deadline()), "");
  Link::Pending get = first->start_get(data.data(), data.size(), offer->addr, key, mine);
  ASSERT_EQ(first->finish_send(get, deadline(), "read"), "");
  EXPECT_TRUE(data == exported(p, la, pa));
  const char ack = 'K';
  ASSERT_EQ(first->send(&ack, 1, deadline()), "");
}

}  // namespace
