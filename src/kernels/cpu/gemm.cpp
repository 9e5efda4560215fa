// The GEMM's blocking and threading and the dense attention on top of it (see gemm.h); the per-ISA
// packing, micro-kernel and softmax are gemm_kernels.h behind gemm_ops().
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "kernels/cpu/dispatch.h"

namespace m3 {

const GemmOps& gemm_ops() {
  // The same ISA as the kernel table (M3_ISA forces both).
  static const GemmOps& ops = [&]() -> const GemmOps& {
    const std::string isa = cpu_ops().name;
    if (isa == "avx512") return isa_avx512::kGemmOps;
    if (isa == "avx2") return isa_avx2::kGemmOps;
    return isa_generic::kGemmOps;
  }();
  return ops;
}

namespace {

constexpr int64_t kRowChunk = 512;     // rows per task: A's block of kGemmKc columns (512 KB) stays in L2
constexpr int64_t kMaxTaskPanels = 4;  // panels (of GemmOps::nr columns) per task at most

void init_rows(int64_t M, int64_t N, float* C, int64_t ldc, const float* bias) {
  for (int64_t i = 0; i < M; ++i) {
    if (bias)
      std::memcpy(C + i * ldc, bias, size_t(N) * sizeof(float));
    else
      std::memset(C + i * ldc, 0, size_t(N) * sizeof(float));
  }
}

// One task: rows [0, M) x columns [n0, n0 + nc) of C, packing B's block of each K step into buf.
void run_task(const GemmOps& ops, int64_t M, int64_t n0, int64_t nc, int64_t K, const float* A, int64_t lda,
              const GemmB& B, float* C, int64_t ldc, const float* bias, AlignedVector<float>& buf) {
  init_rows(M, nc, C + n0, ldc, bias ? bias + n0 : nullptr);
  const int64_t panels = (nc + ops.nr - 1) / ops.nr;
  for (int64_t k0 = 0; k0 < K; k0 += kGemmKc) {
    const int64_t kc = std::min(kGemmKc, K - k0);
    const size_t need = size_t(panels * kc * ops.nr);
    if (buf.size() < need) buf.resize(need);
    ops.pack(B, n0, nc, k0, kc, buf.data());
    ops.block(M, nc, kc, A + k0, lda, buf.data(), kc * ops.nr, C + n0, ldc);
  }
}

}  // namespace

void gemm_pack(const GemmB& B, int64_t N, int64_t K, GemmPacked& out) {
  const GemmOps& ops = gemm_ops();
  const int64_t panels = (N + ops.nr - 1) / ops.nr;
  out.N = N;
  out.K = K;
  out.data.resize(size_t(std::max<int64_t>(1, panels * K * ops.nr)));
  if (N > 0 && K > 0) ops.pack(B, 0, N, 0, K, out.data.data());
}

void gemm_serial(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const GemmB& B, float* C, int64_t ldc,
                 const float* bias) {
  const GemmOps& ops = gemm_ops();
  AlignedVector<float> buf;
  const int64_t step = kMaxTaskPanels * ops.nr;
  for (int64_t n0 = 0; n0 < N; n0 += step) run_task(ops, M, n0, std::min(step, N - n0), K, A, lda, B, C, ldc, bias, buf);
}

void gemm_serial_packed(int64_t M, const float* A, int64_t lda, const GemmPacked& B, float* C, int64_t ldc,
                        const float* bias) {
  const GemmOps& ops = gemm_ops();
  init_rows(M, B.N, C, ldc, bias);
  for (int64_t k0 = 0; k0 < B.K; k0 += kGemmKc) {
    const int64_t kc = std::min(kGemmKc, B.K - k0);
    ops.block(M, B.N, kc, A + k0, lda, B.data.data() + k0 * ops.nr, B.K * ops.nr, C, ldc);
  }
}

void gemm_parallel(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const GemmB& B, float* C,
                   int64_t ldc, const float* bias) {
  if (M <= 0 || N <= 0) return;
  const GemmOps& ops = gemm_ops();
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t mt = (M + kRowChunk - 1) / kRowChunk, np = (N + ops.nr - 1) / ops.nr;
  // Enough tasks for the threads to even out (cores of a shared machine run at different speeds), as
  // few as that allows (each task re-packs its columns' B once per chunk of rows).
  const int64_t pp = std::clamp<int64_t>(np * mt / (3 * int64_t(nt)), 1, kMaxTaskPanels);
  const int64_t nn = (np + pp - 1) / pp, tasks = mt * nn;
  if (nt == 1 || tasks == 1) {
    gemm_serial(M, N, K, A, lda, B, C, ldc, bias);
    return;
  }
#pragma omp parallel num_threads(int(std::min<int64_t>(nt, tasks)))
  {
    AlignedVector<float> buf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t m0 = (t / nn) * kRowChunk, n0 = (t % nn) * pp * ops.nr;
      run_task(ops, std::min(kRowChunk, M - m0), n0, std::min(pp * ops.nr, N - n0), K, A + m0 * lda, lda, B,
               C + m0 * ldc, ldc, bias, buf);
    }
  }
}

bool gemm_supports(const Linear& W) {
  return (W.kind == LinearKind::F32 || W.kind == LinearKind::BF16) && !W.tiled && W.w != nullptr;
}

void gemm_linear(const Linear& W, const float* bias, const float* x, int64_t T, float* y) {
  if (!gemm_supports(W)) throw Error("gemm_linear: " + W.name + " is " + linear_kind_name(W.kind) + (W.tiled ? " tiled" : "") + " (F32 or BF16 rows expected)");
  GemmB B;
  B.p = W.w;
  B.bf16 = W.kind == LinearKind::BF16;
  B.ld = W.K;
  gemm_parallel(T, W.N, W.K, x, W.K, B, y, W.N, bias);
}

void gelu_erf(float* x, int64_t n) {
  const GemmOps& ops = gemm_ops();
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && !omp_in_parallel())
  for (int64_t c = 0; c < chunks; ++c) ops.gelu(x + c * kChunk, std::min(kChunk, n - c * kChunk));
}

void attention_dense(const float* q, const float* k, const float* v, int64_t ld, int64_t n, int heads, int D,
                     float scale, float* out) {
  if (n <= 0) return;
  const GemmOps& ops = gemm_ops();
  // Each head's keys and values packed once, shared by all its blocks of queries.
  std::vector<GemmPacked> kp(static_cast<size_t>(heads)), vp(static_cast<size_t>(heads));
  const bool par = !omp_in_parallel() && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(dynamic, 1) if (par && n * D > 4096)
  for (int h = 0; h < heads; ++h) {
    GemmB kb, vb;
    kb.p = k + h * D;
    kb.ld = ld;
    vb.p = v + h * D;
    vb.ld = ld;
    vb.kn = true;
    gemm_pack(kb, n, D, kp[size_t(h)]);
    gemm_pack(vb, D, n, vp[size_t(h)]);
  }
  // Blocks of queries: the block's scores (qb x n) stay in L2 between the two products.
  const int64_t qb = n <= 128 ? n : 64, nq = (n + qb - 1) / qb, tasks = nq * heads;
#pragma omp parallel if (par && tasks > 1)
  {
    AlignedVector<float> s(static_cast<size_t>(qb * n)), sums(static_cast<size_t>(qb));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int h = int(t / nq);
      const int64_t i0 = (t % nq) * qb, rows = std::min(qb, n - i0);
      gemm_serial_packed(rows, q + i0 * ld + h * D, ld, kp[size_t(h)], s.data(), n, nullptr);
      ops.softmax_rows(s.data(), rows, n, n, scale, sums.data());
      float* o = out + i0 * ld + h * D;
      gemm_serial_packed(rows, s.data(), n, vp[size_t(h)], o, ld, nullptr);
      for (int64_t i = 0; i < rows; ++i) {
        const float inv = 1.0f / sums[size_t(i)];
        for (int e = 0; e < D; ++e) o[i * ld + e] *= inv;
      }
    }
  }
}

}  // namespace m3
