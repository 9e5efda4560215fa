// Sequence: the engine's state for one request: its tokens (prompt + output), its pages (block
// table), how many tokens already have KV in the cache, its sampler and its output text.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_lease.h"
#include "engine/sampler.h"
#include "engine/output_processor.h"
#include "engine/spec_adaptive.h"
#include "structured/matcher.h"

namespace m3 {

// Embeddings that replace a run of prompt tokens (an image's placeholders): rows [offset, offset + count)
// of the prompt take embeds[(i - offset) * hidden ...] instead of their token's embedding. `hash`
// identifies the content (the image bytes): prefix-cache pages holding any of these tokens are keyed
// by it too, so the same text with another image never shares KV (as vLLM's block hashes).
struct MultimodalSpan {
  int64_t offset = 0, count = 0;
  uint64_t hash = 0;
  std::shared_ptr<const std::vector<float>> embeds;  // [count, hidden]
};

// The combined hash of the spans overlapping tokens [first, first + n); 0 when none. It salts the
// prefix-cache hash of a page holding image tokens (and the P/D transfer chain's, kv_lease.h).
uint64_t mm_salt(const std::vector<MultimodalSpan>& mm, int64_t first, int64_t n);
// mm_salt of each block_size page of an n_tokens prompt (empty when there are no spans).
std::vector<uint64_t> mm_page_salts(const std::vector<MultimodalSpan>& mm, int64_t n_tokens, int block_size);

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);

struct Sequence {
  uint64_t id = 0;          // engine-assigned, in arrival order
  std::string request_id;   // caller's id
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<MultimodalSpan> mm;  // sorted by offset, disjoint, inside the prompt
  SamplingParams params;
  Sampler sampler;
  // Structured output: this sequence's grammar state, advanced by every emitted token. Preemption
  // keeps the output (it is recomputed, not resampled), so the state stays valid across it.
  std::unique_ptr<structured::Matcher> constraint;

  std::vector<int32_t> blocks;        // block table: page of positions [i*B, (i+1)*B)
  std::vector<uint64_t> block_hashes; // hash chain of the full pages published so far
  int64_t num_computed = 0;           // tokens whose K/V/index-K are in the pages
  int64_t num_cached_tokens = 0;      // prefix-cache hit of the first admission
  bool admitted_once = false;
  // When the engine took the request and when it was first scheduled (vllm:request_queue_time_seconds).
  std::chrono::steady_clock::time_point added_at, scheduled_at;
  bool fetch_started = false;  // its prefix pages were asked of an asynchronous tier
  int num_preemptions = 0;
  // P/D disaggregation: hold the prompt's pages for a decode engine when done; or the prompt's pages as
  // pulled from a prefill engine, imported at first admission (then dropped).
  bool kv_hold = false;
  std::shared_ptr<const RemotePrefill> remote;
  SpecAcceptance spec_acc;  // its measured draft acceptance (adaptive speculation)

  enum class Status { Waiting, Running, Finished } status = Status::Waiting;
  FinishReason finish = FinishReason::None;

  // Its output text, as its TextOptions ask, cut at a stop string; null without a tokenizer.
  std::unique_ptr<OutputProcessor> text;
  std::vector<TokenLogprob> logprobs;

  int64_t num_tokens() const { return int64_t(prompt.size() + output.size()); }
  int32_t token(int64_t i) const {
    return i < int64_t(prompt.size()) ? prompt[size_t(i)] : output[size_t(i - int64_t(prompt.size()))];
  }
  // All tokens in order (prompt then output), copied.
  std::vector<int32_t> all_tokens() const;
  // The combined hash of the multimodal spans overlapping tokens [first, first + n); 0 when none.
  uint64_t mm_salt(int64_t first, int64_t n) const;
  // The input embedding of token i when a span replaces it, else null.
  const float* mm_embed(int64_t i, int64_t hidden) const;
};

}  // namespace m3
