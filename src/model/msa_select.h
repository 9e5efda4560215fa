// MSA block selection (docs/model.md 4.5-4.8): for one query position and one GQA group, given the
// max-pooled index score of every visible block, keep the forced blocks (init + local) and the
// best-scoring others up to top-k. Ties break towards the lower block index.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace m3 {

struct MsaParams {
  int block_size = 128;
  int topk = 16;
  int local_blocks = 1;
  int init_blocks = 0;
  static MsaParams from(const ModelConfig& c) { return {c.block_size, c.topk_blocks, c.local_blocks, c.init_blocks}; }
};

// Number of blocks visible to a query at `pos` (blocks 0 .. pos/B).
inline int64_t msa_visible_blocks(int64_t pos, int block_size) { return pos / block_size + 1; }

// True when every visible block is kept, so no scores are needed (pos < topk * B).
inline bool msa_all_visible(int64_t pos, const MsaParams& p) {
  return msa_visible_blocks(pos, p.block_size) <= p.topk;
}

// Selects blocks for a query at `pos` from `block_scores` (one per visible block; the query's own
// block may hold the max over keys <= pos). Writes the chosen block ids in ascending order to
// `out` (capacity >= topk) and returns their count. `scratch` holds candidate ids.
int msa_select_blocks(int64_t pos, const float* block_scores, const MsaParams& p, int32_t* out,
                      std::vector<int32_t>& scratch);

}  // namespace m3
