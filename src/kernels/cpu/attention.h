// Attention over KV cache rows in whichever format they are stored (KVRows, kv_format.h): the functions
// the model calls, as it calls linear_forward for a matmul. Each dispatches on the rows' format to the
// kernel table of this CPU (dispatch.h): fp32 and BF16 rows are read in place, FP8 / NVFP4 rows read in
// place and decoded in registers where the kernels do that for the shape (else decoded to scratch first).
// Results are those of the fp32 kernels over the rows kv_decode_row writes (scale 1), bit for bit.
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_format.h"

namespace m3 {

// n rows of `dim` elements as fp32: in place for fp32 rows (*stride = their stride in floats), else
// decoded into scratch (n * dim floats; *stride = dim).
const float* kv_rows_f32(const KVRows& rows, int64_t n, int dim, float* scratch, int64_t* stride);

// The MSA index scan over n key rows: m[h] = max(m[h], max_j q_h · k_j) for h < H, q_h = q + h * qs
// (D floats each).
void attention_max_dots(const float* q, int64_t qs, int H, const KVRows& k, int64_t n, int D, float* m);
// The same for Q query tokens over the same keys (q[i], m[i]: token i's heads and maxima); each token's
// results are those of attention_max_dots on its own (BF16, FP8 and NVFP4 keys are read once for all).
void attention_max_dots_multi(int Q, const float* const* q, int64_t qs, int H, const KVRows& k, int64_t n, int D,
                              float* const* m);

// Whether attention_block reads K / V rows of this format and shape (H heads of D) without decoding them
// to scratch first (fp32, BF16, and FP8 / NVFP4 where the kernels decode in registers). A caller with
// many query tokens over rows for which this is false does better decoding once (kv_rows_f32) and reusing.
bool attention_reads_in_place(KVDtype dtype, int H, int D);

// One block of n keys of online-softmax attention for H query heads (scores scaled by `scale`), K and
// V in the same format. State per head: m[H] running max (-inf before the first block), l[H] running
// sum of exp, acc[H * D] unnormalised output; scratch holds at least H * (n + 8) floats. K_next: the
// n_next K rows of the block the caller attends next (n_next 0: none), prefetched meanwhile.
void attention_block(const float* q, int64_t qs, int H, const KVRows& K, const KVRows& V, int64_t n, int D, float scale,
                     float* m, float* l, float* acc, float* scratch, const KVRows& K_next, int64_t n_next);

}  // namespace m3
