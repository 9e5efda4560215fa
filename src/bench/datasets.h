// `bench serve`'s datasets, as `vllm bench serve` builds them: `random` (token-exact lengths from the
// vocabulary), `sharegpt` (the first human turn of each conversation of a ShareGPT JSON file, its
// reply's length as the output length) and `custom` (a JSONL file of {"prompt": ...} lines).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_client.h"
#include "bench/serve_bench.h"

namespace m3::bench {

struct Prompt {
  std::string text;
  std::vector<int32_t> ids;  // when not empty: sent as the completions prompt instead of text (chat template applied)
  int64_t prompt_len = 0, output_len = 0;
};

// Lengths uniform in [floor(L(1-r)), ceil(L(1+r))]; a body of consecutive allowed ids from a random
// offset; decoded, re-encoded and trimmed / padded to the target length.
std::vector<Prompt> random_dataset(const ServeBenchOptions& o, TokenBackend& tok);

// vLLM's ShareGPT sampling: conversations with at least two turns, shuffled by --seed; prompt = the
// first turn, output length = the second turn's tokens (or --sharegpt-output-len); pairs with a
// prompt or reply under 4 tokens, a prompt over 1024 or a total over 2048 skipped; fewer than
// --num-prompts valid pairs are topped up by drawing again among them.
std::vector<Prompt> sharegpt_dataset(const ServeBenchOptions& o, TokenBackend& tok);

// vLLM's custom dataset: JSONL, one {"prompt": "..."} per line, shuffled by --seed, output length
// --custom-output-len. On /v1/completions the model's chat template is applied (by the server's
// /tokenize) unless --custom-skip-chat-template.
std::vector<Prompt> custom_dataset(const ServeBenchOptions& o, TokenBackend& tok, bool chat, const Endpoint& ep,
                                   const std::string& model);

}  // namespace m3::bench
