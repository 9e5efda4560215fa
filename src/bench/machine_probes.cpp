// `bench roofline`'s machine probes (see machine_probes.h): a streaming read over a buffer far beyond the
// caches, one contiguous slice per thread, and independent FMA chains per thread; AVX2 / AVX-512 forms
// chosen at run time, a scalar fallback elsewhere.
#include "bench/machine_probes.h"

#include "kernels/cpu/cpu_features.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace m3::bench {
namespace {

volatile float g_sink;

// Reads a buffer larger than the last-level cache so a timed kernel starts with cold caches.
void flush_caches() {
  static std::vector<float> junk(size_t(96) << 20 >> 2, 1.0f);
  float s = 0;
#pragma omp parallel for reduction(+ : s)
  for (size_t i = 0; i < junk.size(); i += 16) s += junk[i];
  g_sink = s;
}

bool have_avx2_fma() { return cpu_features().avx2_fma; }

__attribute__((target("avx2,fma"))) float read_slice_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  for (; i < n; ++i) r += p[i];
  return r;
}

float read_slice_scalar(const float* p, size_t n) {
  float a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  float r = 0;
  for (float x : a) r += x;
  for (; i < n; ++i) r += p[i];
  return r;
}

// 12 independent FMA chains per thread (FMA latency 4 x 2 ports needs at least 8 in flight).
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters, float seed) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(seed + 0.001f * j);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

bool have_avx512f() { return have_avx2_fma() && cpu_features().avx512f; }

// The same with 512-bit vectors: on CPUs with AVX-512 the machine's FMA peak (two 512-bit FMAs per
// cycle and core on this machine, twice the 256-bit rate), which the avx512 kernels are measured
// against.
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters, float seed) {
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(seed + 0.001f * j);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}

}  // namespace

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void keep(float value) { g_sink = value; }

double best_time(int reps, const std::function<void()>& fn) {
  double best = 1e300;
  for (int r = 0; r < std::max(1, reps); ++r) {
    flush_caches();
    const double t = now_s();
    fn();
    best = std::min(best, now_s() - t);
  }
  return best;
}

ReadProbe::ReadProbe(double mib, int threads)
    : n_(size_t(mib * 1024 * 1024 / 4) / 64 * 64), threads_(threads), mem_(n_ * 4, "the bandwidth probe buffer") {
  float* buf = reinterpret_cast<float*>(mem_.data());
  const size_t n = n_;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = float(i & 7) * 0.25f;
}

double ReadProbe::gbs(int passes) {
  pass_gbs();
  double best = 0;
  for (int pass = 1; pass < passes; ++pass) best = std::max(best, pass_gbs());
  return best;
}

double ReadProbe::pass_gbs() {
  const float* buf = reinterpret_cast<const float*>(mem_.data());
  const bool avx2 = have_avx2_fma();
  const size_t n = n_;
  float total = 0;
  const double t = now_s();
#pragma omp parallel num_threads(threads_) reduction(+ : total)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const size_t per = (n / size_t(nt)) / 32 * 32;
    const size_t lo = per * size_t(id), cnt = id == nt - 1 ? n - lo : per;
    total += avx2 ? read_slice_avx2(buf + lo, cnt) : read_slice_scalar(buf + lo, cnt);
  }
  const double dt = now_s() - t;
  g_sink = total;
  return double(n) * 4 / dt / 1e9;
}

MachineLimits measure_limits(double probe_mib, int threads) {
  MachineLimits lim;
  lim.threads = threads > 0 ? threads : omp_get_max_threads();
  const bool avx2 = have_avx2_fma(), avx512 = have_avx512f();
  lim.isa = avx512 ? "avx512f" : avx2 ? "avx2+fma" : "scalar";
  lim.fma_lanes = avx512 ? 16 : avx2 ? 8 : 1;
  // Streaming read: a buffer far beyond the caches, one contiguous slice per thread, best of 5 passes
  // after one that warms the TLB, on huge pages where the kernel offers them (the machine's limit, not
  // its TLB's).
  ReadProbe probe(probe_mib, lim.threads);
  lim.read_gbs = probe.gbs(6);
  // FMA peak: every thread runs independent chains; best of 3.
  const int64_t iters = 20'000'000;
  double fbest = 1e300;
  for (int pass = 0; pass < 3; ++pass) {
    float total = 0;
    const double t = now_s();
#pragma omp parallel num_threads(lim.threads) reduction(+ : total)
    {
      if (avx512) total += fma_loop_avx512(iters, float(omp_get_thread_num()));
      else if (avx2) total += fma_loop_avx2(iters, float(omp_get_thread_num()));
      else {
        float a[8] = {};
        for (int64_t i = 0; i < iters / 4; ++i)
          for (int j = 0; j < 8; ++j) a[j] = a[j] * 0.999999f + 1e-7f;
        total += a[0];
      }
    }
    fbest = std::min(fbest, now_s() - t);
    g_sink = total;
  }
  const double flops_per_thread = avx2 ? double(iters) * 12 * lim.fma_lanes * 2 : double(iters / 4) * 8 * 2;
  lim.fma_gflops = flops_per_thread * lim.threads / fbest / 1e9;
  return lim;
}

}  // namespace m3::bench
