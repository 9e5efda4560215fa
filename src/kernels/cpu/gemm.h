// Dense fp32 GEMM for compute-bound products of many rows (the vision tower: hundreds to thousands of
// patch rows per matrix), and the bidirectional attention built on it. linear.h's kernels are made for
// the memory-bound decode step (few rows, weights streamed once); here the weights are reused by every
// row, so the work is blocked for the caches instead: a block of B (the weight) is widened to fp32 once
// into a cache-resident panel and a register-tiled micro-kernel runs every row over it (gemm_kernels.h).
// BF16 weights stay BF16 in memory (their widening is exact); products and sums are fp32 FMAs.
// Each output element is the same sum in the same order whatever M, the row split or the thread count:
// bias, then blocks of kGemmKc along K in order, each summed k by k (so a row's result does not depend
// on the other rows in the call: images in one batch give the same bits as alone).
#pragma once
#include <cstdint>

#include "kernels/cpu/linear.h"

namespace m3 {

constexpr int64_t kGemmKc = 256;  // K block (see above)

// The right operand: element (n, k) of the [N, K] matrix B at p[n * ld + k] (weight form, y = x Bᵀ) or,
// with kn, at p[k * ld + n] (a [K, N] matrix, y = x B: attention's values).
struct GemmB {
  const void* p = nullptr;
  bool bf16 = false;  // elements BF16 (else F32)
  bool kn = false;
  int64_t ld = 0;
};

// B widened and laid out for the micro-kernel once, for products that reuse it many times
// (attention: one head's keys for every block of queries).
struct GemmPacked {
  AlignedVector<float> data;
  int64_t N = 0, K = 0;
};
void gemm_pack(const GemmB& B, int64_t N, int64_t K, GemmPacked& out);

// C[M, N] (row stride ldc) = A[M, K] (row stride lda) · B (+ bias[N] when not null), on the calling
// thread (for callers that thread over independent products themselves).
void gemm_serial(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const GemmB& B, float* C, int64_t ldc,
                 const float* bias);
void gemm_serial_packed(int64_t M, const float* A, int64_t lda, const GemmPacked& B, float* C, int64_t ldc,
                        const float* bias);
// The same split over the OpenMP threads (blocks of rows x columns, claimed dynamically).
void gemm_parallel(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const GemmB& B, float* C,
                   int64_t ldc, const float* bias);

// Whether gemm_linear takes W (untiled F32 or BF16).
bool gemm_supports(const Linear& W);
// y[T, W.N] = x[T, W.K] · Wᵀ (+ bias), threaded; W must satisfy gemm_supports.
void gemm_linear(const Linear& W, const float* bias, const float* x, int64_t T, float* y);

// Bidirectional softmax attention of n tokens, each head on its own: for head h < heads,
// out[i, h D .. h D + D) = softmax_j(scale q_i·k_j) v_j over j < n, with q_i = q + i ld + h D (k, v
// likewise; out's rows ld apart too). Threaded over heads and blocks of queries; fp32 throughout
// (scores, the row max, exp, the sums, the products; the output divided by the row's sum at the end).
void attention_dense(const float* q, const float* k, const float* v, int64_t ld, int64_t n, int heads, int D,
                     float scale, float* out);

// x[0, n) <- x Phi(x), the erf GELU, threaded (fp32; a vector erfc where the ISA has AVX2, else
// std::erfc; errors in gemm_kernels.h).
void gelu_erf(float* x, int64_t n);

// The ISA's micro-kernel shape and block routines (gemm_kernels.h), chosen with cpu_ops()'s ISA.
struct GemmOps {
  const char* name;
  int nr;  // columns per packed panel
  // Packs columns [n0, n0 + nc) and rows [k0, k0 + kc) of B: ceil(nc / nr) panels of [kc][nr], zero
  // padded past nc; panel p at out + p * kc * nr.
  void (*pack)(const GemmB& B, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float* out);
  // C[m, nc] += A[m, kc] · (the packed panels): panel p at Bp + p * pstride, its rows kc long.
  void (*block)(int64_t m, int64_t nc, int64_t kc, const float* A, int64_t lda, const float* Bp, int64_t pstride,
                float* C, int64_t ldc);
  // Each row i of s[rows, n] (ld apart) to exp(scale (row - its max)), in place, the row's sum to
  // sums[i] (fp32).
  void (*softmax_rows)(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* sums);
  // x <- GELU(x) (erf form), in place.
  void (*gelu)(float* x, int64_t n);
};
const GemmOps& gemm_ops();
namespace isa_generic { extern const GemmOps kGemmOps; }
namespace isa_avx2 { extern const GemmOps kGemmOps; }
namespace isa_avx512 { extern const GemmOps kGemmOps; }

}  // namespace m3
