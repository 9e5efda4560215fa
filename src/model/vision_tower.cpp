// The M3 vision tower's forward pass (see vision_tower.h). Matmuls and attention go through the
// compute-bound GEMM (kernels/cpu/gemm.h: BF16 / F32 weights widened per cache block, multithreaded,
// register-tiled); layer norms, softmax and all accumulations are fp32.
#include "model/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "model/tensor_loader.h"

namespace m3 {
namespace {

const std::string kVM = "vision_tower.vision_model.";

void add_bias(float* y, int64_t T, int64_t N, const std::vector<float>& b) {
#pragma omp parallel for schedule(static) if (T * N > 65536)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) y[t * N + n] += b[size_t(n)];
}

void layer_norm(const float* x, int64_t T, int64_t H, const std::vector<float>& w, const std::vector<float>& b,
                float eps, float* y) {
#pragma omp parallel for schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    const float* r = x + t * H;
    float mean = 0.f;
    for (int64_t i = 0; i < H; ++i) mean += r[i];
    mean /= float(H);
    float var = 0.f;
    for (int64_t i = 0; i < H; ++i) var += (r[i] - mean) * (r[i] - mean);
    var /= float(H);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < H; ++i) y[t * H + i] = (r[i] - mean) * inv * w[size_t(i)] + b[size_t(i)];
  }
}


// y = x W^T (+ b): the compute-bound GEMM (kernels/cpu/gemm.h) for F32 / BF16 rows, which every
// vision matrix is; the shared linear kernels otherwise.
void matmul(const Linear& W, const std::vector<float>* b, const float* x, int64_t T, float* y) {
  if (gemm_supports(W)) {
    gemm_linear(W, b ? b->data() : nullptr, x, T, y);
    return;
  }
  linear_forward(W, x, T, y);
  if (b) add_bias(y, T, W.N, *b);
}

// y = x W^T + b.
void affine(const Linear& W, const std::vector<float>& b, const float* x, int64_t T, float* y) { matmul(W, &b, x, T, y); }

}  // namespace

std::vector<VisionGrid> attention_segments(const std::vector<VisionGrid>& grids, int max_frames) {
  std::vector<VisionGrid> out;
  for (const auto& g : grids) {
    if (max_frames <= 0 || g.t <= max_frames) {
      out.push_back(g);
      continue;
    }
    for (int t0 = 0; t0 < g.t; t0 += max_frames) out.push_back({std::min(max_frames, g.t - t0), g.h, g.w});
  }
  return out;
}

VisionTower::VisionTower(const VisionConfig& cfg, const TensorStore& store) : cfg_(cfg) {
  if (!cfg.present) throw Error(store.dir() + ": config.json has no vision_config (no vision tower to load)");
  TensorLoader ld(store);
  const int64_t H = cfg.hidden, I = cfg.intermediate, PH = cfg.projector_hidden, TH = cfg.text_hidden;
  {
    const TensorView& w = ld.tensor(kVM + "embeddings.patch_embedding.weight");
    ld.expect_dtype(w, {DType::F32}, "F32 (the patch embedding is kept in float32)");
    ld.expect_shape(w, {H, 3, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size});
    // Conv3d with kernel == stride over a (C, T, P, P) patch vector is a [H, patch_dim] matmul.
    patch_embed_.kind = LinearKind::F32;
    patch_embed_.N = H;
    patch_embed_.K = cfg.patch_dim();
    patch_embed_.w = w.data;
    patch_embed_.name = w.name;
  }
  pre_ln_w_ = ld.vec(kVM + "pre_layrnorm.weight", H, false);
  pre_ln_b_ = ld.vec(kVM + "pre_layrnorm.bias", H, false);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string L = kVM + "encoder.layers." + std::to_string(l) + ".";
    Layer y;
    y.ln1_w = ld.vec(L + "layer_norm1.weight", H, false);
    y.ln1_b = ld.vec(L + "layer_norm1.bias", H, false);
    y.ln2_w = ld.vec(L + "layer_norm2.weight", H, false);
    y.ln2_b = ld.vec(L + "layer_norm2.bias", H, false);
    y.q = ld.linear(L + "self_attn.q_proj", H, H, WeightFormat::Plain);
    y.k = ld.linear(L + "self_attn.k_proj", H, H, WeightFormat::Plain);
    y.v = ld.linear(L + "self_attn.v_proj", H, H, WeightFormat::Plain);
    y.o = ld.linear(L + "self_attn.out_proj", H, H, WeightFormat::Plain);
    y.q_b = ld.vec(L + "self_attn.q_proj.bias", H, false);
    y.k_b = ld.vec(L + "self_attn.k_proj.bias", H, false);
    y.v_b = ld.vec(L + "self_attn.v_proj.bias", H, false);
    y.o_b = ld.vec(L + "self_attn.out_proj.bias", H, false);
    y.fc1 = ld.linear(L + "mlp.fc1", I, H, WeightFormat::Plain);
    y.fc2 = ld.linear(L + "mlp.fc2", H, I, WeightFormat::Plain);
    y.fc1_b = ld.vec(L + "mlp.fc1.bias", I, false);
    y.fc2_b = ld.vec(L + "mlp.fc2.bias", H, false);
    layers_.push_back(std::move(y));
  }
  // vLLM's shapes: projector vision -> projector_hidden -> text hidden; merge 4 x text hidden ->
  // projector_hidden -> text hidden (the release has projector_hidden == text hidden == 6144).
  proj1_ = ld.linear("multi_modal_projector.linear_1", PH, H, WeightFormat::Plain);
  proj2_ = ld.linear("multi_modal_projector.linear_2", TH, PH, WeightFormat::Plain);
  proj1_b_ = ld.vec("multi_modal_projector.linear_1.bias", PH, false);
  proj2_b_ = ld.vec("multi_modal_projector.linear_2.bias", TH, false);
  merge1_ = ld.linear("patch_merge_mlp.linear_1", PH, 4 * TH, WeightFormat::Plain);
  merge2_ = ld.linear("patch_merge_mlp.linear_2", TH, PH, WeightFormat::Plain);
  merge1_b_ = ld.vec("patch_merge_mlp.linear_1.bias", PH, false);
  merge2_b_ = ld.vec("patch_merge_mlp.linear_2.bias", TH, false);
}

std::vector<float> VisionTower::forward(const float* patches, const std::vector<VisionGrid>& grids) const {
  const int64_t H = cfg_.hidden, NH = cfg_.heads, D = cfg_.head_dim, I = cfg_.intermediate;
  const int M = cfg_.spatial_merge_size;
  int64_t T = 0;
  for (const auto& g : grids) {
    if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % M || g.w % M)
      throw Error("vision tower: grid " + std::to_string(g.t) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w) +
                  " (expected positive sides, h and w multiples of " + std::to_string(M) + ")");
    T += g.patches();
  }
  // From here on a video is its attention segments: RoPE t and the attention scope are per segment.
  const std::vector<VisionGrid> segs = attention_segments(grids, cfg_.segment_max_frames);
  // Segments share nothing (attention stays inside one; the rest is per patch, the merge per 2x2 window),
  // so a long batch runs a few segments at a time: the activations (about 100 bytes per patch per unit of
  // hidden width) stay bounded by kPassPatches or one segment, not by the whole video.
  if (segs.size() > 1 && T > kPassPatches) {
    std::vector<float> out;
    out.reserve(size_t(T / (M * M)) * size_t(cfg_.text_hidden));
    size_t i = 0;
    const float* p = patches;
    while (i < segs.size()) {
      std::vector<VisionGrid> pass;
      int64_t n = 0;
      do {
        n += segs[i].patches();
        pass.push_back(segs[i++]);
      } while (i < segs.size() && n + segs[i].patches() <= kPassPatches);
      const std::vector<float> part = forward(p, pass);  // each of these is one segment: no further split
      out.insert(out.end(), part.begin(), part.end());
      p += size_t(n) * size_t(cfg_.patch_dim());
    }
    return out;
  }
  // 3-D RoPE tables per patch: positions (t, h, w) in merge-window order, cos/sin over rope_dims.
  const int F = cfg_.rope_freqs(), R = cfg_.rope_dims(), half = R / 2;
  std::vector<float> cosv(size_t(T) * half), sinv(size_t(T) * half);
  std::vector<double> inv_freq(static_cast<size_t>(F));
  for (int i = 0; i < F; ++i) inv_freq[size_t(i)] = std::pow(cfg_.rope_theta, -2.0 * i / (2.0 * F));
  {
    int64_t p = 0;
    for (const auto& g : segs)
      for (int t = 0; t < g.t; ++t)
        for (int bh = 0; bh < g.h / M; ++bh)
          for (int bw = 0; bw < g.w / M; ++bw)
            for (int mh = 0; mh < M; ++mh)
              for (int mw = 0; mw < M; ++mw, ++p) {
                const int pos[3] = {t, bh * M + mh, bw * M + mw};
                for (int a = 0; a < 3; ++a)
                  for (int i = 0; i < F; ++i) {
                    // fp32 angle, as the reference's float32 outer product of positions and inv_freq.
                    const float ang = float(pos[a]) * float(inv_freq[size_t(i)]);
                    cosv[size_t(p) * half + size_t(a * F + i)] = std::cos(ang);
                    sinv[size_t(p) * half + size_t(a * F + i)] = std::sin(ang);
                  }
              }
  }
  std::vector<float> x(size_t(T * H)), h(size_t(T * H)), q(size_t(T * H)), k(size_t(T * H)), v(size_t(T * H)),
      att(size_t(T * H)), mlp(size_t(T * I));
  matmul(patch_embed_, nullptr, patches, T, h.data());
  layer_norm(h.data(), T, H, pre_ln_w_, pre_ln_b_, cfg_.layer_norm_eps, x.data());
  const float scale = 1.0f / std::sqrt(float(D));
  for (const Layer& L : layers_) {
    layer_norm(x.data(), T, H, L.ln1_w, L.ln1_b, cfg_.layer_norm_eps, h.data());
    affine(L.q, L.q_b, h.data(), T, q.data());
    affine(L.k, L.k_b, h.data(), T, k.data());
    affine(L.v, L.v_b, h.data(), T, v.data());
    // RoPE (rotate-half over the first R dims of each head; the rest pass through).
#pragma omp parallel for schedule(static) if (T > 16)
    for (int64_t p = 0; p < T; ++p)
      for (int64_t hd = 0; hd < NH; ++hd)
        for (float* z : {q.data() + p * H + hd * D, k.data() + p * H + hd * D})
          for (int i = 0; i < half; ++i) {
            const float c = cosv[size_t(p) * half + size_t(i)], s = sinv[size_t(p) * half + size_t(i)];
            const float a = z[i], b = z[i + half];
            z[i] = a * c - b * s;
            z[i + half] = b * c + a * s;
          }
    // Bidirectional attention within each image or video segment (kernels/cpu/gemm.h: per head and block of queries, the
    // scores and P·V as register-tiled GEMMs, softmax in fp32).
    int64_t off = 0;
    for (const auto& g : segs) {
      const int64_t n = g.patches();
      attention_dense(q.data() + off * H, k.data() + off * H, v.data() + off * H, H, n, int(NH), int(D), scale,
                      att.data() + off * H);
      off += n;
    }
    affine(L.o, L.o_b, att.data(), T, h.data());
    for (int64_t i = 0; i < T * H; ++i) x[size_t(i)] += h[size_t(i)];
    layer_norm(x.data(), T, H, L.ln2_w, L.ln2_b, cfg_.layer_norm_eps, h.data());
    affine(L.fc1, L.fc1_b, h.data(), T, mlp.data());
    gelu_erf(mlp.data(), T * I);
    affine(L.fc2, L.fc2_b, mlp.data(), T, h.data());
    for (int64_t i = 0; i < T * H; ++i) x[size_t(i)] += h[size_t(i)];
  }
  // No post-LayerNorm. Projector per patch, then the 2x2 merge (4 consecutive patches) and its MLP.
  const int64_t PH = cfg_.projector_hidden, TH = cfg_.text_hidden;
  std::vector<float> p1(size_t(T * PH)), p2(size_t(T * TH));
  affine(proj1_, proj1_b_, x.data(), T, p1.data());
  gelu_erf(p1.data(), T * PH);
  affine(proj2_, proj2_b_, p1.data(), T, p2.data());
  const int64_t Tm = T / (M * M);
  std::vector<float> m1(size_t(Tm * PH)), out(size_t(Tm * TH));
  affine(merge1_, merge1_b_, p2.data(), Tm, m1.data());  // [T, TH] read as [T/4, 4 TH]
  gelu_erf(m1.data(), Tm * PH);
  affine(merge2_, merge2_b_, m1.data(), Tm, out.data());
  return out;
}

}  // namespace m3
