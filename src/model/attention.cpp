// Dense and MSA block-sparse attention over KVViews (see attention.h). Work is split over
// (GQA group, token) pairs; each pair reads a K/V block once and updates the online-softmax state
// of all query heads of its group. BF16 and (where the kernels decode them in registers) FP8 / NVFP4
// cache rows are read in place. A chunk of many query tokens (prefill, verification) reads the same
// blocks once per token: when rows must be decoded to fp32 first (other quantised shapes), each
// thread keeps the blocks it decoded during this call and reuses them (speed: decoding the same rows
// for every query token was a large share of prefill time).
#include "model/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "base/aligned_vector.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/worker_pool.h"
#include "model/msa_select.h"

namespace m3 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One decoded K/V block of one group, valid during the attention_batch call tagged `epoch` (pages
// are only written between calls).
struct DecodedBlock {
  const KVView* kv = nullptr;
  int layer = -1, g = -1;
  int64_t lo = -1, n = 0, ks = 0, vs = 0;
  uint64_t epoch = 0, used = 0;
  const float *K = nullptr, *V = nullptr;
  AlignedVector<float> k, v;
};
// Below this many multiply-adds (cached positions the step's tokens see x heads x head_dim x 2, before
// block selection) attention runs on the calling thread: about 50-100 us of work on one core, what a
// region's wake-up costs on a loaded host. The router's threshold in moe.cpp is the same.
constexpr int64_t kAttentionSplitMacs = int64_t(1) << 19;
constexpr int kDecodedBlocks = 40;  // per thread: the blocks one group of a prefill chunk reads

struct Scratch {
  AlignedVector<float> kbuf, vbuf, scores, blk_scores, acc, m, l;
  std::vector<int32_t> cand, chosen;
  std::vector<uint8_t> mask;
  std::vector<DecodedBlock> decoded;
  uint64_t tick = 0;
};

// This thread's scratch (a worker's own when called from inside a pool job).
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

std::atomic<uint64_t> g_attention_epoch{0};

// K/V rows [lo, lo+n) of group g decoded to fp32, reusing this thread's decode of the same block during
// this call.
void block_rows(const KVView& kv, int layer, int g, int64_t lo, int64_t n, int D, int chunk, uint64_t epoch, Scratch& s,
                const float** K, int64_t* ks, const float** V, int64_t* vs) {
  if (s.decoded.empty()) s.decoded.resize(kDecodedBlocks);
  DecodedBlock* slot = nullptr;
  for (DecodedBlock& e : s.decoded) {
    if (e.epoch == epoch && e.kv == &kv && e.layer == layer && e.g == g && e.lo == lo) {
      slot = &e;
      if (e.n >= n) {  // rows [lo, lo+n) are a prefix of what was decoded
        e.used = ++s.tick;
        *K = e.K, *ks = e.ks, *V = e.V, *vs = e.vs;
        return;
      }
      break;
    }
  }
  if (!slot) {
    slot = &s.decoded[0];
    for (DecodedBlock& e : s.decoded)
      if (e.epoch != epoch || e.used < slot->used) {
        slot = &e;
        if (e.epoch != epoch) break;
      }
  }
  if (slot->k.size() < size_t(chunk) * D) {
    slot->k.resize(size_t(chunk) * D);
    slot->v.resize(size_t(chunk) * D);
  }
  slot->kv = &kv, slot->layer = layer, slot->g = g, slot->lo = lo, slot->n = n, slot->epoch = epoch;
  slot->used = ++s.tick;
  slot->K = kv_rows_f32(kv.k_rows(layer, g, lo), n, D, slot->k.data(), &slot->ks);
  slot->V = kv_rows_f32(kv.v_rows(layer, g, lo), n, D, slot->v.data(), &slot->vs);
  *K = slot->K, *ks = slot->ks, *V = slot->V, *vs = slot->vs;
}

// Online softmax over blocks `blocks[0..nb)` (ascending), keys j <= pos, for the HpG heads of group g.
void attend_blocks(const KVView& kv, int layer, int g, int D, int HpG, const float* qg,
                   int64_t qstride, float scale, int64_t pos, int chunk, const int32_t* blocks, int nb, Scratch& s,
                   float* outg, int64_t ostride, bool reuse, uint64_t epoch) {
  s.acc.assign(size_t(HpG) * D, 0.f);
  s.m.assign(HpG, kNegInf);
  s.l.assign(HpG, 0.f);
  if (s.scores.size() < size_t(HpG) * (chunk + 8)) s.scores.resize(size_t(HpG) * (chunk + 8));
  // Rows [lo, lo+n) of block b (n <= 0: nothing visible).
  auto block_span = [&](int b, int64_t* lo, int64_t* n) {
    *lo = int64_t(blocks[b]) * chunk;
    *n = std::min<int64_t>(pos, *lo + chunk - 1) - *lo + 1;
  };
  for (int b = 0; b < nb; ++b) {
    int64_t lo, n, lo_next = 0, n_next = 0;
    block_span(b, &lo, &n);
    if (n <= 0) continue;
    if (b + 1 < nb) block_span(b + 1, &lo_next, &n_next);
    // fp32 and BF16 rows are read in place; FP8 / NVFP4 rows too, decoded in registers, for one query
    // token, and for many when the kernel decodes this shape in registers (speed: for FP8 this beat
    // decoding each block once to scratch and reusing it; for NVFP4 they were even). Otherwise many
    // query tokens decode each block once into this thread's scratch and reuse it (block_rows).
    const KVRows K = kv.k_rows(layer, g, lo);
    if (!reuse || attention_reads_in_place(K.dtype, HpG, D)) {
      const KVRows Kn = n_next > 0 ? kv.k_rows(layer, g, lo_next) : KVRows{};
      attention_block(qg, qstride, HpG, K, kv.v_rows(layer, g, lo), n, D, scale, s.m.data(), s.l.data(), s.acc.data(),
                      s.scores.data(), Kn, n_next);
      continue;
    }
    const float *Kf, *Vf;
    int64_t ks, vs;
    block_rows(kv, layer, g, lo, n, D, chunk, epoch, s, &Kf, &ks, &Vf, &vs);
    attention_block(qg, qstride, HpG, {reinterpret_cast<const uint8_t*>(Kf), ks * 4, KVDtype::F32},
                    {reinterpret_cast<const uint8_t*>(Vf), vs * 4, KVDtype::F32}, n, D, scale, s.m.data(), s.l.data(),
                    s.acc.data(), s.scores.data(), KVRows{}, 0);
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
    const float* kr = kv_rows_f32(kv.k_rows(layer, g, lo), m, D, s.kbuf.data(), &ks);
    const float* vr = kv_rows_f32(kv.v_rows(layer, g, lo), m, D, s.vbuf.data(), &vs);
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
  // Work lists, grown only (no allocation in steady state): (token, group) items for attention and
  // (token, block) items for the index scan.
  // (thread_local storage, used through these references: inside the parallel region a
  // thread_local name would refer to each worker's own, empty, instance.)
  thread_local std::vector<int64_t> tl_first_item, tl_scan_first, tl_score_off, tl_scan_rows, tl_tile_start,
      tl_tile_first;
  thread_local std::vector<float> tl_scores;
  std::vector<int64_t>&first_item = tl_first_item, &scan_first = tl_scan_first, &score_off = tl_score_off,
  &scan_rows = tl_scan_rows, &tile_start = tl_tile_start, &tile_first = tl_tile_first;
  std::vector<float>& scores = tl_scores;
  first_item.assign(size_t(nseq) + 1, 0);
  for (int i = 0; i < nseq; ++i) first_item[i + 1] = first_item[i] + seqs[i].T * G;
  const int64_t work = first_item[nseq];
  const uint64_t epoch = ++g_attention_epoch;
  // Index scan first, for every group of a token in one pass over its index keys (each key row is
  // read once for all groups instead of once per group: at long context this scan is the only part
  // of the step that grows). score_off[row] is the row's offset into `scores` ([nvis][G]).
  int64_t rows = 0;
  for (int i = 0; i < nseq; ++i) rows = std::max(rows, seqs[i].row0 + seqs[i].T);
  score_off.assign(size_t(rows) + 1, -1);
  scan_first.assign(1, 0);
  int64_t nscores = 0;
  scan_rows.clear();  // (seq << 40) | row
  for (int i = 0; sparse && i < nseq; ++i)
    for (int64_t t = 0; t < seqs[i].T; ++t) {
      const int64_t pos = seqs[i].start + t;
      if (msa_all_visible(pos, mp)) continue;
      const int64_t nvis = pos / seqs[i].kv->chunk() + 1;
      score_off[seqs[i].row0 + t] = nscores;
      nscores += nvis * G;
      scan_rows.push_back(int64_t(i) << 40 | (seqs[i].row0 + t));
      scan_first.push_back(scan_first.back() + nvis);
    }
  if (scores.size() < size_t(nscores)) scores.resize(size_t(nscores));
  // Scan items: (tile, block), a tile being up to kScanTile consecutive tokens of one sequence, which
  // scan the blocks they all see whole together (index_scan_tokens: BF16 and NVFP4 keys are read once
  // for the tile). A tile has as many items as its last token has visible blocks. Decode steps (one
  // token per sequence) have tiles of one token.
  constexpr size_t kScanTile = 4;
  constexpr int64_t kRowMask = (int64_t(1) << 40) - 1;
  tile_start.clear();
  tile_first.assign(1, 0);
  for (size_t r = 0; r < scan_rows.size();) {
    size_t e = r + 1;
    while (e < scan_rows.size() && e - r < kScanTile && (scan_rows[e] >> 40) == (scan_rows[r] >> 40) &&
           (scan_rows[e] & kRowMask) == (scan_rows[e - 1] & kRowMask) + 1)
      ++e;
    tile_start.push_back(int64_t(r));
    tile_first.push_back(tile_first.back() + scan_first[e] - scan_first[e - 1]);
    r = e;
  }
  tile_start.push_back(int64_t(scan_rows.size()));
  const int64_t scan_work = tile_first.back();

  const int64_t scan_chunk = index_scan_chunk(scan_work);
  // A step whose attention is small (a few hundred cached positions in all: a decode step at short
  // context) runs it on the calling thread: the threshold was set when a split cost an OpenMP region's
  // wake-up, up to ~100 us on a shared 2-core host (dev/omp_region_bench.cpp; docs/benchmarks.md
  // section 3.4), and is kept for the worker pool's hand-off. Each
  // (token, group) item computes the same either way.
  int64_t attended = 0;  // cached positions the step's tokens see, all heads (before block selection)
  for (int i = 0; i < nseq; ++i) attended += seqs[i].T * (seqs[i].start + seqs[i].T) * cfg.n_heads;
  const bool split = (work > 1 || scan_work > 1) && (scan_work > 0 || attended * D * 2 > kAttentionSplitMacs);
  // Index scan items, in chunks of scan_chunk items.
  auto scan_item = [&](int64_t w) {
    const size_t ti = size_t(std::upper_bound(tile_first.begin(), tile_first.end(), w) - tile_first.begin()) - 1;
    const int64_t c = w - tile_first[ti];
    const AttnSeq& sq = seqs[int(scan_rows[size_t(tile_start[ti])] >> 40)];
    const KVView& kv = *sq.kv;
    const int chunk = kv.chunk();
    // Index scores: raw fp32 dot products of each group's index query with every index key <= pos,
    // max-pooled per block (= page). Tokens that see all of block c scan it together.
    const int64_t lo = c * chunk;
    const float* full_q[kScanTile];
    float* full_m[kScanTile];
    int nfull = 0;
    for (int64_t r = tile_start[ti]; r < tile_start[ti + 1]; ++r) {
      const int64_t row = scan_rows[size_t(r)] & kRowMask, pos = sq.start + (row - sq.row0);
      if (pos / chunk < c) continue;  // block c is not visible to this token
      const int64_t n = std::min<int64_t>(pos, lo + chunk - 1) - lo + 1;
      const float* iqr = iq + row * int64_t(cfg.index_heads) * ID;
      float* m = scores.data() + score_off[row] + c * G;
      for (int g = 0; g < G; ++g) m[g] = kNegInf;
      if (n == chunk) {
        full_q[nfull] = iqr, full_m[nfull++] = m;
      } else {
        index_scan_block(kv, layer, lo, n, iqr, ID, G, m);
      }
    }
    index_scan_tokens(kv, layer, lo, chunk, nfull, full_q, ID, G, full_m);
  };
  // Attention items: one (token, group) each.
  auto attend_item = [&](int64_t w, Scratch& s) {
    const int si = int(std::upper_bound(first_item.begin(), first_item.end(), w) - first_item.begin()) - 1;
    const AttnSeq& sq = seqs[si];
    const int64_t local = w - first_item[si];
    // Group-major: a thread walks the tokens of one group, whose blocks it can reuse.
    const int64_t t = local % sq.T;
    const int g = int(local / sq.T);
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
      if (s.blk_scores.size() < size_t(nvis)) s.blk_scores.resize(size_t(nvis));
      const float* sc = scores.data() + score_off[row];
      for (int64_t c = 0; c < nvis; ++c) s.blk_scores[c] = sc[c * G + g];
      nsel = msa_select_blocks(pos, s.blk_scores.data(), mp, s.chosen.data(), s.cand);
    }
    const float* qg = q + row * qw + int64_t(g) * HpG * D;
    float* og = out + row * qw + int64_t(g) * HpG * D;
    if (sparse && path == AttentionPath::DenseMaskOracle) {
      s.mask.assign(size_t(nvis), 0);
      for (int i = 0; i < nsel; ++i) s.mask[s.chosen[i]] = 1;
      attend_masked(ops, kv, layer, g, D, HpG, qg, D, scale, pos, chunk, s.mask, s, og, D);
    } else {
      attend_blocks(kv, layer, g, D, HpG, qg, D, scale, pos, chunk, s.chosen.data(), nsel, s, og, D, sq.T > 1,
                    epoch);
    }
  };
  if (!split) {
    Scratch& s = thread_scratch();
    for (int64_t w = 0; w < scan_work; ++w) scan_item(w);
    for (int64_t w = 0; w < work; ++w) attend_item(w, s);
    return;
  }
  // Shared over the worker pool, items claimed from a counter (the caller alone finishes any of them a
  // worker did not take); the scan completes before attention reads its scores.
  const int nthreads = WorkerPool::threads();
  if (scan_work > 0) {
    std::atomic<int64_t> next{0};
    WorkerPool::run(nthreads, [&](int) {
      for (int64_t w0; (w0 = next.fetch_add(scan_chunk, std::memory_order_relaxed)) < scan_work;)
        for (int64_t w = w0; w < std::min(w0 + scan_chunk, scan_work); ++w) scan_item(w);
    });
  }
  std::atomic<int64_t> next{0};
  WorkerPool::run(nthreads, [&](int) {
    Scratch& s = thread_scratch();
    for (int64_t w; (w = next.fetch_add(1, std::memory_order_relaxed)) < work;) attend_item(w, s);
  });
}

int64_t index_scan_chunk(int64_t items) {
  return std::clamp<int64_t>(items / (4 * int64_t(WorkerPool::threads())), 1, 8);
}

void index_scan_block(const KVView& kv, int layer, int64_t lo, int64_t n, const float* iq, int ID, int G, float* m) {
  attention_max_dots(iq, ID, G, kv.ik_rows(layer, lo), n, ID, m);
}

void index_scan_tokens(const KVView& kv, int layer, int64_t lo, int64_t n, int Q, const float* const* iq, int ID,
                       int G, float* const* m) {
  attention_max_dots_multi(Q, iq, ID, G, kv.ik_rows(layer, lo), n, ID, m);
}

}  // namespace m3
