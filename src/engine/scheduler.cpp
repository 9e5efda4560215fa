// Continuous-batching scheduler (see scheduler.h).
#include "engine/scheduler.h"
#include "engine/hash64.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace m3 {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockPool& pool) : cfg_(cfg), pool_(pool) {}

void Scheduler::add(Sequence* s) {
  s->status = Sequence::Status::Waiting;
  waiting_.push_back(s);
}

void Scheduler::release_pages(Sequence* s) {
  // Last page first: the prefix pages are freed last, so LRU eviction takes the tails first.
  for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) pool_.release(*it);
  s->blocks.clear();
  s->block_hashes.clear();
  s->num_computed = 0;
}

void Scheduler::remove(Sequence* s) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), s); it != waiting_.end()) waiting_.erase(it);
  if (auto it = std::find(fetching_.begin(), fetching_.end(), s); it != fetching_.end()) fetching_.erase(it);
  if (auto it = std::find(running_.begin(), running_.end(), s); it != running_.end()) running_.erase(it);
  release_pages(s);
}

void Scheduler::finish(Sequence* s) {
  remove(s);
  s->status = Sequence::Status::Finished;
}

bool Scheduler::ensure_pages(Sequence* s, int64_t upto) {
  const int64_t need = (upto + cfg_.block_size - 1) / cfg_.block_size;
  while (int64_t(s->blocks.size()) < need) {
    const int32_t b = pool_.allocate();
    if (b < 0) return false;
    s->blocks.push_back(b);
  }
  return true;
}

void Scheduler::preempt(Sequence* s) {
  running_.erase(std::find(running_.begin(), running_.end(), s));
  release_pages(s);
  s->status = Sequence::Status::Waiting;
  ++s->num_preemptions;
  ++stats_.preemptions;
  waiting_.push_front(s);
}

uint64_t Scheduler::page_hash(const Sequence& s, uint64_t parent, const int32_t* tokens, int64_t i) const {
  const int B = cfg_.block_size;
  const uint64_t h = hash_block(parent, tokens, B);
  const uint64_t salt = s.mm.empty() ? 0 : s.mm_salt(i * B, B);
  return salt ? mix64(h ^ salt) : h;
}

int64_t Scheduler::prefix_hit(Sequence* s) {
  if (!pool_.caching()) return 0;
  const int B = cfg_.block_size;
  // At least one token is always computed, so the step yields logits.
  const int64_t max_blocks = (s->num_tokens() - 1) / B;
  if (max_blocks <= 0) return 0;
  const std::vector<int32_t> toks = s->all_tokens();
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t* bt = &toks[size_t(i * B)];
    const uint64_t h = page_hash(*s, parent, bt, i);
    int32_t b = pool_.acquire_cached(h, parent, bt);
    if (b < 0 && loader_) {
      // Not in the pool: a tier may hold it. The loaded page joins the prefix cache like a computed one.
      b = pool_.allocate();
      if (b >= 0) {
        const TierRead r = loader_->load(h, parent, bt, b);
        if (r != TierRead::Hit) {
          pool_.release(b);
          b = -1;
        }
        if (r == TierRead::Failed && cfg_.fail_on_load_error) {
          release_pages(s);
          load_failures_.emplace_back(s, loader_->failure());
          return -1;
        }
      }
      if (b >= 0) pool_.publish(b, h, parent, bt);
    }
    if (b < 0) break;
    s->blocks.push_back(b);
    s->block_hashes.push_back(h);
    parent = h;
  }
  s->num_computed = int64_t(s->blocks.size()) * B;
  return s->num_computed;
}

int64_t Scheduler::remote_hit(Sequence* s) {
  const int B = cfg_.block_size;
  const int64_t P = int64_t(s->prompt.size());
  const std::vector<TransferPage> chain = transfer_chain(s->prompt, B, mm_page_salts(s->mm, int64_t(s->prompt.size()), B));
  // The last prompt token is computed here again (its logits give the first token, as in vLLM), so the
  // page it lands in is not published before that step: pages entirely before it are.
  const size_t publish = size_t((P - 1) / B);
  size_t i = 0;
  std::string why;
  for (; i < chain.size(); ++i) {
    const int32_t b = pool_.allocate();
    if (b < 0) break;  // the pool is full now: what is missing is computed (admission decides when)
    why = importer_->import(s->remote->blob(i), chain[i], b, i < s->remote->checksummed);
    if (!why.empty()) {
      pool_.release(b);
      why = "KV page " + std::to_string(i) + " pulled from " + s->remote->source + " does not fit this prompt: " + why;
      break;
    }
    s->blocks.push_back(b);
    if (i < publish) {
      pool_.publish(b, chain[i].hash, chain[i].parent, chain[i].tokens.data());
      s->block_hashes.push_back(chain[i].hash);
    }
  }
  if (i == chain.size()) {
    s->num_computed = P - 1;
    return s->num_computed;
  }
  if (!why.empty() && cfg_.fail_on_load_error) {
    release_pages(s);
    load_failures_.emplace_back(s, why);
    return -1;
  }
  // Recompute from the last page that both arrived and may be published.
  const size_t good = std::min(i, publish);
  while (s->blocks.size() > good) {
    pool_.release(s->blocks.back());
    s->blocks.pop_back();
  }
  s->block_hashes.resize(good);
  s->num_computed = int64_t(good) * B;
  return s->num_computed;
}

bool Scheduler::start_fetch(Sequence* s) {
  s->fetch_started = true;
  const int B = cfg_.block_size;
  const int64_t max_blocks = (s->num_tokens() - 1) / B;
  if (max_blocks <= 0) return false;
  const std::vector<int32_t> toks = s->all_tokens();
  std::vector<uint64_t> missing;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const uint64_t h = page_hash(*s, parent, &toks[size_t(i * B)], i);
    if (!pool_.contains(h, parent, &toks[size_t(i * B)])) missing.push_back(h);
    parent = h;
  }
  return !missing.empty() && loader_->prefetch(s->id, missing);
}

int64_t Scheduler::prefill_allowance(bool with_factor) const {
  constexpr int64_t unbounded = std::numeric_limits<int64_t>::max();
  const double factor = with_factor ? cfg_.step_latency_factor : 0;
  if (!cost_ || (factor <= 0 && cfg_.max_step_latency_ms <= 0)) return unbounded;
  // The rows this step's decoding requests will bring: their token, and the drafts they may verify;
  // and the running requests whose prompts are still being read.
  int64_t rows = 0, reading = 0;
  for (const Sequence* s : running_) {
    const int64_t need = s->num_tokens() - s->num_computed;
    reading += need > 1;
    if (need != 1) continue;
    int64_t spec = 0;
    if (cfg_.num_speculative_tokens > 0 && !s->constraint && !s->spec_acc.off)
      spec = std::clamp<int64_t>(int64_t(s->params.max_tokens) - int64_t(s->output.size()) - 1, 0,
                                 cfg_.num_speculative_tokens);
    rows += 1 + spec;
  }
  if (rows == 0 || !cost_->prefill_measured()) return unbounded;  // nobody waits, or nothing to size by
  // The reference is the decode-only step of the batch these rows are about to be part of: they, one
  // row for each request whose prompt is being read, and one for each waiting request that
  // --max-num-seqs and the free pages will let in. Why: the median inter-token latency is a step of
  // that batch, not of the rows decoding now. Against the few rows decoding while a burst of prompts
  // was read, the chunks were small, requests finished before the others had been read, the batch
  // never filled, and decode rows ran in small batches that cost more per row (docs/benchmarks.md 3.8).
  int64_t free_pages = pool_.num_free(), admitted = 0;
  for (const Sequence* s : waiting_) {
    if (int64_t(running_.size()) + admitted >= cfg_.max_num_seqs) break;
    const int64_t pages = (s->num_tokens() + cfg_.block_size) / cfg_.block_size;  // the prompt and a token
    if (pages > free_pages) break;
    free_pages -= pages;
    ++admitted;
  }
  const int64_t batch = rows + reading + admitted;
  // The lower of the measured decode-only shapes (interpolated, or extrapolated from the nearest two
  // beyond the largest measured) and the linear fit: each alone can run high (the fit's decode-only
  // step, fitted over mixed steps, 5x the real one at a few rows; a shape's slope extrapolated far), and
  // a reference that runs high lets the tail of the inter-token latency past its factor.
  double base = cost_->predict_ms(0, batch);
  const double shapes = cost_->predict_decode_ms(batch);
  if (shapes >= 0 && (base < 0 || shapes < base)) base = shapes;
  if (base < 0) return unbounded;
  double budget = std::numeric_limits<double>::infinity();
  if (factor > 0) budget = factor * base;
  if (cfg_.max_step_latency_ms > 0) budget = std::min(budget, cfg_.max_step_latency_ms);
  // The largest chunk that fits (the model is non-decreasing in its prefill tokens).
  int64_t lo = 0, hi = cfg_.max_num_batched_tokens;
  if (cost_->predict_ms(hi, rows) <= budget) return unbounded;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (cost_->predict_ms(mid, rows) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return std::max(lo, cfg_.min_prefill_chunk);
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> plan;
  // Requests whose tier pages have arrived go back to the front of the queue, in arrival order.
  for (size_t i = fetching_.size(); i-- > 0;) {
    if (!loader_->fetched(fetching_[i]->id)) continue;
    waiting_.push_front(fetching_[i]);
    fetching_.erase(fetching_.begin() + long(i));
  }
  int64_t budget = cfg_.max_num_batched_tokens;
  auto cap = [&](int64_t need) {
    int64_t n = std::min(need, budget);
    if (cfg_.long_prefill_token_threshold > 0) n = std::min(n, cfg_.long_prefill_token_threshold);
    return n;
  };
  // Prefill tokens the latency budget leaves this step (decode rows are never held back). Past the
  // factor's allowance only while the decoding requests it would hold up stay within the tail share.
  const int64_t factor_allowance = prefill_allowance();
  int64_t prefill_left = factor_allowance;
  int64_t decoding = 0;
  for (const Sequence* s : running_) decoding += s->num_tokens() - s->num_computed == 1;
  if (cfg_.step_latency_tail_share > 0 && decoding > 0 && factor_allowance < cfg_.max_num_batched_tokens &&
      double(tail_held_ + decoding) <=
          cfg_.step_latency_tail_share * double(std::min<int64_t>(tail_decoding_ + decoding, kTailWindowRequests)))
    prefill_left = prefill_allowance(false);
  const int64_t prefill_granted = prefill_left;
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i];
    const int64_t need = s->num_tokens() - s->num_computed;
    if (need <= 0) continue;
    const int64_t n = need > 1 ? std::min(cap(need), prefill_left) : cap(need);
    if (n <= 0) continue;  // an unfinished prefill waits for the next step's allowance
    if (need > 1) prefill_left -= n;
    int64_t spec = 0;
    // Constrained sequences are speculated too: the Speculator masks drafts and targets alike.
    if (cfg_.num_speculative_tokens > 0 && need == 1 && n == 1 && !s->spec_acc.off) {
      // Drafts to verify after the anchor: never more than the request may still emit.
      spec = std::min<int64_t>(cfg_.num_speculative_tokens, budget - 1);
      spec = std::min<int64_t>(spec, int64_t(s->params.max_tokens) - int64_t(s->output.size()) - 1);
      if (cfg_.max_model_len > 0) spec = std::min<int64_t>(spec, cfg_.max_model_len - s->num_tokens() - 1);
      spec = std::max<int64_t>(spec, 0);
    }
    // Drafts only take pages that are free: speculation never preempts anyone. Short of pages,
    // verify as many drafts as the sequence's last page still holds.
    if (spec > 0 && !ensure_pages(s, s->num_computed + n + spec))
      spec = std::max<int64_t>(0, std::min<int64_t>(spec, int64_t(s->blocks.size()) * cfg_.block_size -
                                                              s->num_computed - n));
    bool self_preempted = false;
    while (!ensure_pages(s, s->num_computed + n + spec)) {
      Sequence* victim = running_.back();
      preempt(victim);
      preempted = true;
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    plan.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens(), spec});
    budget -= n + spec;
  }
  // No admissions in a step that had to preempt, unless nothing is left running (every running
  // sequence was preempted): then the head of the queue runs alone, as it always fits the pool alone.
  if (preempted && !plan.empty()) {
    record_tail(decoding, prefill_granted - prefill_left > factor_allowance ? decoding : 0);
    return plan;
  }
  const int64_t watermark_pages = int64_t(std::ceil(cfg_.watermark * double(pool_.num_blocks())));
  while (!waiting_.empty() && budget > 0 && prefill_left > 0 && int64_t(running_.size()) < cfg_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (loader_ && pool_.caching() && !s->admitted_once && !s->fetch_started && start_fetch(s)) {
      // Its prefix pages are on their way from a tier: it waits off the queue, the others go on.
      waiting_.pop_front();
      fetching_.push_back(s);
      continue;
    }
    const int64_t hit = s->remote && importer_ ? remote_hit(s) : prefix_hit(s);
    if (hit < 0) {  // its prefix failed to load and the policy is to fail it: the engine ends it
      waiting_.pop_front();
      continue;
    }
    const int64_t total_pages = (s->num_tokens() + cfg_.block_size - 1) / cfg_.block_size;
    const int64_t more = total_pages - int64_t(s->blocks.size());
    // The watermark keeps room for the running sequences to grow; with none running there is nothing
    // to keep room for, and a prompt that fits the pool alone must run (else it would wait forever).
    const int64_t keep = running_.empty() ? 0 : watermark_pages;
    if (pool_.num_free() - more < keep) {
      release_pages(s);
      break;
    }
    const int64_t need = s->num_tokens() - s->num_computed;
    const int64_t n = need > 1 ? std::min(cap(need), prefill_left) : cap(need);
    if (!ensure_pages(s, s->num_computed + n)) {
      release_pages(s);
      break;
    }
    if (!s->admitted_once) {
      s->admitted_once = true;
      s->scheduled_at = std::chrono::steady_clock::now();
      s->num_cached_tokens = hit;
      // Pages pulled from a prefill engine are not this engine's prefix cache hits (vllm:prefix_cache_*).
      if (!s->remote) {
        stats_.prefix_queries += s->num_tokens();
        stats_.prefix_hits += hit;
      }
      s->remote.reset();  // imported: the pulled bytes are no longer needed (a preemption recomputes)
    }
    waiting_.pop_front();
    s->status = Sequence::Status::Running;
    running_.push_back(s);
    plan.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens()});
    budget -= n;
    if (need > 1) prefill_left -= n;
  }
  // The decoding requests this step holds up: all it carries, when its prefill went past the factor's
  // allowance.
  record_tail(decoding, prefill_granted - prefill_left > factor_allowance ? decoding : 0);
  return plan;
}

void Scheduler::record_tail(int64_t decoding, int64_t held) {
  if (decoding == 0) return;
  // The oldest steps leave while the window, with this step, would hold more than kTailWindowRequests;
  // every step carries at least one, so the ring then has room for this one.
  const size_t n = tail_ring_.size();
  while (tail_steps_ > 0 && tail_decoding_ + decoding > kTailWindowRequests) {
    tail_decoding_ -= tail_ring_[tail_first_].decoding;
    tail_held_ -= tail_ring_[tail_first_].held;
    tail_first_ = (tail_first_ + 1) % n;
    --tail_steps_;
  }
  tail_ring_[(tail_first_ + tail_steps_++) % n] = {int32_t(decoding), int32_t(held)};
  tail_decoding_ += decoding;
  tail_held_ += held;
  if (held) ++stats_.tail_steps, stats_.tail_held += held;
}

void Scheduler::commit(const std::vector<ScheduledChunk>& plan) {
  const int B = cfg_.block_size;
  for (const auto& c : plan) {
    Sequence* s = c.seq;
    s->num_computed = c.start + c.n;
    while (int64_t(s->block_hashes.size()) < s->num_computed / B) {
      const size_t i = s->block_hashes.size();
      const uint64_t parent = i ? s->block_hashes[i - 1] : 0;
      page_tokens_.resize(size_t(B));
      for (int j = 0; j < B; ++j) page_tokens_[size_t(j)] = s->token(int64_t(i) * B + j);
      const uint64_t h = page_hash(*s, parent, page_tokens_.data(), int64_t(i));
      if (pool_.publish(s->blocks[i], h, parent, page_tokens_.data()) && on_computed_)
        on_computed_(s->blocks[i], h, parent, page_tokens_.data(), int64_t(i + 1) * B > int64_t(s->prompt.size()));
      s->block_hashes.push_back(h);
    }
  }
}

}  // namespace m3
