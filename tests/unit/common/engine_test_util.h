// Shared helpers for the engine tests: a small random model built once per binary, and running a
// set of requests through an Engine to completion.
#pragma once
#include <gtest/gtest.h>

#include "test_tmp.h"
#include "tiny_model_options.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tools/make_model.h"

namespace m3test {

// A tiny M3.1-layout model with small MSA blocks (16 tokens, top-3) so selection is active early.
inline const std::string& small_engine_model() {
  static const std::string dir = [] {
    const std::string d = m3test::test_tmp_dir() + "/engine_small_model";
    std::filesystem::remove_all(d);
    m3::MakeModelOptions o = tiny_model_options(m3::ModelLayout::M31, 9);
    o.layers = 2;
    o.block_size = 16;
    o.topk_blocks = 3;
    m3::make_model(o, d);
    return d;
  }();
  return dir;
}

struct Finished {
  std::vector<int32_t> tokens;
  std::string text;
  m3::FinishReason reason = m3::FinishReason::None;
  int64_t cached = 0;
};

// Runs every queued request to completion.
inline std::map<std::string, Finished> drain(m3::Engine& e) {
  std::map<std::string, Finished> out;
  while (e.has_work()) {
    for (auto& o : e.step()) {
      auto& f = out[o.request_id];
      f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      f.text += o.new_text;
      f.cached = o.num_cached_tokens;
      if (o.finished) f.reason = o.finish_reason;
    }
  }
  return out;
}

// Greedy sampling of exactly max_tokens tokens (end-of-sequence ignored).
inline m3::SamplingParams greedy(int max_tokens) {
  m3::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

// Sampling tests against an exact law: `exact` maps each possible output sequence to its probability.
// Runs n seeded copies of `prompt` (seed i * 7919 + seed_offset, 500 at a time) through `e` and counts
// the outputs per cell of `exact`; counts has one more cell at the end for outputs outside the support.
struct SampledCells {
  std::vector<double> p;       // the cells' probabilities, in `exact`'s order
  std::vector<int64_t> counts; // p.size() + 1
};
inline SampledCells sample_cells(m3::Engine& e, const std::vector<int32_t>& prompt, const m3::SamplingParams& sp,
                                 const std::map<std::vector<int32_t>, double>& exact, int n, uint64_t seed_offset) {
  SampledCells out;
  std::map<std::vector<int32_t>, size_t> cell;
  for (const auto& [k, v] : exact) {
    cell[k] = out.p.size();
    out.p.push_back(v);
  }
  out.counts.assign(out.p.size() + 1, 0);
  for (int base = 0; base < n; base += 500) {
    for (int i = base; i < std::min(n, base + 500); ++i) {
      m3::SamplingParams q = sp;
      q.has_seed = true;
      q.seed = uint64_t(i) * 7919u + seed_offset;
      e.add_request("s" + std::to_string(i), prompt, q);
    }
    for (const auto& [id, f] : drain(e)) {
      auto it = cell.find(f.tokens);
      ++out.counts[it == cell.end() ? out.p.size() : it->second];
    }
  }
  return out;
}

}  // namespace m3test
