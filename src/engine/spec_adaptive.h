// Adaptive speculation: per request and step, how many of its drafts to verify (0 = a plain decode
// step, and no draft pass for it), from what was measured: the request's acceptance so far (an EWMA of
// the conditional acceptance at each draft position) and the cost of a step (a verified row's marginal
// cost from the step cost model, a draft pass's cost per request). The choice maximises the step's
// expected emitted tokens per millisecond. It only truncates the drafts the verification sees; the
// acceptance rule is unchanged, so speculation stays lossless.
#pragma once
#include <cstdint>
#include <vector>

namespace m3 {

// One request's acceptance record: rate[j] estimates P(draft j+1 accepted | drafts 1..j accepted).
struct SpecAcceptance {
  std::vector<double> rate;
  int64_t decisions = 0;  // steps decided for it (every probe_every-th verifies every draft it may)
  // Consecutive decisions in which speculating (its best draft count, plus writing the draft's context
  // for every kept token) was worth less than plain decoding without the draft context; after enough
  // of them speculation ends for the request (`off`): its draft context is no longer written, so it
  // cannot resume, and it decodes as without speculation.
  int idle = 0;
  bool off = false;
  bool admitted = false;  // its first step was seen (Speculator::admit decided whether it speculates)
  // After a verification of `verified` drafts of which the first `accepted` were kept: each position
  // the verification reached moves toward 1 (kept) or 0 (rejected) by `alpha`.
  void update(int verified, int accepted, double alpha);
  // The same, but a position's first outcomes are averaged with the starting value counted as one
  // outcome (step 1/2, 1/3, ...) until that step falls to `alpha`: the all-requests estimate new
  // requests start from leaves its optimistic guess after the first wave of verifications instead of
  // the ~20 per position an EWMA of 0.05 takes (each of them a step that verifies every draft).
  void update_mean(int verified, int accepted, double alpha);
  std::vector<int64_t> seen;  // outcomes counted per position (update_mean)
  // Adaptive verification: conf[j] follows the confidence head's value at the positions whose outcome
  // the same verification measured (as rate[j] does), so that rate[j] / conf[j] calibrates the head to
  // this request's measured acceptance (empty until the first update; the head's own scale until then).
  std::vector<double> conf;
  void update_conf(int verified, int accepted, const float* head, double alpha);
};

struct SpecCosts {
  double base_ms = 0;   // the decode rows' step without any drafts (its fixed cost and rows; no prefill)
  double row_ms = 0;    // one more verified row
  double draft_ms = 0;  // the draft pass of one request (its fixed part)
  double ctx_ms = 0;    // the draft's context K/V for one more kept token (each accepted draft adds one)
  double slot_ms = 0;   // the draft pass's cost per drafted slot (last layer, lm_head, distribution)
};

struct SpecCandidate {
  const SpecAcceptance* acc = nullptr;
  int max_k = 0;  // drafts it may verify (the scheduler's bound: max_tokens, pages, budget)
};

// Drafts to verify per candidate, maximising (plain_tokens + expected accepted drafts) / step time,
// where each candidate brings one plain token anyway; `plain_tokens` counts those of the whole step
// (including decode rows that cannot speculate). Exact for that ratio (Dinkelbach's iteration: with
// the rate lambda fixed the requests separate, each taking the k with the largest
// sum_{i<=k} (P_i - lambda (row_ms + slot_ms + P_i ctx_ms)) - lambda draft_ms [k > 0], P_i = prod_{j<=i}
// rate[j-1]; an accepted draft is one more token of draft context to write).
std::vector<int> choose_drafts(const std::vector<SpecCandidate>& cands, double plain_tokens, const SpecCosts& costs);
// The same into `k` (the engine's step: no allocation once k has grown).
void choose_drafts(const std::vector<SpecCandidate>& cands, double plain_tokens, const SpecCosts& costs,
                   std::vector<int>& k);

// A new request's case for speculating (Speculator::admit), from the all-requests acceptance `rate`,
// `lambda` (tokens per ms of the decode step it joins, without drafts) and extra_ms[k - 1], what k
// drafts add to that step (k verified rows, a draft pass of k slots, the draft context of the 1 + G_k
// tokens kept, G_k = the expected accepted drafts): the best marginal rate G_k / extra_ms over k, and the
// most time drafting saves over `out_tokens` tokens of output (per step G_k tokens that would take
// G_k / lambda ms plainly, less extra_ms; out_tokens / (1 + G_k) steps).
struct AdmitCase {
  double best_rate = 0;
  double saved_ms = 0;
};
AdmitCase admit_case(const std::vector<double>& rate, double lambda, const std::vector<double>& extra_ms,
                     double out_tokens);

// Adaptive verification with the draft's confidence head (DSpark paper section 3.2; vLLM's
// enable_adaptive_verification): after the draft pass, how many of a request's n drafts to verify.
// conf[j] is the head's probability that draft j+1 is accepted given drafts 1..j were, so draft i
// survives with S_i = conf[0] * .. * conf[i-1]; a verified row pays when S_i > threshold (the tokens
// per ms of the step times a row's ms). S_i falls with i, so the kept drafts are the longest prefix
// with S_i > threshold. Exactness: whether draft i is verified depends on conf[0..i-1] only, which
// depend on the drafts before i, not on draft i itself: a stopping rule, under which the token-wise and
// block rules stay exact (the drafts after the stop act as drafts the target never accepts).
int cut_by_survival(const float* conf, int n, double threshold);

// The head's n values calibrated to a request's measured acceptance: out[j] = head[j] x rate[j] /
// conf[j], clamped to [0, 1] (vLLM calibrates its confidence budget per request the same way in
// spirit, with a bias learnt from observed acceptance). Positions without a record keep the head's
// value. The record only holds earlier steps, so the cut stays a stopping rule.
void calibrate_confidence(const float* head, int n, const SpecAcceptance& a, float* out);

}  // namespace m3
