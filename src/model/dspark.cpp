// DSpark draft: config, weights and the two passes (context K/V from target taps; the block pass).
// See dspark.h and docs/serving.md section 1.3 for the math.
#include "model/dspark.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "formats/quantize.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/worker_pool.h"
#include "model/json_reader.h"
#include "model/model.h"
#include "model/tensor_loader.h"

namespace m3 {

using nlohmann::json;

DSparkConfig DSparkConfig::from_dir(const std::string& dir, const ModelConfig& target) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the DSpark draft's config (is " + dir + " a dspark/ folder?)");
  std::stringstream ss;
  ss << in.rdbuf();
  json top;
  try {
    top = json::parse(ss.str());
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!top.is_object()) throw Error(path + ": expected a JSON object");
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& tc = nested ? top["text_config"] : top;
  JsonReader r{tc, path + (nested ? ": text_config" : ":")};
  DSparkConfig c;
  c.dir = dir;
  c.n_layers = r.positive("num_hidden_layers");
  c.hidden = r.positive("hidden_size");
  c.vocab = r.positive("vocab_size");
  c.n_heads = r.positive("num_attention_heads");
  c.n_kv_heads = r.positive("num_key_value_heads");
  c.head_dim = r.has("head_dim") ? r.positive("head_dim") : c.hidden / c.n_heads;
  if (c.n_heads % c.n_kv_heads) r.fail("num_key_value_heads", "must divide num_attention_heads");
  c.rotary_dim = r.has("rotary_dim") ? r.positive("rotary_dim")
                                     : int(c.head_dim * r.number_or("partial_rotary_factor", 1.0));
  if (c.rotary_dim % 2 || c.rotary_dim > c.head_dim)
    r.fail("rotary_dim", "expected an even number <= head_dim " + std::to_string(c.head_dim));
  c.rope_theta = r.number("rope_theta");
  c.rms_eps = float(r.number_or("rms_norm_eps", 1e-6));
  c.inter = r.has("dspark_ffn_hidden_size") ? r.positive("dspark_ffn_hidden_size") : r.positive("dense_intermediate_size");
  c.block_size = r.positive("dspark_block_size");
  c.noise_token = int(r.integer("dspark_noise_token_id"));
  c.markov_rank = r.positive("dspark_markov_rank");
  c.sliding_window = int(r.integer_or("sliding_window", int64_t(1) << 30));
  if (c.sliding_window < 1) r.fail("sliding_window", "must be positive");
  c.swiglu_alpha = float(r.number_or("swiglu_alpha", 1.702));
  c.swiglu_limit = float(r.number_or("swiglu_limit", 7.0));
  c.confidence_head = r.boolean_or("enable_confidence_head", false);
  c.confidence_with_markov = r.boolean_or("confidence_head_with_markov", true);
  const std::string mh = r.string_or("dspark_markov_head_type", "vanilla");
  if (mh != "vanilla") r.fail("dspark_markov_head_type", "only \"vanilla\" is supported, got \"" + mh + "\"");
  if (!r.boolean_or("use_gemma_norm", true)) r.fail("use_gemma_norm", "only Gemma (1 + w) norms are supported");
  if (r.has("sparse_attention_config")) r.fail("sparse_attention_config", "the draft uses plain attention (expected null)");
  if (r.has("moe_layer_freq")) {
    for (const auto& v : tc["moe_layer_freq"])
      if (!v.is_number_integer() || v.get<int>() != 0) r.fail("moe_layer_freq", "the draft has dense layers only (all 0)");
  }
  if (!r.has("dspark_target_layer_ids") || !tc["dspark_target_layer_ids"].is_array() ||
      tc["dspark_target_layer_ids"].empty())
    r.fail("dspark_target_layer_ids", "missing (expected a list of target layer ids)");
  for (const auto& v : tc["dspark_target_layer_ids"]) {
    if (!v.is_number_integer() || v.get<int>() < 0 || v.get<int>() >= target.n_layers)
      r.fail("dspark_target_layer_ids", "entries must be target layer ids in [0, " + std::to_string(target.n_layers) +
                                            "), got " + v.dump());
    c.target_layers.push_back(v.get<int>());
  }
  if (c.hidden != target.hidden)
    r.fail("hidden_size", std::to_string(c.hidden) + " differs from the target's " + std::to_string(target.hidden));
  if (c.vocab != target.vocab)
    r.fail("vocab_size", std::to_string(c.vocab) + " differs from the target's " + std::to_string(target.vocab));
  if (c.noise_token < 0 || c.noise_token >= c.vocab) r.fail("dspark_noise_token_id", "outside the vocabulary");
  const json* q = top.contains("quantization_config") && top["quantization_config"].is_object() ? &top["quantization_config"]
                  : tc.contains("quantization_config") && tc["quantization_config"].is_object() ? &tc["quantization_config"]
                                                                                                  : nullptr;
  if (q) {
    JsonReader qr{*q, path + ": quantization_config"};
    const std::string m = qr.string_or("quant_method", "");
    if (m == "mxfp8" || m == "fp8") {
      c.format = WeightFormat::MXFP8;
    } else {
      qr.fail("quant_method", "the draft supports \"mxfp8\" (or no quantization_config for BF16), got \"" + m + "\"");
    }
  }
  return c;
}

ModelConfig DSparkConfig::kv_layout() const {
  ModelConfig m;
  m.hidden = hidden;
  m.n_layers = n_layers;
  m.n_heads = n_heads;
  m.n_kv_heads = n_kv_heads;
  m.head_dim = head_dim;
  m.vocab = vocab;
  m.rotary_dim = rotary_dim;
  m.rope_theta = rope_theta;
  m.moe_layer.assign(size_t(n_layers), 0);
  m.sparse_layer.assign(size_t(n_layers), 0);
  m.dir = dir;
  return m;
}

struct DSparkDraft::Layer {
  std::vector<float> input_norm, post_attn_norm, q_norm, k_norm;
  Linear q, k, v, o, gate, up, down;
};

DSparkDraft::DSparkDraft(const std::string& dir, const Model& target)
    : cfg_(DSparkConfig::from_dir(dir, target.config())), target_(target) {
  store_ = std::make_unique<TensorStore>(dir, target.weights().store().memory());  // where the target's live
  TensorLoader ld(*store_);
  const std::string P = "language_model.model.dspark.";
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, V = cfg_.vocab, R = cfg_.markov_rank;
  const int64_t TW = taps_width();
  fc_ = ld.linear(P + "fc", H, TW, WeightFormat::Plain);
  hidden_norm_ = ld.vec(P + "hidden_norm.weight", H, true);
  final_norm_ = ld.vec(P + "final_norm.weight", H, true);
  markov_w1_ = &ld.tensor(P + "markov_head.markov_w1.weight");
  ld.expect_dtype(*markov_w1_, {DType::BF16, DType::F16, DType::F32}, "BF16, F16 or F32");
  ld.expect_shape(*markov_w1_, {V, R});
  markov_w2_ = ld.linear(P + "markov_head.markov_w2", V, R, WeightFormat::Plain);
  // markov_w2 transposed to fp32 [R, V] (values exact), read by add_markov before the tiling below.
  {
    const TensorView& w2 = ld.tensor(P + "markov_head.markov_w2.weight");
    std::vector<float> row(static_cast<size_t>(R));
    markov_w2t_.resize(size_t(R * V));
    for (int64_t v = 0; v < V; ++v) {
      embedding_row(w2, int32_t(v), R, row.data());
      for (int64_t r = 0; r < R; ++r) markov_w2t_[size_t(r * V + v)] = row[size_t(r)];
    }
  }
  if (cfg_.confidence_head) {  // read by adaptive verification (Speculator::cut_by_confidence)
    const int64_t in = H + (cfg_.confidence_with_markov ? R : 0);
    conf_w_ = ld.matrix_f32(P + "confidence_head.proj.weight", 1, in);
    conf_b_ = ld.vec(P + "confidence_head.proj.bias", 1, false)[0];
  }
  bytes_ = double(fc_.bytes() + markov_w2_.bytes() + markov_w1_->nbytes);
  layers_.resize(size_t(cfg_.n_layers));
  for (int l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    const std::string B = P + "layers." + std::to_string(l) + ".decoder_layer.";
    const WeightFormat f = cfg_.format;
    L.input_norm = ld.vec(B + "input_layernorm.weight", H, true);
    L.post_attn_norm = ld.vec(B + "post_attention_layernorm.weight", H, true);
    L.q_norm = ld.vec(B + "self_attn.q_norm.weight", D, true);
    L.k_norm = ld.vec(B + "self_attn.k_norm.weight", D, true);
    L.q = ld.linear(B + "self_attn.q_proj", int64_t(cfg_.n_heads) * D, H, f);
    L.k = ld.linear(B + "self_attn.k_proj", int64_t(cfg_.n_kv_heads) * D, H, f);
    L.v = ld.linear(B + "self_attn.v_proj", int64_t(cfg_.n_kv_heads) * D, H, f);
    L.o = ld.linear(B + "self_attn.o_proj", H, int64_t(cfg_.n_heads) * D, f);
    L.gate = ld.linear(B + "mlp.gate_proj", cfg_.inter, H, f);
    L.up = ld.linear(B + "mlp.up_proj", cfg_.inter, H, f);
    L.down = ld.linear(B + "mlp.down_proj", H, cfg_.inter, f);
    for (const Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) bytes_ += double(x->bytes());
  }
  // The tiled layout for the decode kernels, as the target's weights (Weights::tile_for_decode): results
  // unchanged (speed: the draft's block pass and fused context are steps of a few rows, which the
  // kernels decode in registers only from tiles).
  if (store_->set_writable(true)) {
    for (Layer& L : layers_)
      for (Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) tile_rows(*x, const_cast<uint8_t*>(x->w));
    tile_rows(fc_, const_cast<uint8_t*>(fc_.w));
    tile_rows(markov_w2_, const_cast<uint8_t*>(markov_w2_.w));
    store_->set_writable(false);
  }
}

DSparkDraft::~DSparkDraft() = default;

namespace {

// An MXFP8 copy of `src` into `w` / `s` (tiled, on BF16 activations when bf16_act); false (nothing
// done) unless src is BF16, F16 or F32 with K % 32 == 0.
bool mxfp8_copy(const Linear& src, bool bf16_act, Linear& out, AlignedVector<uint8_t>& w, AlignedVector<uint8_t>& s) {
  const bool wide = src.kind == LinearKind::BF16 || src.kind == LinearKind::F16 || src.kind == LinearKind::F32;
  if (!wide || src.K % 32 != 0) return false;
  const int64_t N = src.N, K = src.K;
  w.resize(size_t(N * K));
  s.resize(size_t(N * (K / 32)));
  WorkerPool::parallel_for(N, 256, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> row;
    row.resize(size_t(K));
    for (int64_t n = lo; n < hi; ++n) {
      linear_decode_rows(src, n, 1, row.data());
      mxfp8_quantize_row(row.data(), K, &w[size_t(n * K)], &s[size_t(n * (K / 32))]);
    }
  });
  Linear q;
  q.kind = LinearKind::MXFP8;
  q.N = N;
  q.K = K;
  q.w = w.data();
  q.scales = s.data();
  q.name = src.name + " (the draft's MXFP8 copy)";
  set_scale_range(q);
  if (bf16_act) m3::enable_bf16_activations(q);
  tile_rows(q, w.data());
  out = q;
  return true;
}

}  // namespace

size_t DSparkDraft::quantize_wide_weights(bool bf16_act) {
  size_t bytes = 0;
  const std::pair<const Linear*, Mxfp8Copy*> mats[] = {{&target_.weights().lm_head(), &lm_head_q_}, {&fc_, &fc_q_}};
  for (const auto& [src, copy] : mats)
    if (copy->L.empty() && mxfp8_copy(*src, bf16_act, copy->L, copy->w, copy->s)) bytes += copy->w.size() + copy->s.size();
  return bytes;
}

const Linear& DSparkDraft::lm_head() const {
  return lm_head_q_.L.empty() ? target_.weights().lm_head() : lm_head_q_.L;
}

int DSparkDraft::enable_bf16_activations() {
  int n = 0;
  for (Layer& L : layers_)
    for (Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) n += m3::enable_bf16_activations(*x) ? 1 : 0;
  return n;
}

void DSparkDraft::ensure(int64_t rows) {
  if (rows <= ws_rows_) return;
  const int64_t H = cfg_.hidden, QW = int64_t(cfg_.n_heads) * cfg_.head_dim,
                KW = int64_t(cfg_.n_kv_heads) * cfg_.head_dim;
  x_.resize(size_t(rows * std::max<int64_t>(H, taps_width())));
  a_.resize(size_t(rows * H));
  tmp_.resize(size_t(rows * H));
  q_.resize(size_t(rows * QW));
  att_.resize(size_t(rows * QW));
  k_.resize(size_t(rows * KW));
  v_.resize(size_t(rows * KW));
  g_.resize(size_t(rows * cfg_.inter));
  u_.resize(size_t(rows * cfg_.inter));
  cos_.resize(size_t(rows * cfg_.rotary_dim / 2));
  sin_.resize(size_t(rows * cfg_.rotary_dim / 2));
  ws_rows_ = rows;
}

void DSparkDraft::write_context(const DraftContextRows* rows, int nrows) {
  int64_t R = 0;
  for (int i = 0; i < nrows; ++i) R += rows[i].n;
  if (R == 0) return;
  conf_rows_ = 0;  // a_ is overwritten below
  ensure(R);
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, TW = taps_width(), KW = int64_t(cfg_.n_kv_heads) * D;
  const int half = cfg_.rotary_dim / 2;
  // Gather the taps rows (x_ has room for R x TW), fuse: c = hidden_norm(fc(taps)).
  int64_t r = 0;
  for (int i = 0; i < nrows; ++i)
    for (int64_t t = 0; t < rows[i].n; ++t, ++r) {
      std::copy(rows[i].taps + t * TW, rows[i].taps + (t + 1) * TW, x_.data() + r * TW);
      rope_table(rows[i].start + t, cfg_.rotary_dim, cfg_.rope_theta, &cos_[size_t(r * half)], &sin_[size_t(r * half)]);
    }
  linear_forward(fc(), x_.data(), R, a_.data());
  for (int64_t t = 0; t < R; ++t) rms_norm(&a_[size_t(t * H)], hidden_norm_.data(), H, cfg_.rms_eps, &a_[size_t(t * H)]);
  // Context K/V of every layer: no input norm on c (docs/serving.md 1.3 step 3).
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    linear_forward(L.k, a_.data(), R, k_.data());
    linear_forward(L.v, a_.data(), R, v_.data());
    r = 0;
    for (int i = 0; i < nrows; ++i)
      for (int64_t t = 0; t < rows[i].n; ++t, ++r) {
        for (int g = 0; g < cfg_.n_kv_heads; ++g) {
          float* kh = &k_[size_t(r * KW + g * D)];
          rms_norm(kh, L.k_norm.data(), D, cfg_.rms_eps, kh);
          rope_apply(kh, cfg_.rotary_dim, &cos_[size_t(r * half)], &sin_[size_t(r * half)]);
        }
        rows[i].kv->store(l, rows[i].start + t, &k_[size_t(r * KW)], &v_[size_t(r * KW)], nullptr);
      }
  }
}

namespace {

// Online-softmax state of one (slot, head) query row.
struct SoftmaxRow {
  float m, l;
  float* acc;
};

inline void softmax_update(SoftmaxRow& s, float score, const float* vrow, int D) {
  if (score > s.m) {
    const float c = std::exp(s.m - score);
    s.l *= c;
    for (int d = 0; d < D; ++d) s.acc[d] *= c;
    s.m = score;
  }
  const float p = std::exp(score - s.m);
  s.l += p;
  for (int d = 0; d < D; ++d) s.acc[d] += p * vrow[d];
}

}  // namespace

void DSparkDraft::propose(const DraftQuery* queries, int nq, int nslots, float* out) {
  if (nq <= 0) return;
  slots_.assign(size_t(nq), nslots);
  propose(queries, nq, slots_.data(), out);
}

void DSparkDraft::propose(const DraftQuery* queries, int nq, const int* nslots, float* out) {
  const int S = cfg_.block_size;
  if (nq <= 0) return;
  for (int qi = 0; qi < nq; ++qi)
    if (nslots[qi] < 1 || nslots[qi] > S)
      throw Error("DSpark: " + std::to_string(nslots[qi]) + " draft slots requested, the block has " + std::to_string(S));
  const int64_t rows = int64_t(nq) * S;
  ensure(rows);
  conf_rows_ = 0;  // a_ is overwritten below
  const int64_t H = cfg_.hidden, D = cfg_.head_dim, QW = int64_t(cfg_.n_heads) * D, KW = int64_t(cfg_.n_kv_heads) * D;
  const int half = cfg_.rotary_dim / 2, G = cfg_.n_heads / cfg_.n_kv_heads;
  const TensorView& emb = target_.weights().embed();
  for (int qi = 0; qi < nq; ++qi)
    for (int j = 0; j < S; ++j) {
      const int64_t r = int64_t(qi) * S + j;
      if (j == 0 && queries[qi].anchor_embed)
        std::copy(queries[qi].anchor_embed, queries[qi].anchor_embed + H, &x_[size_t(r * H)]);
      else
        embedding_row(emb, j == 0 ? queries[qi].anchor : cfg_.noise_token, H, &x_[size_t(r * H)]);
      rope_table(queries[qi].pos + j, cfg_.rotary_dim, cfg_.rope_theta, &cos_[size_t(r * half)], &sin_[size_t(r * half)]);
    }
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t W = cfg_.sliding_window;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    // The last layer's outputs matter only for the slots that go through the lm_head: there, only
    // those slots attend (every slot is still a key) and only their rows take the output projection and
    // the MLP (speed: adaptive speculation often drafts 2-3 of the block's 7 slots).
    const bool last = l == cfg_.n_layers - 1;
    for (int64_t t = 0; t < rows; ++t) rms_norm(&x_[size_t(t * H)], L.input_norm.data(), H, cfg_.rms_eps, &a_[size_t(t * H)]);
    const LinearJob qkv[3] = {{&L.q, a_.data(), rows, q_.data()}, {&L.k, a_.data(), rows, k_.data()},
                              {&L.v, a_.data(), rows, v_.data()}};
    linear_forward_many(qkv, 3);
    for (int64_t t = 0; t < rows; ++t) {
      const float *cs = &cos_[size_t(t * half)], *sn = &sin_[size_t(t * half)];
      for (int h = 0; h < cfg_.n_heads; ++h) {
        float* qh = &q_[size_t(t * QW + h * D)];
        rms_norm(qh, L.q_norm.data(), D, cfg_.rms_eps, qh);
        rope_apply(qh, cfg_.rotary_dim, cs, sn);
      }
      for (int g = 0; g < cfg_.n_kv_heads; ++g) {
        float* kh = &k_[size_t(t * KW + g * D)];
        rms_norm(kh, L.k_norm.data(), D, cfg_.rms_eps, kh);
        rope_apply(kh, cfg_.rotary_dim, cs, sn);
      }
    }
    // Attention: windowed context (from the KVView) + all S block slots, non-causal. Scores through the
    // kernel table's dot product (speed: a plain loop is one dependent chain of D adds, which GCC keeps
    // in order: 0.7 ms of a 5.5 ms block pass on mid m31).
    const CpuOps& ops = cpu_ops();
    const int work = nq * cfg_.n_kv_heads;
    const int chunk = queries[0].kv ? queries[0].kv->chunk() : 128;
    // (group, query) items claimed from a counter over the worker pool; each participant's buffers are
    // its thread's own, grown only.
    std::atomic<int> next{0};
    WorkerPool::run(work > 1 ? WorkerPool::threads() : 1, [&](int) {
      thread_local std::vector<float> kbuf, vbuf, acc;
      thread_local std::vector<SoftmaxRow> st;
      if (kbuf.size() < size_t(chunk) * D) kbuf.resize(size_t(chunk) * D), vbuf.resize(size_t(chunk) * D);
      if (acc.size() < size_t(S) * G * D) acc.resize(size_t(S) * G * D);
      if (st.size() < size_t(S) * G) st.resize(size_t(S) * G);
      for (int w; (w = next.fetch_add(1, std::memory_order_relaxed)) < work;) {
        const int qi = w / cfg_.n_kv_heads, g = w % cfg_.n_kv_heads;
        const DraftQuery& Q = queries[qi];
        const int64_t base = int64_t(qi) * S;
        const int nj = last ? nslots[qi] : S;  // the slots that attend
        for (int i = 0; i < S * G; ++i) {
          st[size_t(i)] = {-std::numeric_limits<float>::infinity(), 0.f, &acc[size_t(i) * D]};
          std::fill(st[size_t(i)].acc, st[size_t(i)].acc + D, 0.f);
        }
        auto qrow = [&](int j, int hh) { return &q_[size_t((base + j) * QW + (int64_t(g) * G + hh) * D)]; };
        const int64_t lo0 = std::max<int64_t>(0, Q.pos - (W - 1));  // slot 0's window start (the widest)
        const int cw = Q.kv ? Q.kv->chunk() : chunk;
        for (int64_t lo = lo0; lo < Q.pos;) {
          const int64_t n = std::min<int64_t>(Q.pos, (lo / cw + 1) * cw) - lo;
          int64_t ks = 0, vs = 0;
          const float* K = kv_rows_f32(Q.kv->k_rows(l, g, lo), n, int(D), kbuf.data(), &ks);
          const float* Vv = kv_rows_f32(Q.kv->v_rows(l, g, lo), n, int(D), vbuf.data(), &vs);
          for (int j = 0; j < nj; ++j) {
            const int64_t from = std::max<int64_t>(lo, Q.pos + j - (W - 1));
            for (int hh = 0; hh < G; ++hh) {
              SoftmaxRow& s = st[size_t(j * G + hh)];
              const float* qv = qrow(j, hh);
              for (int64_t t = from; t < lo + n; ++t)
                softmax_update(s, ops.dot(qv, K + (t - lo) * ks, D) * scale, Vv + (t - lo) * vs, int(D));
            }
          }
          lo += n;
        }
        for (int j = 0; j < nj; ++j)
          for (int hh = 0; hh < G; ++hh) {
            SoftmaxRow& s = st[size_t(j * G + hh)];
            const float* qv = qrow(j, hh);
            for (int r2 = 0; r2 < S; ++r2)
              softmax_update(s, ops.dot(qv, &k_[size_t((base + r2) * KW + g * D)], D) * scale,
                             &v_[size_t((base + r2) * KW + g * D)], int(D));
            float* o = &att_[size_t((base + j) * QW + (int64_t(g) * G + hh) * D)];
            for (int d = 0; d < D; ++d) o[d] = s.acc[d] / s.l;
          }
      }
    });
    int64_t nr = rows;
    if (last) {  // the drafted slots' rows to the front, query after query (each row moves down or stays)
      nr = 0;
      for (int qi = 0; qi < nq; ++qi)
        for (int j = 0; j < nslots[qi]; ++j, ++nr) {
          const int64_t from = int64_t(qi) * S + j;
          if (from == nr) continue;
          std::copy_n(&att_[size_t(from * QW)], QW, &att_[size_t(nr * QW)]);
          std::copy_n(&x_[size_t(from * H)], H, &x_[size_t(nr * H)]);
        }
    }
    linear_forward(L.o, att_.data(), nr, tmp_.data());
    for (int64_t i = 0; i < nr * H; ++i) x_[size_t(i)] += tmp_[size_t(i)];
    for (int64_t t = 0; t < nr; ++t) rms_norm(&x_[size_t(t * H)], L.post_attn_norm.data(), H, cfg_.rms_eps, &a_[size_t(t * H)]);
    const LinearJob gu[2] = {{&L.gate, a_.data(), nr, g_.data()}, {&L.up, a_.data(), nr, u_.data()}};
    linear_forward_many(gu, 2);
    swiglu_oai(g_.data(), u_.data(), nr * cfg_.inter, cfg_.swiglu_alpha, cfg_.swiglu_limit, cfg_.swiglu_beta, g_.data());
    linear_forward(L.down, g_.data(), nr, tmp_.data());
    for (int64_t i = 0; i < nr * H; ++i) x_[size_t(i)] += tmp_[size_t(i)];
  }
  // Final norm + the target's lm_head for the drafted slots (the first rows of x_ after the last layer).
  int64_t nout = 0;
  for (int qi = 0; qi < nq; ++qi) nout += nslots[qi];
  for (int64_t t = 0; t < nout; ++t) rms_norm(&x_[size_t(t * H)], final_norm_.data(), H, cfg_.rms_eps, &a_[size_t(t * H)]);
  linear_forward(lm_head(), a_.data(), nout, out);
  conf_rows_ = nout;
}

const float* DSparkDraft::slot_hidden(int64_t row) const {
  if (row < 0 || row >= conf_rows_) throw Error("DSpark: slot row outside the last block pass");
  return &a_[size_t(row * cfg_.hidden)];
}

float DSparkDraft::confidence(int64_t row, int32_t prev) {
  if (conf_w_.empty()) throw Error("DSpark: the draft in " + cfg_.dir + " has no confidence head");
  const int64_t H = cfg_.hidden, R = cfg_.markov_rank;
  // fp32 sums over the 6144 + 256 inputs; a_ holds the final-normed slots of the last propose().
  const float* x = slot_hidden(row);
  float s = conf_b_;
  for (int64_t i = 0; i < H; ++i) s += conf_w_[size_t(i)] * x[i];
  if (cfg_.confidence_with_markov) {
    if (prev < 0 || prev >= cfg_.vocab)
      throw Error("DSpark: previous token " + std::to_string(prev) + " outside the vocabulary");
    conf_w1_.resize(size_t(R));
    embedding_row(*markov_w1_, prev, R, conf_w1_.data());
    for (int64_t i = 0; i < R; ++i) s += conf_w_[size_t(H + i)] * conf_w1_[size_t(i)];
  }
  return 1.0f / (1.0f + std::exp(-s));
}

namespace {

constexpr int64_t kMarkovBlock = 2048;  // words per block: the block's sums stay in L1

// y[0..n) += a * x[0..n), compiled for the CPU it runs on.
__attribute__((target_clones("avx512f", "avx2", "default"))) void markov_axpy(float a, const float* __restrict x,
                                                                              int64_t n, float* __restrict y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void DSparkDraft::add_markov(int32_t prev, float* logits) { add_markov(&prev, &logits, 1); }

void DSparkDraft::add_markov_topk(int32_t prev, float* logits, int k) {
  const int64_t V = cfg_.vocab, R = cfg_.markov_rank;
  if (prev < 0 || prev >= V) throw Error("DSpark: previous token " + std::to_string(prev) + " outside the vocabulary");
  if (k < 1) throw Error("DSpark: dspark_draft_topk must be positive");
  if (k >= V) {
    add_markov(prev, logits);
    return;
  }
  // The k best base logits (ties by lowest id, as the samplers order them).
  cand_.resize(size_t(V));
  for (int64_t v = 0; v < V; ++v) cand_[size_t(v)] = int32_t(v);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::nth_element(cand_.begin(), cand_.begin() + (k - 1), cand_.end(), better);
  cand_.resize(size_t(k));
  w1row_.resize(size_t(R));
  embedding_row(*markov_w1_, prev, R, w1row_.data());
  cand_bias_.assign(size_t(k), 0.0f);
  for (int64_t r = 0; r < R; ++r) {  // the transposed fp32 copy, as add_markov: the same sums per word
    const float w = w1row_[size_t(r)];
    const float* row = &markov_w2t_[size_t(r * V)];
    for (int i = 0; i < k; ++i) cand_bias_[size_t(i)] += w * row[cand_[size_t(i)]];
  }
  for (int i = 0; i < k; ++i) cand_bias_[size_t(i)] += logits[cand_[size_t(i)]];
  std::fill(logits, logits + V, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < k; ++i) logits[cand_[size_t(i)]] = cand_bias_[size_t(i)];
}

void DSparkDraft::add_markov(const int32_t* prev, float* const* logits, int n) {
  const int64_t V = cfg_.vocab, R = cfg_.markov_rank;
  if (n <= 0) return;
  w1row_.resize(size_t(n * R));
  mk_.resize(size_t(kMarkovBlock));
  for (int i = 0; i < n; ++i) {
    if (prev[i] < 0 || prev[i] >= V)
      throw Error("DSpark: previous token " + std::to_string(prev[i]) + " outside the vocabulary");
    embedding_row(*markov_w1_, prev[i], R, &w1row_[size_t(i * R)]);  // row prev of markov_w1 as fp32
  }
  // mk = markov_w2 · w1row through the transposed copy: rank-many multiply-adds over a block of the
  // vocabulary, all rows per block so the block's weights are read from L2 (speed: as a matrix product
  // of K = rank the per-row sums cost more than the products, 0.2-2 ms a call on the 2-core host; this
  // is a few vector FMAs per word, no thread).
  for (int64_t v0 = 0; v0 < V; v0 += kMarkovBlock) {
    const int64_t nv = std::min<int64_t>(kMarkovBlock, V - v0);
    for (int i = 0; i < n; ++i) {
      float* z = logits[i];
      float* m = mk_.data();
      std::fill(m, m + nv, 0.0f);
      for (int64_t r = 0; r < R; ++r) markov_axpy(w1row_[size_t(i * R + r)], &markov_w2t_[size_t(r * V + v0)], nv, m);
      for (int64_t v = 0; v < nv; ++v) z[v0 + v] += m[v];
    }
  }
}

}  // namespace m3
