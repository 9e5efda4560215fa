// Engine: the serving core (vLLM's engine core, no HTTP): owns the paged KV pool, the block pool
// with its prefix cache and the scheduler, and runs one batched forward pass per step over the
// scheduled chunks of every sequence, then samples, applies stop rules and reports outputs.
// Single-threaded: the caller drives step(); the server runs it on its own thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/block_pool.h"
#include "engine/kv_events.h"
#include "engine/kv_format.h"
#include "engine/kv_lease.h"
#include "engine/kv_page_codec.h"
#include "engine/kv_tier.h"
#include "engine/kv_pool.h"
#include "base/host_memory.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/spec_config.h"
#include "engine/speculator.h"
#include "engine/step_cost.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace m3 {

struct EngineConfig {
  int block_size = 0;               // 0 = the model's MSA block size (128 for models without MSA)
  double kv_cache_memory_gib = 0;   // 0 = a quarter of the available RAM
  int64_t num_pages = 0;            // > 0 overrides kv_cache_memory_gib (tests)
  // > 0 and no kv_cache_memory_gib / num_pages: the pool holds this many tokens (plus a page per
  // sequence and the speculative slack), at most the default size. `generate` knows its requests'
  // prompt + max_tokens; the pool's memory is committed at start (KVPool), so it is sized to need.
  int64_t kv_tokens_needed = 0;
  int kv_sequences = 1;  // the sequences kv_tokens_needed is spread over
  std::string kv_cache_dtype = "auto";
  std::string indexer_kv_dtype = "auto";
  bool enable_prefix_caching = true;
  int max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t long_prefill_token_threshold = 0;
  // Time-budgeted steps (--step-latency-factor, --max-step-latency-ms; SchedulerConfig has the
  // rule): a step that carries decoding requests takes a prefill chunk only as large as keeps it within
  // this factor of a decode-only step's measured time, and within the ms cap. 0 turns a bound off.
  double step_latency_factor = 4;
  double max_step_latency_ms = 0;
  // --step-latency-tail-share: the share of decoding requests' inter-token latencies that steps may hold
  // up past the factor (SchedulerConfig::step_latency_tail_share), half of what a p99 leaves.
  double step_latency_tail_share = 0.005;
  int64_t min_prefill_chunk = 32;  // prefill tokens a budgeted step still takes (tests set it lower)
  double watermark = 0.01;
  int64_t max_model_len = 0;  // 0 = the model's max_position_embeddings
  SpeculativeConfig spec;     // --speculative-config (DSpark)
  // Local KV tier (--kv-offloading-size GiB, --kv-offloading-dir): pages evicted from the pool are kept
  // there and loaded back on a prefix hit instead of being recomputed. 0 = off.
  double kv_offloading_gib = 0;
  std::string kv_offloading_dir;  // empty: host memory
  // Lazy offload (the default): a page goes to the local tier when the pool evicts it. Eager (false,
  // SimpleCPUOffloadConnector's lazy_offload: false): as soon as it is computed, so it survives in the
  // tier whatever the pool does later.
  bool kv_offloading_lazy = true;
  // A tier page that fails to load (unreadable, cut off, not verifying): "recompute" the block, or
  // "fail" the request with an error (vLLM's kv_load_failure_policy).
  std::string kv_load_failure_policy = "recompute";
  // serve --seed: requests without a seed of their own draw theirs from a generator with this seed, in
  // arrival order, so a rerun of the same requests samples the same text (vLLM's global seed). Unset:
  // each such request gets a random seed.
  std::optional<uint64_t> seed;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprob> new_logprobs;
  std::string new_text;  // text delta, made as the request's TextOptions ask
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  // Why a finished request stopped (vLLM's stop_reason): the stop string matched in its text, or the
  // stop_token_ids id it ended on; neither for end-of-sequence, the length limit or an abort.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  std::string error;  // finish_reason Error: what went wrong (e.g. a KV cache page that failed to load)
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;
  // A finished request: seconds from the engine taking it to its first scheduling (-1: never scheduled).
  double queue_seconds = -1;
  // A finished request that asked to hold its prompt's pages for another engine (kv_transfer_params
  // do_remote_decode): the lease that holds them.
  std::optional<KvLeaseInfo> kv_lease;
};

// Prefill/decode disaggregation for one request (kv_transfer_params).
struct RequestKv {
  bool hold_for_remote = false;                  // do_remote_decode: lease the prompt's pages at the end
  std::shared_ptr<const RemotePrefill> remote;   // do_remote_prefill: the prompt's pages, pulled
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  int64_t preemptions = 0;
  int64_t tail_steps = 0, tail_held = 0;  // SchedulerStats: steps past the latency factor, requests held up
  size_t running = 0, waiting = 0;
  int64_t free_pages = 0, total_pages = 0;
  // Speculative decoding (vLLM's spec_decode_* counters).
  int64_t spec_drafts = 0;           // verification steps
  int64_t spec_draft_tokens = 0;     // draft tokens proposed
  int64_t spec_accepted_tokens = 0;  // draft tokens accepted
  std::vector<int64_t> spec_accepted_per_pos;  // [num_speculative_tokens]
  int64_t spec_context_tokens = 0;    // tokens whose draft context (K/V) was written
  int64_t spec_skipped_requests = 0;  // requests admitted without speculation (it could not pay)
  int64_t spec_cut_by_confidence = 0;  // drafts drawn but not verified: the confidence head said they would not pay
  // KV tiers.
  int64_t tier_offloaded_pages = 0;  // pages written to a tier on eviction
  int64_t tier_loaded_pages = 0;     // prefix pages loaded back instead of recomputed
  int64_t tier_load_failures = 0;    // pages a tier held that failed verification (recomputed)
  bool has_tier = false, has_shared_tier = false;
  KvTierStats tier;                  // the local tier's own counters
  KvTierStats shared_tier;           // the shared tier's
  // Prefill/decode disaggregation.
  bool has_leases = false;
  KvLeaseStats leases;               // prefill side: pages held for decode engines
  int64_t remote_prefills = 0;       // decode side: requests whose prompt KV came from another engine
  int64_t remote_pages_loaded = 0;   // pages imported from it
  int64_t remote_load_failures = 0;  // pulled pages that did not verify (recomputed or failed, by policy)
};

class Engine {
 public:
  // `tok` (may be null) is needed for stop strings and text deltas: the engine is the one place a
  // request's text is made (OutputProcessor), so that it stops the moment a stop string is matched.
  Engine(Model& model, const Tokenizer* tok, const EngineConfig& cfg);
  ~Engine();

  // Queues a request. Throws m3::Error for an invalid one (empty prompt, prompt + max_tokens over
  // max-model-len, bad params, duplicate id). Every request accepted runs to completion: at most
  // max-model-len tokens, which the pool holds alone.
  // `text`: how its text deltas are made (special tokens, stop string kept, held back for streams).
  // `kv`: prefill/decode disaggregation (hold the prompt's pages for another engine, or start from
  // pages pulled from one; a remote prefill must hold one page per block of the prompt).
  void add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params,
                   const TextOptions& text = {}, const RequestKv& kv = {}, std::vector<MultimodalSpan> mm = {});
  // The same with multimodal spans only: embeddings that replace runs of prompt tokens (see MultimodalSpan;
  // each must lie inside the prompt, in order, disjoint, with count x hidden values).
  void add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params,
                   const TextOptions& text, std::vector<MultimodalSpan> mm);
  // Ends a request at once and frees its pages; returns false if it is unknown or finished. `out`
  // (may be null) gets its final output: finished, Abort, and the text that was still held back.
  bool abort(const std::string& id, RequestOutput* out = nullptr);
  // Runs one step; returns the outputs of the requests that advanced or finished.
  std::vector<RequestOutput> step();
  bool has_work() const { return sched_->has_work(); }
  // KV cache events (pages entering and leaving the prefix cache) go to `sink` after each step; null
  // turns them off. The sink must outlive the engine's steps.
  void set_kv_event_sink(KvEventSink* sink);
  // Drops every cached page identity (vLLM's /reset_prefix_cache); running requests go on. Emits
  // AllBlocksCleared. Returns false when prefix caching is off.
  bool reset_prefix_cache();

  // Prefill side of P/D disaggregation: requests with hold_for_remote leave their prompt's pages under a
  // lease of `duration` (read once by a decode engine, or expired). Makes the page codec the transfer
  // server exports with.
  void enable_kv_leases(std::chrono::milliseconds duration);
  KvLeaseTable* kv_leases() { return leases_.get(); }
  // Exports a leased page as a blob (kv_page_codec). Safe from the transfer thread: a leased page is
  // held, so the engine neither reuses nor writes it.
  void export_leased_page(int32_t page, const TransferPage& p, std::string& out) const;
  // The same into `out`, which holds kv_page_blob_bytes() (the transfer's registered memory).
  void export_leased_page(int32_t page, const TransferPage& p, char* out) const;
  // Decode side: makes the codec and importer pulled pages go through (else made at the first such
  // request). Call before serving, so that verify_remote may run on other threads.
  void enable_remote_prefill();
  // Verifies pulled pages against `prompt` (header and checksum) on the calling thread, so that the
  // engine thread only copies them in: the checksum of a long prompt's pages would stall every other
  // request's step. Thread-safe once enable_remote_prefill ran (the codec is only read).
  // mm: the request's images (their hashes name the pages that hold them).
  void verify_remote(const std::vector<int32_t>& prompt, const std::vector<MultimodalSpan>& mm, RemotePrefill& rp) const;
  // Timers the engine loop drives without work: returns expired and read leases' pages to the pool.
  void housekeeping();
  std::optional<std::chrono::steady_clock::time_point> next_timer() const;
  // "kv bf16 ik bf16" and the like: the cache dtypes, for the transfer handshake.
  std::string kv_dtypes() const;

  EngineStats stats() const;
  const EngineConfig& config() const { return cfg_; }
  int block_size() const { return block_size_; }
  int64_t capacity_tokens() const { return pool_pages_ * block_size_; }
  int64_t num_pages() const { return pool_pages_; }
  // In force: --max-model-len, else the smaller of max_position_embeddings and the pool's capacity.
  int64_t max_model_len() const { return max_model_len_; }
  std::string describe() const;  // one line for the start-up log
  const BlockPool& block_pool() const { return *blocks_; }
  KvTier* kv_tier() { return tier_.get(); }
  // A tier shared by several engines (e.g. Redis): pages are written to it as soon as they are
  // computed (prompt pages; generated ones too with save_decode) and looked up after the local tier.
  // Throws m3::Error without prefix caching.
  void set_shared_tier(std::unique_ptr<KvTier> tier, bool save_decode);
  // Identity of the model and cache layout that stored pages carry (keys of a shared tier).
  uint64_t kv_layout_id() { return codec().layout_id(); }
  size_t kv_page_blob_bytes() { return codec().blob_bytes(); }
  bool speculative() const { return spec_ != nullptr; }
  // "drafts N, draft tokens N, accepted N, acceptance length X, per position [..]".
  std::string spec_summary() const;
  // The fitted step time (for logs and benchmarks): "a ms + b ms/decode row + c ms/prefill token".
  std::string step_cost_summary() const { return step_cost_.describe(); }
  // Tests: the latency budget and adaptive speculation read `m` instead of the measured step costs
  // (null: back to the measured ones). Not owned.
  void set_step_cost_model(const StepCostModel* m);

 private:
  void finish(Sequence* s, FinishReason r, RequestOutput& out);
  void finish_text(Sequence* s, RequestOutput& out);  // the text held back at the end, released
  void flush_kv_events();
  void setup_tiers();
  KvPageCodec& codec();  // made on first use
  void wire_loader();
  // The scheduler's on-computed hook: writes each completed page to the shared tier (prompt pages,
  // generated ones with save_decode) and, with eager offload, to the local tier.
  void install_on_computed();
  bool save_decode_ = false;
  bool check_stop(Sequence* s, RequestOutput& out);
  // Samples the plain (non-speculative) rows of the step, requests in parallel (see engine.cpp).
  void sample_plain_rows(const std::vector<ScheduledChunk>& plan);
  // Emits token t for s (logprobs from `logits`, the raw target row); true when s finished.
  bool emit(Sequence* s, int32_t t, const float* logits, RequestOutput& out);

  Model& model_;
  const Tokenizer* tok_;
  EngineConfig cfg_;
  std::mt19937_64 seed_rng_;  // cfg_.seed's generator of request seeds
  int block_size_ = 128;
  int64_t pool_pages_ = 0;
  int64_t max_model_len_ = 0;
  bool max_model_len_from_pool_ = false;  // no --max-model-len: the pool's capacity was taken
  int32_t eos_ = -1;
  KVDtype kv_dtype_, ik_dtype_;
  std::unique_ptr<KVPool> kv_;
  std::unique_ptr<BlockPool> blocks_;
  std::unique_ptr<Scheduler> sched_;
  std::map<std::string, std::unique_ptr<Sequence>> seqs_;
  uint64_t next_id_ = 0;
  EngineStats stats_;
  std::vector<float> logits_;
  std::vector<BatchItem> items_;
  std::vector<std::unique_ptr<PagedKV>> views_;
  std::vector<std::vector<int32_t>> step_tokens_;
  std::vector<std::vector<const float*>> step_embeds_;  // per chunk with multimodal rows  // per scheduled chunk, reused across steps
  KvEventSink* kv_sink_ = nullptr;
  // KV tiers (null when off): the codec turns pages into verified blobs, the loader feeds the scheduler.
  std::unique_ptr<KvPageCodec> codec_;
  std::unique_ptr<KvTier> tier_;
  std::unique_ptr<PrefixLoader> loader_;
  std::unique_ptr<KvTier> shared_;
  std::string blob_, shared_blob_;  // scratch for one page
  std::vector<KvCacheEvent> kv_events_;  // this step's, recorded by the block pool while a sink is set

  std::unique_ptr<KvLeaseTable> leases_;       // null unless enable_kv_leases
  std::unique_ptr<RemoteImporter> importer_;   // imports pulled pages for the scheduler
  void lease_pages(Sequence* s, RequestOutput& out);

  FittedStepCost step_cost_;  // measured here, read by the scheduler's latency budget
  const StepCostModel* cost_override_ = nullptr;
  const StepCostModel& cost_model() const { return cost_override_ ? *cost_override_ : step_cost_; }
  std::unique_ptr<Speculator> spec_;  // null when speculative decoding is off
  std::vector<ScheduledChunk> accepted_chunks_;
  // sample_plain_rows: this step's token per chunk (-1: not sampled there), and its work list.
  struct SampleJob {
    size_t chunk;
    const uint64_t* allowed;
  };
  std::vector<int32_t> sampled_;
  std::vector<const float*> chunk_logits_;  // the first logits row of each chunk of the step
  std::vector<SampleJob> sample_jobs_;
};

}  // namespace m3
