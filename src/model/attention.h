// Attention of one layer for a batch of sequences, each contributing T query tokens at positions
// start..start+T-1 whose K/V (and index keys) are already in its KVView: dense causal GQA, or MSA
// block-sparse attention that reads only the selected blocks (pages). Softmax is computed online
// block by block in fp32. A dense-with-mask path is kept as a test oracle.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/kv_view.h"

namespace m3 {

enum class AttentionPath {
  Sparse,           // the model: real block-sparse attention over the selected blocks
  DenseMaskOracle,  // test oracle: full causal scores with the non-selected blocks masked
  DenseIgnoreMsa,   // plain dense causal attention on every layer (not the model; shows MSA matters)
};

// Rows [row0, row0 + T) of the step's q / iq / out matrices belong to this sequence.
struct AttnSeq {
  const KVView* kv;
  int64_t start;
  int64_t T;
  int64_t row0;
};

// q: [rows, n_heads*head_dim] post-norm post-RoPE; iq: [rows, index_heads*index_dim] (sparse
// layers, else nullptr); out: [rows, n_heads*head_dim].
void attention_batch(const ModelConfig& cfg, int layer, const AttnSeq* seqs, int nseq, const float* q,
                     const float* iq, AttentionPath path, float* out);

// The MSA index scan of one block: m[g] = max(m[g], iq_g · k_j) over the index keys j in [lo, lo+n)
// of one page, for the G groups' index queries (iq_g = iq + g*ID), the keys read in place
// (attention_max_dots).
void index_scan_block(const KVView& kv, int layer, int64_t lo, int64_t n, const float* iq, int ID, int G, float* m);
// OpenMP chunk for a step's index-scan items ((tile, block) pairs, consecutive blocks of one tile
// next to each other): up to 8 blocks per grab, so that each thread streams a run of a sequence's
// pages (consecutive in the pool when they were allocated together) instead of every other page, and
// at least 4 grabs per thread for balance. Speed: the hardware's stream prefetch follows one thread's
// run of pages; each thread alone keeps few misses in flight.
int64_t index_scan_chunk(int64_t items);

// index_scan_block for Q tokens over the same n keys (iq[i], m[i]: token i's index queries and maxima),
// each with the results it gets alone; over BF16 and (avx512) NVFP4 index keys the keys are read and
// decoded once for all Q tokens.
void index_scan_tokens(const KVView& kv, int layer, int64_t lo, int64_t n, int Q, const float* const* iq, int ID,
                       int G, float* const* m);

}  // namespace m3
