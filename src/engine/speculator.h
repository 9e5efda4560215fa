// Speculator: speculative decoding (DSpark draft + verification) as one component the engine calls at
// three points of a step, so Engine::step stays the plain schedule -> forward -> sample loop:
//   propose()        before the forward: drafts for every speculative chunk of the plan;
//   verify()         after it: how many drafts the target keeps, and the token after them;
//   keep_accepted()  writes the draft's context K/V for the kept tokens only (rejected drafts roll
//                    back by never being written; the scheduler commits what the engine emits).
// The draft's K/V live in a second pool indexed by the same page ids as the target's, so prefix
// caching, preemption and tiers treat them like the target's.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <chrono>
#include <string>
#include <vector>

#include "engine/kv_format.h"
#include "engine/kv_pool.h"
#include "engine/scheduler.h"
#include "engine/decayed_fit.h"
#include "engine/spec_adaptive.h"
#include "engine/spec_config.h"
#include "engine/step_cost.h"
#include "engine/spec_verify.h"
#include "model/dspark.h"
#include "model/model.h"
#include "structured/matcher.h"

namespace m3 {

struct EngineStats;

class Speculator {
 public:
  // Loads the draft (cfg.model, else the checkpoint's dspark/ folder) and makes `target` tap the
  // draft's layers. Throws m3::Error naming the flag for a missing or mismatched draft.
  Speculator(const SpeculativeConfig& cfg, Model& target, KVDtype target_kv_dtype);
  ~Speculator();

  // Bytes the draft adds to one KV page, and its pool (made once the page count is known).
  size_t page_bytes(int block_size) const;
  void make_pool(int block_size, int64_t pages);
  KVPool* kv() { return kv_.get(); }
  int num_speculative_tokens() const { return cfg_.num_speculative_tokens; }
  // What identifies the draft's pages in stored KV (part of the page codec's layout id).
  std::string layout_extra() const;
  std::string describe() const;  // for the engine's start-up line

  // Adaptive speculation (cfg.adaptive): lowers each speculative chunk's spec to the drafts worth
  // verifying, from the requests' measured acceptance, `cost` (the target step) and the draft pass's
  // measured cost. Until both costs are measured every draft is verified (which measures them).
  void choose(std::vector<ScheduledChunk>& plan, const StepCostModel& cost);
  // A step before the costs are measured: verified drafts capped at max(K, decode rows) (choose()).
  void limit_unmeasured(std::vector<ScheduledChunk>& plan, int64_t rows) const;
  // A request's first step: whether it speculates at all. When the all-requests acceptance and the
  // measured costs say its best speculation cannot pay for the draft's context, or the costs are not
  // measured yet, it starts `off`: no draft context for its prompt or its tokens, and no draft pass.
  // Every kExploreEvery-th request (the first one included) speculates unless the measured costs rule
  // it out even at full acceptance, so the costs and the estimate keep being measured (on a changing
  // load or prompt mix).
  void admit(std::vector<ScheduledChunk>& plan, const StepCostModel& cost);
  // The draft pass of a step took `ms` for `requests` requests drafting `slots` slots in all (each
  // drafted slot takes the draft's last layer, the lm_head and a distribution).
  void observe_draft(double ms, int requests, int64_t slots);
  // The draft pass's measured cost for one request drafting k slots (-1: not measured yet).
  double draft_ms(int k) const;
  // Milliseconds the last keep_accepted() spent writing draft context (the engine takes them out of
  // the step time it measures, as it does the draft pass: choose() prices the context on its own).
  double last_ctx_ms() const { return last_ctx_ms_; }
  // "draft pass X ms per request + Y ms per slot, draft context Z ms per token" as measured (for the
  // summary line; "not measured" until it is).
  std::string costs_describe() const;
  void propose(const std::vector<ScheduledChunk>& plan);
  // enable_adaptive_verification: after propose(), lowers each speculative chunk's spec (and its drafts)
  // to the drafts whose survival probability from the confidence head, calibrated to the request's
  // measured acceptance, pays for a verified row at the rate choose() expects of the step
  // (engine/spec_adaptive.h: calibrate_confidence, cut_by_survival). Probes and steps before the costs
  // are measured keep every draft.
  void cut_by_confidence(std::vector<ScheduledChunk>& plan);
  // The confidence head's value for chunk `chunk`'s draft j (after propose(), with it enabled).
  float confidence(size_t chunk, int j) const { return conf_[size_t(qrow_[chunk] + j)]; }
  const std::vector<int32_t>& drafts(size_t chunk) const { return drafts_[chunk]; }
  // The forward's tap rows (the draft's input), `rows` tokens of the step.
  float* taps(int64_t rows);
  // Every speculative chunk of the plan, requests in parallel; logits[i] are the target's rows for
  // chunk i's anchor and drafts.
  void verify_all(const std::vector<ScheduledChunk>& plan, const float* const* logits);
  const VerifyOutcome& outcome(size_t chunk) const { return outcomes_[chunk]; }
  void keep_accepted(const std::vector<ScheduledChunk>& plan);
  void count(const ScheduledChunk& c, const VerifyOutcome& v);  // the spec_* counters
  void fill_stats(EngineStats& st) const;

 private:
  // Chunk `chunk` (a speculative one); `logits` are the target's rows for its anchor and drafts. Safe
  // on several threads for distinct chunks (its buffers are the thread's own).
  void verify(const ScheduledChunk& c, size_t chunk, const float* logits);
  SpeculativeConfig cfg_;
  int64_t vocab_ = 0;
  std::unique_ptr<DSparkDraft> draft_;
  size_t draft_copy_bytes_ = 0;  // the draft's MXFP8 copies of its wide matrices (draft_weights "mxfp8"), else 0
  std::unique_ptr<KVPool> kv_;
  KVDtype kv_dtype_ = KVDtype::BF16;
  RejectionMethod rejection_ = RejectionMethod::Standard;
  bool greedy_ = false;
  std::vector<double> synthetic_rates_;
  // Per step, reused: draft logits, draft distributions q (chunk i's rows from qrow_[i]), target
  // distributions p of the chunk being verified, drafts and outcomes per chunk.
  std::vector<float> taps_, z_, q_;
  std::vector<int64_t> qrow_;
  // propose(): per drafting request (in plan order) its slot count, chunk index, first row of z_ and
  // q_ (zrow_[nq] = all rows), token history, constraint fork and last token; one position's Markov
  // inputs.
  std::vector<int> slots_;
  std::vector<size_t> chunks_;
  std::vector<int64_t> zrow_;
  std::vector<float*> mrows_;
  std::vector<std::vector<int32_t>> prefixes_;
  std::vector<std::optional<structured::Matcher>> forks_;
  std::vector<int32_t> prev_, mprev_;
  std::vector<std::vector<int32_t>> drafts_;
  std::vector<VerifyOutcome> outcomes_;
  std::vector<size_t> verify_chunks_;     // verify_all's speculative chunks
  std::vector<const uint64_t*> masks_;   // propose(): one position's constraint masks per request
  std::vector<DraftQuery> queries_;
  std::vector<DraftContextRows> ctx_rows_;
  std::vector<std::unique_ptr<PagedKV>> views_;
  int64_t steps_ = 0, drafted_ = 0, accepted_ = 0, ctx_tokens_ = 0, skipped_ = 0;
  std::vector<int64_t> accepted_per_pos_;
  SpecAcceptance global_acc_;    // all requests' acceptance: a new request's starting estimate
  // The draft pass's cost: ms = a x requests + b x drafted slots over the recent passes (one pass
  // drafting 7 slots took about 2x one drafting 3 on mid m31: a cost per request alone priced the
  // 3-draft steps of adaptive speculation at the full-block passes that measured it, and started
  // requests without speculation that paid 1.2x).
  DecayedLeastSquares<2> draft_fit_{0.9};
  double draft_coef_[2] = {-1, 0};  // a, b; a < 0: not measured
  // Slots per request of the first pass timed, and whether a later one differed (until then the split
  // between a and b is the ridge's guess: a pass of 7 slots alone priced 3 at 7 ms against 4.5).
  double first_slots_per_request_ = -1;
  bool draft_varied_ = false;
  double ctx_ms_ = -1;           // EWMA of writing the draft's context K/V, per token
  double last_ctx_ms_ = 0;
  // Draft passes and context writes timed so far: the first of each is not counted (cold: its weights
  // and pages are touched for the first time, and one cold measurement could start every later request
  // off before a warm one corrects it).
  int64_t draft_timings_ = 0, ctx_timings_ = 0;
  // Decode-row counts of the steps choose() has shaped (0, 1, or 2 = two different ones) and the first.
  int64_t admitted_ = 0;  // requests admit() has seen
  int decode_shapes_ = 0;
  int64_t first_shape_ = -1;
  // Adaptive verification: per draft row (as q_), the confidence head's acceptance probability; per
  // plan chunk whether choose() made it a probe; the survival a verified row must beat (-1: no cut).
  std::vector<float> conf_, calibrated_;
  std::vector<char> probe_;
  double conf_threshold_ = -1;
  int64_t cut_by_conf_ = 0;
  std::vector<SpecCandidate> cands_;
  std::vector<int> chosen_;  // choose(): drafts per candidate
  std::vector<double> extra_ms_;  // admit(): per draft count, what the drafts add to the step
  std::vector<size_t> cand_chunk_;
};

// "speculative: N drafts, N draft tokens, N accepted; acceptance length X; acceptance rate per position [..]"
// (then "; N drafts cut by the confidence head" when adaptive verification cut any).
std::string spec_summary(const EngineStats& st);

}  // namespace m3
