// `m3serve bench roofline`: this machine's limits (streaming read bandwidth, FMA peak) measured with
// its own probes, then the model's decode and prefill steps timed per kernel class (projections,
// index branch, sparse attention, routed / shared experts, dense MLP, lm_head) and set against them;
// with each class's one-token kernels timed with their rows in cache, the decode roof (the step's
// best weight read rate if reads and decode overlapped perfectly).
#pragma once
#include <cstdint>
#include <string>

#include "model/model.h"

namespace m3::bench {

struct RooflineOptions {
  std::string model_dir;
  int64_t context = 512;   // tokens already in the cache for the decode step
  int64_t prefill = 512;   // tokens in the prefill step
  // When > 0: each steady decode run at `context` is followed by one at this context, and the ratio
  // of the two rates is printed per pair (the 16K / 512 target measured within seconds, not minutes).
  int64_t compare_context = 0;
  int repeats = 3;         // timed repetitions (the best is kept)
  int threads = 0;         // 0: OpenMP default
  double probe_mib = 512;  // bandwidth probe buffer
  std::string kv_cache_dtype = "auto";    // the paged cache's K/V dtype (as `serve --kv-cache-dtype`)
  std::string indexer_kv_dtype = "auto";  // index keys (as `serve --attention-config indexer_kv_dtype`)
  ModelOptions model;                     // as `serve --nvfp4-activations`
};

// Throws m3::Error for a bad flag value (run_roofline checks them too): called before the model is
// resolved, so a flag error never waits for a download.
void check_roofline_options(const RooflineOptions& o);

// Runs everything and prints the report to stdout.
void run_roofline(const RooflineOptions& opt);

}  // namespace m3::bench
