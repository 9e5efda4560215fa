// Run-time ISA dispatch: the kernel table compiled for generic x86-64, AVX2+FMA and AVX-512 is
// chosen once from cpuid (cpu_features.h), or forced with M3_ISA=generic|avx2|avx512 for parity tests.
// Each ISA's table is two parts, each compiled with that ISA's flags in its own translation unit:
// LinearOps (linear_generic.cpp, linear_avx2.cpp, linear_avx512.cpp) and AttentionOps
// (attention_generic.cpp, attention_avx2.cpp, attention_avx512.cpp).
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_format.h"
#include "kernels/cpu/linear.h"

namespace m3 {

// Hands out the next row range [*r0, *r1) of a matmul (whole tiles) to the calling thread; false
// when it has no more for this call.
using RowClaim = bool (*)(void* ctx, int64_t* r0, int64_t* r1);

struct LinearOps {
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a*x
  // Rows [r0, r1) of y[T, N] = x[T, K] · Wᵀ; scratch holds at least kLinearTileRows * K floats.
  void (*linear_rows)(const Linear& W, const float* x, int64_t T, float* y, int64_t r0, int64_t r1, float* scratch);
  // The same for every range claim(ctx, ...) hands out, with the per-call set-up (activation copies,
  // scale tables) done once for all of them; each row's result equals linear_rows'.
  void (*linear_rows_claimed)(const Linear& W, const float* x, int64_t T, float* y, RowClaim claim, void* ctx,
                              float* scratch);
  void (*decode_rows)(const Linear& W, int64_t r0, int64_t n, float* out);
};

struct AttentionOps {
  // MSA index scan: m[h] = max(m[h], max_j q_h · k_j) for h < H, j < n, with q_h = q + h*qs and
  // k_j = k + j*ks (D floats each).
  void (*max_dots)(const float* q, int64_t qs, int H, const float* k, int64_t ks, int64_t n, int D, float* m);
  // One block of n keys of online-softmax attention for H query heads (scores scaled by `scale`).
  // State per head: m[H] running max (-inf before the first block), l[H] running sum of exp,
  // acc[H*D] unnormalised output. scratch holds at least H * (n + 8) floats. K_next (nullable): the
  // n_next K rows (stride ks_next) of the block the caller attends next, prefetched meanwhile.
  void (*attn_block)(const float* q, int64_t qs, int H, const float* K, int64_t ks, const float* V, int64_t vs,
                     int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                     const float* K_next, int64_t ks_next, int64_t n_next);
  // The same two kernels over BF16 rows (strides in elements), read in place from a BF16 cache;
  // results equal the fp32 kernels' on the widened rows.
  void (*max_dots_bf16)(const float* q, int64_t qs, int H, const uint16_t* k, int64_t ks, int64_t n, int D, float* m);
  void (*attn_block_bf16)(const float* q, int64_t qs, int H, const uint16_t* K, int64_t ks, const uint16_t* V,
                          int64_t vs, int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                          const uint16_t* K_next, int64_t ks_next, int64_t n_next);
  // n cache rows of `dim` elements (stride_bytes apart) decoded to fp32 [n, dim], exactly as
  // kv_decode_row (kv_format.h) with scale 1 (fp32, BF16, FP8 E4M3, NVFP4 with per-16 E4M3 scales).
  void (*decode_kv_rows)(KVDtype kind, const uint8_t* src, int64_t stride_bytes, int64_t n, int dim, float* out);
  // The index scan (as max_dots) over n quantised cache rows of `kind` (FP8 or NVFP4, scale 1) read in
  // place, stride_bytes apart; equals max_dots over the rows decode_kv_rows writes, bit for bit.
  void (*max_dots_rows)(KVDtype kind, const float* q, int64_t qs, int H, const uint8_t* k, int64_t stride_bytes,
                        int64_t n, int D, float* m);
  // attn_block over quantised K / V cache rows of `kind` (FP8 or NVFP4, scale 1) read in place,
  // kb / vb bytes apart (K_next: kb_next apart); equals attn_block over the rows decode_kv_rows
  // writes, bit for bit.
  void (*attn_block_rows)(KVDtype kind, const float* q, int64_t qs, int H, const uint8_t* K, int64_t kb, const uint8_t* V,
                          int64_t vb, int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                          const uint8_t* K_next, int64_t kb_next, int64_t n_next);
  // Whether attn_block_rows decodes rows of this kind and shape in registers; if not, it decodes the
  // block to scratch first, and a caller with many query tokens does better decoding once and reusing.
  bool (*attn_block_rows_in_registers)(KVDtype kind, int H, int D);
  // max_dots_bf16 for Q query tokens over the same keys (prefill: consecutive tokens scan the same
  // blocks): q[i] token i's H heads (qs apart), m[i] its H running maxima; each token's results are
  // those of max_dots_bf16 on its own.
  void (*max_dots_bf16_multi)(int Q, const float* const* q, int64_t qs, int H, const uint16_t* k, int64_t ks,
                              int64_t n, int D, float* const* m);
  // max_dots_rows for Q query tokens over the same quantised rows (as max_dots_bf16_multi).
  void (*max_dots_rows_multi)(KVDtype kind, int Q, const float* const* q, int64_t qs, int H, const uint8_t* k,
                              int64_t stride_bytes, int64_t n, int D, float* const* m);
};

// One ISA's whole table (callers read the members of both parts: ops.linear_rows, ops.attn_block).
struct CpuOps : LinearOps, AttentionOps {
  const char* name;
};

constexpr int kLinearTileRows = 4;
// Steps of this many tokens or more run the AVX2 build's lane GEMM (lane_gemm.h) on panels of
// kLanePanelRows rows (4 tiles); the parallel matmul hands such steps whole panels. Below it the
// decoded tile's dot products win: the lane GEMM decodes and transposes each panel once per call
// (figures: docs/benchmarks.md, perf notes).
constexpr int64_t kLaneGemmMinTokens = 64;
constexpr int kLanePanelRows = 16;
// linear_forward_many runs a step of more tokens than lane_slice_tokens(K) as near-equal slices (same
// bits: each output depends on its own token only). That bounds the lane GEMM's per-thread packed copy
// of the activations, which every 16-row panel streams once: at most 512 tokens (an 8192-token prefill
// chunk on a 64-thread server would otherwise hold 64 copies of its x), and at most 512 x 2048 floats
// (4 MB) for wider matrices, down to 128 tokens. Speed: a whole 512-token x of a 6144-wide product
// (12.6 MB per thread) falls out of the caches (figures: docs/benchmarks.md section 5).
constexpr int64_t kLaneGemmMaxTokens = 512;
constexpr int64_t kLaneGemmMaxFloats = kLaneGemmMaxTokens * 2048;
inline int64_t lane_slice_tokens(int64_t K) {
  const int64_t fit = kLaneGemmMaxFloats / (K > 0 ? K : 1);
  return fit >= kLaneGemmMaxTokens ? kLaneGemmMaxTokens : fit < 2 * kLaneGemmMinTokens ? 2 * kLaneGemmMinTokens : fit;
}


const CpuOps& cpu_ops();
// The table for one ISA by name, or nullptr when this CPU cannot run it.
const CpuOps* cpu_ops_for(const char* isa);

// The parts each ISA's translation units define.
namespace isa_generic { extern const LinearOps kLinearOps; extern const AttentionOps kAttentionOps; }
namespace isa_avx2 { extern const LinearOps kLinearOps; extern const AttentionOps kAttentionOps; }
namespace isa_avx512 { extern const LinearOps kLinearOps; extern const AttentionOps kAttentionOps; }

}  // namespace m3
