// Speculative-decoding verification rules (docs/serving.md §2): given the drafts d_1..d_gamma, the
// target distributions P_0..P_gamma along the drafted path and the draft distributions
// q_1..q_gamma, decide how many drafts to keep and the one extra token to emit. Pure functions:
// no engine state; randomness comes from the request's own Sampler so it stays seeded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace m3 {

// `rejection_sample_method` of the speculative config (docs/serving.md §3).
enum class RejectionMethod { Block, Standard, Synthetic };
// "block" | "standard" | "synthetic"; anything else throws m3::Error naming the allowed values.
RejectionMethod parse_rejection_method(const std::string& s);

struct VerifyInput {
  int gamma = 0;               // drafts d_1..d_gamma
  int64_t vocab = 0;
  const int32_t* drafts = nullptr;  // [gamma]
  // [(gamma+1) * vocab]: P_0..P_gamma, normalised, after the sampling transforms; P_i is the
  // distribution of the token after anchor, d_1..d_i.
  const float* target = nullptr;
  // [gamma * vocab]: q_1..q_gamma, q_i the distribution d_i was drawn from (one-hot for a greedy
  // draft). Not read by verify_greedy / verify_synthetic (may be null there).
  const float* draft = nullptr;
};

// Emit d_1..d_accepted, then `next` (1..gamma+1 tokens in all).
struct VerifyOutcome {
  int accepted = 0;
  int32_t next = 0;
};

// §2.3 token-wise rejection sampling: accept d_i with probability min(1, P_{i-1}(d_i)/q_i(d_i));
// at the first reject, next ~ normalize(max(0, P_{i-1} - q_i)); if all accepted, next ~ P_gamma.
// Draws up to gamma uniforms and then one token from rng_owner.
VerifyOutcome verify_standard(const VerifyInput& in, Sampler& rng_owner);

// §2.4 block verification (Sun et al., arXiv 2403.10444), exact: p_i, Z_i over the full
// vocabulary (fp64), h_i (= 1 where its denominator is 0), h_gamma = p_gamma; gamma independent
// uniforms eta_i; tau = the largest i with eta_i < h_i (all i scanned); next ~ P_gamma when
// tau = gamma, else ~ normalize(max(0, p_tau * P_tau - q_{tau+1})). Always draws gamma uniforms
// and then one token from rng_owner.
VerifyOutcome verify_block(const VerifyInput& in, Sampler& rng_owner);

// §2.2 greedy requests: accept while d_i == argmax P_{i-1}; next = argmax P_tau (ties: lowest id).
VerifyOutcome verify_greedy(const VerifyInput& in);

// Benchmarking only (rejection_sample_method "synthetic"): accept d_i with the conditional rate
// per_pos_accept_rate[i-1] (given d_1..d_{i-1} accepted), stopping at the first reject; next ~
// P_tau. The output is NOT the target's distribution. Throws m3::Error when fewer than gamma
// rates are given.
VerifyOutcome verify_synthetic(const VerifyInput& in, const std::vector<double>& per_pos_accept_rate,
                               Sampler& rng_owner);

// The block rule's weights, for tests and metrics: p[0..gamma] (p[0] = 1) and h[1..gamma]
// (h[0] unused, set to 1), each array gamma+1 long. The probability that verify_block keeps
// exactly i drafts is h_i * prod_{j>i} (1 - h_j) (h_0 = 1).
void block_verification_weights(const VerifyInput& in, double* p, double* h);

// Conditional per-position rates for verify_synthetic.
//
// synthetic_rates_for_length: one constant conditional rate a, repeated gamma times, with
// 1 + sum_{i=1..gamma} a^i == acceptance_length (found by bisection). Throws m3::Error unless
// 1 <= acceptance_length <= 1 + gamma.
std::vector<double> synthetic_rates_for_length(double acceptance_length, int gamma);
// vLLM's resolution of `synthetic_acceptance_length` (vllm/config/speculative.py): the
// minimum-variance schedule of UNCONDITIONAL rates [1, .., 1, frac, 0, .., 0] (gamma entries),
// returned already converted to conditional rates. Same range check.
std::vector<double> synthetic_rates_min_variance(double acceptance_length, int gamma);
// vLLM's `synthetic_acceptance_rates`: UNCONDITIONAL per-position rates (entry i = probability
// that the first i+1 drafts are all accepted; each in [0, 1], non-increasing) converted to
// conditional ones, c_i = u_i / u_{i-1} (0 once u_{i-1} is 0). Throws m3::Error when invalid.
std::vector<double> synthetic_rates_from_unconditional(const std::vector<double>& unconditional);

}  // namespace m3
