// Scheduler: continuous batching with a per-step token budget (vLLM v1 style). Each step first
// gives running sequences their next tokens (a decode token, or the next chunk of an unfinished
// prefill), then admits waiting sequences with prefill chunks while budget, --max-num-seqs and free
// pages allow. Long prompts are cut into chunks of at most --long-prefill-token-threshold tokens.
// Admission keeps a --watermark fraction of pages free while others run (never when nothing runs:
// the head of the queue then runs alone); admission is in arrival order, so no request waits behind
// later ones. When a running sequence cannot get a page, the latest-admitted one is preempted (pages
// released, recomputed later from its tokens) and goes back to the front of the queue. A sequence that
// fits the pool alone therefore always completes: the Engine admits nothing longer than the pool.
// Time-budgeted steps: with a step cost model (step_cost.h), a step that carries decode rows takes
// only as many prefill tokens as keep its predicted time within the latency budget, a multiple of the
// decode-only step of the batch the running and waiting requests form (at least min_prefill_chunk, so
// long prompts always progress); the token budgets above stay upper bounds. A step may pass that budget
// while the decoding requests it holds up stay a small share of the recent ones (the tail share).
#pragma once
#include <cstdint>
#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/block_pool.h"
#include "engine/kv_tier.h"
#include "engine/sequence.h"
#include "engine/step_cost.h"

namespace m3 {

struct SchedulerConfig {
  int block_size = 128;
  int max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t long_prefill_token_threshold = 0;  // 0 = no cap per request and step
  double watermark = 0.01;
  int num_speculative_tokens = 0;  // > 0: decode steps also reserve pages and budget for drafts
  int64_t max_model_len = 0;       // caps the drafts of a sequence near the end (0 = no cap)
  // kv_load_failure_policy "fail": a prefix page a tier holds but cannot deliver intact ends the request
  // (take_load_failures) instead of being recomputed.
  bool fail_on_load_error = false;
  // Latency budget of a step that carries decode rows (needs a cost model, set_cost_model): its
  // predicted time stays within step_latency_factor x that of a decode-only step of the batch its rows
  // are about to form (they, the requests whose prompts are being read, and the waiting ones that
  // --max-num-seqs and the free pages admit) and within max_step_latency_ms; 0 turns either bound off
  // (both 0: token budgets only, as before).
  // Its prefill chunks shrink to fit, but together take at least min_prefill_chunk tokens.
  double step_latency_factor = 0;
  double max_step_latency_ms = 0;
  int64_t min_prefill_chunk = 32;
  // The factor bounds the tail of the inter-token latency (its p99 against its median), not every
  // sample: a step may take prefill beyond the factor's allowance (up to the token budgets and
  // max_step_latency_ms) while the decoding requests it holds up, added to those held up by such steps
  // among the last kTailWindowRequests decoding requests, stay within this share of them. A window of
  // requests, not of time: the share then holds in any run of requests longer than the window, which a
  // p99 measured over a benchmark run or a minute of traffic needs (a longer memory let the stalls a
  // long history allowed fall into one short run). Why: when one or two requests decode beside a batch
  // of prompts (requests finishing at different times), reading the prompts in the factor's small
  // chunks costs every request a step's fixed part per chunk, and holding up those few inter-token
  // latencies does not move the p99.
  double step_latency_tail_share = 0;
};

struct ScheduledChunk {
  Sequence* seq;
  int64_t start;  // first position computed in this step
  int64_t n;      // tokens computed in this step
  bool sample;    // the chunk reaches the end of the sequence's tokens: sample the next one
  int64_t spec = 0;  // draft tokens to verify after the anchor (decode chunks with speculation)
};

struct SchedulerStats {
  int64_t prefix_queries = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hits = 0;     // of which found
  int64_t preemptions = 0;
  // Steps that read prompts past --step-latency-factor under the tail share, and the decoding requests
  // they held up.
  int64_t tail_steps = 0, tail_held = 0;
};

// Pages beyond the pool (KV tiers): fills `page` (freshly allocated) with the block (hash, parent,
// tokens) if a tier holds it and it verifies (Hit); Miss when no tier holds it; Failed when one holds
// it but the load failed or the page did not verify (why in failure()). The block is recomputed unless
// the policy is to fail.
class PrefixLoader {
 public:
  virtual ~PrefixLoader() = default;
  virtual TierRead load(uint64_t hash, uint64_t parent, const int32_t* tokens, int32_t page) = 0;
  virtual std::string failure() const { return {}; }
  // Asynchronous tiers (see KvTier::prefetch): start fetching a request's missing prefix pages; the
  // request waits for them off the queue while the others run.
  virtual bool prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) { return false; }
  virtual bool fetched(uint64_t ticket) { return true; }
  virtual void wait_fetch(std::chrono::milliseconds timeout) {}
};

// P/D disaggregation: imports a page pulled from another engine into `page` after checking it is page
// `p` of the prompt's transfer chain; returns "" or why not (the page is then unchanged).
class RemoteImporter {
 public:
  virtual ~RemoteImporter() = default;
  virtual std::string import(std::string_view blob, const TransferPage& p, int32_t page, bool checksummed) = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockPool& pool);

  void add(Sequence* s);
  // Removes a sequence wherever it is and releases its pages.
  void remove(Sequence* s);
  std::vector<ScheduledChunk> schedule();
  // After the step ran: advance num_computed to start + n and publish pages that became full (a
  // speculative chunk's n is set by the engine to 1 + accepted drafts before commit).
  void commit(const std::vector<ScheduledChunk>& plan);
  // Releases the pages of a finished sequence.
  void finish(Sequence* s);

  size_t num_waiting() const { return waiting_.size() + fetching_.size(); }
  // Requests waiting for their prefix pages from an asynchronous tier (part of num_waiting()).
  size_t num_fetching() const { return fetching_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !fetching_.empty(); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return cfg_; }
  // A prefix lookup that misses the pool asks `loader` (null: none) before recomputing.
  void set_prefix_loader(PrefixLoader* loader) { loader_ = loader; }
  // Sequences with pulled pages (Sequence::remote) take them through `importer` at first admission.
  void set_remote_importer(RemoteImporter* importer) { importer_ = importer; }
  // The step cost model the latency budget is computed from (null: none, token budgets only). Not owned.
  void set_cost_model(const StepCostModel* m) { cost_ = m; }
  // Prefill tokens a step carrying the running decode rows may take within the latency budget
  // (INT64_MAX when unbounded: no budget, no decode rows, or a cost model that cannot tell yet).
  // Without the factor (with_factor false): what max_step_latency_ms alone allows.
  int64_t prefill_allowance(bool with_factor = true) const;
  // The decoding requests (inter-token latencies) the tail share (SchedulerConfig::step_latency_tail_share)
  // is counted over.
  static constexpr int kTailWindowRequests = 1024;
  // Called for each page that a step completed and that entered the prefix cache; `from_decode`: the
  // page holds generated tokens (a shared tier writes pages then).
  using ComputedFn =
      std::function<void(int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens, bool from_decode)>;
  void set_on_computed(ComputedFn f) { on_computed_ = std::move(f); }
  // Requests taken out of the queue because a prefix page failed to load (fail_on_load_error), with
  // the reason; the engine ends them. Their pages are already released.
  std::vector<std::pair<Sequence*, std::string>> take_load_failures() { return std::move(load_failures_); }

 private:
  bool ensure_pages(Sequence* s, int64_t upto_tokens);
  void release_pages(Sequence* s);
  void preempt(Sequence* s);
  // Page i's hash: the token chain, salted with the hashes of the images whose tokens it holds.
  uint64_t page_hash(const Sequence& s, uint64_t parent, const int32_t* tokens, int64_t i) const;
  int64_t prefix_hit(Sequence* s);  // acquires cached pages; returns hit tokens, -1 for a failed load
  int64_t remote_hit(Sequence* s);  // the same from pulled pages (Sequence::remote)
  // First admission with an asynchronous tier: starts fetching the prefix pages the pool lacks; true
  // when s must wait for them.
  bool start_fetch(Sequence* s);

  SchedulerConfig cfg_;
  BlockPool& pool_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> fetching_;  // first admissions waiting for tier pages, in arrival order
  std::vector<Sequence*> running_;  // in admission order (last = lowest priority)
  SchedulerStats stats_;
  std::vector<int32_t> page_tokens_;  // commit(): the tokens of the page being published
  PrefixLoader* loader_ = nullptr;
  RemoteImporter* importer_ = nullptr;
  const StepCostModel* cost_ = nullptr;
  // The last steps that carried decoding requests, up to kTailWindowRequests of them: how many each
  // carried, and how many of those it held up beyond the factor's allowance (a ring, oldest at
  // tail_first_; the sums over it). Each step carries at least one, so kTailWindowRequests slots suffice.
  struct TailStep {
    int32_t decoding = 0, held = 0;
  };
  std::vector<TailStep> tail_ring_ = std::vector<TailStep>(kTailWindowRequests);
  size_t tail_first_ = 0, tail_steps_ = 0;
  int64_t tail_decoding_ = 0, tail_held_ = 0;
  void record_tail(int64_t decoding, int64_t held);
  ComputedFn on_computed_;
  std::vector<std::pair<Sequence*, std::string>> load_failures_;
};

}  // namespace m3
