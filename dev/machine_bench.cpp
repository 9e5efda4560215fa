// Google Benchmark probes of the CPU itself (the `machine_bench` target; an experiment kept apart from the
// product code), behind the account in docs/benchmarks.md of what bounds the one-token decode kernels:
//  - BM_read_fma/F/cold/PF: a read loop with F independent vector FMAs per 64-byte line, all threads, over
//    256 KiB per thread (in L2) or a 512 MiB buffer (from memory), on huge pages where the kernel offers them. Its in-cache rate is set by F; from
//    memory it shows how much of the read bandwidth a core keeps while it also computes (F = 0: the
//    lines are only ORed together, the plain read); PF = 8: each line also prefetched (into L2) 8 KiB
//    ahead, as the decode kernels prefetch their next tiles.
//  - BM_issue/OP: one thread, 16 independent chains of one 512-bit instruction form (or two forms
//    alternated), instructions per ns: which forms share execution pipes.
// AVX-512 (F, BW, VBMI, GFNI) only, chosen at run time; skipped elsewhere.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>

#include "base/host_memory.h"
#include "kernels/cpu/cpu_features.h"

// GCC 12 warns inside its own AVX-512 intrinsic headers (their undefined merge operand) when the
// intrinsics are used under a target attribute; the probes' values are all defined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

#define M3_PROBE_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,gfni,fma")))

bool have_probe_isa() {
  const m3::CpuFeatures& f = m3::cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vbmi && f.gfni;
}

// Eight lines per step, line u feeding F of eight accumulators (F = 0: ORed into accumulator u);
// PF: the step's lines prefetched 8 KiB ahead into L2 (prefetches past the end are harmless).
template <int F, bool PF>
M3_PROBE_TARGET float read_fma(const float* p, size_t n) {
  __m512 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm512_setzero_ps();
  const __m512 c = _mm512_set1_ps(1.0001f);
  for (size_t i = 0; i + 128 <= n; i += 128) {
    if constexpr (PF)
      for (int u = 0; u < 8; ++u) _mm_prefetch(reinterpret_cast<const char*>(p + i + 16 * u) + 8192, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {
      const __m512 v = _mm512_load_ps(p + i + 16 * u);
      if constexpr (F == 0) a[u] = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a[u]), _mm512_castps_si512(v)));
#pragma GCC unroll 16
      for (int f = 0; f < F; ++f) a[(u + f) & 7] = _mm512_fmadd_ps(v, c, a[(u + f) & 7]);
    }
  }
  __m512 s = a[0];
  for (int j = 1; j < 8; ++j) s = _mm512_add_ps(s, a[j]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

template <bool PF>
float read_fma_f(int64_t f, const float* p, size_t n) {
  switch (f) {
    case 0: return read_fma<0, PF>(p, n);
    case 1: return read_fma<1, PF>(p, n);
    case 2: return read_fma<2, PF>(p, n);
    case 4: return read_fma<4, PF>(p, n);
    case 8: return read_fma<8, PF>(p, n);
    case 12: return read_fma<12, PF>(p, n);
    default: return read_fma<16, PF>(p, n);
  }
}

// range(0): F (0, 1, 2, 4, 8, 12, 16); range(1): 1 = from memory (512 MiB), 0 = 256 KiB per thread; on
// huge pages where the kernel offers them (HugePageBuffer); range(2): 8 = the F loop prefetches 8 KiB
// ahead, 0 = it does not. Bytes/s over all threads, of the F loop's passes only (manual time); each is
// preceded by a plain pass (F = 0, no prefetch) over the same data, and "of_plain" is the F loop's rate
// over the plain passes' (on a shared host memory's rate moves within a second; the pair shares the
// moment).
void BM_read_fma(benchmark::State& state) {
  if (!have_probe_isa()) return state.SkipWithError("needs AVX-512 F/BW/VBMI and GFNI");
  const int64_t f = state.range(0);
  const bool cold = state.range(1) != 0, pf = state.range(2) != 0;
  const int threads = omp_get_max_threads();
  const size_t per = cold ? (size_t(512) << 20) / 4 / size_t(threads) / 128 * 128 : (size_t(256) << 10) / 4;
  const size_t total = per * size_t(threads);
  m3::HugePageBuffer mem(total * 4, "the BM_read_fma buffer");
  float* buf = reinterpret_cast<float*>(mem.data());
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < total; ++i) buf[i] = float(i & 7) * 0.25f;
  const int passes = cold ? 1 : 256;  // in cache: 64 MiB per thread per timed pass
  auto timed_pass = [&](int64_t ff, bool with_pf) {
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    {
      const float* p = buf + per * size_t(omp_get_thread_num());
      for (int r = 0; r < passes; ++r) {
        sink += with_pf ? read_fma_f<true>(ff, p, per) : read_fma_f<false>(ff, p, per);
        asm volatile("" : : "r"(p) : "memory");  // a pass per call (the loop reads memory only)
      }
    }
    benchmark::DoNotOptimize(sink);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double plain = 0, with_f = 0;
  for (auto _ : state) {
    plain += timed_pass(0, false);
    const double t = timed_pass(f, pf);
    with_f += t;
    state.SetIterationTime(t);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(total * 4) * passes);
  state.counters["of_plain"] = plain / with_f;
  state.counters["threads"] = threads;
}
BENCHMARK(BM_read_fma)->ArgsProduct({{0, 1, 2, 4, 8, 12, 16}, {0, 1}, {0, 8}})->UseManualTime();

// Instruction forms for BM_issue: x -> op(x) with the other operands constant.
enum Op { kFma, kVpermps, kVpermt2ps, kVpermb, kVpermt2b, kVpshufb, kAffine, kUnpack, kShift, kAnd, kAdd };
template <Op O>
M3_PROBE_TARGET inline __m512 apply(__m512 x) {
  const __m512i b = _mm512_set1_epi8(5), i3 = _mm512_set1_epi32(3);
  const __m512i xi = _mm512_castps_si512(x);
  if constexpr (O == kFma) return _mm512_fmadd_ps(x, _mm512_set1_ps(1.0001f), _mm512_set1_ps(1e-7f));
  if constexpr (O == kVpermps) return _mm512_permutexvar_ps(i3, x);
  if constexpr (O == kVpermt2ps) return _mm512_permutex2var_ps(x, i3, _mm512_set1_ps(2.0f));
  if constexpr (O == kVpermb) return _mm512_castsi512_ps(_mm512_permutexvar_epi8(b, xi));
  if constexpr (O == kVpermt2b) return _mm512_castsi512_ps(_mm512_permutex2var_epi8(xi, b, i3));
  if constexpr (O == kVpshufb) return _mm512_castsi512_ps(_mm512_shuffle_epi8(xi, b));
  if constexpr (O == kAffine) return _mm512_castsi512_ps(_mm512_gf2p8affine_epi64_epi8(xi, _mm512_set1_epi64(0x0102040810204080ll), 1));
  if constexpr (O == kUnpack) return _mm512_castsi512_ps(_mm512_unpacklo_epi8(xi, b));
  if constexpr (O == kShift) return _mm512_castsi512_ps(_mm512_srli_epi32(xi, 1));
  if constexpr (O == kAnd) return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(xi, b, i3, 0x96));  // a ^ b ^ c
  if constexpr (O == kAdd) return _mm512_castsi512_ps(_mm512_add_epi32(xi, b));
  return x;
}

// 16 chains: A on chains 0..7 and B on 8..15 (A == B: one form on all 16). Named variables, not an
// array, so that they stay in registers.
template <Op A, Op B>
M3_PROBE_TARGET float issue_loop(int64_t iters) {
  __m512 v0 = _mm512_set1_ps(1), v1 = _mm512_set1_ps(2), v2 = _mm512_set1_ps(3), v3 = _mm512_set1_ps(4);
  __m512 v4 = _mm512_set1_ps(5), v5 = _mm512_set1_ps(6), v6 = _mm512_set1_ps(7), v7 = _mm512_set1_ps(8);
  __m512 v8 = _mm512_set1_ps(9), v9 = _mm512_set1_ps(10), v10 = _mm512_set1_ps(11), v11 = _mm512_set1_ps(12);
  __m512 v12 = _mm512_set1_ps(13), v13 = _mm512_set1_ps(14), v14 = _mm512_set1_ps(15), v15 = _mm512_set1_ps(16);
  for (int64_t i = 0; i < iters; ++i) {
    v0 = apply<A>(v0), v1 = apply<A>(v1), v2 = apply<A>(v2), v3 = apply<A>(v3);
    v4 = apply<A>(v4), v5 = apply<A>(v5), v6 = apply<A>(v6), v7 = apply<A>(v7);
    v8 = apply<B>(v8), v9 = apply<B>(v9), v10 = apply<B>(v10), v11 = apply<B>(v11);
    v12 = apply<B>(v12), v13 = apply<B>(v13), v14 = apply<B>(v14), v15 = apply<B>(v15);
    // Every chain opaque to the compiler between iterations (no folding of repeated forms).
    asm volatile("" : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3), "+v"(v4), "+v"(v5), "+v"(v6), "+v"(v7));
    asm volatile("" : "+v"(v8), "+v"(v9), "+v"(v10), "+v"(v11), "+v"(v12), "+v"(v13), "+v"(v14), "+v"(v15));
  }
  const __m512 s = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v0, v1), _mm512_add_ps(v2, v3)),
                    _mm512_add_ps(_mm512_add_ps(v4, v5), _mm512_add_ps(v6, v7))),
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v8, v9), _mm512_add_ps(v10, v11)),
                    _mm512_add_ps(_mm512_add_ps(v12, v13), _mm512_add_ps(v14, v15))));
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

template <Op A, Op B>
void BM_issue(benchmark::State& state) {
  if (!have_probe_isa()) return state.SkipWithError("needs AVX-512 F/BW/VBMI and GFNI");
  constexpr int64_t kIters = 1 << 16;
  for (auto _ : state) benchmark::DoNotOptimize(issue_loop<A, B>(kIters));
  state.counters["instructions/ns"] = benchmark::Counter(
      double(kIters) * 16 * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK_TEMPLATE(BM_issue, kFma, kFma)->Name("BM_issue/fma");
BENCHMARK_TEMPLATE(BM_issue, kVpermps, kVpermps)->Name("BM_issue/vpermps");
BENCHMARK_TEMPLATE(BM_issue, kVpermt2ps, kVpermt2ps)->Name("BM_issue/vpermt2ps");
BENCHMARK_TEMPLATE(BM_issue, kVpermb, kVpermb)->Name("BM_issue/vpermb");
BENCHMARK_TEMPLATE(BM_issue, kVpermt2b, kVpermt2b)->Name("BM_issue/vpermt2b");
BENCHMARK_TEMPLATE(BM_issue, kVpshufb, kVpshufb)->Name("BM_issue/vpshufb");
BENCHMARK_TEMPLATE(BM_issue, kAffine, kAffine)->Name("BM_issue/gf2p8affineqb");
BENCHMARK_TEMPLATE(BM_issue, kUnpack, kUnpack)->Name("BM_issue/vpunpcklbw");
BENCHMARK_TEMPLATE(BM_issue, kShift, kShift)->Name("BM_issue/vpsrld");
BENCHMARK_TEMPLATE(BM_issue, kAnd, kAnd)->Name("BM_issue/vpternlogd");
BENCHMARK_TEMPLATE(BM_issue, kAdd, kAdd)->Name("BM_issue/vpaddd");
BENCHMARK_TEMPLATE(BM_issue, kFma, kVpermt2ps)->Name("BM_issue/fma+vpermt2ps");
BENCHMARK_TEMPLATE(BM_issue, kFma, kVpermb)->Name("BM_issue/fma+vpermb");
BENCHMARK_TEMPLATE(BM_issue, kFma, kVpermt2b)->Name("BM_issue/fma+vpermt2b");
BENCHMARK_TEMPLATE(BM_issue, kFma, kAffine)->Name("BM_issue/fma+gf2p8affineqb");
BENCHMARK_TEMPLATE(BM_issue, kFma, kUnpack)->Name("BM_issue/fma+vpunpcklbw");
BENCHMARK_TEMPLATE(BM_issue, kFma, kShift)->Name("BM_issue/fma+vpsrld");
BENCHMARK_TEMPLATE(BM_issue, kFma, kAnd)->Name("BM_issue/fma+vpternlogd");
BENCHMARK_TEMPLATE(BM_issue, kFma, kAdd)->Name("BM_issue/fma+vpaddd");
BENCHMARK_TEMPLATE(BM_issue, kVpermt2b, kAdd)->Name("BM_issue/vpermt2b+vpaddd");

}  // namespace
