// vLLM's wire format for KV cache events, as its msgspec structs encode them (array-like, tagged):
//   KVEventBatch     [ts: float, events: [...], data_parallel_rank: int]
//   BlockStored      ["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size,
//                     lora_id (nil), medium]
//   BlockRemoved     ["BlockRemoved", block_hashes, medium]
//   AllBlocksCleared ["AllBlocksCleared"]
// Block hashes are our 64-bit chain hashes written as signed 64-bit integers (the range of the
// Python hash() values vLLM published), the medium is "CPU".
#pragma once
#include <string>
#include <vector>

#include "engine/kv_events.h"

namespace m3::events {

std::string encode_kv_event_batch(double ts, int block_size, const std::vector<KvCacheEvent>& events,
                                  int data_parallel_rank);

}  // namespace m3::events
