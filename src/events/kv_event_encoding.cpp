// msgpack encoding of KV event batches (see kv_event_encoding.h), with Debian's msgpack-cxx packer.
#define MSGPACK_NO_BOOST 1
#include "events/kv_event_encoding.h"

#include <cstring>
#include <msgpack.hpp>

namespace m3::events {

namespace {

void pack_hashes(msgpack::packer<msgpack::sbuffer>& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(uint32_t(hashes.size()));
  for (uint64_t h : hashes) {
    int64_t s;
    std::memcpy(&s, &h, sizeof s);  // the same 64 bits, in the signed range consumers expect
    pk.pack_int64(s);
  }
}

void pack_str(msgpack::packer<msgpack::sbuffer>& pk, const char* s) {
  const uint32_t n = uint32_t(std::strlen(s));
  pk.pack_str(n);
  pk.pack_str_body(s, n);
}

}  // namespace

std::string encode_kv_event_batch(double ts, int block_size, const std::vector<KvCacheEvent>& events,
                                  int data_parallel_rank) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(&buf);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(events.size()));
  for (const KvCacheEvent& e : events) {
    switch (e.kind) {
      case KvCacheEvent::Kind::Stored:
        pk.pack_array(7);
        pack_str(pk, "BlockStored");
        pack_hashes(pk, e.hashes);
        if (e.has_parent) {
          int64_t p;
          std::memcpy(&p, &e.parent, sizeof p);
          pk.pack_int64(p);
        } else {
          pk.pack_nil();
        }
        pk.pack_array(uint32_t(e.tokens.size()));
        for (int32_t t : e.tokens) pk.pack_int32(t);
        pk.pack_int32(block_size);
        pk.pack_nil();  // lora_id
        pack_str(pk, "CPU");
        break;
      case KvCacheEvent::Kind::Removed:
        pk.pack_array(3);
        pack_str(pk, "BlockRemoved");
        pack_hashes(pk, e.hashes);
        pack_str(pk, "CPU");
        break;
      case KvCacheEvent::Kind::Cleared:
        pk.pack_array(1);
        pack_str(pk, "AllBlocksCleared");
        break;
    }
  }
  pk.pack_int32(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace m3::events
