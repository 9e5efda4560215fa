// The engine step: schedule -> one batched forward over paged KV -> sample -> stop rules (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "formats/error.h"

namespace m3 {

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

Engine::Engine(Model& model, const Tokenizer* tok, const EngineConfig& cfg) : model_(model), tok_(tok), cfg_(cfg) {
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
  const size_t page = KVPool::page_bytes(mc, block_size_, kv_dtype_, ik_dtype_);
  if (cfg.num_pages > 0) {
    pool_pages_ = cfg.num_pages;
  } else {
    double bytes = cfg.kv_cache_memory_gib > 0 ? cfg.kv_cache_memory_gib * double(1ull << 30)
                                               : 0.25 * double(available_memory_bytes());
    pool_pages_ = int64_t(bytes / double(page));
    if (pool_pages_ < 1)
      throw Error("--kv-cache-memory " + std::to_string(bytes / double(1ull << 30)) +
                  " GiB holds no KV page (one page of " + std::to_string(block_size_) + " tokens needs " +
                  std::to_string(page) + " bytes)");
  }
  if (cfg.max_num_seqs < 1) throw Error("--max-num-seqs must be at least 1");
  if (cfg.max_num_batched_tokens < 1) throw Error("--max-num-batched-tokens must be at least 1");
  if (cfg.long_prefill_token_threshold < 0) throw Error("--long-prefill-token-threshold must be >= 0");
  if (!(cfg.watermark >= 0 && cfg.watermark < 1)) throw Error("--watermark must be in [0, 1)");
  max_model_len_ = cfg.max_model_len > 0 ? cfg.max_model_len : mc.max_position_embeddings;
  if (max_model_len_ > mc.max_position_embeddings)
    throw Error("--max-model-len " + std::to_string(max_model_len_) + " exceeds the model's max_position_embeddings " +
                std::to_string(mc.max_position_embeddings));
  eos_ = mc.eos_id >= 0 ? mc.eos_id : (tok ? tok->eos_id() : -1);
  kv_ = std::make_unique<KVPool>(mc, block_size_, kv_dtype_, ik_dtype_, pool_pages_);
  blocks_ = std::make_unique<BlockPool>(pool_pages_, block_size_, cfg.enable_prefix_caching);
  SchedulerConfig sc;
  sc.block_size = block_size_;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.long_prefill_token_threshold = cfg.long_prefill_token_threshold;
  sc.watermark = cfg.watermark;
  sched_ = std::make_unique<Scheduler>(sc, *blocks_);
}

Engine::~Engine() = default;

std::string Engine::describe() const {
  std::ostringstream o;
  const size_t page = KVPool::page_bytes(model_.config(), block_size_, kv_dtype_, ik_dtype_);
  o << "KV cache: " << pool_pages_ << " pages x " << block_size_ << " tokens = " << capacity_tokens() << " tokens ("
    << double(page) * double(pool_pages_) / double(1ull << 30) << " GiB; kv " << kv_dtype_name(kv_dtype_)
    << ", index-K " << kv_dtype_name(ik_dtype_) << "), prefix caching " << (cfg_.enable_prefix_caching ? "on" : "off")
    << ", max-num-seqs " << cfg_.max_num_seqs << ", max-num-batched-tokens " << cfg_.max_num_batched_tokens
    << ", max-model-len " << max_model_len_;
  return o.str();
}

void Engine::add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params) {
  params.validate();
  if (seqs_.count(id)) throw Error("request id \"" + id + "\" is already in use");
  if (prompt.empty()) throw Error("the prompt is empty (at least one token is needed)");
  const int64_t V = model_.config().vocab;
  for (int32_t t : prompt)
    if (t < 0 || t >= V)
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (int64_t(prompt.size()) >= max_model_len_)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, but --max-model-len is " +
                std::to_string(max_model_len_) + " (prompt plus at least one generated token must fit)");
  const int64_t pages = (int64_t(prompt.size()) + 1 + block_size_ - 1) / block_size_;
  if (pages > pool_pages_)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the KV cache holds (" +
                std::to_string(capacity_tokens()) + " tokens); raise --kv-cache-memory");
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->request_id = id;
  s->prompt = std::move(prompt);
  s->params = params;
  if (!s->params.has_seed) s->params.seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  s->sampler = Sampler(s->params);
  if (tok_) s->detok = std::make_unique<IncrementalDetokenizer>(*tok_, true);
  sched_->add(s.get());
  seqs_.emplace(id, std::move(s));
}

bool Engine::abort(const std::string& id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  sched_->remove(it->second.get());
  seqs_.erase(it);
  return true;
}

void Engine::finish(Sequence* s, FinishReason r, RequestOutput& out) {
  s->finish = r;
  if (s->detok && r != FinishReason::Stop) {
    const std::string rest = s->detok->flush();
    s->text += rest;
    out.new_text += rest;
  }
  sched_->finish(s);
  out.finished = true;
  out.finish_reason = r;
}

// Appends the newest token's text and applies the stop rules; true when the sequence finished.
bool Engine::check_stop(Sequence* s, RequestOutput& out) {
  const int32_t t = s->output.back();
  const SamplingParams& p = s->params;
  if (s->detok) {
    const size_t old = s->text.size();
    std::string piece = s->detok->push(t);
    std::string combined = s->text + piece;
    size_t best = std::string::npos;
    for (const auto& st : p.stop) {
      const size_t from = old >= st.size() ? old - st.size() + 1 : 0;
      const size_t at = combined.find(st, from);
      if (at != std::string::npos) best = std::min(best, at);
    }
    if (best != std::string::npos) {
      if (best > old) out.new_text += combined.substr(old, best - old);
      s->text = combined.substr(0, best);
      finish(s, FinishReason::Stop, out);
      return true;
    }
    s->text = std::move(combined);
    out.new_text += piece;
  }
  if ((t == eos_ && !p.ignore_eos) ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end()) {
    finish(s, FinishReason::Stop, out);
    return true;
  }
  if (int64_t(s->output.size()) >= p.max_tokens || s->num_tokens() >= max_model_len_) {
    finish(s, FinishReason::Length, out);
    return true;
  }
  return false;
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> outs;
  std::vector<ScheduledChunk> plan = sched_->schedule();
  if (plan.empty()) {
    // Nothing could run: the first waiting request cannot fit even into an empty pool (it grew past
    // the pool while running). End it rather than spin.
    if (sched_->num_running() == 0 && sched_->num_waiting() > 0) {
      for (auto& [id, s] : seqs_) {
        if (s->status == Sequence::Status::Waiting) {
          RequestOutput out;
          out.request_id = id;
          out.num_prompt_tokens = int64_t(s->prompt.size());
          finish(s.get(), FinishReason::Length, out);
          outs.push_back(std::move(out));
          seqs_.erase(id);
          break;
        }
      }
    }
    return outs;
  }
  const int64_t V = model_.config().vocab;
  items_.resize(plan.size());
  views_.resize(plan.size());
  if (step_tokens_.size() < plan.size()) step_tokens_.resize(plan.size());
  auto& toks = step_tokens_;
  int64_t nsample = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    toks[i].resize(size_t(c.n));
    for (int64_t j = 0; j < c.n; ++j) toks[i][size_t(j)] = c.seq->token(c.start + j);
    views_[i] = std::make_unique<PagedKV>(*kv_, c.seq->blocks, c.start + c.n);
    items_[i].kv = views_[i].get();
    items_[i].tokens = toks[i].data();
    items_[i].n = c.n;
    items_[i].start = c.start;
    items_[i].logits_from = c.sample ? c.n - 1 : c.n;
    nsample += c.sample;
    if (c.start < int64_t(c.seq->prompt.size())) stats_.prompt_tokens_computed += std::min<int64_t>(c.n, int64_t(c.seq->prompt.size()) - c.start);
  }
  if (logits_.size() < size_t(nsample * V)) logits_.resize(size_t(nsample * V));
  model_.forward_batch(items_.data(), int(items_.size()), logits_.data());
  sched_->commit(plan);
  ++stats_.steps;
  int64_t row = 0;
  std::vector<std::string> done;
  for (const ScheduledChunk& c : plan) {
    if (!c.sample) continue;
    Sequence* s = c.seq;
    RequestOutput out;
    out.request_id = s->request_id;
    out.num_prompt_tokens = int64_t(s->prompt.size());
    out.num_cached_tokens = s->num_cached_tokens;
    TokenLogprob lp;
    const int32_t t = s->sampler.sample(logits_.data() + row * V, V, s->prompt, s->output,
                                        s->params.logprobs >= 0 ? &lp : nullptr);
    ++row;
    s->output.push_back(t);
    ++stats_.generated_tokens;
    out.new_tokens.push_back(t);
    if (s->params.logprobs >= 0) {
      s->logprobs.push_back(lp);
      out.new_logprobs.push_back(lp);
    }
    if (check_stop(s, out)) done.push_back(s->request_id);
    outs.push_back(std::move(out));
  }
  for (const auto& id : done) seqs_.erase(id);
  return outs;
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.prefix_queries = sched_->stats().prefix_queries;
  s.prefix_hits = sched_->stats().prefix_hits;
  s.preemptions = sched_->stats().preemptions;
  s.running = sched_->num_running();
  s.waiting = sched_->num_waiting();
  s.free_pages = blocks_->num_free();
  s.total_pages = blocks_->num_blocks();
  return s;
}

}  // namespace m3
