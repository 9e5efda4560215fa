// Structured-output micro-benchmarks (Google Benchmark; `make bench-structured`): grammar compile
// time and the per-step cost of the allowed-token mask at vocabulary 200K (o200k), for a small and a
// large JSON schema. A "step" is mask() + choosing an allowed token + advance(), along a
// deterministic pseudo-random walk from a fresh matcher (its caches start empty, as per request).
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>
#include <random>

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

void mask_bench(benchmark::State& st, const std::string& schema) {
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(json_schema_grammar(ojson::parse(schema)));
  spec->vocab = vocab();
  const TokenVocab& v = *spec->vocab;
  const int kSteps = 128;
  int64_t steps = 0, computed = 0, trie_steps = 0;
  for (auto _ : st) {
    Matcher m(spec);
    std::mt19937 rng(7);
    std::vector<int32_t> allowed;
    for (int i = 0; i < kSteps; ++i) {
      const uint64_t* mask = m.mask();
      allowed.clear();
      for (int64_t w = 0; w < v.mask_words(); ++w)
        for (uint64_t b = mask[w]; b; b &= b - 1) allowed.push_back(int32_t(w * 64 + __builtin_ctzll(b)));
      if (allowed.empty()) break;
      // Short tokens half the time so the walk leaves strings and visits structure.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2)
        for (int k = 0; k < 64; ++k) {
          const int32_t t = allowed[rng() % allowed.size()];
          if (v.bytes(t).size() <= 2) { pick = t; break; }
        }
      if (pick == v.eos()) break;
      m.advance(pick);
      ++steps;
    }
    computed += m.stats().masks_computed;
    trie_steps += m.stats().trie_steps;
  }
  st.counters["us_per_step"] = benchmark::Counter(double(steps) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["masks_computed_per_step"] = double(computed) / double(std::max<int64_t>(steps, 1));
  st.counters["trie_nodes_per_mask"] = double(trie_steps) / double(std::max<int64_t>(computed, 1));
  st.counters["trie_nodes"] = double(v.trie_nodes());
}
void BM_MaskStepSmall(benchmark::State& st) { mask_bench(st, kSmall); }
void BM_MaskStepLarge(benchmark::State& st) { mask_bench(st, large_schema()); }

}  // namespace

BENCHMARK(BM_BuildVocabTrie)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_CompileSmall)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CompileLarge)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskStepSmall)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_MaskStepLarge)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
