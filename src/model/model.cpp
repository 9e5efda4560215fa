// The M3 / M3.1 text forward pass (docs/model.md section 4), written to read like the math:
// embed -> [norm, attention (dense or MSA), residual, norm, FFN (dense MLP or MoE), residual] x L
// -> final norm -> lm_head. One step runs any number of sequences together.
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/worker_pool.h"
#include "model/moe.h"

namespace m3 {

namespace {
// Indices per claimed chunk of the per-token loops (WorkerPool::parallel_for): a few microseconds of
// work each, so a decode step of a few sequences runs them on the calling thread and a prefill chunk
// shares them. Norm rows go in groups of 4 (rms_norm_rows), so their grain is a multiple of 4.
constexpr int64_t kNormRowsGrain = 16, kHeadRowsGrain = 8, kAddGrain = 65536;
}  // namespace

Model::Model(const std::string& dir, const ModelOptions& opt) : cfg_(ModelConfig::from_dir(dir, opt.config_overrides)) {
  if (opt.nvfp4_int8_activations && opt.nvfp4_bf16_activations)
    throw Error("NVFP4 activations: int8 and bf16 exclude each other (--nvfp4-activations takes one)");
  const std::string& mx = opt.mxfp4_activations;
  if (mx != "auto" && mx != "mxfp4" && mx != "fp32")
    throw Error("--mxfp4-activations: unknown value \"" + mx + "\" (expected auto, mxfp4 or fp32)");
  if (mx == "mxfp4" && cfg_.quark.on && !cfg_.quark.act_dynamic)
    throw Error("--mxfp4-activations mxfp4: the checkpoint's quantization_config (quark) has no input_tensors: its "
                "MXFP4 weights were quantised for unquantised activations (use auto or fp32)");
  weights_ = std::make_unique<Weights>(cfg_, opt.weight_memory);
  // Dynamic MXFP4 activations: the checkpoint's scheme (auto) or asked for; the scale rule is the
  // checkpoint's input_tensors.scale_calculation_mode ("even" without a quark config).
  mxfp4_act_matrices_ = weights_->set_mxfp4_activations(mx == "mxfp4" || (mx == "auto" && cfg_.quark.act_dynamic),
                                                        cfg_.quark.act_mode);
  if (opt.nvfp4_int8_activations) int8_matrices_ = weights_->enable_int8_activations();
  if (opt.mxfp8_bf16_activations) mxfp8_bf16_matrices_ = weights_->enable_bf16_activations(LinearKind::MXFP8);
  if (opt.nvfp4_bf16_activations) nvfp4_bf16_matrices_ = weights_->enable_bf16_activations(LinearKind::NVFP4);
  tiled_matrices_ = weights_->tile_for_decode();
}

void Model::ensure_workspace(int64_t T) {
  if (T <= ws_tokens_) return;
  const int64_t H = cfg_.hidden, QW = int64_t(cfg_.n_heads) * cfg_.head_dim, KW = int64_t(cfg_.n_kv_heads) * cfg_.head_dim;
  x_.resize(T * H);
  a_.resize(T * H);
  tmp_.resize(T * H);
  q_.resize(T * QW);
  att_.resize(T * QW);
  k_.resize(T * KW);
  v_.resize(T * KW);
  iq_.resize(T * int64_t(std::max(cfg_.index_heads, 1)) * std::max(cfg_.index_dim, 1));
  ik_.resize(T * int64_t(std::max(cfg_.index_dim, 1)));
  rope_cos_.resize(T * cfg_.rotary_dim / 2);
  rope_sin_.resize(T * cfg_.rotary_dim / 2);
  tok_.resize(T);
  pos_.resize(T);
  item_of_.resize(T);
  ws_tokens_ = T;
}

void Model::forward(const int32_t* tokens, int64_t T, SeqCache& cache, float* logits, const ForwardOptions& opt) {
  if (T <= 0) return;
  cache.reserve(cache.n_tokens + T);
  BatchItem it;
  it.kv = &cache;
  it.tokens = tokens;
  it.n = T;
  it.start = cache.n_tokens;
  it.logits_from = opt.all_logits ? 0 : T - 1;
  forward_batch(&it, 1, logits, opt.attention);
  cache.n_tokens += T;
}

void embedding_row(const TensorView& emb, int32_t tok, int64_t H, float* out) {
  const size_t esz = dtype_size(emb.dtype);
  const uint8_t* er = emb.data + size_t(tok) * size_t(H) * esz;
  if (emb.dtype == DType::F32) {
    std::memcpy(out, er, size_t(H) * 4);
    return;
  }
  for (int64_t h = 0; h < H; ++h) {
    uint16_t u;
    std::memcpy(&u, er + 2 * h, 2);
    out[h] = emb.dtype == DType::BF16 ? bf16_to_float(u) : f16_to_float(u);
  }
}

void Model::forward_batch(const BatchItem* items, int nitems, float* logits, AttentionPath path, float* taps) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden, D = c.head_dim, V = c.vocab;
  const int64_t QW = int64_t(c.n_heads) * D, KW = int64_t(c.n_kv_heads) * D;
  const int half = c.rotary_dim / 2;
  int64_t T = 0;
  for (int i = 0; i < nitems; ++i) {
    for (int64_t t = 0; t < items[i].n; ++t)
      if (items[i].tokens[t] < 0 || items[i].tokens[t] >= V)
        throw Error("token id " + std::to_string(items[i].tokens[t]) + " is outside the vocabulary [0, " +
                    std::to_string(V) + ")");
    T += items[i].n;
  }
  if (T == 0) return;
  ensure_workspace(T);
  seqs_.resize(nitems);
  embed_of_.assign(size_t(T), nullptr);
  int64_t row = 0;
  for (int i = 0; i < nitems; ++i) {
    seqs_[i] = {items[i].kv, items[i].start, items[i].n, row};
    for (int64_t t = 0; t < items[i].n; ++t, ++row) {
      tok_[row] = items[i].tokens[t];
      pos_[row] = items[i].start + t;
      item_of_[row] = i;
      if (items[i].embeds) embed_of_[size_t(row)] = items[i].embeds[t];
    }
  }
  float *x = x_.data(), *a = a_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data();

  // Embedding rows (no scaling).
  const TensorView& emb = weights_->embed();
  for (int64_t t = 0; t < T; ++t) {
    if (embed_of_[size_t(t)]) std::memcpy(x + t * H, embed_of_[size_t(t)], size_t(H) * sizeof(float));
    else embedding_row(emb, tok_[t], H, x + t * H);
    rope_table(pos_[t], c.rotary_dim, c.rope_theta, &rope_cos_[t * half], &rope_sin_[t * half]);
  }

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights_->layer(l);
    const bool sparse = c.sparse_layer[l];
    // Attention block: projections over all rows, per-head norm + RoPE, cache append. The per-token
    // loops run on all threads when the step has several tokens (each token's arithmetic is the same
    // either way; speed: serial loops left the other threads idle during a prefill).
    WorkerPool::parallel_for(T, kNormRowsGrain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t += 4)
        rms_norm_rows(x + t * H, H, L.input_norm.data(), H, std::min<int64_t>(4, t1 - t), c.rms_eps, a + t * H, H);
    });
    // The projections that read the same normed input share one parallel region.
    const int64_t ID = c.index_dim, IW = int64_t(c.index_heads) * ID;
    const LinearJob proj[5] = {{&L.attn.q, a, T, q}, {&L.attn.k, a, T, k}, {&L.attn.v, a, T, v},
                               {&L.attn.index_q, a, T, iq_.data()}, {&L.attn.index_k, a, T, ik_.data()}};
    linear_forward_many(proj, sparse ? 5 : 3);
    WorkerPool::parallel_for(T, kHeadRowsGrain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float *cs = &rope_cos_[t * half], *sn = &rope_sin_[t * half];
        rms_norm_rows(q + t * QW, D, L.attn.q_norm.data(), D, c.n_heads, c.rms_eps, q + t * QW, D);
        for (int h = 0; h < c.n_heads; ++h) rope_apply(q + t * QW + h * D, c.rotary_dim, cs, sn);
        rms_norm_rows(k + t * KW, D, L.attn.k_norm.data(), D, c.n_kv_heads, c.rms_eps, k + t * KW, D);
        for (int g = 0; g < c.n_kv_heads; ++g) rope_apply(k + t * KW + g * D, c.rotary_dim, cs, sn);
        if (sparse) {
          float* iqt = iq_.data() + t * IW;
          rms_norm_rows(iqt, ID, L.attn.index_q_norm.data(), ID, c.index_heads, c.rms_eps, iqt, ID);
          for (int g = 0; g < c.index_heads; ++g) rope_apply(iqt + g * ID, c.rotary_dim, cs, sn);
          float* ikt = ik_.data() + t * ID;
          rms_norm(ikt, L.attn.index_k_norm.data(), ID, c.rms_eps, ikt);
          rope_apply(ikt, c.rotary_dim, cs, sn);
        }
      }
    });
    // Cache appends stay serial (a KVView is not required to take concurrent stores).
    for (int64_t t = 0; t < T; ++t)
      items[item_of_[t]].kv->store(l, pos_[t], k + t * KW, v + t * KW, sparse ? ik_.data() + t * ID : nullptr);
    attention_batch(c, l, seqs_.data(), nitems, q, sparse ? iq_.data() : nullptr, path, att_.data());
    linear_forward(L.attn.o, att_.data(), T, tmp_.data());
    const float* tmp = tmp_.data();  // the attention output, then the FFN's
    // Residual add and FFN norm, per token.
    WorkerPool::parallel_for(T, kNormRowsGrain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; t += 4) {
        const int64_t n = std::min<int64_t>(4, t1 - t);
        for (int64_t i = t * H; i < (t + n) * H; ++i) x[i] += tmp[i];
        rms_norm_rows(x + t * H, H, L.post_attn_norm.data(), H, n, c.rms_eps, a + t * H, H);
      }
    });

    // FFN block.
    ffn_forward(c, L, c.moe_layer[l], a, T, tmp_.data());
    WorkerPool::parallel_for(T * H, kAddGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] += tmp[i];
    });
    if (taps) {
      const int64_t TW = int64_t(tap_layers_.size()) * H;
      for (size_t i = 0; i < tap_layers_.size(); ++i)
        if (tap_layers_[i] == l)
          for (int64_t t = 0; t < T; ++t) std::memcpy(taps + t * TW + int64_t(i) * H, x + t * H, size_t(H) * 4);
    }
  }

  // Final norm + lm_head for the requested rows.
  int64_t nout = 0;
  row = 0;
  for (int i = 0; i < nitems; ++i) {
    for (int64_t t = 0; t < items[i].n; ++t, ++row)
      if (t >= items[i].logits_from) rms_norm(x + row * H, weights_->final_norm().data(), H, c.rms_eps, a + (nout++) * H);
  }
  if (nout) linear_forward(weights_->lm_head(), a, nout, logits);
}

}  // namespace m3
