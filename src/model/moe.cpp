// Dense MLP and MoE forward (see moe.h).
#include "model/moe.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/worker_pool.h"

namespace m3 {

namespace {

// Indices per claimed chunk of the per-token loops (WorkerPool::parallel_for): a few microseconds of
// work each, so a decode step of a few sequences runs them on the calling thread. The row copies into
// the experts' inputs shared when a prefill chunk copies megabytes.
constexpr int64_t kTokensGrain = 16, kCopyRowsGrain = 256, kCombineGrain = 8;

// y[T, H] = down(SwiGLU_OAI(gate(x), up(x))); gate and up share one parallel region; buffers
// reused across calls.
void swiglu_mlp(const ModelConfig& cfg, const ExpertWeights& W, const float* x, int64_t T, float* y) {
  thread_local AlignedVector<float> g, u;
  const int64_t F = W.gate.N;
  if (g.size() < size_t(T * F)) {
    g.resize(size_t(T * F));
    u.resize(size_t(T * F));
  }
  const LinearJob gu[2] = {{&W.gate, x, T, g.data()}, {&W.up, x, T, u.data()}};
  linear_forward_many(gu, 2);
  swiglu_oai(g.data(), u.data(), T * F, cfg.swiglu_alpha, cfg.swiglu_limit, cfg.swiglu_beta, g.data());
  linear_forward(W.down, g.data(), T, y);
}

}  // namespace

void moe_route(const ModelConfig& cfg, const LayerWeights& L, const float* m, int64_t T, RouteDecision out) {
  const int E = cfg.n_experts, K = cfg.experts_per_tok;
  const int64_t H = cfg.hidden;
  const CpuOps& ops = cpu_ops();
  // The router logits, every (token, expert) dot product on all threads (speed: on one thread the
  // fp32 router's dots were a visible share of a decode step) unless there are too few to pay for the
  // team's wake-up: mid's 32 x 2048 router at decode takes ~10 us on the calling thread, ~100 us as a
  // region on a loaded 2-core host (dev/omp_region_bench.cpp). The same dots either way.
  constexpr int64_t kRouterSplitMacs = int64_t(1) << 19;
  thread_local std::vector<float> logits;
  logits.resize(size_t(T * E));
  float* z = logits.data();
  const int64_t dots = T * E;
  WorkerPool::parallel_for(dots, dots * H >= kRouterSplitMacs ? std::max<int64_t>(8, kRouterSplitMacs / 4 / H) : dots,
                           [&](int64_t i0, int64_t i1) {
                             for (int64_t i = i0; i < i1; ++i)
                               z[i] = ops.dot(m + (i / E) * H, L.router.data() + (i % E) * H, H);
                           });
  WorkerPool::parallel_for(T, kTokensGrain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      thread_local std::vector<float> s, biased;
      thread_local std::vector<int> idx;
      s.resize(E);
      biased.resize(E);
      idx.resize(E);
      for (int e = 0; e < E; ++e) {
        s[e] = sigmoidf(z[t * E + e]);
        biased[e] = s[e] + L.router_bias[e];
      }
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                        [&](int a, int b) { return biased[a] > biased[b] || (biased[a] == biased[b] && a < b); });
      float sum = 0.f;
      for (int i = 0; i < K; ++i) sum += s[idx[i]];
      for (int i = 0; i < K; ++i) {
        out.experts[t * K + i] = idx[i];
        out.weights[t * K + i] = s[idx[i]] / sum * cfg.routed_scaling;
      }
    }
  });
}

void ffn_forward(const ModelConfig& cfg, const LayerWeights& L, bool moe, const float* m, int64_t T, float* y) {
  const int64_t H = cfg.hidden;
  if (!moe) {
    swiglu_mlp(cfg, L.mlp, m, T, y);
    return;
  }
  const int K = cfg.experts_per_tok, E = cfg.n_experts;
  thread_local std::vector<int32_t> ex;
  thread_local AlignedVector<float> wt, xin, yout;
  thread_local std::vector<int64_t> count;  // [E]: tokens routed to each expert
  thread_local std::vector<int64_t> slot;   // [T * K]: the token's index among its expert's tokens
  ex.resize(size_t(T * K));
  slot.resize(size_t(T * K));
  wt.resize(size_t(T * K));
  moe_route(cfg, L, m, T, {ex.data(), wt.data()});
  count.assign(E, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < K; ++i) {
      slot[t * K + i] = count[ex[t * K + i]]++;
    }
  // All active experts (and the shared one) run together: one parallel region for every gate/up
  // product, one for every down product, threads over experts x rows.
  thread_local std::vector<LinearJob> jobs;
  thread_local std::vector<int64_t> x_off, h_off, y_off;
  thread_local AlignedVector<float> hg, hu;
  int64_t nx = 0, nh = 0, ny = 0;
  x_off.assign(E, 0);
  h_off.assign(E + 1, 0);
  y_off.assign(E, 0);
  const int64_t shared_h = L.has_shared ? T * L.shared.gate.N : 0;
  nh = shared_h;
  for (int e = 0; e < E; ++e) {
    const int64_t n = count[e];
    if (!n) continue;
    x_off[e] = nx;
    h_off[e] = nh;
    y_off[e] = ny;
    nx += n * H;
    nh += n * L.experts[e].gate.N;
    ny += n * H;
  }
  if (xin.size() < size_t(nx)) xin.resize(size_t(nx));
  if (yout.size() < size_t(ny)) yout.resize(size_t(ny));
  if (hg.size() < size_t(nh)) {
    hg.resize(size_t(nh));
    hu.resize(size_t(nh));
  }
  jobs.clear();
  if (L.has_shared) {
    jobs.push_back({&L.shared.gate, m, T, hg.data()});
    jobs.push_back({&L.shared.up, m, T, hu.data()});
  }
  for (int e = 0; e < E; ++e) {
    const int64_t n = count[e];
    if (!n) continue;
    float* xe = xin.data() + x_off[e];
    jobs.push_back({&L.experts[e].gate, xe, n, hg.data() + h_off[e]});
    jobs.push_back({&L.experts[e].up, xe, n, hu.data() + h_off[e]});
  }
  {
    // Each (token, choice) row to its place among its expert's inputs, on all threads when the step
    // has many tokens (speed: a prefill chunk copies megabytes per layer here).
    // Plain pointers: inside the parallel region a thread_local name would be the worker's own.
    const int32_t* exd = ex.data();
    const int64_t *slotd = slot.data(), *xoffd = x_off.data();
    float* xind = xin.data();
    WorkerPool::parallel_for(T * K, kCopyRowsGrain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        std::copy(m + (p / K) * H, m + (p / K + 1) * H, xind + xoffd[exd[p]] + slotd[p] * H);
    });
  }
  linear_forward_many(jobs.data(), int(jobs.size()));
  swiglu_oai(hg.data(), hu.data(), nh, cfg.swiglu_alpha, cfg.swiglu_limit, cfg.swiglu_beta, hg.data());
  jobs.clear();
  if (L.has_shared) jobs.push_back({&L.shared.down, hg.data(), T, y});
  for (int e = 0; e < E; ++e)
    if (count[e])
      jobs.push_back({&L.experts[e].down, hg.data() + h_off[e], count[e], yout.data() + y_off[e]});
  linear_forward_many(jobs.data(), int(jobs.size()));
  // Shared expert (weight 1) first, then each routed expert in ascending order, token by token (the
  // tokens on all threads when the step has several).
  if (!L.has_shared) std::fill(y, y + T * H, 0.f);
  // Plain pointers into the thread_local buffers: inside the parallel region a thread_local name
  // would name each worker's own, empty, instance.
  const int32_t* exd = ex.data();
  const float* wtd = wt.data();
  const int64_t* slotd = slot.data();
  const float* youtd = yout.data();
  const int64_t* y_offd = y_off.data();
  WorkerPool::parallel_for(T, kCombineGrain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int small[64];  // the token's K choices by ascending expert id (no allocation for K <= 64)
      std::vector<int> large;
      int* order = small;
      if (K > 64) {
        large.resize(size_t(K));
        order = large.data();
      }
      for (int i = 0; i < K; ++i) order[i] = i;
      std::sort(order, order + K, [&](int a, int b) { return exd[t * K + a] < exd[t * K + b]; });
      float* dst = y + t * H;
      for (int j = 0; j < K; ++j) {
        const int i = order[j], e = exd[t * K + i];
        const float w = wtd[t * K + i];
        const float* src = youtd + y_offd[e] + slotd[t * K + i] * H;
        for (int64_t h = 0; h < H; ++h) dst[h] += w * src[h];
      }
    }
  });
}

}  // namespace m3
