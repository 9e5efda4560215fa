// SpeculativeConfig: the --speculative-config JSON object, with vLLM's keys (docs/serving.md section 3):
// method (dspark), num_speculative_tokens, draft_sample_method, rejection_sample_method, the draft's
// kv_cache_dtype, an optional draft `model` folder, and the synthetic-acceptance settings used for
// benchmarking. Unknown keys and values are errors that name the key and the allowed values.
#pragma once
#include <string>
#include <vector>

namespace m3 {

struct SpeculativeConfig {
  bool enabled = false;
  std::string method;                 // "dspark"
  std::string model;                  // draft folder; empty = <target>/dspark
  int num_speculative_tokens = 0;     // drafts per step (<= dspark_block_size)
  std::string draft_sample_method = "probabilistic";  // or "greedy"
  std::string rejection_sample_method = "standard";   // "block", "standard" or "synthetic"
  std::string kv_cache_dtype;         // draft KV dtype; empty = inherit --kv-cache-dtype
  std::string attention_backend;      // accepted for drop-in compatibility (GPU backend names)
  // rejection_sample_method "synthetic": a target acceptance length, or per-position rates.
  double synthetic_acceptance_length = 0;
  std::vector<double> synthetic_acceptance_rates;
  // m3serve's key "adaptive_num_speculative_tokens" (default true): each step verifies per request
  // only the drafts its measured acceptance and the measured step costs say will pay (0 = a plain
  // decode step, no draft pass); false verifies num_speculative_tokens every step (engine/spec_adaptive.h).
  bool adaptive = true;
  // m3serve's key "draft_activations": "fp32" (exact), "bf16" (the draft's MXFP8 / NVFP4 layers round
  // their activations to BF16 and multiply with BF16 dot products where the CPU has them,
  // Linear::act_bf16) or "auto" (default: bf16 where the CPU has BF16 dot products, else fp32). Only the
  // draft's proposals move: verification compares the target with the distribution the drafts were drawn
  // from, so the output's distribution (and greedy output) is unchanged; the demo draft's acceptance
  // length is the same either way (2.35 fp32, 2.37 bf16), and the draft pass, which at the small
  // presets costs about a target step, is faster.
  std::string draft_activations = "auto";
  // m3serve's key "draft_weights": "checkpoint" (the draft multiplies with its matrices as loaded, and
  // its slots go through the target's lm_head), "mxfp8" (MXFP8 copies of its wide matrices, its fc and
  // the target's lm_head where they are BF16 / F16 / F32, quantised at load,
  // DSparkDraft::quantize_wide_weights; N x K x 33/32 bytes each) or "auto" (default: mxfp8 where the
  // draft's activations resolve to bf16, else checkpoint). As draft_activations, it moves only the
  // proposals, never the output's distribution.
  std::string draft_weights = "auto";
  // "enable_adaptive_verification" (vLLM's key, default false): after the draft pass, each request's
  // drafts are cut where the draft's confidence head (DSparkDraft::confidence) puts the survival
  // probability of the next one below what its verified row costs (Speculator::cut_by_confidence).
  // Needs a draft with a confidence head and `adaptive`.
  bool adaptive_verification = false;
  // "dspark_draft_topk" (vLLM's key, default unset = 0): the Markov bias is added to the k best base
  // logits of each draft position only and the draft is drawn among those (DSparkDraft::add_markov_topk);
  // verification compares with that distribution, so output stays exact. Constrained requests keep the
  // full-vocabulary bias (their allowed tokens may all lie outside the k).
  int draft_topk = 0;

  // Parses the JSON text of --speculative-config; "" gives a disabled config. Throws m3::Error.
  static SpeculativeConfig parse(const std::string& json_text);
  std::string describe() const;
};

}  // namespace m3
