// Attention of one layer for a step of T query tokens at positions start..start+T-1 over a
// SeqCache that already holds their K/V (and index keys): dense causal GQA, or MSA block-sparse
// attention that gathers only the selected blocks. A dense-with-mask path is kept as a test oracle.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/kv_cache.h"

namespace m3 {

enum class AttentionPath {
  Sparse,           // the model: real block-sparse attention over the selected blocks
  DenseMaskOracle,  // test oracle: full causal scores with the non-selected blocks masked
  DenseIgnoreMsa,   // plain dense causal attention on every layer (not the model; shows MSA matters)
};

// Per-(token, group) selected blocks, token-major: sel[(t * n_groups + g) * topk + i], count in nsel.
struct MsaSelection {
  int topk = 0, n_groups = 0;
  int32_t* sel = nullptr;
  int32_t* nsel = nullptr;
};

// q: [T, n_heads*head_dim] post-norm post-RoPE; iq: [T, index_heads*index_dim] (sparse layers,
// else nullptr); out: [T, n_heads*head_dim]. If `record` is non-null the chosen blocks are written there.
void attention_step(const ModelConfig& cfg, int layer, const SeqCache& cache, int64_t start, int64_t T,
                    const float* q, const float* iq, AttentionPath path, float* out, MsaSelection* record = nullptr);

}  // namespace m3
