// Engine flag registration and resolution (see engine_flags.h).
#include "cli/engine_flags.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_flag.h"
#include "cli/flag_checks.h"

namespace m3::cli {

void add_engine_flags(CLI::App* app, EngineFlags& f) {
  EngineConfig& c = f.cfg;
  app->add_option("--block-size", c.block_size,
                  "KV page size in tokens; must equal the model's MSA block size (its sparse_block_size: 128 for "
                  "MiniMax-M3.1-Flash; the default)")
      ->check(positive_number());
  app->add_option("--kv-cache-memory", c.kv_cache_memory_gib,
                  "KV pool size in GiB (default: serve takes a quarter of the free RAM, generate what its requests "
                  "need)")
      ->check(positive_number());
  app->add_option("--kv-cache-dtype", c.kv_cache_dtype,
                  "auto (bf16), bf16, fp8, nvfp4, fp32 (vLLM's bfloat16 and fp8_e4m3 name bf16 and fp8)");
  app->add_option("--attention-config", f.attention_config, "JSON, e.g. '{\"indexer_kv_dtype\": \"fp8\"}'");
  app->add_flag("--enable-prefix-caching", f.prefix_caching, "Reuse cached KV pages of shared prefixes (default on)");
  app->add_flag("--no-enable-prefix-caching", f.no_prefix_caching, "Disable prefix caching");
  app->add_option("--max-num-seqs", c.max_num_seqs, "Maximum running sequences per step");
  app->add_option("--max-num-batched-tokens", c.max_num_batched_tokens, "Token budget of one step");
  app->add_option("--long-prefill-token-threshold", c.long_prefill_token_threshold,
                  "Cap on the prefill tokens one request takes per step (0 = off)");
  app->add_option("--step-latency-factor", c.step_latency_factor,
                  "A step that carries decoding requests takes a prefill chunk only as large as keeps its measured "
                  "cost within this many times a decode-only step of the batch the running and waiting requests form "
                  "(default 4; 0 = off: token budgets only)");
  app->add_option("--step-latency-tail-share", c.step_latency_tail_share,
                  "Share of the decoding requests' inter-token latencies (of the last 1024) that steps may "
                  "hold up past --step-latency-factor to read whole prompts beside a few decoding requests "
                  "(default 0.005, half of what an ITL p99 leaves; 0 = every step within the factor)");
  app->add_option("--max-step-latency-ms", c.max_step_latency_ms,
                  "Cap in ms on the predicted time of a step that carries decoding requests (0 = none)");
  app->add_option("--watermark", c.watermark, "Fraction of KV pages kept free when admitting requests");
  app->add_option("--max-model-len", c.max_model_len, "Maximum prompt + output length (default: the model's)")
      ->check(positive_number());
  app->add_option("--kv-offloading-size", c.kv_offloading_gib,
                  "GiB of a KV tier beyond the pool: evicted prefix pages are kept there and loaded back instead "
                  "of recomputed (0 = off)");
  app->add_option("--kv-offloading-backend", f.kv_offloading_backend, "native (the only one here)");
  app->add_option("--kv-offloading-dir", c.kv_offloading_dir,
                  "Keep the KV tier in files in this folder (e.g. on NVMe; found again after a restart) instead "
                  "of host memory");
  app->add_option("--speculative-config", f.speculative_config,
                  "JSON, e.g. '{\"method\":\"dspark\",\"num_speculative_tokens\":7,"
                  "\"draft_sample_method\":\"probabilistic\",\"rejection_sample_method\":\"block\"}'");
  add_model_flags(app, f.model);
}

EngineConfig EngineFlags::resolve(std::vector<std::string>* ignored) const {
  EngineConfig c = cfg;
  if (prefix_caching && no_prefix_caching)
    throw Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  c.enable_prefix_caching = !no_prefix_caching;
  if (!attention_config.empty()) {
    const nlohmann::json j = parse_json_flag(attention_config, "--attention-config");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "indexer_kv_dtype") {
        if (!it.value().is_string()) throw Error("--attention-config: indexer_kv_dtype must be a string");
        c.indexer_kv_dtype = it.value().get<std::string>();
      } else if (it.key() == "indexer_decode_cp" || it.key() == "use_prefill_query_quantization") {
        // GPU kernel options of the vLLM recipe (the indexer's decode scoring split over tensor-parallel
        // ranks; FP8 index queries in prefill for the Q8KV4 kernels): accepted, no effect here (the CPU
        // engine scores with fp32 index queries), reported by serve at start.
        if (!it.value().is_boolean())
          throw Error("--attention-config: " + it.key() + " must be true or false, got " + it.value().dump());
        if (ignored) ignored->push_back("--attention-config " + it.key());
      } else if (it.key() == "backend") {
        if (!it.value().is_string() && !it.value().is_null())
          throw Error("--attention-config: backend must be a string, got " + it.value().dump());
        if (ignored) ignored->push_back("--attention-config backend");
      } else {
        throw Error("--attention-config: unknown key \"" + it.key() +
                    "\" (known: indexer_kv_dtype; accepted without effect: indexer_decode_cp, "
                    "use_prefill_query_quantization, backend)");
      }
    }
  }
  c.spec = SpeculativeConfig::parse(speculative_config);
  if (kv_offloading_backend != "native")
    throw Error("--kv-offloading-backend " + kv_offloading_backend + " is not available here (native only)");
  return c;
}

void print_not_applicable(const std::vector<std::string>& flags) {
  if (flags.empty()) return;
  std::string s;
  for (const auto& f : flags) s += (s.empty() ? "" : ", ") + f;
  std::fprintf(stderr, "[m3serve] not applicable on this build (CPU engine, one process; accepted and ignored): %s\n",
               s.c_str());
}

}  // namespace m3::cli
