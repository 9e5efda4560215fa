// Speculative decoding around the engine step (see speculator.h).
#include "engine/speculator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <numeric>
#include <optional>
#include <sstream>

#include "engine/engine.h"
#include "engine/kv_page_codec.h"
#include "base/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/worker_pool.h"
#include "structured/matcher.h"

namespace m3 {

Speculator::Speculator(const SpeculativeConfig& cfg, Model& target, KVDtype target_kv_dtype)
    : cfg_(cfg), vocab_(target.config().vocab) {
  const std::string dir =
      cfg.model.empty() ? (std::filesystem::path(target.config().dir) / "dspark").string() : cfg.model;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json"))
    throw Error("--speculative-config method \"" + cfg.method + "\" needs the draft model in " + dir +
                " (no config.json there); the checkpoint has no dspark/ folder, or pass \"model\": \"DIR\"");
  draft_ = std::make_unique<DSparkDraft>(dir, target);
  const DSparkConfig& dc = draft_->config();
  if (cfg_.draft_activations == "auto") cfg_.draft_activations = bf16_dot_products() ? "bf16" : "fp32";
  if (cfg_.draft_activations == "bf16" && draft_->enable_bf16_activations() == 0) {
    if (cfg.draft_activations == "bf16")
      throw Error("--speculative-config draft_activations \"bf16\": the draft in " + dir +
                  " has no MXFP8 or NVFP4 layers (BF16 activations apply to those only); remove the key");
    cfg_.draft_activations = "fp32";  // "auto" on a BF16 draft: nothing to round
  }
  if (cfg_.draft_weights == "auto") cfg_.draft_weights = cfg_.draft_activations == "bf16" ? "mxfp8" : "checkpoint";
  if (cfg_.draft_weights == "mxfp8") {
    draft_copy_bytes_ = draft_->quantize_wide_weights(cfg_.draft_activations == "bf16");
    if (draft_copy_bytes_ == 0) {
      if (cfg.draft_weights == "mxfp8")
        throw Error("--speculative-config draft_weights \"mxfp8\": neither the draft's fc (" +
                    std::string(linear_kind_name(draft_->fc().kind)) + ") nor the target's lm_head (" +
                    std::string(linear_kind_name(target.weights().lm_head().kind)) +
                    ") is a BF16, F16 or F32 matrix with in-features a multiple of 32, so there is nothing to copy "
                    "to MXFP8; remove the key");
      cfg_.draft_weights = "checkpoint";  // "auto": the matrices are already as narrow
    }
  }
  if (cfg.adaptive_verification && !draft_->has_confidence())
    throw Error("--speculative-config enable_adaptive_verification: the draft in " + dir +
                " has no confidence head (enable_confidence_head is not true in its config.json); remove the key "
                "or set it to false");
  if (cfg.num_speculative_tokens > dc.block_size)
    throw Error("--speculative-config num_speculative_tokens " + std::to_string(cfg.num_speculative_tokens) +
                " exceeds the draft's dspark_block_size " + std::to_string(dc.block_size) + " (" + dir +
                "/config.json)");
  kv_dtype_ = cfg.kv_cache_dtype.empty() ? target_kv_dtype
                                         : parse_kv_dtype(cfg.kv_cache_dtype, "--speculative-config kv_cache_dtype");
  rejection_ = parse_rejection_method(cfg.rejection_sample_method);
  greedy_ = cfg.draft_sample_method == "greedy";
  if (rejection_ == RejectionMethod::Synthetic)
    // vLLM's meanings: rates are unconditional per position; a length resolves to the
    // minimum-variance schedule.
    synthetic_rates_ = !cfg.synthetic_acceptance_rates.empty()
                           ? synthetic_rates_from_unconditional(cfg.synthetic_acceptance_rates)
                           : synthetic_rates_min_variance(cfg.synthetic_acceptance_length, cfg.num_speculative_tokens);
  target.set_tap_layers(dc.target_layers);
  accepted_per_pos_.assign(size_t(cfg.num_speculative_tokens), 0);
  // Optimistic start: new requests verify their drafts until their own acceptance is measured.
  global_acc_.rate.assign(size_t(cfg.num_speculative_tokens), 0.8);
}

namespace {
constexpr double kRequestAlpha = 0.3;   // a request's estimate follows its last few verifications
constexpr double kGlobalAlpha = 0.05;
constexpr double kCtxAlpha = 0.2;
// Every probe_every-th decision of a request verifies every draft it may, so that positions its
// estimate has stopped reaching are measured again.
constexpr int64_t kProbeEvery = 32;
// Consecutive decisions against speculating after which it ends for a request.
constexpr int kIdleToStop = 16;
// One request in this many speculates from its first step whatever the estimate says (admit()).
constexpr int64_t kExploreEvery = 8;
// admit() starts a request off when speculating's best marginal rate is below this fraction of the
// plain rate.
constexpr double kAdmitMargin = 0.85;
// Draft passes after which the draft's cost counts as measured even if every one drafted the same
// number of slots per request (limit_unmeasured varies it; requests near their max_tokens may not).
constexpr int64_t kDraftTimingsEnough = 8;
}  // namespace

void Speculator::observe_draft(double ms, int requests, int64_t slots) {
  if (requests <= 0 || !(ms >= 0) || !std::isfinite(ms) || draft_timings_++ == 0) return;
  draft_fit_.observe({double(requests), double(slots)}, ms);
  const double per = double(slots) / requests;
  if (first_slots_per_request_ < 0) first_slots_per_request_ = per;
  draft_varied_ |= std::fabs(per - first_slots_per_request_) >= 0.5 || draft_timings_ > kDraftTimingsEnough;
  double coef[2];
  if (draft_varied_ && draft_fit_.solve(coef)) std::copy(coef, coef + 2, draft_coef_);
}

double Speculator::draft_ms(int k) const {
  return draft_coef_[0] < 0 ? -1 : draft_coef_[0] + draft_coef_[1] * double(k);
}

void Speculator::admit(std::vector<ScheduledChunk>& plan, const StepCostModel& cost) {
  int64_t rows = 0;
  // Whether a request of this step already speculates: it measures the costs and the acceptance, so a
  // new request need not explore (at concurrency 32 every request is admitted in the first steps, and
  // one explorer in eight made four of them, each paying a draft pass per step where it cannot pay).
  bool speculating = false;
  for (const ScheduledChunk& c : plan) {
    rows += c.n == 1 && c.sample ? 1 + c.spec : 0;
    speculating |= c.seq->spec_acc.admitted && !c.seq->spec_acc.off;
  }
  for (ScheduledChunk& c : plan) {
    SpecAcceptance& a = c.seq->spec_acc;
    if (a.admitted) continue;
    a.admitted = true;
    if (a.off || c.seq->constraint) continue;
    const bool explorer = admitted_++ % kExploreEvery == 0 && !speculating;
    speculating |= explorer;
    // Until every cost is measured (and the step cost model has seen two decode shapes) only the
    // explorers speculate: they measure the costs. Otherwise a burst of requests admitted together (at
    // concurrency 32 every request of a run) all wrote their prompts' draft context, the largest cost
    // of speculation where it does not pay, before the first decision could tell.
    const bool measured = draft_ms(0) >= 0 && ctx_ms_ >= 0 && decode_shapes_ >= 2;
    if (explorer && !measured) continue;
    if (!measured) {
      a.off = true;
      c.spec = 0;
      ++skipped_;
      continue;
    }
    // The decode step it will join: the rows decoding now and its own.
    const double base = cost.predict_decode_ms(rows + 1);
    if (!(base > 0)) continue;
    const double row_ms = std::max(0.0, cost.predict_decode_ms(rows + 2) - base);
    // The best marginal rate speculating can reach (k drafts: G_k expected accepted tokens for k more
    // rows in the step, a draft pass of k slots and the draft context of its 1 + G_k tokens) against
    // the step's plain rate. It starts off only when that is clearly below (kAdmitMargin): one
    // snapshot of measured costs decides here, and near the break-even their noise would flip requests
    // off for good; there the per-request decisions (choose()) settle it over many steps.
    //
    // It also starts off where speculating cannot win back the draft context of its prompt (the part
    // not already in the prefix cache, written in its prefill steps if it speculates): the time its
    // drafts save per step (G_k tokens at the plain rate, less their cost) times its steps (max_tokens
    // at 1 + G_k tokens a step; an earlier EOS only shortens that) must exceed it. At concurrency 1 and
    // acceptance 2.3 a step of one draft saved 0.4 ms beside a 5.9 ms plain step, 25 ms over 128
    // tokens, while a prompt's context took up to 180 ms (0.44 ms a token): speculating read 0.95x.
    const double lambda = double(rows + 1) / base;
    extra_ms_.resize(size_t(cfg_.num_speculative_tokens));
    double g = 0, p = 1;
    for (int k = 1; k <= cfg_.num_speculative_tokens; ++k) {
      g += (p *= std::clamp(global_acc_.rate[size_t(k - 1)], 0.0, 1.0));
      extra_ms_[size_t(k - 1)] =
          std::max(0.0, cost.predict_decode_ms(rows + 1 + k) - base) + draft_ms(k) + ctx_ms_ * (1.0 + g);
    }
    const int64_t prompt_left = std::max<int64_t>(0, int64_t(c.seq->prompt.size()) - c.start);
    const int64_t out_left = std::max<int64_t>(1, int64_t(c.seq->params.max_tokens) - int64_t(c.seq->output.size()));
    const AdmitCase ac = admit_case(global_acc_.rate, lambda, extra_ms_, double(out_left));
    const double prompt_ctx_ms = ctx_ms_ * double(prompt_left);
    double best = !explorer && ac.saved_ms <= prompt_ctx_ms ? 0.0 : ac.best_rate;
    // An explorer (measuring acceptance and the draft's costs) starts off only where the rows alone
    // rule speculation out: a verified row, even always accepted, costs more than a plain row's share
    // of the step (at concurrency 8 and 32 on a 2-core CPU; exploring there only paid for draft
    // passes). The step cost model follows every step, while the draft's costs and the estimate are
    // re-measured only by speculating requests.
    if (explorer) best = row_ms > 0 ? 1.0 / row_ms : lambda;
    if (best < kAdmitMargin * lambda) {
      a.off = true;
      c.spec = 0;
      ++skipped_;
    } else {
      speculating = true;
    }
  }
}

void Speculator::limit_unmeasured(std::vector<ScheduledChunk>& plan, int64_t rows) const {
  int64_t left = std::max<int64_t>(cfg_.num_speculative_tokens, rows);
  // After a measured pass of whole blocks, one of a single draft per request: the draft's cost per
  // slot and per request apart (observe_draft).
  const bool one_each = draft_timings_ >= 2 && !draft_varied_;
  for (ScheduledChunk& c : plan) {
    c.spec = std::min(c.spec, one_each ? std::min<int64_t>(left, 1) : left);
    left -= c.spec;
  }
}

void Speculator::choose(std::vector<ScheduledChunk>& plan, const StepCostModel& cost) {
  conf_threshold_ = -1;
  probe_.assign(plan.size(), 0);
  if (!cfg_.adaptive) return;
  admit(plan, cost);
  int64_t prefill = 0, rows = 0, drafts = 0;
  double plain = 0;
  for (const ScheduledChunk& c : plan) {
    (c.n == 1 && c.sample ? rows : prefill) += c.n;
    if (c.sample) plain += 1;
    drafts += c.spec;
  }
  // Until the step cost model has measured decode steps of two different row counts, its split of a
  // step's time into a fixed part and a part per row is only its ridge's guess (every step so far
  // verified every draft: at concurrency 8 always 8 + 56 rows), and the verified row's cost it gives
  // can be off by 2x either way, which made the decisions swing from run to run. One plain step
  // (no drafts; its tokens are not lost), once the model predicts, measures the second count.
  // Only decode-only steps count: a step that also carries prefill tokens has a third unknown, and when
  // the first decode rows share a step with the last prompt chunks (every request admitted at once, as
  // at concurrency 32), counting it as the first shape skipped the plain step and left the fit with one
  // decode shape: its slope per row came out 0, every draft looked free, and nothing was ever cut.
  if (rows > 0 && prefill == 0 && decode_shapes_ < 2) {
    const int64_t shape = rows + drafts;
    if (decode_shapes_ == 0) {
      first_shape_ = shape;
      decode_shapes_ = 1;
    } else if (shape != first_shape_) {
      decode_shapes_ = 2;
    }
  }
  // Until the costs are measured, the steps that measure them verify at most max(K, decode rows)
  // drafts, in whole blocks for the first requests (deep positions measured too) and none for the
  // rest: at concurrency 32 a step verifying every request's 7 drafts is 256 rows, about 20 plain
  // steps on this CPU, and it took 2-3 of them before the step cost model could predict.
  if (draft_ms(0) < 0) return limit_unmeasured(plan, rows);
  const double base = cost.predict_ms(prefill, rows);
  if (!(base > 0)) return limit_unmeasured(plan, rows);
  if (rows > 0 && prefill == 0 && decode_shapes_ == 1) {  // the plain step of the comment above, once the model predicts
    for (ScheduledChunk& c : plan) c.spec = 0;
    if (rows != first_shape_) decode_shapes_ = 2;
    return;
  }
  // The rate drafts must beat is the decode rows' own (a decode-only step of these rows): a prompt chunk
  // riding in the step made every draft look nearly free beside it, while the few requests decoding
  // then (at concurrency 32, the explorers among prompts being read) drafted at full length.
  const double decode_base = rows > 0 ? cost.predict_decode_ms(rows) : base;
  SpecCosts sc{decode_base > 0 ? decode_base : base, 0, draft_ms(0), std::max(0.0, ctx_ms_),
               std::max(0.0, draft_ms(1) - draft_ms(0))};
  // A verified row's cost. In a decode-only step: the measured decode shapes' mean cost per row over
  // the drafts the step is about to verify (a one-row step is memory-bound and rows beyond it cost
  // more: mid m31's 4-row step took 2.4x its one-row step), guessed first as half of every candidate's
  // drafts, then once more at the count that guess chose. With prefill in the step: the linear fit's.
  const auto row_cost = [&](int64_t span) {
    if (prefill > 0 || !(decode_base > 0)) return std::max(0.0, cost.predict_ms(prefill, rows + 1) - base);
    span = std::max<int64_t>(span, 1);
    return std::max(0.0, (cost.predict_decode_ms(rows + span) - decode_base) / double(span));
  };
  cands_.clear();
  cand_chunk_.clear();
  int64_t span = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].spec) continue;
    SpecAcceptance& a = plan[i].seq->spec_acc;
    if (a.rate.empty()) a.rate = global_acc_.rate;
    cands_.push_back({&a, int(plan[i].spec)});
    cand_chunk_.push_back(i);
    span += plan[i].spec;
  }
  span = std::max<int64_t>(1, span / 2);
  sc.row_ms = row_cost(span);
  std::vector<int>& k = chosen_;
  choose_drafts(cands_, plain, sc, k);
  const int64_t chosen = std::accumulate(k.begin(), k.end(), int64_t(0));
  if (chosen > 0 && chosen != span) {
    sc.row_ms = row_cost(chosen);
    choose_drafts(cands_, plain, sc, k);
  }
  const double lambda = plain / sc.base_ms;  // tokens per ms of the decode rows without drafts
  if (cfg_.adaptive_verification) {
    // The rate the chosen step expects (tokens per ms, from measured acceptance, before any draft of
    // this step exists): a verified row must bring more than rate x row_ms tokens. Fixed before the
    // drafts are drawn, so the cut stays a stopping rule (spec_adaptive.h).
    double tokens = plain, ms = sc.base_ms;
    for (size_t j = 0; j < k.size(); ++j) {
      double p = 1, g = 0;
      for (int i = 0; i < k[j]; ++i) g += (p *= std::clamp(cands_[j].acc->rate[size_t(i)], 0.0, 1.0));
      tokens += g;
      if (k[j] > 0) ms += double(k[j]) * (sc.row_ms + sc.slot_ms) + sc.draft_ms + g * sc.ctx_ms;
    }
    conf_threshold_ = tokens / ms * sc.row_ms;  // a cut after the draft pass saves the verified row only
  }
  for (size_t j = 0; j < k.size(); ++j) {
    ScheduledChunk& c = plan[cand_chunk_[j]];
    SpecAcceptance& a = c.seq->spec_acc;
    if (++a.decisions % kProbeEvery == 0) {  // a probe: every draft, to re-measure
      probe_[cand_chunk_[j]] = 1;
      continue;
    }
    c.spec = k[j];
    // Speculating (k[j] drafts, and the draft context of every kept token) against ending it (no
    // drafts, no context): G expected accepted drafts for k row + draft + G ctx more ms, against
    // ctx ms saved on the plain token.
    if (ctx_ms_ >= 0) {
      double g = 0, p = 1;
      for (int i = 0; i < k[j]; ++i) g += (p *= std::clamp(a.rate[size_t(i)], 0.0, 1.0));
      const double extra = k[j] > 0 ? double(k[j]) * (sc.row_ms + sc.slot_ms) + sc.draft_ms : 0.0;
      const bool worth = g - lambda * (extra + ctx_ms_ * g) > lambda * ctx_ms_;
      a.idle = worth ? 0 : a.idle + 1;
      if (a.idle >= kIdleToStop) {
        a.off = true;
        c.spec = 0;
      }
    }
  }
}

Speculator::~Speculator() = default;

size_t Speculator::page_bytes(int block_size) const {
  return KVPool::page_bytes(draft_->config().kv_layout(), block_size, kv_dtype_, kv_dtype_);
}

void Speculator::make_pool(int block_size, int64_t pages) {
  kv_ = std::make_unique<KVPool>(draft_->config().kv_layout(), block_size, kv_dtype_, kv_dtype_, pages);
}

std::string Speculator::layout_extra() const {
  return " draft " + std::to_string(model_layout_id(draft_->config().dir, "")) + " " + kv_dtype_name(kv_dtype_);
}

std::string Speculator::describe() const {
  std::ostringstream o;
  o << cfg_.describe() << "; draft " << draft_->config().dir << " (" << draft_->config().n_layers << " layers, block "
    << draft_->config().block_size << ", KV " << kv_dtype_name(kv_dtype_) << " in the same pages";
  if (draft_copy_bytes_)
    o << ", MXFP8 copies of its wide matrices " << std::fixed << std::setprecision(1) << double(draft_copy_bytes_) / 1e6 << " MB";
  o << ")";
  return o.str();
}

float* Speculator::taps(int64_t rows) {
  const size_t need = size_t(rows) * size_t(draft_->taps_width());
  if (taps_.size() < need) taps_.resize(need);
  return taps_.data();
}

void Speculator::propose(const std::vector<ScheduledChunk>& plan) {
  const int64_t V = vocab_;
  queries_.clear();
  slots_.clear();
  chunks_.clear();
  views_.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    if (!c.spec) continue;
    views_[i] = std::make_unique<PagedKV>(*kv_, c.seq->blocks, c.start);
    // An image placeholder anchor (the prompt's last token) is fed its image embedding, as the target is.
    const float* embed = c.seq->mm.empty() ? nullptr : c.seq->mm_embed(c.start, draft_->config().hidden);
    queries_.push_back({views_[i].get(), c.seq->token(c.start), c.start, embed});
    slots_.push_back(int(c.spec));
    chunks_.push_back(i);
  }
  if (queries_.empty()) return;
  const size_t nq = queries_.size();
  // Draft rows: query qi's c.spec rows from zrow_[qi] on, the same rows of q_ (the lm_head runs for
  // the drafts each request will verify, not for the whole block).
  zrow_.resize(nq + 1);
  zrow_[0] = 0;
  for (size_t qi = 0; qi < nq; ++qi) zrow_[qi + 1] = zrow_[qi] + slots_[qi];
  const int64_t zrows = zrow_[nq];
  if (z_.size() < size_t(zrows * V)) z_.resize(size_t(zrows * V));
  draft_->propose(queries_.data(), int(nq), slots_.data(), z_.data());
  if (drafts_.size() < plan.size()) drafts_.resize(plan.size());
  // Draft rows of chunk i in q_ start at qrow_[i].
  qrow_.assign(plan.size(), 0);
  for (size_t qi = 0; qi < nq; ++qi) qrow_[chunks_[qi]] = zrow_[qi];
  if (q_.size() < size_t(zrows * V)) q_.resize(size_t(zrows * V));
  if (cfg_.adaptive_verification && conf_.size() < size_t(zrows)) conf_.resize(size_t(zrows));
  // Position by position over all drafting requests: the Markov biases after the requests' previous
  // tokens are one pass over the Markov weights.
  prefixes_.resize(nq);
  forks_.resize(nq);
  prev_.resize(nq);
  for (size_t qi = 0; qi < nq; ++qi) {
    Sequence* s = plan[chunks_[qi]].seq;
    drafts_[chunks_[qi]].clear();
    prefixes_[qi] = s->output;
    prev_[qi] = queries_[qi].anchor;
    // Structured output: the drafts walk a fork of the request's matcher and each q_j is masked by
    // the constraint at its position, so the draft only proposes allowed tokens and q_j has the
    // same support as the masked target distribution verify() compares it with.
    forks_[qi].reset();
    if (s->constraint) forks_[qi].emplace(s->constraint->fork());
  }
  const int kmax = *std::max_element(slots_.begin(), slots_.end());
  for (int j = 0; j < kmax; ++j) {
    mprev_.clear();
    mrows_.clear();
    for (size_t qi = 0; qi < nq; ++qi)
      if (j < slots_[qi]) {
        float* zr = &z_[size_t((zrow_[qi] + j) * V)];
        // dspark_draft_topk: the bias on the k best base logits only (a constrained request keeps the
        // whole vocabulary: its allowed tokens may all lie outside them).
        if (cfg_.draft_topk > 0 && !forks_[qi]) {
          draft_->add_markov_topk(prev_[qi], zr, cfg_.draft_topk);
          continue;
        }
        mprev_.push_back(prev_[qi]);
        mrows_.push_back(zr);
      }
    // The Markov bias enters before the sampling transforms.
    draft_->add_markov(mprev_.data(), mrows_.data(), int(mprev_.size()));
    // The head reads the slot's normed hidden state and the token its Markov bias follows (the draft's
    // workspace: on this thread), and each constraint's mask is built here too.
    masks_.assign(nq, nullptr);
    for (size_t qi = 0; qi < nq; ++qi) {
      if (j >= slots_[qi]) continue;
      if (cfg_.adaptive_verification) conf_[size_t(zrow_[qi] + j)] = draft_->confidence(zrow_[qi] + j, prev_[qi]);
      if (forks_[qi]) masks_[qi] = forks_[qi]->mask();
    }
    // Each request's distribution and draw over the worker pool (speed, as in verify_all; a request's
    // sampler, history and rows are its own).
    WorkerPool::parallel_for(int64_t(nq), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t qi = lo; qi < hi; ++qi) {
        if (j >= slots_[size_t(qi)]) continue;
        Sequence* s = plan[chunks_[size_t(qi)]].seq;
        const int64_t row = zrow_[size_t(qi)] + j;
        float* q = &q_[size_t(row * V)];
        s->sampler.distribution(&z_[size_t(row * V)], V, s->prompt, prefixes_[size_t(qi)], q, masks_[size_t(qi)]);
        int32_t t;
        if (greedy_ || s->params.temperature <= 0.0f) {
          // Argmax after the request's penalties; q becomes one-hot (already so at temperature 0).
          t = int32_t(std::max_element(q, q + V) - q);
          std::fill(q, q + V, 0.0f);
          q[t] = 1.0f;
        } else {
          t = s->sampler.draw(q, V);
        }
        prev_[size_t(qi)] = t;
      }
    });
    for (size_t qi = 0; qi < nq; ++qi) {
      if (j >= slots_[qi]) continue;
      const int32_t t = prev_[qi];
      drafts_[chunks_[qi]].push_back(t);
      prefixes_[qi].push_back(t);
      if (forks_[qi]) forks_[qi]->advance(t);
    }
  }
}

void Speculator::cut_by_confidence(std::vector<ScheduledChunk>& plan) {
  if (!cfg_.adaptive_verification || conf_threshold_ < 0) return;
  for (size_t i = 0; i < plan.size(); ++i) {
    ScheduledChunk& c = plan[i];
    if (!c.spec || (i < probe_.size() && probe_[i])) continue;
    calibrated_.resize(size_t(c.spec));
    calibrate_confidence(&conf_[size_t(qrow_[i])], int(c.spec), c.seq->spec_acc, calibrated_.data());
    const int k = cut_by_survival(calibrated_.data(), int(c.spec), conf_threshold_);
    cut_by_conf_ += c.spec - k;
    c.spec = k;
    drafts_[i].resize(size_t(k));
  }
}

void Speculator::verify_all(const std::vector<ScheduledChunk>& plan, const float* const* logits) {
  verify_chunks_.clear();
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].spec) verify_chunks_.push_back(i);
  if (outcomes_.size() < plan.size()) outcomes_.resize(plan.size());
  // Requests over the worker pool (speed: each verified row is a distribution over the vocabulary, and
  // a step verifies several rows per request). A request's sampler and outcome are its own.
  WorkerPool::parallel_for(int64_t(verify_chunks_.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const size_t i = verify_chunks_[size_t(k)];
      verify(plan[i], i, logits[i]);
    }
  });
}

void Speculator::verify(const ScheduledChunk& c, size_t ci, const float* logits) {
  const int64_t V = vocab_;
  Sequence* s = c.seq;
  const std::vector<int32_t>& d = drafts_[ci];
  const int gamma = int(c.spec);
  // This thread's target distributions (verify_all runs chunks on several threads).
  thread_local std::vector<float> p;
  if (p.size() < size_t((gamma + 1) * V)) p.resize(size_t((gamma + 1) * V));
  // Structured output: every target distribution P_i is the masked one (the constraint's state
  // after anchor, d_1..d_i, walked on a fork: the request's matcher advances in emit() over the
  // tokens kept only), exactly what the non-speculative step samples from. The draft's q_i were
  // masked the same way, so the rejection rules compare two distributions over the allowed tokens
  // and stay exact, and the token after a rejection (drawn from the masked P or the residual
  // max(0, P - q)) is allowed too. A draft the constraint refuses (none is proposed; kept as a
  // guard) ends the verified drafts before it: a shorter speculation, still exact.
  std::optional<structured::Matcher> fork;
  if (s->constraint) fork.emplace(s->constraint->fork());
  int verified = gamma;
  float* P = p.data();
  if (!fork) {
    // The rows over the worker pool (speed: the usual single request's step); row i's history is
    // the output and the first i drafts. Inside verify_all's own threads this runs on the caller.
    WorkerPool::parallel_for(gamma + 1, 1, [&](int64_t lo, int64_t hi) {
      thread_local std::vector<int32_t> hist;
      for (int64_t i = lo; i < hi; ++i) {
        hist.assign(s->output.begin(), s->output.end());
        hist.insert(hist.end(), d.begin(), d.begin() + i);
        s->sampler.distribution(logits + i * V, V, s->prompt, hist, P + i * V);
      }
    });
  } else {
    thread_local std::vector<int32_t> prefix;
    prefix = s->output;
    for (int i = 0; i <= verified; ++i) {
      s->sampler.distribution(logits + int64_t(i) * V, V, s->prompt, prefix, P + int64_t(i) * V, fork->mask());
      if (i == verified) break;
      if (!fork->advance(d[size_t(i)])) verified = i;
      else prefix.push_back(d[size_t(i)]);
    }
  }
  VerifyOutcome& out = outcomes_.at(ci);  // sized by verify_all, before the threads
  // The draft rows of this chunk in q_ follow the rows of the chunks before it.
  VerifyInput in{verified, V, d.data(), P, &q_[size_t(qrow_[ci] * V)]};
  if (rejection_ == RejectionMethod::Synthetic) out = verify_synthetic(in, synthetic_rates_, s->sampler);
  else if (s->params.temperature <= 0.0f) out = verify_greedy(in);
  else if (rejection_ == RejectionMethod::Block) out = verify_block(in, s->sampler);
  else out = verify_standard(in, s->sampler);
  // The head's values at the positions this verification measured calibrate the next cuts.
  if (cfg_.adaptive_verification) {
    if (s->spec_acc.rate.empty()) s->spec_acc.rate = global_acc_.rate;
    s->spec_acc.update_conf(gamma, out.accepted, &conf_[size_t(qrow_[ci])], kRequestAlpha);
  }
}

void Speculator::keep_accepted(const std::vector<ScheduledChunk>& plan) {
  // Draft context: every token the target processed and keeps (anchor + accepted drafts for a
  // speculative chunk); the taps hold one row per token of the forward, chunk after chunk.
  ctx_rows_.clear();
  views_.resize(plan.size());
  last_ctx_ms_ = 0;
  int64_t trow = 0, rows = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    if (c.seq->spec_acc.off) {  // speculation ended for it: no draft context any more
      trow += c.n + c.spec;
      continue;
    }
    const int64_t keep = c.spec ? 1 + outcomes_[i].accepted : c.n;
    rows += keep;
    views_[i] = std::make_unique<PagedKV>(*kv_, c.seq->blocks, c.start + keep);
    ctx_rows_.push_back({views_[i].get(), taps_.data() + trow * draft_->taps_width(), c.start, keep});
    trow += c.n + c.spec;
  }
  if (ctx_rows_.empty()) return;
  ctx_tokens_ += rows;
  draft_->write_context(ctx_rows_.data(), int(ctx_rows_.size()));
  last_ctx_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double per = last_ctx_ms_ / double(std::max<int64_t>(rows, 1));
  if (ctx_timings_++ == 0) return;
  ctx_ms_ = ctx_ms_ < 0 ? per : ctx_ms_ + kCtxAlpha * (per - ctx_ms_);
}

void Speculator::count(const ScheduledChunk& c, const VerifyOutcome& v) {
  SpecAcceptance& a = c.seq->spec_acc;
  if (a.rate.empty()) a.rate = global_acc_.rate;
  a.update(int(c.spec), v.accepted, kRequestAlpha);
  global_acc_.update_mean(int(c.spec), v.accepted, kGlobalAlpha);
  ++steps_;
  drafted_ += c.spec;
  accepted_ += v.accepted;
  for (int j = 0; j < v.accepted; ++j) ++accepted_per_pos_[size_t(j)];
}

void Speculator::fill_stats(EngineStats& st) const {
  st.spec_drafts = steps_;
  st.spec_draft_tokens = drafted_;
  st.spec_accepted_tokens = accepted_;
  st.spec_accepted_per_pos = accepted_per_pos_;
  st.spec_context_tokens = ctx_tokens_;
  st.spec_skipped_requests = skipped_;
  st.spec_cut_by_confidence = cut_by_conf_;
}

std::string Speculator::costs_describe() const {
  std::ostringstream o;
  o.precision(3);
  if (draft_coef_[0] < 0) o << "draft pass not measured";
  else o << "draft pass " << draft_coef_[0] << " ms per request + " << draft_coef_[1] << " ms per slot";
  o << ", draft context ";
  if (ctx_ms_ < 0) o << "not measured";
  else o << ctx_ms_ << " ms per token";
  return o.str();
}

std::string spec_summary(const EngineStats& st) {
  std::ostringstream o;
  o << "speculative: " << st.spec_drafts << " drafts, " << st.spec_draft_tokens << " draft tokens, "
    << st.spec_accepted_tokens << " accepted; acceptance length "
    << (st.spec_drafts ? 1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts) : 0.0)
    << "; acceptance rate per position [";
  for (size_t i = 0; i < st.spec_accepted_per_pos.size(); ++i)
    o << (i ? ", " : "") << (st.spec_drafts ? double(st.spec_accepted_per_pos[i]) / double(st.spec_drafts) : 0.0);
  o << "]; draft context for " << st.spec_context_tokens << " tokens";
  if (st.spec_skipped_requests) o << "; " << st.spec_skipped_requests << " requests admitted without speculation";
  if (st.spec_cut_by_confidence > 0) o << "; " << st.spec_cut_by_confidence << " drafts cut by the confidence head";
  return o.str();
}

}  // namespace m3
