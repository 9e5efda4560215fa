// Structured-output micro-benchmarks (Google Benchmark; `make bench-structured`): grammar compile
// time and the per-step cost of the allowed-token mask at vocabulary 200K (o200k), for a small and a
// large JSON schema. The token path of each schema is fixed once (a deterministic pseudo-random walk
// through allowed tokens that leaves strings and visits structure); the benchmarks replay it, timing
// exactly what the engine does per generated token: mask() + advance(token).
//   BM_MaskStepCold*: a fresh matcher per pass, as every request starts (its caches empty): new
//     configurations compute their mask by walking the vocabulary trie; recurring ones hit the cache.
//   BM_MaskStepWarm*: passes on forks of one matcher (shared caches, as the speculator's forks are):
//     after the first pass every mask is a lookup, the floor of the per-step cost.
//   BM_SamplerMask/<masked>: what the mask adds to sampling one row of 200K logits (the disallowed
//     logits to -inf before the transforms), greedy and temperature 1 with top-p 0.9.
// Compile time: BM_Compile* (schema -> grammar -> determinised DFAs), BM_BuildVocabTrie (once per
// tokenizer for the life of the process).
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/sampler.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

#ifndef M3_TEST_DATA
#define M3_TEST_DATA "tests/data"
#endif

namespace {

using namespace m3::structured;
using ojson = nlohmann::ordered_json;

const char* kSmall = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
  "email":{"type":"string","format":"email"}},"required":["name","age"]})";

std::string large_schema() {
  ojson props = ojson::object();
  for (int i = 0; i < 60; ++i) {
    ojson p;
    switch (i % 6) {
      case 0: p = {{"type", "string"}, {"maxLength", 64}}; break;
      case 1: p = {{"type", "integer"}, {"minimum", -1000}, {"maximum", 100000}}; break;
      case 2: p = {{"enum", {"alpha", "beta", "gamma", "delta"}}}; break;
      case 3: p = {{"type", "array"}, {"items", {{"$ref", "#/$defs/item"}}}, {"maxItems", 8}}; break;
      case 4: p = {{"type", "number"}}; break;
      case 5: p = {{"type", "string"}, {"format", "date-time"}}; break;
    }
    props["field_" + std::to_string(i)] = p;
  }
  ojson req = ojson::array();
  for (int i = 0; i < 60; i += 3) req.push_back("field_" + std::to_string(i));
  ojson s = {{"type", "object"}, {"properties", props}, {"required", req},
             {"$defs", {{"item", {{"type", "object"}, {"properties", {{"k", {{"type", "string"}}}, {"v", {{"type", "number"}}},
                                                                     {"sub", {{"$ref", "#/$defs/item"}}}}},
                                 {"required", {"k"}}}}}}};
  return s.dump();
}

const m3::Tokenizer& tok() {
  static m3::Tokenizer t = m3::Tokenizer::from_dir(std::string(M3_TEST_DATA) + "/tokenizer/o200k");
  return t;
}
std::shared_ptr<const TokenVocab> vocab() {
  static auto v = TokenVocab::build(tok(), tok().vocab_size());
  return v;
}

void BM_BuildVocabTrie(benchmark::State& st) {
  for (auto _ : st) benchmark::DoNotOptimize(TokenVocab::build(tok(), tok().vocab_size()));
}

void compile_bench(benchmark::State& st, const std::string& schema) {
  const ojson j = ojson::parse(schema);
  int64_t states = 0;
  for (auto _ : st) {
    auto g = compile(json_schema_grammar(j));
    states = int64_t(g->states.size());
    benchmark::DoNotOptimize(g);
  }
  st.counters["dfa_states"] = double(states);
}
void BM_CompileSmall(benchmark::State& st) { compile_bench(st, kSmall); }
void BM_CompileLarge(benchmark::State& st) { compile_bench(st, large_schema()); }

std::shared_ptr<const ConstraintSpec> spec_of(const std::string& schema) {
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(json_schema_grammar(ojson::parse(schema)));
  spec->vocab = vocab();
  spec->description = "json_schema";
  return spec;
}

// The fixed token path of a schema: up to kSteps tokens, short tokens half of the time.
constexpr int kSteps = 128;
std::vector<int32_t> walk_path(const std::shared_ptr<const ConstraintSpec>& spec) {
  const TokenVocab& v = *spec->vocab;
  Matcher m(spec);
  std::mt19937 rng(7);
  std::vector<int32_t> path, allowed;
  for (int i = 0; i < kSteps; ++i) {
    const uint64_t* mask = m.mask();
    allowed.clear();
    for (int64_t w = 0; w < v.mask_words(); ++w)
      for (uint64_t b = mask[w]; b; b &= b - 1) allowed.push_back(int32_t(w * 64 + __builtin_ctzll(b)));
    if (allowed.empty()) break;
    int32_t pick = allowed[rng() % allowed.size()];
    if (rng() % 2)
      for (int k = 0; k < 64; ++k) {
        const int32_t t = allowed[rng() % allowed.size()];
        if (v.bytes(t).size() <= 2) {
          pick = t;
          break;
        }
      }
    if (pick == v.eos()) break;
    m.advance(pick);
    path.push_back(pick);
  }
  return path;
}

void mask_bench(benchmark::State& st, const std::string& schema, bool warm) {
  const auto spec = spec_of(schema);
  const std::vector<int32_t> path = walk_path(spec);
  Matcher base(spec);
  int64_t steps = 0;
  Matcher::Stats last;
  uint64_t sink = 0;
  for (auto _ : st) {
    Matcher m = warm ? base.fork() : Matcher(spec);
    for (int32_t t : path) {
      sink += m.mask()[0];
      m.advance(t);
    }
    steps += int64_t(path.size());
    last = m.stats();
  }
  benchmark::DoNotOptimize(sink);
  st.counters["us_per_step"] = benchmark::Counter(double(steps) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["steps"] = double(path.size());
  // Of the last pass (warm: cumulative over all passes, so its misses are the first pass's).
  st.counters["masks_computed"] = double(last.masks_computed);
  st.counters["mask_hits"] = double(last.mask_hits);
  st.counters["trie_nodes_per_mask"] = double(last.trie_steps) / double(std::max<int64_t>(last.masks_computed, 1));
  st.counters["trie_nodes"] = double(spec->vocab->trie_nodes());
  st.counters["state_KiB"] = double(last.state_bytes + last.row_bytes) / 1024.0;
  st.counters["mask_cache_KiB"] = double(last.mask_bytes) / 1024.0;
}
void BM_MaskStepColdSmall(benchmark::State& st) { mask_bench(st, kSmall, false); }
void BM_MaskStepColdLarge(benchmark::State& st) { mask_bench(st, large_schema(), false); }
void BM_MaskStepWarmSmall(benchmark::State& st) { mask_bench(st, kSmall, true); }
void BM_MaskStepWarmLarge(benchmark::State& st) { mask_bench(st, large_schema(), true); }

// Sampling one row of 200K logits with and without a mask (arg 1: masked; arg 0 as the baseline).
void sampler_bench(benchmark::State& st, float temperature) {
  const int64_t V = vocab()->size();
  const auto spec = spec_of(kSmall);
  Matcher m(spec);
  m.advance_bytes("{\"name\": \"");  // inside a string: most of the vocabulary allowed
  const uint64_t* mask = st.range(0) ? m.mask() : nullptr;
  std::vector<float> logits(static_cast<size_t>(V));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& x : logits) x = nd(rng);
  m3::SamplingParams p;
  p.temperature = temperature;
  if (temperature > 0) p.top_p = 0.9f;
  p.has_seed = true;
  m3::Sampler smp(p);
  const std::vector<int32_t> prompt{1, 2, 3}, output;
  for (auto _ : st) benchmark::DoNotOptimize(smp.sample(logits.data(), V, prompt, output, nullptr, mask));
}
void BM_SamplerMaskGreedy(benchmark::State& st) { sampler_bench(st, 0.0f); }
void BM_SamplerMaskTopP(benchmark::State& st) { sampler_bench(st, 1.0f); }

}  // namespace

BENCHMARK(BM_BuildVocabTrie)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_CompileSmall)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileLarge)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskStepColdSmall)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MaskStepColdLarge)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MaskStepWarmSmall)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskStepWarmLarge)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SamplerMaskGreedy)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SamplerMaskTopP)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
