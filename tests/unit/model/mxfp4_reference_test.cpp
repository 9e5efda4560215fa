// Logits of a make-model MXFP4 (AMD Quark layout, m31-mxfp4) checkpoint against a float64 reference of the
// same math, written here from docs/model.md section 4 (embedding, Gemma RMSNorm, q/k norm, partial NEOX
// RoPE, GQA causal attention, sigmoid router with bias selection and renormalised unbiased scores,
// SwiGLU-OAI experts + shared expert, final norm, lm_head). MXFP4 weights are dequantised with the format
// reference (mxfp4_dequant_row), everything else is float64. The sequence stays inside one MSA block, where
// block selection keeps every causal key, so plain causal attention is the same math.
//
// Two activation modes:
// - fp32 (--mxfp4-activations fp32): the engine's fp32 activations against exact weights. Tolerance 1e-4
//   max-abs on every logit, the golden tolerance of an FP32 engine against its float64 reference (the
//   engine rounds each operation to fp32: about 1e-6 relative, measured below 1e-5 here).
// - mxfp4 (W4A4, the checkpoint's default): the reference quantises each linear's input per 32 with the
//   same rule in float64 (scale from the amax exponent, "even" rounding, E2M1 ties to even). The rule is
//   discontinuous: an activation within fp32 rounding of an E2M1 midpoint can round the other way in the
//   two computations, moving that element by a grid step (up to a sixth of its block's amax), and such a
//   flip propagates. Asserted: top-1 agreement on every position, and max-abs <= 0.05 on logits of
//   magnitude about 1-3: room for a few flips, which another ISA's summation order could cause (measured
//   on the avx512 build: no flip, max-abs 6.8e-7 for W4A4 and 2.7e-6 for fp32 activations, 40 tokens,
//   prefill and decode; printed by the test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/block_dequant.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "test_tmp.h"
#include "tools/make_model.h"

namespace {

using Mat = std::vector<double>;  // row-major

struct RefModel {
  const m3::ModelConfig& c;
  m3::TensorStore st;
  bool act_mxfp4;
  RefModel(const m3::ModelConfig& cfg, bool act) : c(cfg), st(cfg.dir, m3::WeightMemory::Mmap), act_mxfp4(act) {}

  std::vector<double> plain(const std::string& name) const {
    const m3::TensorView& v = *st.find(name);
    std::vector<double> out(size_t(v.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (v.dtype == m3::DType::F32) {
        float f;
        std::memcpy(&f, v.data + 4 * i, 4);
        out[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, v.data + 2 * i, 2);
        out[i] = m3::bf16_to_float(h);
      }
    }
    return out;
  }
  // A linear's weight [N, K]: MXFP4 (weight U8 + weight_scale) dequantised, or plain.
  Mat weight(const std::string& base, bool& quantised) const {
    const m3::TensorView* w = st.find(base + ".weight");
    const m3::TensorView* s = st.find(base + ".weight_scale");
    quantised = s != nullptr;
    if (!quantised) return plain(base + ".weight");
    const int64_t N = w->shape[0], K = w->shape[1] * 2;
    Mat out(size_t(N * K));
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      m3::mxfp4_dequant_row(w->data + n * (K / 2), s->data + n * (K / 32), K, row.data());
      for (int64_t k = 0; k < K; ++k) out[size_t(n * K + k)] = row[size_t(k)];
    }
    return out;
  }

  // The dynamic MXFP4 activation rule in float64 (docs/formats.md section 4, Quark "even").
  static void qdq(std::vector<double>& x) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (size_t b = 0; b < x.size(); b += 32) {
      double amax = 0;
      for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      int k = -127;
      if (amax > 0) {
        int e;
        const double f = std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1)
        k = e - 1 + (f >= 0.875 ? 1 : 0);       // floor(log2) of amax rounded to two significant bits
      }
      const int sexp = std::clamp(k - 2, -127, 127);
      const double scale = std::ldexp(1.0, sexp);
      for (size_t i = b; i < b + 32; ++i) {
        const double v = std::fabs(x[i]) / scale;
        int best = 0;
        for (int c = 1; c < 8; ++c) {
          const double d = std::fabs(v - mag[c]), db = std::fabs(v - mag[best]);
          if (d < db || (d == db && c % 2 == 0)) best = c;  // ties: the even code
        }
        x[i] = std::copysign(mag[best] * scale, x[i]);
      }
    }
  }

  // y[T, N] = x[T, K] W^T, the input quantised first when the weight is MXFP4 and act_mxfp4.
  std::vector<double> linear(const std::string& base, std::vector<double> x, int64_t T) const {
    bool q;
    const Mat W = weight(base, q);
    const int64_t K = int64_t(x.size()) / T, N = int64_t(W.size()) / K;
    if (q && act_mxfp4)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> row(x.begin() + t * K, x.begin() + (t + 1) * K);
        qdq(row);
        std::copy(row.begin(), row.end(), x.begin() + t * K);
      }
    std::vector<double> y(size_t(T * N));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[size_t(t * K + k)] * W[size_t(n * K + k)];
        y[size_t(t * N + n)] = s;
      }
    return y;
  }

  void rmsnorm(std::vector<double>& x, int64_t dim, const std::string& w) const {
    const std::vector<double> g = plain(w);
    for (size_t r = 0; r < x.size(); r += size_t(dim)) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += x[r + i] * x[r + i];
      const double inv = 1.0 / std::sqrt(ss / double(dim) + double(c.rms_eps));
      for (int64_t i = 0; i < dim; ++i) x[r + i] = x[r + i] * inv * (1.0 + g[size_t(i)]);
    }
  }

  void rope(std::vector<double>& x, int64_t T, int heads) const {
    const int64_t D = c.head_dim, half = c.rotary_dim / 2;
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h) {
        double* v = x.data() + (t * heads + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const double th = double(t) * std::pow(c.rope_theta, -2.0 * double(i) / double(c.rotary_dim));
          const double a = v[i], b = v[i + half];
          v[i] = a * std::cos(th) - b * std::sin(th);
          v[i + half] = b * std::cos(th) + a * std::sin(th);
        }
      }
  }

  std::vector<double> swiglu_mlp(const std::string& gate, const std::string& up, const std::string& down,
                                 const std::vector<double>& m, int64_t T) const {
    std::vector<double> g = linear(gate, m, T), u = linear(up, m, T);
    for (size_t i = 0; i < g.size(); ++i) {
      const double gg = std::min(g[i], double(c.swiglu_limit));
      const double uu = std::clamp(u[i], -double(c.swiglu_limit), double(c.swiglu_limit));
      g[i] = (uu + double(c.swiglu_beta)) * gg / (1.0 + std::exp(-double(c.swiglu_alpha) * gg));
    }
    return linear(down, g, T);
  }

  std::vector<double> forward(const std::vector<int32_t>& toks) const {
    const int64_t T = int64_t(toks.size()), H = c.hidden, D = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
    const std::string P = "language_model.model.";
    const std::vector<double> emb = plain(P + "embed_tokens.weight");
    std::vector<double> h(size_t(T * H));
    for (int64_t t = 0; t < T; ++t)
      std::copy(emb.begin() + toks[size_t(t)] * H, emb.begin() + (toks[size_t(t)] + 1) * H, h.begin() + t * H);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string L = P + "layers." + std::to_string(l) + ".", A = L + "self_attn.";
      std::vector<double> a = h;
      rmsnorm(a, H, L + "input_layernorm.weight");
      std::vector<double> q = linear(A + "q_proj", a, T), k = linear(A + "k_proj", a, T), v = linear(A + "v_proj", a, T);
      rmsnorm(q, D, A + "q_norm.weight");
      rmsnorm(k, D, A + "k_norm.weight");
      rope(q, T, int(nh));
      rope(k, T, int(nkv));
      std::vector<double> o(size_t(T * nh * D), 0.0);
      const double scale = 1.0 / std::sqrt(double(D));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hh = 0; hh < nh; ++hh) {
          const int64_t g = hh / (nh / nkv);
          std::vector<double> s(size_t(t + 1));
          double mx = -1e300;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int64_t i = 0; i < D; ++i) d += q[size_t((t * nh + hh) * D + i)] * k[size_t((j * nkv + g) * D + i)];
            s[size_t(j)] = d * scale;
            mx = std::max(mx, s[size_t(j)]);
          }
          double sum = 0;
          for (auto& e : s) sum += (e = std::exp(e - mx));
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t i = 0; i < D; ++i)
              o[size_t((t * nh + hh) * D + i)] += s[size_t(j)] / sum * v[size_t((j * nkv + g) * D + i)];
        }
      const std::vector<double> ao = linear(A + "o_proj", o, T);
      for (size_t i = 0; i < h.size(); ++i) h[i] += ao[i];
      std::vector<double> m = h;
      rmsnorm(m, H, L + "post_attention_layernorm.weight");
      std::vector<double> f;
      if (!c.moe_layer[size_t(l)]) {
        f = swiglu_mlp(L + "mlp.gate_proj", L + "mlp.up_proj", L + "mlp.down_proj", m, T);
      } else {
        const std::string M = L + "block_sparse_moe.";
        const std::vector<double> wr = plain(M + "gate.weight"), bias = plain(M + "e_score_correction_bias");
        f = swiglu_mlp(M + "shared_experts.gate_proj", M + "shared_experts.up_proj", M + "shared_experts.down_proj", m, T);
        const int E = c.n_experts;
        for (int64_t t = 0; t < T; ++t) {
          // The router in fp32, as the spec says (z = float(m) . Wr^T): m rounded to float first.
          std::vector<double> sc(static_cast<size_t>(E)), key(static_cast<size_t>(E));
          for (int e = 0; e < E; ++e) {
            double z = 0;
            for (int64_t i = 0; i < H; ++i) z += double(float(m[size_t(t * H + i)])) * wr[size_t(e * H + i)];
            sc[size_t(e)] = 1.0 / (1.0 + std::exp(-z));
            key[size_t(e)] = sc[size_t(e)] + bias[size_t(e)];
          }
          std::vector<int> idx(static_cast<size_t>(E));
          for (int e = 0; e < E; ++e) idx[size_t(e)] = e;
          std::stable_sort(idx.begin(), idx.end(), [&](int a2, int b2) { return key[size_t(a2)] > key[size_t(b2)]; });
          double tot = 0;
          for (int j = 0; j < c.experts_per_tok; ++j) tot += sc[size_t(idx[size_t(j)])];
          const std::vector<double> mt(m.begin() + t * H, m.begin() + (t + 1) * H);
          for (int j = 0; j < c.experts_per_tok; ++j) {
            const int e = idx[size_t(j)];
            const std::string X = M + "experts." + std::to_string(e) + ".";
            const std::vector<double> y = swiglu_mlp(X + "w1", X + "w3", X + "w2", mt, 1);
            const double w = double(c.routed_scaling) * sc[size_t(e)] / tot;
            for (int64_t i = 0; i < H; ++i) f[size_t(t * H + i)] += w * y[size_t(i)];
          }
        }
      }
      for (size_t i = 0; i < h.size(); ++i) h[i] += f[i];
    }
    rmsnorm(h, H, P + "norm.weight");
    return linear("language_model.lm_head", h, T);
  }
};

struct Diff {
  double max_abs = 0;
  int top1_disagree = 0;
};

Diff compare(const std::vector<float>& got, const std::vector<double>& ref, int64_t T, int64_t V) {
  Diff d;
  for (int64_t t = 0; t < T; ++t) {
    int64_t ag = 0, ar = 0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = size_t(t * V + v);
      d.max_abs = std::max(d.max_abs, std::fabs(double(got[i]) - ref[i]));
      if (got[i] > got[size_t(t * V + ag)]) ag = v;
      if (ref[i] > ref[size_t(t * V + ar)]) ar = v;
    }
    d.top1_disagree += ag != ar;
  }
  return d;
}

class Mxfp4Reference : public testing::TestWithParam<const char*> {};

TEST_P(Mxfp4Reference, LogitsMatchFloat64Reference) {
  const std::string act = GetParam();
  m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31Mxfp4);
  o.seed = 5;
  const std::string dir = m3test::test_tmp_dir() + "/mxfp4_reference";
  m3::make_model(o, dir);
  m3::ModelOptions mo;
  mo.mxfp4_activations = act;
  m3::Model model(dir, mo);
  const m3::ModelConfig& c = model.config();
  ASSERT_TRUE(c.quark.on);
  ASSERT_EQ(model.mxfp4_activation_matrices() > 0, act == "mxfp4");
  const int64_t T = 40, V = c.vocab;
  ASSERT_LT(T, c.block_size);  // one MSA block: selection keeps every causal key
  std::vector<int32_t> toks(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) toks[size_t(t)] = int32_t((t * 97 + 13) % 256);
  for (bool decode : {false, true}) {
    std::vector<float> got(size_t(T * V));
    m3::SeqCache cache = model.new_cache(T);
    m3::ForwardOptions fo;
    if (decode) {
      for (int64_t t = 0; t < T; ++t) model.forward(&toks[size_t(t)], 1, cache, got.data() + t * V, fo);
    } else {
      fo.all_logits = true;
      model.forward(toks.data(), T, cache, got.data(), fo);
    }
    const RefModel ref(c, act == "mxfp4");
    const std::vector<double> r = ref.forward(toks);
    const Diff d = compare(got, r, T, V);
    std::printf("[mxfp4 %s, %s] max-abs %.3g, top-1 disagreements %d of %lld\n", act.c_str(),
                decode ? "decode" : "prefill", d.max_abs, d.top1_disagree, (long long)T);
    EXPECT_EQ(d.top1_disagree, 0);
    EXPECT_LE(d.max_abs, act == "fp32" ? 1e-4 : 0.05);
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, Mxfp4Reference, testing::Values("fp32", "mxfp4"));

}  // namespace
