// Dense and MSA block-sparse attention (see attention.h). All scores, softmax and sums in fp32.
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

struct KeyRange {
  int64_t lo, hi;  // inclusive
};

// Softmax attention of one query head over the key ranges (ascending positions).
void attend_ranges(const CpuOps& ops, const SeqCache& cache, int layer, int kv_head, int D, const float* qh,
                   float scale, const KeyRange* ranges, int nranges, std::vector<float>& scores, float* out) {
  int64_t n = 0;
  for (int r = 0; r < nranges; ++r) n += ranges[r].hi - ranges[r].lo + 1;
  if (scores.size() < size_t(n)) scores.resize(size_t(n));
  float mx = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (int r = 0; r < nranges; ++r)
    for (int64_t j = ranges[r].lo; j <= ranges[r].hi; ++j, ++i) {
      const float s = ops.dot(qh, cache.k_at(layer, j) + kv_head * D, D) * scale;
      scores[i] = s;
      mx = std::max(mx, s);
    }
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    scores[t] = std::exp(scores[t] - mx);
    sum += scores[t];
  }
  std::fill(out, out + D, 0.f);
  i = 0;
  for (int r = 0; r < nranges; ++r)
    for (int64_t j = ranges[r].lo; j <= ranges[r].hi; ++j, ++i)
      ops.axpy(scores[i], cache.v_at(layer, j) + kv_head * D, out, D);
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

// Oracle: scores over every causal key, non-selected blocks masked to -inf, then softmax.
void attend_masked(const CpuOps& ops, const SeqCache& cache, int layer, int kv_head, int D, const float* qh,
                   float scale, int64_t pos, const std::vector<uint8_t>& block_mask, int B, std::vector<float>& scores,
                   float* out) {
  const int64_t n = pos + 1;
  if (scores.size() < size_t(n)) scores.resize(size_t(n));
  const float ninf = -std::numeric_limits<float>::infinity();
  float mx = ninf;
  for (int64_t j = 0; j < n; ++j) {
    const float s = block_mask[j / B] ? ops.dot(qh, cache.k_at(layer, j) + kv_head * D, D) * scale : ninf;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = scores[j] == ninf ? 0.f : std::exp(scores[j] - mx);
    sum += scores[j];
  }
  std::fill(out, out + D, 0.f);
  for (int64_t j = 0; j < n; ++j)
    if (scores[j] != 0.f) ops.axpy(scores[j], cache.v_at(layer, j) + kv_head * D, out, D);
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

}  // namespace

void attention_step(const ModelConfig& cfg, int layer, const SeqCache& cache, int64_t start, int64_t T,
                    const float* q, const float* iq, AttentionPath path, float* out, MsaSelection* record) {
  const CpuOps& ops = cpu_ops();
  const int D = cfg.head_dim, G = cfg.n_kv_heads, HpG = cfg.group_size();
  const int qw = cfg.n_heads * D;
  const float scale = 1.0f / std::sqrt(float(D));
  const bool sparse = cfg.sparse_layer[layer] && path != AttentionPath::DenseIgnoreMsa;
  const MsaParams mp = sparse ? MsaParams::from(cfg) : MsaParams{};
  const int B = sparse ? cfg.block_size : 1;
  const int ID = cfg.index_dim;
  const int64_t work = T * G;

#pragma omp parallel
  {
    thread_local std::vector<float> scores, tok_scores, blk_scores;
    thread_local std::vector<int32_t> cand, chosen;
    thread_local std::vector<KeyRange> ranges;
    thread_local std::vector<uint8_t> mask;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t t = w / G;
      const int g = int(w % G);
      const int64_t pos = start + t;
      ranges.clear();
      int nsel = 0;
      if (!sparse) {
        ranges.push_back({0, pos});
      } else {
        const int64_t nvis = msa_visible_blocks(pos, B);
        chosen.resize(size_t(std::max<int64_t>(mp.topk, 1)));
        if (msa_all_visible(pos, mp)) {
          for (int64_t c = 0; c < nvis; ++c) chosen[c] = int32_t(c);
          nsel = int(nvis);
        } else {
          // Index scores: raw fp32 dot products of this group's index query with every key <= pos,
          // max-pooled per block.
          const float* iqg = iq + t * int64_t(cfg.index_heads) * ID + int64_t(g) * ID;
          if (blk_scores.size() < size_t(nvis)) blk_scores.resize(size_t(nvis));
          for (int64_t c = 0; c < nvis; ++c) {
            const int64_t lo = c * B, hi = std::min<int64_t>(pos, lo + B - 1);
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = lo; j <= hi; ++j) m = std::max(m, ops.dot(iqg, cache.ik_at(layer, j), ID));
            blk_scores[c] = m;
          }
          nsel = msa_select_blocks(pos, blk_scores.data(), mp, chosen.data(), cand);
        }
        if (record) {
          int32_t* dst = record->sel + (t * record->n_groups + g) * record->topk;
          std::fill(dst, dst + record->topk, -1);
          std::copy(chosen.begin(), chosen.begin() + nsel, dst);
          record->nsel[t * record->n_groups + g] = nsel;
        }
        // Merge adjacent selected blocks into key ranges; the own block stops at pos.
        for (int i = 0; i < nsel; ++i) {
          const int64_t lo = int64_t(chosen[i]) * B, hi = std::min<int64_t>(pos, lo + B - 1);
          if (!ranges.empty() && ranges.back().hi + 1 == lo) {
            ranges.back().hi = hi;
          } else {
            ranges.push_back({lo, hi});
          }
        }
        if (path == AttentionPath::DenseMaskOracle) {
          mask.assign(size_t(nvis), 0);
          for (int i = 0; i < nsel; ++i) mask[chosen[i]] = 1;
        }
      }
      for (int hh = 0; hh < HpG; ++hh) {
        const int h = g * HpG + hh;
        const float* qh = q + t * qw + h * D;
        float* oh = out + t * qw + h * D;
        if (sparse && path == AttentionPath::DenseMaskOracle) {
          attend_masked(ops, cache, layer, g, D, qh, scale, pos, mask, B, scores, oh);
        } else {
          attend_ranges(ops, cache, layer, g, D, qh, scale, ranges.data(), int(ranges.size()), scores, oh);
        }
      }
    }
  }
}

}  // namespace m3
