// The KV transfer handshake and read request: a hello survives its encoding, every difference that
// would make a page's bytes mean something else is named (page size, dtypes, page bytes, model and
// layout, protocol version), and malformed messages are refused, never half-read.
#include <gtest/gtest.h>

#include "transfer/transfer_protocol.h"

using namespace m3::transfer;

namespace {
Hello hello() {
  Hello h;
  h.layout_id = 0x0123456789abcdefull;
  h.block_size = 128;
  h.dtypes = "kv bf16 ik bf16";
  h.page_bytes = 123456;
  h.engine_id = "prefill-0";
  return h;
}
}  // namespace

TEST(TransferProtocol, HelloRoundTripsAndMatchesItself) {
  const auto h = decode_hello(encode(hello()));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->layout_id, hello().layout_id);
  EXPECT_EQ(h->block_size, 128);
  EXPECT_EQ(h->dtypes, "kv bf16 ik bf16");
  EXPECT_EQ(h->page_bytes, 123456u);
  EXPECT_EQ(h->engine_id, "prefill-0");
  EXPECT_EQ(check_hello(hello(), *h), "");
}

TEST(TransferProtocol, HandshakeNamesWhatDiffers) {
  Hello t = hello();
  t.block_size = 64;
  EXPECT_NE(check_hello(hello(), t).find("page size 64 tokens, this engine's is 128"), std::string::npos);
  t = hello();
  t.dtypes = "kv fp8 ik bf16";
  EXPECT_NE(check_hello(hello(), t).find("KV cache dtypes \"kv fp8 ik bf16\""), std::string::npos);
  t = hello();
  t.page_bytes = 99;
  EXPECT_NE(check_hello(hello(), t).find("KV pages of 99 bytes"), std::string::npos);
  t = hello();
  t.layout_id ^= 1;
  EXPECT_NE(check_hello(hello(), t).find("another model or weights"), std::string::npos);
  t = hello();
  t.version = 1;  // the first protocol (pages on the stream only)
  EXPECT_NE(check_hello(hello(), t).find("protocol version 1"), std::string::npos);
}

TEST(TransferProtocol, MalformedMessagesAreRefused) {
  EXPECT_FALSE(decode_hello("GET / HTTP/1.1\r\n").has_value());
  EXPECT_FALSE(decode_hello("m3pd-hello 1\nlayout 00\n").has_value());  // fields missing
  EXPECT_FALSE(decode_hello(encode(hello()) + "color blue\n").has_value());
  const auto r = decode_read(encode(ReadRequest{"abc", {3, 1, 2}}));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request_id, "abc");
  EXPECT_EQ(r->block_ids, (std::vector<int32_t>{3, 1, 2}));
  EXPECT_EQ(r->mode, ReadMode::Rma);
  EXPECT_EQ(decode_read(encode(ReadRequest{"abc", {3}, ReadMode::Stream}))->mode, ReadMode::Stream);
  EXPECT_FALSE(decode_read("m3pd-read abc\n1 2\n").has_value());               // no mode
  EXPECT_FALSE(decode_read("m3pd-read abc\n1 2\nmode teleport\n").has_value());
  EXPECT_FALSE(decode_read("m3pd-read abc\n1 2\nmode rma\nmore\n").has_value());
  EXPECT_FALSE(decode_read("m3pd-read abc\n1 -2\n").has_value());
  EXPECT_FALSE(decode_read("m3pd-read abc\n1 x\n").has_value());
  EXPECT_FALSE(decode_read("m3pd-read abc\n\n").has_value());
  EXPECT_FALSE(decode_read("m3pd-read \n1\n").has_value());
}

TEST(TransferProtocol, RmaOfferRoundTripsWithABinaryKey) {
  RmaOffer o;
  o.addr = 0x7f12345678abULL;
  o.bytes = 123456789;
  o.key = std::string("\0\n\xff key", 8);  // packed keys are binary: newlines and NULs included
  const auto d = decode_rma_offer(encode(o));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->addr, o.addr);
  EXPECT_EQ(d->bytes, o.bytes);
  EXPECT_EQ(d->key, o.key);
  EXPECT_FALSE(decode_rma_offer("").has_value());  // the server could not register its buffer
  EXPECT_FALSE(decode_rma_offer("m3pd-rma 10 20\n").has_value());  // no key
  EXPECT_FALSE(decode_rma_offer("m3pd-rma 10\nkey").has_value());
  EXPECT_FALSE(decode_rma_offer("m3pd-rma zz 20\nkey").has_value());
}
