// `m3serve bench roofline` (see roofline.h): the machine probes (machine_probes.h), then decode and
// prefill steps of the model, timed whole (Model::forward) and per kernel class through the public
// kernel entry points (linear_forward on the real weights, attention_batch over a filled paged KV cache
// of the serving engine's dtypes, moe_route), with bytes and FLOPs counted from the shapes. Each class's
// first matrix is also timed with its rows in cache (its one-token kernels' own rate), which with the
// read bandwidth gives the decode roof.
//
// run_roofline reads top to bottom: describe the machine and the model, build a filled paged cache,
// time whole steps, time each kernel class, print the tables.
#include "bench/roofline.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/machine_probes.h"
#include "bench/metrics.h"
#include "engine/kv_format.h"
#include "engine/kv_pool.h"
#include "base/error.h"
#include "base/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/linear.h"
#include "model/attention.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/msa_select.h"

namespace m3::bench {
namespace {

// The weight classes' row names: the decode table's rows and the decode roof's in-cache rates (one
// matrix per class, ClassRoof) are matched by them.
constexpr const char* kAttnProjections = "attention projections";
constexpr const char* kIndexProjections = "index projections";
constexpr const char* kDenseMlp = "dense MLP";
constexpr const char* kRoutedExperts = "routed experts";
constexpr const char* kSharedExpert = "shared expert";
constexpr const char* kLmHead = "lm_head";

struct Row {
  std::string cls, how;
  double t = 0, bytes = 0, flops = 0;
};

void print_table(const char* title, const std::vector<Row>& rows, const MachineLimits& lim, double whole_s,
                 int64_t tokens) {
  std::printf("\n%s\n", title);
  std::printf("%-28s %9s %9s %9s %8s %6s %9s %6s  %s\n", "kernel class", "time ms", "MB", "GFLOP", "GB/s", "%BW",
              "GFLOP/s", "%FMA", "how measured");
  double sum_t = 0, sum_b = 0, sum_f = 0;
  for (const auto& r : rows) {
    const double gbs = r.t > 0 ? r.bytes / r.t / 1e9 : 0, gfs = r.t > 0 ? r.flops / r.t / 1e9 : 0;
    std::printf("%-28s %9.3f %9.2f %9.3f %8.2f %5.0f%% %9.2f %5.0f%%  %s\n", r.cls.c_str(), r.t * 1e3, r.bytes / 1e6,
                r.flops / 1e9, gbs, 100 * gbs / lim.read_gbs, gfs, 100 * gfs / lim.fma_gflops, r.how.c_str());
    sum_t += r.t;
    sum_b += r.bytes;
    sum_f += r.flops;
  }
  const double gbs = sum_b / sum_t / 1e9, gfs = sum_f / sum_t / 1e9;
  std::printf("%-28s %9.3f %9.2f %9.3f %8.2f %5.0f%% %9.2f %5.0f%%  %s\n", "sum of classes", sum_t * 1e3, sum_b / 1e6,
              sum_f / 1e9, gbs, 100 * gbs / lim.read_gbs, gfs, 100 * gfs / lim.fma_gflops, "sum of the rows above");
  const double wg = sum_b / whole_s / 1e9, wf = sum_f / whole_s / 1e9;
  std::printf("%-28s %9.3f %9s %9s %8.2f %5.0f%% %9.2f %5.0f%%  %s\n", "whole step (Model::forward)", whole_s * 1e3, "", "",
              wg, 100 * wg / lim.read_gbs, wf, 100 * wf / lim.fma_gflops,
              "timed Model::forward; bytes/FLOPs of the classes");
  std::printf("  -> %.2f tokens/s (%lld token%s per step); classes cover %.0f%% of the step time\n",
              double(tokens) / whole_s, (long long)tokens, tokens == 1 ? "" : "s", 100 * sum_t / whole_s);
}
// One-token decode rate of a matrix's kernels with its rows in cache: each thread multiplies its own
// 128 rows (whole tiles; fewer when the matrix is smaller) again and again through
// CpuOps::linear_rows, the decode step's per-thread entry: the rate a decode step could reach for this
// matrix if reading memory cost nothing.
struct ResidentRate {
  double gws = 0, gbs = 0;  // G weights/s and GB/s of the bytes the decode step reads, all threads
};
ResidentRate resident_rate(const Linear& L, int threads) {
  constexpr int64_t tr = kLinearTileRows;
  ResidentRate res;
  if (L.empty() || L.N < tr || L.K <= 0) return res;
  const int64_t rp = std::min<int64_t>(128, L.N / tr * tr);
  const double bytes_per_weight = double(L.decode_bytes()) / double(L.N * L.K);
  // Rounds of about 1 ms, the best kept per thread (on a shared host a round can lose its core).
  const int reps = int(std::max<int64_t>(20, int64_t(5e7) / (rp * L.K))), rounds = 7;
  const CpuOps& ops = cpu_ops();
  double rate = 0;
#pragma omp parallel num_threads(threads) reduction(+ : rate)
  {
    const int id = omp_get_thread_num();
    int64_t r0 = (int64_t(id) * rp) / tr * tr;
    if (r0 + rp > L.N) r0 = 0;
    AlignedVector<float> x(size_t(L.K)), y(size_t(L.N)), scratch(size_t(tr * L.K));
    for (int64_t k = 0; k < L.K; ++k) x[size_t(k)] = float((k * 37 + id) % 17) * 0.0625f - 0.5f;
    for (int r = 0; r < 3; ++r) ops.linear_rows(L, x.data(), 1, y.data(), r0, r0 + rp, scratch.data());
    double best = 0;
    for (int round = 0; round < rounds; ++round) {
#pragma omp barrier
      const double t = now_s();
      for (int r = 0; r < reps; ++r) {
        ops.linear_rows(L, x.data(), 1, y.data(), r0, r0 + rp, scratch.data());
        asm volatile("" : : "r"(y.data()) : "memory");  // every call runs (the kernel writes y only)
      }
      best = std::max(best, double(rp) * double(L.K) * reps / (now_s() - t));
    }
    rate += best;
    keep(y[size_t(r0)]);
  }
  res.gws = rate / 1e9;
  res.gbs = res.gws * bytes_per_weight;
  return res;
}

// Each weight class's first matrix, timed with its rows in cache for the decode roof.
struct ClassRoof {
  const char* cls;
  const Linear* L;
  ResidentRate best;
};

std::vector<ClassRoof> class_roof_matrices(const ModelConfig& c, const Weights& W) {
  const Linear *index = nullptr, *dense = nullptr, *routed = nullptr, *shared = nullptr;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = W.layer(l);
    if (c.sparse_layer[l] && !index) index = &L.attn.index_q;
    if (!c.moe_layer[l] && !dense) dense = &L.mlp.gate;
    if (c.moe_layer[l] && !routed && !L.experts.empty()) routed = &L.experts[0].gate;
    if (c.moe_layer[l] && !shared && L.has_shared) shared = &L.shared.gate;
  }
  const std::pair<const char*, const Linear*> firsts[] = {
      {kAttnProjections, &W.layer(0).attn.q}, {kIndexProjections, index}, {kDenseMlp, dense},
      {kRoutedExperts, routed}, {kSharedExpert, shared}, {kLmHead, &W.lm_head()}};
  std::vector<ClassRoof> roofs;
  for (const auto& [cls, L] : firsts)
    if (L && !L->empty()) roofs.push_back({cls, L, {}});
  return roofs;
}

// Measured twice, before and after the timed steps, the faster kept (on a shared host both cores can
// be slowed for a while).
void measure_class_roofs(std::vector<ClassRoof>& roofs, int threads) {
  for (ClassRoof& r : roofs) {
    const ResidentRate m = resident_rate(*r.L, threads);
    if (m.gws > r.best.gws) r.best = m;
  }
}

void print_machine(const MachineLimits& lim, const RooflineOptions& o) {
  std::printf("machine: %d threads, probe ISA %s, kernels dispatch to %s\n", lim.threads, lim.isa.c_str(), cpu_ops().name);
  std::printf("  memory read bandwidth: %.2f GB/s  (streaming read of %.0f MiB on huge pages, best of 5 passes)\n", lim.read_gbs,
              o.probe_mib);
  std::printf("  FMA peak:              %.2f GFLOP/s  (12 independent %d-wide FMA chains per thread)\n", lim.fma_gflops,
              lim.fma_lanes);
}

void print_model(const Model& model, const RooflineOptions& o) {
  const ModelConfig& c = model.config();
  const Weights& W = model.weights();
  std::printf("model: %s\n  %s\n", o.model_dir.c_str(), c.summary().c_str());
  if (o.model.nvfp4_int8_activations)
    std::printf("  NVFP4 activations: int8 (per-16 scales) in %d matrices, not bit-exact; their integer\n"
                "  multiply-adds count as FLOPs against the fp32 FMA peak\n",
                model.int8_activation_matrices());
  for (const LinearKind kind : {LinearKind::MXFP8, LinearKind::NVFP4})
    if (const int n = model.bf16_activation_matrices(kind); n > 0)
      std::printf("  %s activations: bf16 in %d matrices, not bit-exact, %s; their BF16 multiply-adds count as\n"
                  "  FLOPs against the fp32 FMA peak\n",
                  linear_kind_name(kind), n,
                  bf16_dot_products() ? "BF16 dot products" : "fp32 kernels (no AVX512-BF16 on this CPU)");
  std::printf("  weights %.1f MB, active per decoded token %.1f MB, %s\n", W.total_bytes() / 1e6,
              W.active_bytes_per_token() / 1e6,
              W.store().memory() == WeightMemory::Ram ? "read into huge-page memory (--mmap maps them instead)"
                                                      : "read from the mapped checkpoint (4 KiB pages; --no-mmap reads "
                                                        "them into huge-page memory)");
}

constexpr int kSteadySteps = 32;  // decode steps in a row for the steady rate

// Everything the timings share: the options, the machine's limits, the model, and a paged cache like
// the engine's (same page size and dtypes) holding random K/V (and index keys) for positions [0, need).
struct Bench {
  const RooflineOptions& o;
  const MachineLimits& lim;
  Model& model;
  const ModelConfig& c;
  const Weights& W;
  KVDtype kvd, ikd;
  std::vector<int32_t> table;
  KVPool pool;
  std::vector<int32_t> toks;  // random prompt tokens, o.prefill of them
  std::vector<float> logits;
  std::mt19937 rng{1};
  std::normal_distribution<float> nd{0.f, 1.f};

  Bench(const RooflineOptions& opt, const MachineLimits& l, Model& m, KVDtype kv, KVDtype ik, int64_t need, int page)
      : o(opt), lim(l), model(m), c(m.config()), W(m.weights()), kvd(kv), ikd(ik),
        table(size_t((need + page - 1) / page)), pool(c, page, kv, ik, int64_t(table.size())),
        logits(size_t(c.vocab)) {
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  }
  template <class V>
  void randomize(V& v) {
    for (auto& x : v) x = nd(rng) * 0.5f;
  }
  // One forward step of T tokens starting at `start` (its cache holding start + T positions).
  void step(const int32_t* tokens, int64_t T, int64_t start) {
    PagedKV view(pool, table, start + T);
    const BatchItem item{&view, tokens, T, start, T - 1};
    model.forward_batch(&item, 1, logits.data());
  }
};

void fill_cache(Bench& b, int64_t need) {
  const ModelConfig& c = b.c;
  const int64_t kvw = int64_t(c.n_kv_heads) * c.head_dim;
  PagedKV cache(b.pool, b.table, need);
  std::vector<float> k(static_cast<size_t>(kvw)), v(static_cast<size_t>(kvw)), ik(static_cast<size_t>(std::max(c.index_dim, 1)));
  for (int l = 0; l < c.n_layers; ++l)
    for (int64_t p = 0; p < need; ++p) {
      b.randomize(k);
      b.randomize(v);
      b.randomize(ik);
      cache.store(l, p, k.data(), v.data(), c.sparse_layer[l] ? ik.data() : nullptr);
    }
}

// Whole steps through Model::forward.
struct StepTimes {
  double decode_whole = 0, prefill_whole = 0;
  double steady = 1e300, steady_cmp = 1e300;  // best mean step at context / compare_context
  std::vector<double> paired;            // per run: weights GB/s over the paired probe's GB/s
  std::vector<double> ratios;            // per run with --compare-context: rate at context / at compare_context
  std::vector<double> inter, inter_ms;   // interleaved steps: weights over the probe passes around them; ms
};

// The mean step of kSteadySteps decode steps in a row from context ctx, each appending its token at the
// next position, no cache flush in between (as generate and serve run it), after one untimed step.
double steady_run(Bench& b, int64_t ctx) {
  auto one = [&](int s) { b.step(b.toks.data() + s % b.toks.size(), 1, ctx + s); };
  one(0);
  const double t0 = now_s();
  for (int s = 0; s < kSteadySteps; ++s) one(s);
  return (now_s() - t0) / kSteadySteps;
}

StepTimes time_whole_steps(Bench& b) {
  const RooflineOptions& o = b.o;
  StepTimes st;
  st.decode_whole = best_time(o.repeats, [&] { b.step(b.toks.data(), 1, o.context); });
  // Steady decode: the best mean step over `repeats` runs. Each run is paired with a read probe taken
  // just before it (a 256 MiB buffer at most), so that the weights' read rate is also set against what
  // memory gave in the same minute: on a shared machine the probe at the start and the best run can
  // come from quieter or busier moments.
  const double active = double(b.W.active_bytes_per_token());
  ReadProbe pair_probe(std::min(o.probe_mib, 256.0), b.lim.threads);
  for (int r = 0; r < std::max(1, o.repeats); ++r) {
    const double probe_gbs = pair_probe.gbs(3);
    const double mean = steady_run(b, o.context);
    st.steady = std::min(st.steady, mean);
    st.paired.push_back(active / mean / 1e9 / probe_gbs);
    if (o.compare_context > 0) {
      const double cmp = steady_run(b, o.compare_context);
      st.steady_cmp = std::min(st.steady_cmp, cmp);
      st.ratios.push_back(cmp / mean);
    }
  }
  // Interleaved: kSteadySteps decode steps from context, each between two passes of the paired probe
  // (one pass, about as long as a step), the weights' read rate of each step over the mean of the two
  // passes around it. On a shared host the memory a step gets moves within a second; a probe taken in
  // the same few milliseconds sets each step against what memory gave then. The passes leave the
  // caches cold for the step after them (conservative for the step).
  double before = pair_probe.pass_gbs();
  for (int s = 0; s < kSteadySteps; ++s) {
    const double t0 = now_s();
    b.step(b.toks.data() + s % b.toks.size(), 1, o.context + s);
    const double dt = now_s() - t0;
    const double after = pair_probe.pass_gbs();
    st.inter.push_back(active / dt / 1e9 / (0.5 * (before + after)));
    st.inter_ms.push_back(dt * 1e3);
    before = after;
  }
  st.prefill_whole = best_time(std::min(o.repeats, 2), [&] { b.step(b.toks.data(), o.prefill, 0); });
  return st;
}

// The rows of one step's table, keyed by class, in the order the classes first appear.
class RowTable {
 public:
  void add(const std::string& cls, const std::string& how, double t, double bytes, double flops) {
    if (!acc_.count(cls)) order_.push_back(cls);
    Row& r = acc_[cls];
    r.cls = cls;
    r.how = how;
    r.t += t;
    r.bytes += bytes;
    r.flops += flops;
  }
  std::vector<Row> rows() const {
    std::vector<Row> out;
    for (const auto& k : order_) out.push_back(acc_.at(k));
    return out;
  }

 private:
  std::map<std::string, Row> acc_;
  std::vector<std::string> order_;
};

// Index scoring of layer l for T tokens from `start`: the same scan attention_batch does (each index
// key up to the position read once and dotted with every group's index query by the kernels' dot,
// max-pooled per block), replayed here to split it from the block attention. Tiles of 4 tokens, each
// scanning together the blocks they all see whole, as attention_batch does.
double time_index_scoring(const Bench& b, int l, const PagedKV& view, const float* iq, int64_t start, int64_t T) {
  const ModelConfig& c = b.c;
  const MsaParams mp = MsaParams::from(c);
  const int G = c.n_kv_heads, ID = c.index_dim;
  const int chunk = view.chunk();
  const int64_t nblk = (start + T - 1) / chunk + 1, tiles = (T + 3) / 4;
  return best_time(b.o.repeats, [&] {
    float sink = 0;
    const int64_t chunk_items = index_scan_chunk(tiles * nblk);
#pragma omp parallel for schedule(dynamic, chunk_items) reduction(+ : sink)
    for (int64_t w = 0; w < tiles * nblk; ++w) {
      const int64_t t0 = w / nblk * 4, blk = w % nblk, lo = blk * chunk;
      float mx[4][64];
      const float* fq[4];
      float* fm[4];
      int nfull = 0;
      for (int64_t t = t0; t < std::min(T, t0 + 4); ++t) {
        const int64_t pos = start + t;
        if (msa_all_visible(pos, mp) || blk > pos / chunk) continue;
        const float* iqt = iq + t * int64_t(c.index_heads) * ID;
        const int64_t n = std::min<int64_t>(pos, lo + chunk - 1) - lo + 1;
        float* m = mx[t - t0];
        for (int g = 0; g < G && g < 64; ++g) m[g] = -1e30f;
        if (n == chunk) {
          fq[nfull] = iqt, fm[nfull++] = m;
        } else {
          index_scan_block(view, l, lo, n, iqt, ID, std::min(G, 64), m);
          for (int g = 0; g < G && g < 64; ++g) sink += m[g];
        }
      }
      index_scan_tokens(view, l, lo, chunk, nfull, fq, ID, std::min(G, 64), fm);
      for (int i = 0; i < nfull; ++i)
        for (int g = 0; g < G && g < 64; ++g) sink += fm[i][g];
    }
    keep(sink);
  });
}

// Per class: the kernels called directly on the real weights, for a step of T tokens (decode: one
// token at the context; prefill: from an empty cache).
std::vector<Row> time_classes(Bench& b, int64_t T, bool decode) {
  const RooflineOptions& o = b.o;
  const ModelConfig& c = b.c;
  const int D = c.head_dim, G = c.n_kv_heads, ID = c.index_dim;
  const int64_t qw = int64_t(c.n_heads) * D;
  RowTable table;
  int64_t maxk = std::max<int64_t>({c.hidden, qw, c.dense_inter, c.moe_inter, c.shared_inter});
  AlignedVector<float> x(size_t(T * maxk)), y(size_t(T * std::max<int64_t>(maxk, c.vocab)));
  b.randomize(x);
  auto lin = [&](const std::string& cls, const Linear& L, int64_t rows) {
    if (L.empty() || rows == 0) return;
    const double t = best_time(o.repeats, [&] { linear_forward(L, x.data(), rows, y.data()); });
    // A packed BF16 matrix (pack_bf16_tiles) is read packed by steps of up to 40 tokens.
    const double wb = rows == 1                    ? double(L.decode_bytes())
                      : L.bf16_packed && rows <= 40 ? double(L.bf16_packed_bytes)
                                                    : double(L.bytes());
    table.add(cls, "linear_forward on the real weights", t, wb + 4.0 * rows * (L.K + L.N), 2.0 * rows * L.N * L.K);
  };
  const int64_t start = decode ? o.context : 0;
  AlignedVector<float> q(size_t(T * qw)), iq(size_t(T * std::max(c.index_heads * ID, 1))), out(size_t(T * qw));
  b.randomize(q);
  b.randomize(iq);
  AlignedVector<float> m(size_t(T * c.hidden));
  b.randomize(m);
  std::vector<int32_t> ex(size_t(T * std::max(c.experts_per_tok, 1)));
  std::vector<float> ew(ex.size());
  const MsaParams mp = MsaParams::from(c);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = b.W.layer(l);
    const bool sparse = c.sparse_layer[l];
    for (const Linear* p : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) lin(kAttnProjections, *p, T);
    if (sparse) {
      lin(kIndexProjections, L.attn.index_q, T);
      lin(kIndexProjections, L.attn.index_k, T);
    }
    // Attention over the filled cache.
    PagedKV view(b.pool, b.table, start + T);
    AttnSeq seq{&view, start, T, 0};
    const double t_att = best_time(o.repeats, [&] {
      attention_batch(c, l, &seq, 1, q.data(), sparse ? iq.data() : nullptr, AttentionPath::Sparse, out.data());
    });
    double idx_bytes = 0, idx_flops = 0, att_tokens = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = start + t;
      if (sparse && !msa_all_visible(pos, mp)) {
        idx_bytes += double(pos + 1) * double(kv_row_bytes(b.ikd, ID));
        idx_flops += 2.0 * G * (pos + 1) * ID;
        att_tokens += double(std::min<int64_t>(int64_t(mp.topk) * mp.block_size, pos + 1));
      } else {
        att_tokens += double(pos + 1);
      }
    }
    double t_idx = 0;
    if (idx_flops > 0) {
      t_idx = time_index_scoring(b, l, view, iq.data(), start, T);
      table.add("index scoring", "replay of attention_batch's index scan (index_scan_block)", t_idx, idx_bytes, idx_flops);
    }
    table.add(sparse ? "sparse attention" : "dense attention",
              sparse ? "attention_batch(Sparse) minus the index-scoring replay" : "attention_batch",
              std::max(0.0, t_att - t_idx), double(G) * att_tokens * 2 * double(kv_row_bytes(b.kvd, D)),
              4.0 * c.n_heads * att_tokens * D);
    // FFN.
    if (!c.moe_layer[l]) {
      lin(kDenseMlp, L.mlp.gate, T);
      lin(kDenseMlp, L.mlp.up, T);
      lin(kDenseMlp, L.mlp.down, T);
      continue;
    }
    const double t_route = best_time(o.repeats, [&] { moe_route(c, L, m.data(), T, RouteDecision{ex.data(), ew.data()}); });
    table.add("router", "moe_route", t_route, 4.0 * c.n_experts * c.hidden + 4.0 * T * c.hidden,
              2.0 * T * c.n_experts * c.hidden);
    std::vector<int64_t> count(size_t(c.n_experts), 0);
    for (int32_t e : ex)
      if (e >= 0 && e < c.n_experts) count[size_t(e)]++;
    for (int e = 0; e < c.n_experts; ++e) {
      if (!count[size_t(e)]) continue;
      const ExpertWeights& E = L.experts[size_t(e)];
      lin(kRoutedExperts, E.gate, count[size_t(e)]);
      lin(kRoutedExperts, E.up, count[size_t(e)]);
      lin(kRoutedExperts, E.down, count[size_t(e)]);
    }
    if (L.has_shared) {
      lin(kSharedExpert, L.shared.gate, T);
      lin(kSharedExpert, L.shared.up, T);
      lin(kSharedExpert, L.shared.down, T);
    }
  }
  lin(kLmHead, b.W.lm_head(), 1);  // logits for the last token only, as forward() does
  return table.rows();
}

void print_class_roofs(const std::vector<ClassRoof>& roofs, const MachineLimits& lim) {
  std::printf("decode kernels in cache (one token, up to 128 rows per thread resident, all threads, the faster of two\n"
              "  measurements before and after the timed steps: the rate a class would reach if reading memory cost\n"
              "  nothing; its first matrix):\n");
  for (const ClassRoof& r : roofs) {
    if (r.best.gws <= 0) continue;
    std::printf("  %-22s %-5s %7.2f G weights/s = %7.2f GB/s = %.2fx read BW\n", r.cls, linear_kind_name(r.L->kind),
                r.best.gws, r.best.gbs, r.best.gbs / lim.read_gbs);
  }
  std::printf("\nlimits: %.2f GB/s read, %.2f GFLOP/s FMA; %%BW and %%FMA are fractions of these.\n", lim.read_gbs,
              lim.fma_gflops);
  std::printf("bytes: weights read once per call + fp32 activations in/out; KV and index-key rows read in their cache dtype.\n");
  std::printf("every timed call starts from cold caches (a 96 MiB buffer is read before it).\n");
}

// The decode roof: each weight class at the lower of its kernels' in-cache rate and the read
// bandwidth, as if every read overlapped its decode perfectly; a class bound by its decode keeps the
// step below the read bandwidth however fast memory is.
void print_decode_roof(const std::vector<Row>& decode_rows, const std::vector<ClassRoof>& roofs, const MachineLimits& lim,
                       double active, double steady) {
  double roof_t = 0, roof_b = 0;
  std::string bound;
  for (const Row& r : decode_rows) {
    const auto it = std::find_if(roofs.begin(), roofs.end(), [&](const ClassRoof& cr) { return r.cls == cr.cls; });
    if (it == roofs.end() || it->best.gws <= 0) continue;
    const double gbs = it->best.gbs;  // the class's in-cache rate
    roof_t += r.bytes / (std::min(gbs, lim.read_gbs) * 1e9);
    roof_b += r.bytes;
    if (gbs < lim.read_gbs) bound += fmt::format("{}{} {:.2f}x", bound.empty() ? "" : ", ", r.cls, gbs / lim.read_gbs);
  }
  if (roof_t > 0)
    std::printf("  decode roof (each weight class at the lower of its in-cache rate and the read BW, as if reads and\n"
                "  decode overlapped perfectly): %.3f ms for %.1f MB = %.0f%% of read BW; the steady step's weights\n"
                "  reach %.0f%% of the roof's rate; classes bound by their decode: %s\n",
                roof_t * 1e3, roof_b / 1e6, 100 * roof_b / roof_t / 1e9 / lim.read_gbs,
                100 * (active / steady) / (roof_b / roof_t), bound.empty() ? "none" : bound.c_str());
}

void print_steady_decode(const Bench& b, const StepTimes& st, const std::vector<Row>& decode_rows,
                         const std::vector<ClassRoof>& roofs) {
  const RooflineOptions& o = b.o;
  const MachineLimits& lim = b.lim;
  const double active = double(b.W.active_bytes_per_token());
  double step_bytes = 0;
  for (const Row& r : decode_rows) step_bytes += r.bytes;
  std::printf("steady decode: %d steps in a row from context %lld (cache appended, no flush; best mean of %d): %.3f ms "
              "= %.2f tokens/s, weights %.2f GB/s (%.0f%% of read BW)\n",
              kSteadySteps, (long long)o.context, std::max(1, o.repeats), st.steady * 1e3, 1.0 / st.steady,
              active / st.steady / 1e9, 100 * active / st.steady / 1e9 / lim.read_gbs);
  print_decode_roof(decode_rows, roofs, lim, active, st.steady);
  std::string runs;
  for (double p : st.paired) runs += fmt::format("{}{:.0f}%", runs.empty() ? "" : " ", 100 * p);
  std::printf("  paired with a read probe just before each run: weights at %s of it (median %.0f%%)\n", runs.c_str(),
              100 * percentile(st.paired, 50));
  std::vector<double> inter = st.inter, inter_ms = st.inter_ms;
  std::sort(inter.begin(), inter.end());
  std::sort(inter_ms.begin(), inter_ms.end());
  const size_t n = inter.size();
  std::printf("  interleaved with the read probe (%d steps, each between two %.0f MiB passes): weights at a median %.0f%% "
              "(quartiles %.0f-%.0f%%) of the passes around each step; step median %.3f ms\n",
              int(n), std::min(o.probe_mib, 256.0), 100 * inter[n / 2], 100 * inter[n / 4], 100 * inter[3 * n / 4],
              inter_ms[n / 2]);
  if (!st.ratios.empty()) {
    std::string rs;
    for (double x : st.ratios) rs += fmt::format("{}{:.2f}", rs.empty() ? "" : " ", x);
    std::printf("  against context %lld, run right after each (best %.3f ms): rate at %lld over rate at %lld, per pair "
                "%s (median %.2f)\n",
                (long long)o.compare_context, st.steady_cmp * 1e3, (long long)o.context, (long long)o.compare_context,
                rs.c_str(), percentile(st.ratios, 50));
  }
  // At long context the K/V and index-key rows add to the weights (the bytes that bound decode there).
  std::printf("  everything a step reads (weights, K/V and index-key rows, activations; as the table counts): %.1f MB, "
              "%.2f GB/s at the steady rate (%.0f%% of read BW)\n",
              step_bytes / 1e6, step_bytes / st.steady / 1e9, 100 * step_bytes / st.steady / 1e9 / lim.read_gbs);
}

}  // namespace

void check_roofline_options(const RooflineOptions& o) {
  if (o.context < 1 || o.prefill < 1) throw Error("--context and --prefill must be at least 1");
  if (o.compare_context < 0) throw Error("--compare-context must be at least 1 (0: off)");
  parse_kv_dtype(o.kv_cache_dtype, "--kv-cache-dtype");
  parse_kv_dtype(o.indexer_kv_dtype, "--indexer-kv-dtype");
}

void run_roofline(const RooflineOptions& o) {
  check_roofline_options(o);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const KVDtype kvd = parse_kv_dtype(o.kv_cache_dtype, "--kv-cache-dtype");
  const KVDtype ikd = parse_kv_dtype(o.indexer_kv_dtype, "--indexer-kv-dtype");
  const MachineLimits lim = measure_limits(o.probe_mib, o.threads);
  print_machine(lim, o);

  Model model(o.model_dir, o.model);
  print_model(model, o);
  std::vector<ClassRoof> roofs = class_roof_matrices(model.config(), model.weights());
  measure_class_roofs(roofs, lim.threads);

  const ModelConfig& c = model.config();
  const int64_t need = std::max({o.context + 1 + kSteadySteps, o.compare_context + 1 + kSteadySteps, o.prefill}) + 1;
  const int page = c.any_sparse() ? c.block_size : 128;
  Bench b(o, lim, model, kvd, ikd, need, page);
  std::printf("  KV cache: paged, %d-token pages, K/V %s, index keys %s (--kv-cache-dtype / --indexer-kv-dtype)\n", page,
              kv_dtype_name(kvd), kv_dtype_name(ikd));
  fill_cache(b, need);
  b.toks.resize(size_t(o.prefill));
  for (auto& t : b.toks) t = int32_t(b.rng() % uint32_t(c.vocab));

  const StepTimes st = time_whole_steps(b);
  measure_class_roofs(roofs, lim.threads);
  print_class_roofs(roofs, lim);
  const std::vector<Row> decode_rows = time_classes(b, 1, true);
  print_table(fmt::format("DECODE: 1 token at context {} (best of {})", o.context, o.repeats).c_str(), decode_rows, lim,
              st.decode_whole, 1);
  print_steady_decode(b, st, decode_rows, roofs);
  print_table(fmt::format("PREFILL: {} tokens from an empty cache (best of {})", o.prefill, std::min(o.repeats, 2)).c_str(),
              time_classes(b, o.prefill, false), lim, st.prefill_whole, o.prefill);
}

}  // namespace m3::bench
