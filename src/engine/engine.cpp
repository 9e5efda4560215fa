// The engine step: schedule -> one batched forward over paged KV -> sample -> stop rules (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "base/error.h"
#include "kernels/cpu/worker_pool.h"

namespace m3 {

Engine::Engine(Model& model, const Tokenizer* tok, const EngineConfig& cfg) : model_(model), tok_(tok), cfg_(cfg) {
  if (cfg_.seed) seed_rng_.seed(*cfg_.seed);
  const ModelConfig& mc = model.config();
  if (mc.any_sparse()) {
    if (cfg.block_size != 0 && cfg.block_size != mc.block_size)
      throw Error("--block-size " + std::to_string(cfg.block_size) + " does not match the model's MSA block size " +
                  std::to_string(mc.block_size) +
                  " (sparse_attention_config.sparse_block_size in config.json): one KV page must hold one MSA block");
    block_size_ = mc.block_size;
  } else {
    block_size_ = cfg.block_size ? cfg.block_size : 128;
  }
  if (block_size_ <= 0) throw Error("--block-size must be positive");
  kv_dtype_ = parse_kv_dtype(cfg.kv_cache_dtype, "--kv-cache-dtype");
  ik_dtype_ = parse_kv_dtype(cfg.indexer_kv_dtype, "--attention-config indexer_kv_dtype");
  size_t page = KVPool::page_bytes(mc, block_size_, kv_dtype_, ik_dtype_);
  if (cfg.spec.enabled) {
    spec_ = std::make_unique<Speculator>(cfg.spec, model_, kv_dtype_);
    page += spec_->page_bytes(block_size_);
  }
  if (cfg.num_pages > 0) {
    pool_pages_ = cfg.num_pages;
  } else {
    double bytes = cfg.kv_cache_memory_gib > 0 ? cfg.kv_cache_memory_gib * double(1ull << 30)
                                               : 0.25 * double(available_memory_bytes());
    pool_pages_ = int64_t(bytes / double(page));
    if (cfg.kv_cache_memory_gib <= 0 && cfg.kv_tokens_needed > 0) {
      const int64_t slack = cfg.spec.enabled ? cfg.spec.num_speculative_tokens + 1 : 0;
      const int64_t seqs = std::max(cfg.kv_sequences, 1);
      int64_t need = (cfg.kv_tokens_needed + seqs * slack + block_size_ - 1) / block_size_ + seqs;
      // An explicit --max-model-len is a promise that one sequence of that length fits.
      if (cfg.max_model_len > 0) need = std::max(need, (cfg.max_model_len + block_size_ - 1) / block_size_);
      pool_pages_ = std::min(pool_pages_, need);
    }
    if (pool_pages_ < 1)
      throw Error("--kv-cache-memory " + std::to_string(bytes / double(1ull << 30)) +
                  " GiB holds no KV page (one page of " + std::to_string(block_size_) + " tokens needs " +
                  std::to_string(page) + " bytes)");
  }
  if (cfg.max_num_seqs < 1) throw Error("--max-num-seqs must be at least 1");
  if (cfg.max_num_batched_tokens < 1) throw Error("--max-num-batched-tokens must be at least 1");
  if (cfg.long_prefill_token_threshold < 0) throw Error("--long-prefill-token-threshold must be >= 0");
  if (!(cfg.watermark >= 0 && cfg.watermark < 1)) throw Error("--watermark must be in [0, 1)");
  if (cfg.max_model_len < 0) throw Error("--max-model-len must be positive");
  if (cfg.max_model_len > mc.max_position_embeddings)
    throw Error("--max-model-len " + std::to_string(cfg.max_model_len) + " exceeds the model's max_position_embeddings " +
                std::to_string(mc.max_position_embeddings));
  // As vLLM does at start: one sequence of the maximum length must fit the pool, so that every
  // request admitted (prompt + max_tokens <= max-model-len) can run to completion, alone if need be.
  const int64_t pool_tokens = pool_pages_ * block_size_;
  if (cfg.max_model_len > 0) {
    if (cfg.max_model_len > pool_tokens) {
      const int64_t pages_needed = (cfg.max_model_len + block_size_ - 1) / block_size_;
      char buf[640];
      std::snprintf(buf, sizeof buf,
                    "--max-model-len %lld needs %lld KV pages of %d tokens (%.3f GiB) for one sequence, but the KV "
                    "cache holds %lld pages (%lld tokens, %.3f GiB). Lower --max-model-len to at most %lld, or raise "
                    "--kv-cache-memory to at least %.3f GiB",
                    (long long)cfg.max_model_len, (long long)pages_needed, block_size_,
                    double(page) * double(pages_needed) / double(1ull << 30), (long long)pool_pages_,
                    (long long)pool_tokens, double(page) * double(pool_pages_) / double(1ull << 30),
                    (long long)pool_tokens, double(page) * double(pages_needed) / double(1ull << 30) + 0.0005);
      throw Error(buf);
    }
    max_model_len_ = cfg.max_model_len;
  } else {
    max_model_len_ = std::min(mc.max_position_embeddings, pool_tokens);
    max_model_len_from_pool_ = max_model_len_ < mc.max_position_embeddings;
  }
  eos_ = mc.eos_id >= 0 ? mc.eos_id : (tok ? tok->eos_id() : -1);
  kv_ = std::make_unique<KVPool>(mc, block_size_, kv_dtype_, ik_dtype_, pool_pages_);
  if (spec_) spec_->make_pool(block_size_, pool_pages_);
  blocks_ = std::make_unique<BlockPool>(pool_pages_, block_size_, cfg.enable_prefix_caching);
  SchedulerConfig sc;
  sc.block_size = block_size_;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.long_prefill_token_threshold = cfg.long_prefill_token_threshold;
  sc.watermark = cfg.watermark;
  sc.num_speculative_tokens = spec_ ? spec_->num_speculative_tokens() : 0;
  sc.max_model_len = max_model_len_;
  if (cfg_.kv_load_failure_policy != "recompute" && cfg_.kv_load_failure_policy != "fail")
    throw Error("kv_load_failure_policy must be \"recompute\" or \"fail\", got \"" + cfg_.kv_load_failure_policy + "\"");
  sc.fail_on_load_error = cfg_.kv_load_failure_policy == "fail";
  if (!(cfg.step_latency_factor == 0 || cfg.step_latency_factor >= 1))
    throw Error("--step-latency-factor must be 0 (off) or at least 1 (a step carrying decode rows may take that many "
                "times a decode-only step), got " + std::to_string(cfg.step_latency_factor));
  if (!(cfg.max_step_latency_ms >= 0)) throw Error("--max-step-latency-ms must be >= 0 (0 = no cap)");
  sc.step_latency_factor = cfg.step_latency_factor;
  sc.max_step_latency_ms = cfg.max_step_latency_ms;
  if (!(cfg.step_latency_tail_share >= 0 && cfg.step_latency_tail_share < 1))
    throw Error("--step-latency-tail-share must be in [0, 1) (a share of inter-token latencies; 0 = every step "
                "within the factor), got " + std::to_string(cfg.step_latency_tail_share));
  sc.step_latency_tail_share = cfg.step_latency_tail_share;
  if (cfg.min_prefill_chunk < 1) throw Error("min_prefill_chunk must be at least 1 (long prompts must progress)");
  sc.min_prefill_chunk = cfg.min_prefill_chunk;
  sched_ = std::make_unique<Scheduler>(sc, *blocks_);
  sched_->set_cost_model(&step_cost_);
  setup_tiers();
}

namespace {
// Loads prefix pages from the tiers (local first, then shared), each verified by the codec first.
class TierLoader : public PrefixLoader {
 public:
  TierLoader(std::vector<KvTier*> tiers, KvPageCodec& codec, EngineStats& st)
      : tiers_(std::move(tiers)), codec_(codec), st_(st) {}
  TierRead load(uint64_t hash, uint64_t parent, const int32_t* tokens, int32_t page) override {
    for (KvTier* t : tiers_) {
      const TierRead r = t->get(hash, blob_);
      if (r == TierRead::Miss) continue;
      char id[24];
      std::snprintf(id, sizeof id, "%016llx", (unsigned long long)hash);
      if (r == TierRead::Failed) {
        failure_ = std::string("KV cache page ") + id + " could not be loaded from the " + t->name() + " tier";
        ++st_.tier_load_failures;
        return r;
      }
      const std::string why = codec_.import_page(blob_, page, hash, parent, tokens);
      if (!why.empty()) {
        // Wrong or damaged bytes are never used: drop them (the block is recomputed, or the request
        // fails, as the policy says).
        std::fprintf(stderr, "[m3serve] KV tier (%s): page %s refused: %s\n", t->name(), id, why.c_str());
        failure_ = std::string("KV cache page ") + id + " from the " + t->name() + " tier failed verification: " + why;
        t->erase(hash);
        ++st_.tier_load_failures;
        return TierRead::Failed;
      }
      ++st_.tier_loaded_pages;
      return TierRead::Hit;
    }
    return TierRead::Miss;
  }
  std::string failure() const override { return failure_; }
  // The asynchronous tiers (shared ones) fetch ahead; the local tiers answer at once.
  // Each tier is asked only for the pages the tiers before it (the local ones) do not hold.
  bool prefetch(uint64_t ticket, const std::vector<uint64_t>& hashes) override {
    bool started = false;
    std::vector<uint64_t> rest = hashes, next;
    for (KvTier* t : tiers_) {
      if (rest.empty()) break;
      started |= t->prefetch(ticket, rest);
      next.clear();
      for (uint64_t h : rest)
        if (!t->holds(h)) next.push_back(h);
      rest.swap(next);
    }
    return started;
  }
  bool fetched(uint64_t ticket) override {
    bool all = true;
    for (KvTier* t : tiers_) all &= t->fetched(ticket);
    return all;
  }
  void wait_fetch(std::chrono::milliseconds timeout) override {
    for (KvTier* t : tiers_) t->wait_fetch(timeout);
  }

 private:
  std::vector<KvTier*> tiers_;
  KvPageCodec& codec_;
  EngineStats& st_;
  std::string blob_;
  std::string failure_;
};
}  // namespace

namespace {
// Pulled pages go through the same codec as tier pages: a page is taken only when it is this model and
// cache layout, this place in the prompt's chain, these tokens, and its checksum holds.
class CodecImporter : public RemoteImporter {
 public:
  CodecImporter(KvPageCodec& codec, EngineStats& st) : codec_(codec), st_(st) {}
  std::string import(std::string_view blob, const TransferPage& p, int32_t page, bool checksummed) override {
    std::string why = codec_.import_page(blob, page, p.hash, p.parent, p.tokens.data(), checksummed);
    if (why.empty()) ++st_.remote_pages_loaded;
    else ++st_.remote_load_failures;
    return why;
  }

 private:
  KvPageCodec& codec_;
  EngineStats& st_;
};
}  // namespace

void Engine::enable_kv_leases(std::chrono::milliseconds duration) {
  if (duration.count() <= 0) throw Error("kv_lease_duration must be positive");
  codec();  // made here, on the engine's thread, before any transfer thread exports with it
  leases_ = std::make_unique<KvLeaseTable>(duration);
}

void Engine::enable_remote_prefill() {
  if (importer_) return;
  importer_ = std::make_unique<CodecImporter>(codec(), stats_);
  sched_->set_remote_importer(importer_.get());
}

void Engine::verify_remote(const std::vector<int32_t>& prompt, const std::vector<MultimodalSpan>& mm,
                           RemotePrefill& rp) const {
  if (!codec_) return;
  const std::vector<TransferPage> chain =
      transfer_chain(prompt, block_size_, mm_page_salts(mm, int64_t(prompt.size()), block_size_));
  size_t i = 0;
  while (i < rp.pages() && i < chain.size() &&
         codec_->verify(rp.blob(i), chain[i].hash, chain[i].parent, chain[i].tokens.data()).empty())
    ++i;
  rp.checksummed = i;  // a page that fails is checked again, and refused with its reason, on admission
}

void Engine::export_leased_page(int32_t page, const TransferPage& p, std::string& out) const {
  codec_->export_page(page, p.hash, p.parent, p.tokens.data(), out);
}

void Engine::export_leased_page(int32_t page, const TransferPage& p, char* out) const {
  codec_->export_page_to(page, p.hash, p.parent, p.tokens.data(), out);
}

void Engine::housekeeping() {
  if (!leases_) return;
  for (int32_t b : leases_->take_released(std::chrono::steady_clock::now())) blocks_->release(b);
}

std::optional<std::chrono::steady_clock::time_point> Engine::next_timer() const {
  if (!leases_) return std::nullopt;
  return leases_->next_deadline();
}

std::string Engine::kv_dtypes() const {
  return std::string("kv ") + kv_dtype_name(kv_dtype_) + " ik " + kv_dtype_name(ik_dtype_) +
         (spec_ ? spec_->layout_extra() : std::string());
}

// The prompt's pages stay, referenced by the lease, when the request ends; the decode engine reads
// them by the lease's id, or they return to the pool when it expires (housekeeping).
void Engine::lease_pages(Sequence* s, RequestOutput& out) {
  const int64_t P = int64_t(s->prompt.size());
  const size_t n = size_t((P + block_size_ - 1) / block_size_);
  if (s->num_computed < P || s->blocks.size() < n) return;
  std::vector<int32_t> pages(s->blocks.begin(), s->blocks.begin() + long(n));
  for (int32_t b : pages) blocks_->retain(b);
  KvLeaseInfo info;
  info.block_ids = pages;
  info.request_id = leases_->grant(std::move(pages),
                                   transfer_chain(s->prompt, block_size_, mm_page_salts(s->mm, P, block_size_)),
                                   std::chrono::steady_clock::now());
  out.kv_lease = std::move(info);
}

KvPageCodec& Engine::codec() {
  if (!codec_) {
    std::string extra = std::string("kv ") + kv_dtype_name(kv_dtype_) + " ik " + kv_dtype_name(ik_dtype_) +
                        " block " + std::to_string(block_size_);
    if (spec_) extra += spec_->layout_extra();
    codec_ = std::make_unique<KvPageCodec>(*kv_, spec_ ? spec_->kv() : nullptr, model_layout_id(model_.config().dir, extra));
  }
  return *codec_;
}

void Engine::wire_loader() {
  std::vector<KvTier*> tiers;
  if (tier_) tiers.push_back(tier_.get());
  if (shared_) tiers.push_back(shared_.get());
  loader_ = std::make_unique<TierLoader>(tiers, codec(), stats_);
  sched_->set_prefix_loader(loader_.get());
}

void Engine::set_shared_tier(std::unique_ptr<KvTier> tier, bool save_decode) {
  if (!cfg_.enable_prefix_caching)
    throw Error("a shared KV tier needs prefix caching (pages are found by their prefix hash)");
  shared_ = std::move(tier);
  save_decode_ = save_decode;
  wire_loader();
  install_on_computed();
}

void Engine::install_on_computed() {
  const bool eager_local = tier_ && !cfg_.kv_offloading_lazy;
  if (!shared_ && !eager_local) return;
  sched_->set_on_computed([this, eager_local](int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens,
                                              bool from_decode) {
    // Shared tier: written as soon as a page is computed, so that other engines find it (generated
    // pages too when save_decode is set).
    if (shared_ && (!from_decode || save_decode_)) {
      codec_->export_page(page, hash, parent, tokens, shared_blob_);
      shared_->put(hash, std::move(shared_blob_));
    }
    if (eager_local && !tier_->holds(hash)) {
      codec_->export_page(page, hash, parent, tokens, blob_);
      tier_->put(hash, std::move(blob_));
      ++stats_.tier_offloaded_pages;
    }
  });
}

void Engine::setup_tiers() {
  if (cfg_.kv_offloading_gib < 0) throw Error("--kv-offloading-size must be >= 0");
  if (cfg_.kv_offloading_gib == 0) {
    if (!cfg_.kv_offloading_dir.empty()) throw Error("--kv-offloading-dir needs --kv-offloading-size GiB");
    return;
  }
  if (!cfg_.enable_prefix_caching)
    throw Error("--kv-offloading-size needs prefix caching (pages are found again by their prefix hash)");
  // A tier in host memory fills as pages are evicted: one the machine cannot hold would end in the
  // out-of-memory killer hours later, so it is refused now (a tier in files is bounded by its disk).
  if (const uint64_t avail = available_memory_bytes();
      cfg_.kv_offloading_dir.empty() && avail > 0 && cfg_.kv_offloading_gib * double(1ull << 30) > double(avail))
    throw Error("--kv-offloading-size " + std::to_string(cfg_.kv_offloading_gib) + " GiB is more than the " +
                std::to_string(avail >> 20) + " MiB of memory available; choose a smaller size or keep the tier in "
                "files (--kv-offloading-dir)");
  tier_ = std::make_unique<LocalKvTier>(int64_t(cfg_.kv_offloading_gib * double(1ull << 30)), cfg_.kv_offloading_dir,
                                        codec().layout_id(), codec().blob_bytes());
  wire_loader();
  install_on_computed();
  // Lazy offload: a page is written to the tier when the pool evicts it for reuse (with eager offload
  // it is there already, unless the tier dropped it since).
  blocks_->set_on_evict([this](int32_t page, uint64_t hash, uint64_t parent, const int32_t* tokens) {
    if (!cfg_.kv_offloading_lazy && tier_->holds(hash)) return;
    codec_->export_page(page, hash, parent, tokens, blob_);
    tier_->put(hash, std::move(blob_));
    ++stats_.tier_offloaded_pages;
  });
}

Engine::~Engine() = default;

std::string Engine::describe() const {
  std::ostringstream o;
  size_t page = KVPool::page_bytes(model_.config(), block_size_, kv_dtype_, ik_dtype_);
  if (spec_) page += spec_->page_bytes(block_size_);
  o << "KV cache: " << pool_pages_ << " pages x " << block_size_ << " tokens = " << capacity_tokens() << " tokens ("
    << double(page) * double(pool_pages_) / double(1ull << 30) << " GiB; kv " << kv_dtype_name(kv_dtype_)
    << ", index-K " << kv_dtype_name(ik_dtype_) << "), prefix caching " << (cfg_.enable_prefix_caching ? "on" : "off")
    << ", max-num-seqs " << cfg_.max_num_seqs << ", max-num-batched-tokens " << cfg_.max_num_batched_tokens
    << ", max-model-len " << max_model_len_;
  if (max_model_len_from_pool_)
    o << " (the most the KV cache holds; the model's max_position_embeddings is "
      << model_.config().max_position_embeddings << ": raise --kv-cache-memory for more)";
  if (tier_)
    o << "; KV tier " << tier_->name() << " " << cfg_.kv_offloading_gib << " GiB ("
      << int64_t(cfg_.kv_offloading_gib * double(1ull << 30)) / int64_t(codec_->blob_bytes()) << " pages"
      << (cfg_.kv_offloading_dir.empty() ? "" : ", in " + static_cast<LocalKvTier*>(tier_.get())->folder())
      << (cfg_.kv_offloading_lazy ? ", offloaded when evicted" : ", offloaded as computed") << ")";
  if (spec_) o << "; " << spec_->describe();
  return o.str();
}

void Engine::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params,
                         const TextOptions& text, std::vector<MultimodalSpan> mm) {
  add_request(id, std::move(prompt), params, text, RequestKv{}, std::move(mm));
}

void Engine::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params,
                         const TextOptions& text, const RequestKv& kv, std::vector<MultimodalSpan> mm) {
  params.validate();
  {
    const int64_t H = model_.config().hidden;
    int64_t end = 0;
    for (const auto& m : mm) {
      if (m.count <= 0 || m.offset < end || m.offset + m.count > int64_t(prompt.size()))
        throw Error("multimodal span at token " + std::to_string(m.offset) + " of " + std::to_string(m.count) +
                    " tokens: expected spans in order, disjoint, inside the " + std::to_string(prompt.size()) +
                    "-token prompt");
      if (!m.embeds || int64_t(m.embeds->size()) != m.count * H)
        throw Error("multimodal span at token " + std::to_string(m.offset) + ": " +
                    std::to_string(m.embeds ? m.embeds->size() : 0) + " values, expected " + std::to_string(m.count) +
                    " x hidden " + std::to_string(H));
      end = m.offset + m.count;
    }
  }
  if (seqs_.count(id)) throw Error("request id \"" + id + "\" is already in use");
  if (prompt.empty()) throw Error("the prompt is empty (at least one token is needed)");
  const int64_t V = model_.config().vocab;
  for (int32_t t : prompt)
    if (t < 0 || t >= V)
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  // Every admitted request fits the pool alone (max-model-len <= the pool, checked at start), so the
  // scheduler can always run it to completion: what cannot fit is refused here, never ended empty.
  const std::string limit = "--max-model-len is " + std::to_string(max_model_len_) +
                            (max_model_len_from_pool_ ? " (the most the KV cache holds: raise --kv-cache-memory)" : "");
  const int64_t plen = int64_t(prompt.size());
  if (plen >= max_model_len_)
    throw Error("the prompt has " + std::to_string(plen) + " tokens, but " + limit +
                " (prompt plus at least one generated token must fit)");
  if (int64_t(params.max_tokens) > max_model_len_ - plen)
    throw Error("the prompt has " + std::to_string(plen) + " tokens and max_tokens is " +
                std::to_string(params.max_tokens) + ": " + std::to_string(plen + params.max_tokens) +
                " tokens, but " + limit + "; ask for at most " + std::to_string(max_model_len_ - plen) +
                " tokens");
  if (kv.hold_for_remote && !leases_)
    throw Error("kv_transfer_params do_remote_decode: this engine holds no KV for other engines (start it with "
                "--kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_producer\"}')");
  if (kv.remote) {
    const size_t pages = size_t((plen + block_size_ - 1) / block_size_);
    if (kv.remote->pages() != pages)
      throw Error("kv_transfer_params: " + std::to_string(kv.remote->pages()) + " KV pages were pulled, but the " +
                  "prompt of " + std::to_string(plen) + " tokens fills " + std::to_string(pages) + " pages of " +
                  std::to_string(block_size_) + " tokens");
    enable_remote_prefill();
  }
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->kv_hold = kv.hold_for_remote;
  if (kv.remote) {
    s->remote = kv.remote;
    s->fetch_started = true;  // its prefix comes from the pulled pages, not a tier
    ++stats_.remote_prefills;
  }
  s->request_id = id;
  s->added_at = std::chrono::steady_clock::now();
  s->prompt = std::move(prompt);
  s->mm = std::move(mm);
  s->params = params;
  if (!s->params.has_seed)
    s->params.seed = cfg_.seed ? seed_rng_() : std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  s->sampler = Sampler(s->params);
  if (s->params.constraint) {  // structured output: a matcher of its own (the spec is shared)
    if (s->params.constraint->vocab->size() != V) throw Error("structured output: the constraint was built for another vocabulary size");
    s->constraint = std::make_unique<structured::Matcher>(s->params.constraint);
  }
  if (tok_) {
    OutputOptions oo;
    static_cast<TextOptions&>(oo) = text;
    oo.stop = s->params.stop;
    s->text = std::make_unique<OutputProcessor>(tok_, std::move(oo));
  }
  sched_->add(s.get());
  seqs_.emplace(id, std::move(s));
}

void Engine::set_kv_event_sink(KvEventSink* sink) {
  kv_sink_ = sink;
  kv_events_.clear();
  blocks_->set_event_log(sink ? &kv_events_ : nullptr);
}

void Engine::flush_kv_events() {
  if (!kv_sink_ || kv_events_.empty()) return;
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  kv_sink_->publish(ts, block_size_, std::move(kv_events_));
  kv_events_.clear();
}

bool Engine::reset_prefix_cache() {
  if (!cfg_.enable_prefix_caching) return false;
  blocks_->clear_cache();
  flush_kv_events();
  return true;
}

bool Engine::abort(const std::string& id, RequestOutput* out) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  if (out) {
    // Only the text: an abort carries no tokens, and the counts the client has seen stay as they were.
    *out = RequestOutput{};
    out->request_id = id;
    finish_text(it->second.get(), *out);
    out->finished = true;
    out->finish_reason = FinishReason::Abort;
  }
  sched_->remove(it->second.get());
  seqs_.erase(it);
  return true;
}

void Engine::finish_text(Sequence* s, RequestOutput& out) {
  if (!s->text) return;
  out.new_text += s->text->finish();
  // Also a stop string matched only in the detokenizer's last bytes: the text is cut there, though
  // the limit that ended the request stays its finish reason.
  if (const std::string* st = s->text->stop_string()) out.stop_string = *st;
}

void Engine::finish(Sequence* s, FinishReason r, RequestOutput& out) {
  s->finish = r;
  finish_text(s, out);
  if (s->kv_hold && leases_ && (r == FinishReason::Stop || r == FinishReason::Length)) lease_pages(s, out);
  sched_->finish(s);
  out.finished = true;
  out.finish_reason = r;
  if (s->admitted_once) out.queue_seconds = std::chrono::duration<double>(s->scheduled_at - s->added_at).count();
}

// Appends the newest token's text and applies the stop rules; true when the sequence finished.
bool Engine::check_stop(Sequence* s, RequestOutput& out) {
  const int32_t t = s->output.back();
  const SamplingParams& p = s->params;
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end();
  const bool stop_token = (t == eos_ && !p.ignore_eos) || stop_id;
  // An ending token whose text is left out cannot complete a stop string either.
  if (s->text && !(stop_token && !s->text->options().stop_token_text)) {
    out.new_text += s->text->push_token(t);
    if (s->text->stopped()) {
      finish(s, FinishReason::Stop, out);
      return true;
    }
  }
  if (stop_token) {
    if (stop_id) out.stop_token = t;
    finish(s, FinishReason::Stop, out);
    return true;
  }
  if (int64_t(s->output.size()) >= p.max_tokens || s->num_tokens() >= max_model_len_) {
    finish(s, FinishReason::Length, out);
    return true;
  }
  return false;
}

// The token of every chunk that samples without speculation, into sampled_[chunk], the requests over
// the worker pool (speed: a sampled token sorts and exponentiates the whole vocabulary, about 0.35 ms at
// 32K words and 1.6 ms at 200K with top-p; one thread sampling for 32 requests left the other cores
// idle for about a tenth of the step). Each request's sampler, with its own random stream and
// buffers, is used by one thread, so the tokens are those the requests would draw one after another.
// Constraint masks are built first, on this thread (a matcher is not shared between threads).
void Engine::sample_plain_rows(const std::vector<ScheduledChunk>& plan) {
  const int64_t V = model_.config().vocab;
  sampled_.assign(plan.size(), -1);
  sample_jobs_.clear();
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    if (c.sample && !c.spec) sample_jobs_.push_back({i, c.seq->constraint ? c.seq->constraint->mask() : nullptr});
  }
  WorkerPool::parallel_for(int64_t(sample_jobs_.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const SampleJob& j = sample_jobs_[size_t(k)];
      Sequence* s = plan[j.chunk].seq;
      sampled_[j.chunk] = s->sampler.sample(chunk_logits_[j.chunk], V, s->prompt, s->output, nullptr, j.allowed);
    }
  });
}

bool Engine::emit(Sequence* s, int32_t t, const float* logits, RequestOutput& out) {
  std::string over;  // the constraint's per-request state bound, checked once the token is taken
  if (s->constraint) {
    s->constraint->advance(t);
    over = s->constraint->check_limits();
  }
  s->output.push_back(t);
  ++stats_.generated_tokens;
  out.new_tokens.push_back(t);
  if (s->params.logprobs >= 0) {
    TokenLogprob lp;
    s->sampler.fill_logprob(logits, model_.config().vocab, t, &lp);
    s->logprobs.push_back(lp);
    out.new_logprobs.push_back(lp);
  }
  if (!over.empty()) {
    if (s->text) out.new_text += s->text->push_token(t);
    out.error = over;
    finish(s, FinishReason::Error, out);
    return true;
  }
  return check_stop(s, out);
}

std::vector<RequestOutput> Engine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RequestOutput> outs;
  housekeeping();
  std::vector<ScheduledChunk> plan = sched_->schedule();
  // Requests whose prefix failed to load under kv_load_failure_policy "fail" end here, with the reason.
  for (auto& [s, why] : sched_->take_load_failures()) {
    RequestOutput out;
    out.request_id = s->request_id;
    out.num_prompt_tokens = int64_t(s->prompt.size());
    out.error = why + " (kv_load_failure_policy \"fail\")";
    finish(s, FinishReason::Error, out);
    outs.push_back(std::move(out));
    const std::string id = s->request_id;  // not a reference into the map entry being erased
    seqs_.erase(id);
  }
  if (plan.empty()) {
    if (!outs.empty()) {
      flush_kv_events();
      return outs;
    }
    // Only requests waiting for tier pages: wait a little for a fetch to end instead of spinning.
    if (sched_->num_running() == 0 && sched_->num_waiting() == sched_->num_fetching() &&
        sched_->num_fetching() > 0) {
      loader_->wait_fetch(std::chrono::milliseconds(5));
      flush_kv_events();
      return outs;
    }
    // Otherwise the scheduler always runs something while there is work (the head of the queue fits
    // the pool alone); an empty plan would be a bug, and ending a request for it would lose it silently.
    if (sched_->has_work())
      throw std::logic_error("scheduler made no progress with " + std::to_string(sched_->num_running()) +
                             " running and " + std::to_string(sched_->num_waiting()) + " waiting requests");
    flush_kv_events();
    return outs;
  }
  const int64_t V = model_.config().vocab;
  double draft_ms = 0;
  if (spec_) {
    spec_->choose(plan, cost_model());
    int drafting = 0;
    int64_t slots = 0;
    for (const ScheduledChunk& c : plan) drafting += c.spec > 0, slots += c.spec;
    const auto d0 = std::chrono::steady_clock::now();
    spec_->propose(plan);
    draft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
    spec_->observe_draft(draft_ms, drafting, slots);
    spec_->cut_by_confidence(plan);  // enable_adaptive_verification: fewer drafts where the head says so
  }
  items_.resize(plan.size());
  views_.resize(plan.size());
  if (step_tokens_.size() < plan.size()) step_tokens_.resize(plan.size());
  if (step_embeds_.size() < plan.size()) step_embeds_.resize(plan.size());
  auto& toks = step_tokens_;
  int64_t nlogits = 0, nrows = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    toks[i].resize(size_t(c.n + c.spec));
    for (int64_t j = 0; j < c.n; ++j) toks[i][size_t(j)] = c.seq->token(c.start + j);
    for (int64_t j = 0; j < c.spec; ++j) toks[i][size_t(c.n + j)] = spec_->drafts(i)[size_t(j)];
    views_[i] = std::make_unique<PagedKV>(*kv_, c.seq->blocks, c.start + c.n + c.spec);
    items_[i].kv = views_[i].get();
    items_[i].tokens = toks[i].data();
    items_[i].n = c.n + c.spec;
    items_[i].start = c.start;
    // A speculative chunk needs the target's distribution at every position (anchor + drafts).
    items_[i].logits_from = c.spec ? 0 : c.sample ? c.n - 1 : c.n;
    items_[i].embeds = nullptr;
    if (!c.seq->mm.empty() && c.seq->mm_salt(c.start, c.n)) {
      // This chunk holds image tokens (chunked prefill may split an image across steps).
      auto& e = step_embeds_[i];
      e.assign(size_t(c.n + c.spec), nullptr);
      for (int64_t j = 0; j < c.n; ++j) e[size_t(j)] = c.seq->mm_embed(c.start + j, model_.config().hidden);
      items_[i].embeds = e.data();
    }
    nlogits += items_[i].n - items_[i].logits_from;
    nrows += items_[i].n;
    if (c.start < int64_t(c.seq->prompt.size())) stats_.prompt_tokens_computed += std::min<int64_t>(c.n, int64_t(c.seq->prompt.size()) - c.start);
  }
  if (logits_.size() < size_t(nlogits * V)) logits_.resize(size_t(nlogits * V));
  model_.forward_batch(items_.data(), int(items_.size()), logits_.data(), AttentionPath::Sparse,
                       spec_ ? spec_->taps(nrows) : nullptr);
  ++stats_.steps;
  // Each chunk's first logits row (verification, sampling and emit read them).
  chunk_logits_.resize(plan.size());
  int64_t lrow = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    chunk_logits_[i] = logits_.data() + lrow * V;
    lrow += items_[i].n - items_[i].logits_from;
  }

  if (spec_) {
    // How many of each speculative chunk's tokens are kept (anchor + accepted drafts); the draft
    // learns the context of exactly those.
    spec_->verify_all(plan, chunk_logits_.data());
    spec_->keep_accepted(plan);
  }
  // The anchor is committed now; accepted drafts once they are in the sequence (below). Rejected
  // drafts' K/V (and index keys) stay beyond num_computed and are overwritten later.
  sched_->commit(plan);

  sample_plain_rows(plan);
  std::vector<std::string> done;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    const float* rows = chunk_logits_[i];
    if (!c.sample) continue;
    Sequence* s = c.seq;
    RequestOutput out;
    out.request_id = s->request_id;
    out.num_prompt_tokens = int64_t(s->prompt.size());
    out.num_cached_tokens = s->num_cached_tokens;
    bool finished = false;
    if (c.spec) {
      const VerifyOutcome& v = spec_->outcome(i);
      spec_->count(c, v);
      for (int j = 0; j < v.accepted && !finished; ++j) finished = emit(s, spec_->drafts(i)[size_t(j)], rows + int64_t(j) * V, out);
      if (!finished) finished = emit(s, v.next, rows + int64_t(v.accepted) * V, out);
    } else {
      finished = emit(s, sampled_[i], rows, out);
    }
    if (finished) {
      done.push_back(s->request_id);
    } else if (c.spec && spec_->outcome(i).accepted > 0) {
      accepted_chunks_.clear();
      accepted_chunks_.push_back({s, c.start + 1, spec_->outcome(i).accepted, false, 0});
      sched_->commit(accepted_chunks_);
    }
    outs.push_back(std::move(out));
  }
  for (const auto& id : done) seqs_.erase(id);
  // The step's measured cost (scheduling, forward, verification, sampling; the draft pass and the
  // draft context are measured on their own) feeds the latency budget of the next steps and adaptive
  // speculation. A chunk of one token that ends a sequence's tokens is a decode row, each draft
  // verified one more.
  int64_t prefill_tokens = 0, decode_rows = 0;
  for (const ScheduledChunk& c : plan) (c.n == 1 && c.sample ? decode_rows : prefill_tokens) += c.n + c.spec;
  step_cost_.observe(prefill_tokens, decode_rows,
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() -
                         draft_ms - (spec_ ? spec_->last_ctx_ms() : 0.0));
  flush_kv_events();
  return outs;
}

void Engine::set_step_cost_model(const StepCostModel* m) {
  cost_override_ = m;
  sched_->set_cost_model(&cost_model());
}

std::string Engine::spec_summary() const {
  // With the measured costs the decisions were made from (the step's fit, the draft pass, the context).
  std::string out = m3::spec_summary(stats());
  if (spec_) out += "; costs: steps " + step_cost_.describe() + ", " + spec_->costs_describe();
  return out;
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  if (spec_) spec_->fill_stats(s);
  s.prefix_queries = sched_->stats().prefix_queries;
  s.prefix_hits = sched_->stats().prefix_hits;
  s.preemptions = sched_->stats().preemptions;
  s.tail_steps = sched_->stats().tail_steps;
  s.tail_held = sched_->stats().tail_held;
  s.running = sched_->num_running();
  s.waiting = sched_->num_waiting();
  s.free_pages = blocks_->num_free();
  s.total_pages = blocks_->num_blocks();
  if (tier_) {
    s.has_tier = true;
    s.tier = tier_->stats();
  }
  if (shared_) {
    s.has_shared_tier = true;
    s.shared_tier = shared_->stats();
  }
  if (leases_) {
    s.has_leases = true;
    s.leases = leases_->stats();
  }
  return s;
}

}  // namespace m3
