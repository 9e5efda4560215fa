// Dense and MSA block-sparse attention over KVViews (see attention.h). Work is split over
// (token, GQA group) pairs; each pair reads a K/V block once and updates the online-softmax state
// of all query heads of its group.
#include "model/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "model/msa_select.h"

namespace m3 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Scratch {
  std::vector<float> kbuf, vbuf, ibuf, scores, blk_scores, acc, m, l;
  std::vector<int32_t> cand, chosen;
  std::vector<uint8_t> mask;
};

// Online softmax over blocks `blocks[0..nb)` (ascending), keys j <= pos, for the HpG heads of group g.
void attend_blocks(const CpuOps& ops, const KVView& kv, int layer, int g, int D, int HpG, const float* qg,
                   int64_t qstride, float scale, int64_t pos, int chunk, const int32_t* blocks, int nb, Scratch& s,
                   float* outg, int64_t ostride) {
  s.acc.assign(size_t(HpG) * D, 0.f);
  s.m.assign(HpG, kNegInf);
  s.l.assign(HpG, 0.f);
  if (s.kbuf.size() < size_t(chunk) * D) {
    s.kbuf.resize(size_t(chunk) * D);
    s.vbuf.resize(size_t(chunk) * D);
  }
  if (s.scores.size() < size_t(chunk)) s.scores.resize(chunk);
  for (int b = 0; b < nb; ++b) {
    const int64_t lo = int64_t(blocks[b]) * chunk;
    const int64_t n = std::min<int64_t>(pos, lo + chunk - 1) - lo + 1;
    if (n <= 0) continue;
    int64_t ks, vs;
    const float* K = kv.k_rows(layer, g, lo, n, s.kbuf.data(), &ks);
    const float* V = kv.v_rows(layer, g, lo, n, s.vbuf.data(), &vs);
    for (int hh = 0; hh < HpG; ++hh) {
      const float* qh = qg + hh * qstride;
      float bm = kNegInf;
      for (int64_t j = 0; j < n; ++j) {
        const float sc = ops.dot(qh, K + j * ks, D) * scale;
        s.scores[j] = sc;
        bm = std::max(bm, sc);
      }
      float* acc = s.acc.data() + size_t(hh) * D;
      const float mnew = std::max(s.m[hh], bm);
      if (s.m[hh] != kNegInf && mnew != s.m[hh]) {
        const float r = std::exp(s.m[hh] - mnew);
        for (int d = 0; d < D; ++d) acc[d] *= r;
        s.l[hh] *= r;
      }
      s.m[hh] = mnew;
      for (int64_t j = 0; j < n; ++j) {
        const float p = std::exp(s.scores[j] - mnew);
        s.l[hh] += p;
        ops.axpy(p, V + j * vs, acc, D);
      }
    }
  }
  for (int hh = 0; hh < HpG; ++hh) {
    const float inv = 1.0f / s.l[hh];
    const float* acc = s.acc.data() + size_t(hh) * D;
    float* o = outg + hh * ostride;
    for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
  }
}

// Oracle: every causal key is scored, keys outside the selected blocks are masked to -inf, then a
// plain two-pass softmax over the whole row.
void attend_masked(const CpuOps& ops, const KVView& kv, int layer, int g, int D, int HpG, const float* qg,
                   int64_t qstride, float scale, int64_t pos, int chunk, const std::vector<uint8_t>& block_mask,
                   Scratch& s, float* outg, int64_t ostride) {
  const int64_t n = pos + 1;
  std::vector<float> K(size_t(n) * D), V(size_t(n) * D), sc(static_cast<size_t>(n));
  for (int64_t lo = 0; lo < n; lo += chunk) {
    const int64_t m = std::min<int64_t>(chunk, n - lo);
    int64_t ks, vs;
    if (s.kbuf.size() < size_t(chunk) * D) {
      s.kbuf.resize(size_t(chunk) * D);
      s.vbuf.resize(size_t(chunk) * D);
    }
    const float* kr = kv.k_rows(layer, g, lo, m, s.kbuf.data(), &ks);
    const float* vr = kv.v_rows(layer, g, lo, m, s.vbuf.data(), &vs);
    for (int64_t j = 0; j < m; ++j) {
      std::copy(kr + j * ks, kr + j * ks + D, K.begin() + (lo + j) * D);
      std::copy(vr + j * vs, vr + j * vs + D, V.begin() + (lo + j) * D);
    }
  }
  for (int hh = 0; hh < HpG; ++hh) {
    const float* qh = qg + hh * qstride;
    float mx = kNegInf;
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = block_mask[j / chunk] ? ops.dot(qh, &K[j * D], D) * scale : kNegInf;
      mx = std::max(mx, sc[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = sc[j] == kNegInf ? 0.f : std::exp(sc[j] - mx);
      sum += sc[j];
    }
    float* o = outg + hh * ostride;
    std::fill(o, o + D, 0.f);
    for (int64_t j = 0; j < n; ++j)
      for (int d = 0; d < D; ++d) o[d] += sc[j] * V[j * D + d];
    for (int d = 0; d < D; ++d) o[d] = float(o[d] / sum);
  }
}

}  // namespace

void attention_batch(const ModelConfig& cfg, int layer, const AttnSeq* seqs, int nseq, const float* q,
                     const float* iq, AttentionPath path, float* out) {
  const CpuOps& ops = cpu_ops();
  const int D = cfg.head_dim, G = cfg.n_kv_heads, HpG = cfg.group_size();
  const int64_t qw = int64_t(cfg.n_heads) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  const bool sparse = cfg.sparse_layer[layer] && path != AttentionPath::DenseIgnoreMsa;
  const MsaParams mp = MsaParams::from(cfg);
  const int ID = cfg.index_dim;
  std::vector<int64_t> first_item(size_t(nseq) + 1, 0);
  for (int i = 0; i < nseq; ++i) first_item[i + 1] = first_item[i] + seqs[i].T * G;
  const int64_t work = first_item[nseq];

#pragma omp parallel if (work > 1)
  {
    thread_local Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < work; ++w) {
      const int si = int(std::upper_bound(first_item.begin(), first_item.end(), w) - first_item.begin()) - 1;
      const AttnSeq& sq = seqs[si];
      const int64_t local = w - first_item[si];
      const int64_t t = local / G;
      const int g = int(local % G);
      const int64_t row = sq.row0 + t, pos = sq.start + t;
      const KVView& kv = *sq.kv;
      const int chunk = kv.chunk();
      const int64_t nvis = pos / chunk + 1;
      s.chosen.resize(size_t(std::max<int64_t>(nvis, mp.topk)));
      int nsel;
      if (!sparse || msa_all_visible(pos, mp)) {
        for (int64_t c = 0; c < nvis; ++c) s.chosen[c] = int32_t(c);
        nsel = int(nvis);
      } else {
        // Index scores: raw fp32 dot products of this group's index query with every index key <= pos,
        // max-pooled per block (= page).
        const float* iqg = iq + row * int64_t(cfg.index_heads) * ID + int64_t(g) * ID;
        if (s.blk_scores.size() < size_t(nvis)) s.blk_scores.resize(size_t(nvis));
        if (s.ibuf.size() < size_t(chunk) * ID) s.ibuf.resize(size_t(chunk) * ID);
        for (int64_t c = 0; c < nvis; ++c) {
          const int64_t lo = c * chunk, n = std::min<int64_t>(pos, lo + chunk - 1) - lo + 1;
          int64_t st;
          const float* ik = kv.ik_rows(layer, lo, n, s.ibuf.data(), &st);
          float m = kNegInf;
          for (int64_t j = 0; j < n; ++j) m = std::max(m, ops.dot(iqg, ik + j * st, ID));
          s.blk_scores[c] = m;
        }
        nsel = msa_select_blocks(pos, s.blk_scores.data(), mp, s.chosen.data(), s.cand);
      }
      const float* qg = q + row * qw + int64_t(g) * HpG * D;
      float* og = out + row * qw + int64_t(g) * HpG * D;
      if (sparse && path == AttentionPath::DenseMaskOracle) {
        s.mask.assign(size_t(nvis), 0);
        for (int i = 0; i < nsel; ++i) s.mask[s.chosen[i]] = 1;
        attend_masked(ops, kv, layer, g, D, HpG, qg, D, scale, pos, chunk, s.mask, s, og, D);
      } else {
        attend_blocks(ops, kv, layer, g, D, HpG, qg, D, scale, pos, chunk, s.chosen.data(), nsel, s, og, D);
      }
    }
  }
}

}  // namespace m3
