// What a parallel region costs on this host against the work it splits: times an empty OpenMP region
// at the team's width, and an fp32 router-sized dot-product block (E rows of H) run on the calling
// thread and split over the team, its matrices cycled through a buffer larger than the last-level
// cache (as a decode step finds them). The break-even work (serial time = 2 x region cost at 2 threads)
// sets the "too small to split" thresholds in src/model (docs/benchmarks.md section 3.4).
// Build: g++ -O2 -std=c++20 -fopenmp -march=native dev/omp_region_bench.cpp -o /tmp/omp_region_bench
// Run:   /tmp/omp_region_bench [E] [H]      (beside `yes > /dev/null &` for the busy-neighbour case)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

float dot(const float* a, const float* b, long n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (long i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Median of `reps` timings of f(), in microseconds.
template <class F>
double median_us(int reps, F&& f) {
  std::vector<double> t(static_cast<size_t>(reps));
  for (auto& x : t) {
    const double t0 = now_us();
    f();
    x = now_us() - t0;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long E = argc > 1 ? std::atol(argv[1]) : 32, H = argc > 2 ? std::atol(argv[2]) : 2048;
  const long mats = std::max(1L, (256L << 20) / (E * H * 4));  // 256 MiB of matrices: past the LLC
  std::vector<float> w(size_t(mats * E * H), 0.01f), x(static_cast<size_t>(H), 1.f), z(static_cast<size_t>(E));
  long next = 0;
  volatile float sink = 0;
  const int reps = 2000;
  // Some time between regions, as a step's serial work leaves: the workers' spin may run out.
  auto gap = [](double us) { const double t0 = now_us(); while (now_us() - t0 < us) {} };
  for (double g : {0.0, 5.0, 50.0}) {
    const double empty = median_us(reps, [&] {
      gap(g);
#pragma omp parallel
      { sink = sink + 0.f; }
    }) - median_us(reps, [&] { gap(g); });
    std::printf("threads %d, gap %4.0f us: empty region %.2f us\n", omp_get_max_threads(), g, empty);
  }
  auto router = [&](bool par) {
    const float* m = w.data() + (next++ % mats) * E * H;
    float* zd = z.data();
#pragma omp parallel for schedule(static) if (par)
    for (long e = 0; e < E; ++e) zd[e] = dot(x.data(), m + e * H, H);
    sink = sink + zd[0];
  };
  for (int r = 0; r < 2; ++r) {
    const double s = median_us(reps, [&] { gap(50); router(false); }) - median_us(reps, [&] { gap(50); });
    const double p = median_us(reps, [&] { gap(50); router(true); }) - median_us(reps, [&] { gap(50); });
    std::printf("router %ldx%ld fp32 (cold): calling thread %.2f us, team %.2f us\n", E, H, s, p);
  }
  return 0;
}
