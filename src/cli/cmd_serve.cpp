// `m3serve serve [MODEL] [flags]`: the OpenAI-compatible HTTP server, a drop-in for `vllm serve`.
// Every flag of the MiniMax-M3.1 recipe is accepted with vLLM's meaning; flags that only concern
// GPUs or multi-node setups are accepted and reported once at start as not applicable here.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/chat_template_file.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/generation_defaults.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "events/zmq_event_publisher.h"
#include "store/kv_transfer_config.h"
#include "store/redis_kv_tier.h"
#include "base/error.h"
#include "model/image_encoder.h"
#include "vision/processor_options.h"
#include "model/model.h"
#include "model/vision_config.h"
#include "server/http_server.h"
#include "server/image_inputs.h"
#include "tokenizer/tokenizer.h"
#include "transfer/kv_transfer_client.h"
#include "transfer/kv_transfer_server.h"

namespace m3::cli {

namespace {

namespace fs = std::filesystem;

struct ServeOpts {
  std::string model, model_flag;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::vector<std::string> allowed_origins{"*"}, allowed_methods{"*"}, allowed_headers{"*"};
  bool allow_credentials = false;
  std::vector<std::string> served_names;
  std::string chat_template;
  int stream_interval = 1;
  std::string reasoning_parser, tool_call_parser;
  bool enable_auto_tool_choice = false;
  size_t max_request_bytes = 32u << 20;
  server::HttpOptions http;  // connection, admission and per-request limits (defaults in http_server.h)
  EngineFlags engine;
  // Accepted, not applicable on this build (GPU, multi-node, disaggregation).
  std::string compilation_config, quant_moe, kv_transfer_config, limit_mm, mm_processor_kwargs, moe_backend,
      kernel_config, kv_events_config, load_format, dp_address;
  std::vector<int> numa_bind_nodes;  // vLLM: one NUMA node per rank
  int tp = 1, dp = 1, dp_local = 0, dp_start_rank = 0, dp_rpc_port = 0, max_cudagraph = 0;
  int64_t dbo_prefill = 0, dbo_decode = 0;
  double gpu_mem = 0;
  bool enable_dbo = false, disable_hybrid = false, expert_parallel = false, numa_bind = false, enforce_eager = false,
       dp_hybrid_lb = false, kv_cache_metrics = false, trust_remote_code = false, log_requests = false,
       no_log_requests = false, language_model_only = false, disable_log_requests = false, disable_log_stats = false,
       chunked_prefill = false, no_chunked_prefill = false;
  std::string dtype = "auto";
  std::optional<uint64_t> seed;
  double mm_processor_cache_gb = 4.0;
  std::string allowed_local_media_path;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string default_model_dir() {
  std::vector<fs::path> cands{fs::current_path() / "models" / "demo"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    cands.push_back(exe.parent_path().parent_path() / "models" / "demo");
    cands.push_back(exe.parent_path() / "models" / "demo");
  }
  for (auto& c : cands)
    if (fs::exists(c / "config.json")) return c.string();
  throw Error("no MODEL given and no demo model found at models/demo (looked in the current directory and next to "
              "the binary); pass the checkpoint directory: m3serve serve MODEL");
}

// generation_config.json's sampling defaults (vLLM's behaviour), as generate --input applies them too.
void apply_generation_config(const std::string& dir, server::ServerContext& ctx) {
  const SamplingParams d = generation_defaults(dir);
  ctx.default_temperature = d.temperature;
  ctx.default_top_p = d.top_p;
  ctx.default_top_k = d.top_k;
  ctx.default_min_p = d.min_p;
  ctx.default_repetition_penalty = d.repetition_penalty;
}

void run_serve(ServeOpts& o, CLI::App* sub) {
  // Signals are taken by the server's own thread (sigwait); block them before any thread exists.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (!o.model.empty() && !o.model_flag.empty() && o.model != o.model_flag)
    throw Error("MODEL given twice: " + o.model + " and --model " + o.model_flag);
  // The model as given (a directory or a Hub id): the API's model name, as vLLM's.
  const std::string ref = !o.model.empty() ? o.model : !o.model_flag.empty() ? o.model_flag : default_model_dir();

  std::vector<std::string> na;
  auto note = [&](const char* flag) {
    if (sub->count(flag) > 0) na.push_back(flag);
  };
  for (const char* f : {"--compilation-config", "--quantization-config.moe",
                        "--moe-backend", "--kernel-config",
                        "--data-parallel-address", "--data-parallel-size-local", "--data-parallel-start-rank",
                        "--data-parallel-rpc-port", "--data-parallel-hybrid-lb", "--max-cudagraph-capture-size",
                        "--dbo-prefill-token-threshold", "--dbo-decode-token-threshold", "--enable-dbo",
                        "--disable-hybrid-kv-cache-manager", "--enable-expert-parallel", "--numa-bind",
                        "--numa-bind-nodes", "--gpu-memory-utilization", "--enforce-eager", "--kv-cache-metrics",
                        "--load-format"})
    note(f);
  if (o.tp > 1) na.push_back("--tensor-parallel-size " + std::to_string(o.tp));
  if (o.dp > 1) na.push_back("--data-parallel-size " + std::to_string(o.dp));
  EngineConfig ec = o.engine.resolve(&na);
  if (o.no_chunked_prefill)
    throw Error("--no-enable-chunked-prefill: chunked prefill is always on here (bound a step with "
                "--max-num-batched-tokens or --long-prefill-token-threshold instead)");
  if (o.dtype != "auto")
    throw Error("--dtype " + o.dtype + ": each tensor is computed in the format the checkpoint stores it (BF16 / "
                "MXFP8 / NVFP4, fp32 accumulation); only --dtype auto is accepted");
  ec.seed = o.seed;
  const store::KvTransferConfig ktc = store::KvTransferConfig::parse(o.kv_transfer_config);
  ec.kv_load_failure_policy = ktc.load_failure_policy;
  if (ktc.cpu_offload) {
    // SimpleCPUOffloadConnector is the local host-memory tier. Its size is per GPU rank in vLLM (the
    // recipe's 560 GiB x 4 ranks); here one process serves, and a tier larger than half this host's
    // memory would end in the OOM killer as it fills, so it is capped there, said at start.
    if (ec.kv_offloading_gib > 0)
      throw Error("--kv-offloading-size and --kv-transfer-config SimpleCPUOffloadConnector both configure the host "
                  "KV tier: give one");
    const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
    double bytes = double(ktc.cpu_offload->bytes);
    if (phys > 0 && bytes > phys / 2) {
      std::fprintf(stderr,
                   "[m3serve] SimpleCPUOffloadConnector: cpu_bytes_to_use %.1f GiB is more than half of this "
                   "host's %.1f GiB of memory; the host KV tier is capped at %.1f GiB\n",
                   bytes / double(1ull << 30), phys / double(1ull << 30), phys / 2 / double(1ull << 30));
      bytes = phys / 2;
    }
    ec.kv_offloading_gib = bytes / double(1ull << 30);
    ec.kv_offloading_lazy = ktc.cpu_offload->lazy;
  }
  na.insert(na.end(), ktc.not_applicable.begin(), ktc.not_applicable.end());
  print_not_applicable(na);
  if (o.enable_auto_tool_choice && o.tool_call_parser.empty())
    throw Error("--enable-auto-tool-choice needs --tool-call-parser");
  if (o.stream_interval < 1) throw Error("--stream-interval must be at least 1");
  if (o.api_key.empty())
    if (const char* k = std::getenv("VLLM_API_KEY")) o.api_key = k;

  server::ServerContext ctx;
  if (o.log_requests && (o.no_log_requests || o.disable_log_requests))
    throw Error(std::string("--enable-log-requests and ") +
                (o.no_log_requests ? "--no-enable-log-requests" : "--disable-log-requests") + " contradict each other");
  ctx.log_requests = o.log_requests;
  if (!o.reasoning_parser.empty()) ctx.reasoning = chat::reasoning_format_from_name(o.reasoning_parser);
  if (!o.tool_call_parser.empty()) ctx.tool = chat::tool_format_from_name(o.tool_call_parser);
  ctx.enable_auto_tool_choice = o.enable_auto_tool_choice;
  server::parse_limit_mm(o.limit_mm, ctx.media);  // flag errors before the model loads
  {
    vision::ProcessorConfig check;
    vision::apply_mm_processor_kwargs(o.mm_processor_kwargs, check);
  }
  ctx.media.language_model_only = o.language_model_only;
  if (!o.allowed_local_media_path.empty()) {
    if (!fs::is_directory(o.allowed_local_media_path))
      throw Error("--allowed-local-media-path: " + o.allowed_local_media_path + " is not a directory");
    ctx.media.allowed_local_media_path = o.allowed_local_media_path;
  }

  const ModelOptions model_options = o.engine.model.options();  // flag errors before a download
  server::check_listen_address(o.host, o.port);  // a busy port before the model loads, not after
  const ModelDirs dirs = resolve_model_dirs(o.engine.model.ref, ref);
  const std::string& dir = dirs.model;
  Model model(dir, model_options);
  if (const std::string d = describe_model_flags(o.engine.model, model); !d.empty())
    std::fprintf(stderr, "[m3serve] %s\n", d.c_str());
  Tokenizer tok = Tokenizer::from_dir(dirs.tokenizer);
  // The vision tower, unless --language-model-only (then its weights are never read) or the checkpoint
  // has none; chat image parts are refused by name without it.
  std::unique_ptr<ImageEncoder> image_encoder;
  if (!o.language_model_only &&
      VisionConfig::from_json_text(read_file(fs::path(dir) / "config.json"), dir + "/config.json", model.config().hidden)
          .present) {
    image_encoder = std::make_unique<ImageEncoder>(dir, int(model.config().hidden), o.mm_processor_kwargs);
    image_encoder->set_cache_bytes(size_t(o.mm_processor_cache_gb * double(size_t(1) << 30)));
    const VisionConfig& vc = image_encoder->config();
    if (vc.image_token_id < 0 || vc.image_token_id >= model.config().vocab)
      throw Error(dir + "/config.json: image_token_index " + std::to_string(vc.image_token_id) +
                  " is outside the vocabulary (" + std::to_string(model.config().vocab) + ")");
    ctx.images = image_encoder.get();
    std::fprintf(stderr, "[m3serve] vision tower: %d layers, hidden %d; at most %lld image(s) per prompt; %lld-%lld pixels\n",
                 vc.layers, vc.hidden, (long long)ctx.media.limit_image, (long long)image_encoder->processor().min_pixels,
                 (long long)image_encoder->processor().max_pixels);
    const vision::VideoOptions& vo = image_encoder->video();
    std::fprintf(stderr,
                 "[m3serve] video: at most %lld per prompt; %.3g fps sampled, up to %.0f s, %lld frames, %lld-%lld pixels "
                 "a frame, %lld pixels in all\n",
                 (long long)ctx.media.limit_video, vo.fps, vo.max_duration, (long long)vo.max_frames,
                 (long long)vo.min_pixels, (long long)vo.max_pixels, (long long)vo.total_pixels);
  } else if (o.language_model_only) {
    std::fprintf(stderr, "[m3serve] --language-model-only: vision tower not loaded; image parts are refused\n");
  }
  Engine engine(model, &tok, ec);
  // The shared KV tier (--kv-transfer-config RedisConnector): pages written as computed, found by
  // every engine of the same model and cache layout.
  if (ktc.redis) {
    engine.set_shared_tier(
        std::make_unique<store::RedisKvTier>(*ktc.redis, engine.kv_layout_id(), engine.kv_page_blob_bytes()),
        ktc.save_decode_cache);
    std::fprintf(stderr, "[m3serve] KV store redis://%s:%d shared (pages of layout %016llx%s)\n",
                 ktc.redis->host.c_str(), ktc.redis->port, (unsigned long long)engine.kv_layout_id(),
                 ktc.save_decode_cache ? ", generated pages too" : "");
  }
  // KV cache events for KV-aware routers (--kv-events-config, vLLM's JSON): published from their own
  // thread, so a step never waits on them.
  const events::KvEventsConfig kvc = events::KvEventsConfig::parse(o.kv_events_config);
  std::unique_ptr<events::ZmqEventPublisher> kv_pub;
  if (kvc.publishing()) {
    kv_pub = std::make_unique<events::ZmqEventPublisher>(kvc);
    engine.set_kv_event_sink(kv_pub.get());
    std::fprintf(stderr, "[m3serve] KV events published on %s (ZMQ PUB, topic \"%s\")%s%s\n", kv_pub->endpoint().c_str(),
                 kvc.topic.c_str(), kv_pub->replay_endpoint().empty() ? "" : ", replay on ",
                 kv_pub->replay_endpoint().c_str());
  } else if (kvc.enable_kv_cache_events) {
    std::fprintf(stderr, "[m3serve] %s\n", kvc.describe().c_str());
  }

  // Prefill/decode disaggregation (--kv-transfer-config NixlConnector): a producer leases prompts' pages
  // and serves them on its UCX listener; a consumer pulls them for do_remote_prefill requests.
  std::shared_ptr<transfer::UcxContext> ucx;
  std::unique_ptr<transfer::KvTransferServer> kv_server;
  std::unique_ptr<transfer::UcxKvFetcher> kv_fetcher;
  if (ktc.nixl) {
    const auto& n = *ktc.nixl;
    std::string engine_id = n.engine_id;
    if (engine_id.empty()) {
      std::random_device rd;
      engine_id = fmt::format("{:08x}-{:08x}", rd(), rd());
    }
    transfer::Hello hello;
    hello.layout_id = engine.kv_layout_id();
    hello.block_size = engine.block_size();
    hello.dtypes = engine.kv_dtypes();
    hello.page_bytes = engine.kv_page_blob_bytes();
    hello.engine_id = engine_id;
    ucx = std::make_shared<transfer::UcxContext>();
    ctx.kv_engine_id = engine_id;
    ctx.kv_fail_on_load_error = ktc.load_failure_policy == "fail";
    if (n.producer()) {
      engine.enable_kv_leases(std::chrono::milliseconds(int64_t(n.lease_seconds * 1000)));
      try {
        kv_server = std::make_unique<transfer::KvTransferServer>(ucx, engine, hello, n.host, n.port, n.num_threads);
      } catch (const Error& e) {
        // The listener's port travels in every prefill answer (remote_port), so without an explicit
        // kv_port a busy default (another engine on this host) gives way to any free port.
        if (n.port_given) throw;
        std::fprintf(stderr, "[m3serve] %s; listening on any free port instead (give kv_port to insist)\n", e.what());
        kv_server = std::make_unique<transfer::KvTransferServer>(ucx, engine, hello, n.host, 0, n.num_threads);
      }
      ctx.kv_producer = true;
      ctx.kv_host = n.host;
      ctx.kv_port = kv_server->port();
    }
    if (n.consumer()) {
      kv_fetcher = std::make_unique<transfer::UcxKvFetcher>(ucx, hello);
      engine.enable_remote_prefill();
      ctx.kv_consumer = true;
      ctx.kv_fetcher = kv_fetcher.get();
    }
    std::fprintf(stderr,
                 "[m3serve] P/D disaggregation (NixlConnector, kv_role %s, engine id %s): %s%s; KV pages of %llu "
                 "bytes over UCX; kv_load_failure_policy %s\n",
                 n.role.c_str(), engine_id.c_str(),
                 kv_server ? fmt::format("KV transfer listening on {}:{} ({} serving threads), leases of {} s", n.host,
                                         kv_server->port(), kv_server->num_threads(), n.lease_seconds).c_str()
                           : "no listener",
                 kv_fetcher ? ", pulls remote prefills" : "", (unsigned long long)hello.page_bytes,
                 ktc.load_failure_policy.c_str());
  }

  ctx.served_names = o.served_names.empty() ? std::vector<std::string>{ref} : o.served_names;
  ctx.model_path = ref;
  ctx.tok = &tok;
  ctx.max_model_len = engine.max_model_len();
  ctx.vocab = model.config().vocab;
  if (tok.bos_id() >= 0) ctx.bos_token = tok.token_bytes(tok.bos_id());
  if (tok.eos_id() >= 0) ctx.eos_token = tok.token_bytes(tok.eos_id());
  const std::string tmpl = load_chat_template(o.chat_template, dirs.tokenizer);
  if (!tmpl.empty()) ctx.chat_template = std::make_shared<chat::ChatTemplate>(tmpl);
  else std::fprintf(stderr, "[m3serve] warning: no chat template; /v1/chat/completions will answer 400\n");
  apply_generation_config(dir, ctx);

  std::fprintf(stderr, "[m3serve] %s\n", engine.describe().c_str());
  std::fprintf(stderr, "[m3serve] model %s served as %s; reasoning parser %s, tool-call parser %s%s\n", ref.c_str(),
               ctx.served_names.front().c_str(), o.reasoning_parser.empty() ? "none" : o.reasoning_parser.c_str(),
               o.tool_call_parser.empty() ? "none" : o.tool_call_parser.c_str(),
               o.enable_auto_tool_choice ? " (auto tool choice)" : "");

  server::HttpOptions ho;
  if (kv_pub)
    ho.extra_metrics = [&kv_pub] {
      const auto ks = kv_pub->stats();
      return fmt::format(
          "# HELP m3serve:kv_events_published_total KV event batches published.\n"
          "# TYPE m3serve:kv_events_published_total counter\nm3serve:kv_events_published_total {}\n"
          "# HELP m3serve:kv_events_total KV cache events in the batches published.\n"
          "# TYPE m3serve:kv_events_total counter\nm3serve:kv_events_total {}\n"
          "# HELP m3serve:kv_events_dropped_total KV event batches dropped (publisher queue full).\n"
          "# TYPE m3serve:kv_events_dropped_total counter\nm3serve:kv_events_dropped_total {}\n",
          ks.published, ks.events, ks.dropped);
    };
  if (kv_fetcher) {
    auto before = std::move(ho.extra_metrics);
    ho.extra_metrics = [before, f = kv_fetcher.get()] {
      const auto s = f->stats();
      std::string out = before ? before() : std::string();
      auto m = [&](const char* name, const char* type, const char* help, double v) {
        out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} {}\nm3serve:{} {}\n", name, help, name, type, name, v);
      };
      m("kv_transfer_fetches_total", "counter", "KV pulls from prefill engines.", double(s.fetches));
      m("kv_transfer_refused_total", "counter", "KV pulls the prefill engine refused (answered 400).", double(s.refused));
      m("kv_transfer_failed_total", "counter", "KV pulls that broke (kv_load_failure_policy applied).", double(s.failed));
      m("kv_transfer_received_bytes_total", "counter", "KV page bytes pulled.", double(s.bytes));
      m("kv_transfer_seconds_total", "counter", "Wall time of successful KV pulls.", s.seconds);
      return out;
    };
  }
  ho.host = o.host;
  ho.port = o.port;
  ho.api_key = o.api_key;
  ho.cors.allowed_origins = server::parse_cors_list(o.allowed_origins, "--allowed-origins");
  ho.cors.allowed_methods = server::parse_cors_list(o.allowed_methods, "--allowed-methods");
  ho.cors.allowed_headers = server::parse_cors_list(o.allowed_headers, "--allowed-headers");
  ho.cors.allow_credentials = o.allow_credentials;
  ho.stream_interval = o.stream_interval;
  ho.max_body_bytes = o.max_request_bytes;
  ho.max_body_bytes_in_flight = o.http.max_body_bytes_in_flight;
  ho.threads = o.http.threads;
  ho.max_connections = o.http.max_connections;
  ho.max_waiting = o.http.max_waiting;
  ho.header_timeout_s = o.http.header_timeout_s;
  ho.body_timeout_s = o.http.body_timeout_s;
  ho.idle_timeout_s = o.http.idle_timeout_s;
  ho.write_timeout_s = o.http.write_timeout_s;
  ho.shutdown_timeout_s = o.http.shutdown_timeout_s;
  ho.limits = o.http.limits;
  server::run_http_server(engine, ctx, ho);
  if (kv_pub) {
    kv_pub->flush(std::chrono::milliseconds(1000));
    const auto ks = kv_pub->stats();
    const auto es = engine.stats();
    std::fprintf(stderr,
                 "[m3serve] KV events: %llu batches (%llu events) published, %llu dropped; publishing took %.3f ms "
                 "of the engine thread over %lld steps\n",
                 (unsigned long long)ks.published, (unsigned long long)ks.events, (unsigned long long)ks.dropped,
                 ks.publish_seconds * 1e3, (long long)es.steps);
  }
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server (drop-in for `vllm serve`)");
  auto o = std::make_shared<ServeOpts>();
  sub->add_option("MODEL", o->model,
                  "Checkpoint directory or Hugging Face Hub id ORG/NAME (from the HF cache, else downloaded; default: "
                  "models/demo)");
  sub->add_option("--model", o->model_flag, "Checkpoint directory or Hub id (same as MODEL)");
  sub->add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--port", o->port, "Port (default 8000; 0 = any free port, printed at start)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", o->api_key, "Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on /v1 (also $VLLM_API_KEY)");
  sub->add_option("--allowed-origins", o->allowed_origins,
                  "CORS: origins browsers may call from, a JSON list or comma-separated (default [\"*\"]: any)")
      ->allow_extra_args(false)  // one value per occurrence: CLI11 would split a JSON list itself
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--allowed-methods", o->allowed_methods, "CORS: methods a preflight may ask for (default [\"*\"])")
      ->allow_extra_args(false)  // one value per occurrence: CLI11 would split a JSON list itself
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--allowed-headers", o->allowed_headers, "CORS: request headers a preflight may ask for (default [\"*\"])")
      ->allow_extra_args(false)  // one value per occurrence: CLI11 would split a JSON list itself
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_flag("--allow-credentials", o->allow_credentials, "CORS: allow credentialed requests (cookies, auth headers)");
  sub->add_option("--served-model-name", o->served_names, "Model name(s) in the API (default: MODEL as given)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--chat-template", o->chat_template, "Chat template file (or inline template)");
  sub->add_option("--stream-interval", o->stream_interval, "Stream every N tokens (first and last at once)");
  sub->add_option("--reasoning-parser", o->reasoning_parser, "minimax_m3, minimax_m2, minimax_m2_append_think");
  sub->add_option("--tool-call-parser", o->tool_call_parser, "minimax_m3, minimax_m2");
  sub->add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice, "Parse tool calls (tool_choice auto)");
  sub->add_option("--max-request-bytes", o->max_request_bytes,
                  "Largest request body accepted, counted after de-chunking and gzip/deflate inflation (413 above; "
                  "default 32 MiB)")
      ->check(positive_number());
  auto& h = o->http;
  sub->add_option("--max-request-bytes-in-flight", h.max_body_bytes_in_flight,
                  "Bytes of request bodies received or handled at once across connections (a chunked or compressed "
                  "body counts --max-request-bytes); a body past it gets 503; bodies up to 64 KiB are not counted "
                  "(default 8 x --max-request-bytes)")
      ->check(non_negative_number());
  sub->add_option("--http-threads", h.threads,
                  "Requests handled at once (tokenize and generation; each holds a worker thread); more get 503 "
                  "(default 512)")
      ->check(CLI::Range(1, 100000));
  sub->add_option("--max-connections", h.max_connections,
                  "Open HTTP connections; at the cap the one waiting longest for a request is closed for the new "
                  "one, and 503 only when all are answering requests (default 1024)")
      ->check(CLI::Range(1, 1000000));
  sub->add_option("--max-waiting-requests", h.max_waiting,
                  "Sequences that may wait for a place in the running batch (beyond its free places); a request past it gets 503 with "
                  "Retry-After (default 256; 0: no limit)")
      ->check(non_negative_number());
  sub->add_option("--http-header-timeout", h.header_timeout_s,
                  "Seconds for a whole request header, from the connection's start (a later request on it: from its "
                  "first byte) (default 10)")
      ->check(positive_number());
  sub->add_option("--http-body-timeout", h.body_timeout_s, "Seconds for a whole request body (default 30)")
      ->check(positive_number());
  sub->add_option("--http-keep-alive-timeout", h.idle_timeout_s,
                  "Seconds an idle keep-alive connection is kept (default 5)")
      ->check(positive_number());
  sub->add_option("--http-write-timeout", h.write_timeout_s,
                  "Seconds one write may wait for a client that does not read (default 30)")
      ->check(positive_number());
  sub->add_option("--shutdown-timeout", h.shutdown_timeout_s,
                  "SIGTERM/SIGINT: seconds running requests get to finish before they are ended with "
                  "finish_reason abort (default 5; a second signal exits at once)")
      ->check(non_negative_number());
  sub->add_option("--max-prompts-per-request", h.limits.max_prompts, "Prompts in one completions request (default 64)")
      ->check(positive_number());
  sub->add_option("--max-choices-per-request", h.limits.max_choices,
                  "Completions one request may ask for: prompts x n (default 128)")
      ->check(positive_number());
  sub->add_option("--max-tokens-per-request", h.limits.max_tokens,
                  "Tokens one request may generate: prompts x n x max_tokens (default 1048576)")
      ->check(positive_number());
  sub->add_option("--max-stop-strings", h.limits.max_stop, "Stop strings (and stop_token_ids) per request (default 64)")
      ->check(non_negative_number());
  sub->add_option("--max-stop-string-bytes", h.limits.max_stop_bytes, "Bytes of one stop string (default 1024)")
      ->check(positive_number());
  sub->add_option("--max-logprobs-per-request", h.limits.max_logprobs,
                  "Logprob entries one request may return: prompts x n x max_tokens x (1 + top_logprobs) "
                  "(default 262144)")
      ->check(positive_number());
  add_engine_flags(sub, o->engine);
  add_tokenizer_ref_flags(sub, o->engine.model.ref);
  // vLLM flags without effect here (reported at start when they ask for GPUs or several processes).
  sub->add_option("--tensor-parallel-size", o->tp, "Not applicable (one CPU process); -tp N is the same");
  sub->add_option("--data-parallel-size", o->dp, "Not applicable");
  sub->add_option("--data-parallel-size-local", o->dp_local, "Not applicable");
  sub->add_option("--data-parallel-start-rank", o->dp_start_rank, "Not applicable");
  sub->add_option("--data-parallel-rpc-port", o->dp_rpc_port, "Not applicable");
  sub->add_option("--data-parallel-address", o->dp_address, "Not applicable");
  sub->add_flag("--data-parallel-hybrid-lb", o->dp_hybrid_lb, "Not applicable");
  sub->add_flag("--enable-expert-parallel", o->expert_parallel, "Not applicable");
  sub->add_option("--compilation-config,-O", o->compilation_config, "Not applicable (CUDA graphs / torch.compile)");
  sub->add_option("--quantization-config.moe", o->quant_moe, "Not applicable (GPU MoE re-quantization)");
  sub->add_option("--kv-transfer-config", o->kv_transfer_config,
                  "vLLM's JSON: RedisConnector (a KV tier shared by engines: {\"kv_connector\": \"RedisConnector\", "
                  "\"kv_connector_extra_config\": {\"url\": \"redis://HOST:PORT\"}}); NixlConnector (prefill/decode "
                  "disaggregation over UCX: kv_role kv_producer|kv_consumer|kv_both, kv_ip, kv_port, "
                  "kv_connector_extra_config {\"kv_lease_duration\": seconds}); GPU connectors accepted without effect");
  sub->add_option("--kv-events-config", o->kv_events_config,
                  "KV cache events for KV-aware routers, vLLM's JSON: '{\"enable_kv_cache_events\": true, "
                  "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": ..., \"topic\": ...}'");
  sub->add_option("--moe-backend", o->moe_backend, "Not applicable (GPU MoE kernels)");
  sub->add_option("--kernel-config", o->kernel_config, "Not applicable");
  sub->add_option("--load-format", o->load_format, "Not applicable (safetensors only)");
  sub->add_option("--max-cudagraph-capture-size", o->max_cudagraph, "Not applicable");
  sub->add_flag("--enable-dbo", o->enable_dbo, "Not applicable (dual-batch overlap)");
  sub->add_option("--dbo-prefill-token-threshold", o->dbo_prefill, "Not applicable");
  sub->add_option("--dbo-decode-token-threshold", o->dbo_decode, "Not applicable");
  sub->add_flag("--disable-hybrid-kv-cache-manager", o->disable_hybrid, "Not applicable (one KV cache group here)");
  sub->add_option("--gpu-memory-utilization", o->gpu_mem, "Not applicable (use --kv-cache-memory)");
  sub->add_flag("--numa-bind", o->numa_bind, "Not applicable");
  sub->add_option("--numa-bind-nodes", o->numa_bind_nodes, "Not applicable")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_flag("--enforce-eager", o->enforce_eager, "Not applicable");
  sub->add_flag("--kv-cache-metrics", o->kv_cache_metrics, "Not applicable");
  sub->add_option("--limit-mm-per-prompt", o->limit_mm,
                  "Images and videos per chat prompt, vLLM's JSON '{\"image\": N, \"video\": M}' (default 999 each); audio only as 0");
  sub->add_option("--mm-processor-kwargs", o->mm_processor_kwargs,
                  "Image and video processor options as JSON: '{\"min_pixels\": N, \"max_pixels\": M, \"fps\": F, "
                  "\"max_frames\": N, \"total_pixels\": N, \"max_duration\": S}' (other keys refused)");
  sub->add_option("--mm-processor-cache-gb", o->mm_processor_cache_gb,
                  "GiB of encoded images kept by content, so a resent image skips decoding and the vision tower "
                  "(default 4; 0: no cache)")
      ->check(CLI::Range(0.0, 1024.0));
  sub->add_option("--allowed-local-media-path", o->allowed_local_media_path,
                  "Folder whose files chat image parts may name as file:// URLs (default: file:// refused)");
  sub->add_flag("--trust-remote-code", o->trust_remote_code, "Accepted (no remote code is ever run)");
  sub->add_flag("--language-model-only", o->language_model_only,
                "Skip loading the vision tower; chat image parts are refused");
  sub->add_flag("--enable-log-requests", o->log_requests,
                "Log each request as it arrives: its id, prompt tokens, sampling parameters and the start of "
                "its prompt (stderr)");
  sub->add_flag("--no-enable-log-requests", o->no_log_requests, "Do not log requests (the default)");
  // vLLM flags that ask for what this server does anyway, and two whose other values it refuses by name.
  sub->add_flag("--disable-log-requests", o->disable_log_requests, "Do not log requests (the default; vLLM's older flag)");
  sub->add_flag("--disable-log-stats", o->disable_log_stats,
                "No periodic stats lines in the log (the default here: the figures are in /metrics)");
  sub->add_flag("--enable-chunked-prefill", o->chunked_prefill, "Chunked prefill (always on)");
  sub->add_flag("--no-enable-chunked-prefill", o->no_chunked_prefill, "Refused: chunked prefill is always on here");
  sub->add_option("--dtype", o->dtype,
                  "auto only: each tensor is computed in the format the checkpoint stores it (other values are refused)");
  sub->add_option("--seed", o->seed,
                  "Seed of the seeds drawn for requests that give none (vLLM's global seed: the same requests in the "
                  "same order sample the same text); default: random seeds")
      ->check(non_negative_number());
  sub->callback([o, sub] { run_serve(*o, sub); });
}

}  // namespace m3::cli
