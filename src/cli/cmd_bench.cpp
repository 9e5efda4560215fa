// The `bench` subcommand: `bench serve` (load generator for OpenAI-compatible servers, as
// `vllm bench serve`) and `bench roofline` (machine limits vs. per-kernel-class step timings).
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "bench/roofline.h"
#include "cli/flag_checks.h"
#include "cli/model_flags.h"
#include "bench/serve_bench.h"
#include "bench/vision_bench.h"
#include "cli/commands.h"
#include "base/error.h"

namespace m3::cli {

void register_bench(CLI::App& app) {
  CLI::App* b = app.add_subcommand("bench", "Benchmarks: `serve` (an OpenAI-compatible endpoint), `roofline` (this machine) and `vision` (the image path)");
  b->require_subcommand(1);

  auto so = std::make_shared<bench::ServeBenchOptions>();
  auto rate = std::make_shared<std::string>("inf");
  auto no_progress = std::make_shared<bool>(false);
  CLI::App* s = b->add_subcommand("serve", "Benchmark a running server with streamed requests (as `vllm bench serve`)");
  s->add_option("--base-url", so->base_url, "Server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port)");
  s->add_option("--host", so->host, "Server host")->capture_default_str();
  s->add_option("--port", so->port, "Server port")->capture_default_str();
  s->add_option("--model", so->model, "Served model name (default: the first of /v1/models)");
  s->add_option("--backend", so->backend,
                "vLLM's backend name: vllm, openai, sglang, lmdeploy, scalellm (completions) or openai-chat (chat)");
  s->add_option("--endpoint", so->endpoint,
                "/v1/completions or /v1/chat/completions (default: the backend's; /v1/completions without one)");
  s->add_option("--dataset-name", so->dataset_name, "random, sharegpt, custom or agentic")->capture_default_str();
  s->add_option("--dataset-path", so->dataset_path, "sharegpt: a ShareGPT JSON file; custom: a JSONL file of {\"prompt\": ...}");
  s->add_option("--sharegpt-output-len", so->sharegpt_output_len, "sharegpt: output tokens per request instead of the reply's length");
  s->add_option("--custom-output-len", so->custom_output_len, "custom: output tokens per request")->capture_default_str();
  s->add_flag("--custom-skip-chat-template", so->custom_skip_chat_template,
              "custom on /v1/completions: send the prompts as they are, without the chat template");
  s->add_option("--random-input-len", so->random_input_len, "Input tokens per request (agentic: initial context)")
      ->capture_default_str()
      ->check(positive_number());
  s->add_option("--random-output-len", so->random_output_len, "Output tokens per request (max_tokens)")
      ->capture_default_str()
      ->check(positive_number());
  s->add_option("--random-prefix-len", so->random_prefix_len, "Shared random prefix tokens")
      ->capture_default_str()
      ->check(non_negative_number());
  s->add_option("--random-range-ratio", so->random_range_ratio, "Lengths uniform in [L(1-r), L(1+r)], r in [0, 1)")
      ->capture_default_str();
  s->add_option("--num-prompts", so->num_prompts, "Number of requests (random dataset)")
      ->capture_default_str()
      ->check(positive_number());
  s->add_option("--max-concurrency", so->max_concurrency, "Cap on requests in flight (0: none)")
      ->capture_default_str()
      ->check(non_negative_number());
  s->add_option("--request-rate", *rate, "Requests per second, Poisson arrivals (inf: all at once)")->capture_default_str();
  s->add_option("--burstiness", so->burstiness,
                "Gamma shape of the arrival gaps with --request-rate: 1 Poisson, < 1 burstier, > 1 steadier")
      ->capture_default_str();
  s->add_option("--goodput", so->goodput, "Objectives KEY:MS (ttft, tpot, e2el); reports requests/s meeting all of them")
      ->expected(1, 3)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s->add_option("--percentile-metrics", so->percentile_metrics,
                "Comma-separated metrics to report percentiles for (ttft, tpot, itl, e2el; vLLM's default ttft,tpot,itl)");
  s->add_option("--metric-percentiles", so->metric_percentiles, "Comma-separated percentiles, e.g. 50,90,99 (default 99)");
  s->add_option("--seed", so->seed, "Random seed")->capture_default_str();
  s->add_flag("--ignore-eos", so->ignore_eos, "Send ignore_eos so every request generates its full length");
  s->add_option("--tokenizer", so->tokenizer_dir, "Model directory whose tokenizer.json builds the prompts (default: the server's /tokenize, /detokenize)");
  s->add_option("--api-key", so->api_key, "Bearer token (default: $OPENAI_API_KEY)");
  s->add_option("--save-result", so->save_result, "Write the result JSON here");
  s->add_option("--plot", so->plot, "Write an SVG of the latency distributions here");
  s->add_flag("--no-progress", *no_progress, "No progress bar");
  s->add_option("--num-sessions", so->num_sessions, "Agentic: concurrent sessions (users)")->capture_default_str();
  s->add_option("--turns", so->turns, "Agentic: turns per session")->capture_default_str();
  s->add_option("--tool-result-len", so->tool_result_len, "Agentic: approximate tokens of tool output added per turn")
      ->capture_default_str();
  s->add_option("--session-header", so->session_header, "Agentic: the per-conversation session header")->capture_default_str();
  s->callback([so, rate, no_progress] {
    if (*rate == "inf" || *rate == "infinity") so->request_rate = std::numeric_limits<double>::infinity();
    else {
      try {
        so->request_rate = std::stod(*rate);
      } catch (...) {
        throw Error("--request-rate: expected a number or inf, got " + *rate);
      }
      if (!(so->request_rate > 0)) throw Error("--request-rate must be positive");
    }
    so->progress = !*no_progress;
    bench::run_serve_bench(*so);
  });

  auto ro = std::make_shared<bench::RooflineOptions>();
  CLI::App* r = b->add_subcommand("roofline", "Measure read bandwidth and FMA peak, then time decode / prefill per kernel class");
  r->add_option("--model", ro->model_dir, "Model directory or Hugging Face Hub id")->required();
  r->add_option("--context", ro->context, "Context tokens in the cache for the decode step")->capture_default_str();
  r->add_option("--prefill", ro->prefill, "Tokens in the prefill step")->capture_default_str();
  r->add_option("--compare-context", ro->compare_context,
                "Also run steady decode at this context after each run at --context and print the rate ratios "
                "(e.g. --context 16384 --compare-context 512)");
  r->add_option("--repeats", ro->repeats, "Timed repetitions (best kept)")->capture_default_str();
  r->add_option("--threads", ro->threads, "Threads (0: OpenMP default)")->capture_default_str();
  r->add_option("--probe-mib", ro->probe_mib, "Bandwidth probe buffer, MiB")->capture_default_str();
  r->add_option("--kv-cache-dtype", ro->kv_cache_dtype, "K/V cache dtype, as for serve: auto (bf16), bf16, fp8, nvfp4, fp32")
      ->capture_default_str();
  r->add_option("--indexer-kv-dtype", ro->indexer_kv_dtype, "Index-key cache dtype: auto (bf16), bf16, fp8, nvfp4, fp32")
      ->capture_default_str();
  auto rflags = std::make_shared<ModelFlags>();
  add_model_flags(r, *rflags);
  r->callback([ro, rflags] {
    ro->model = rflags->options();
    bench::check_roofline_options(*ro);  // flag errors before a download
    ro->model_dir = resolve_model_dirs(rflags->ref, ro->model_dir).model;
    bench::run_roofline(*ro);
  });

  auto vo = std::make_shared<bench::VisionBenchOptions>();
  CLI::App* v = b->add_subcommand("vision", "Time image and video preprocessing and the vision tower's encoder");
  v->add_option("--model", vo->model_dir, "Model directory (with a vision tower)")->required();
  v->add_option("--image", vo->images, "Image file(s) to decode, preprocess and encode");
  v->add_option("--size", vo->sizes, "Synthetic image size(s) WxH, e.g. 448x448 1344x896");
  v->add_option("--video", vo->videos, "Video file(s) to decode, sample, preprocess and encode");
  v->add_flag("--preprocess-only", vo->preprocess_only, "Videos: decode and preprocess only (no encoder)");
  v->add_option("--mm-processor-kwargs", vo->mm_processor_kwargs,
                "Processor options as serve's flag (fps, max_frames, total_pixels, max_duration, min/max_pixels)");
  v->add_option("--repeats", vo->repeats, "Timed repetitions per image (median and range printed)")->capture_default_str();
  v->add_option("--threads", vo->threads, "Threads (0: OpenMP default)")->capture_default_str();
  v->callback([vo] { bench::run_vision_bench(*vo); });
}

}  // namespace m3::cli
