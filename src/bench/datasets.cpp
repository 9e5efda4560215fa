// `bench serve`'s datasets (see datasets.h).
#include "bench/datasets.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace m3::bench {

using json = nlohmann::json;

std::vector<Prompt> random_dataset(const ServeBenchOptions& o, TokenBackend& tok) {
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1)) throw Error("--random-range-ratio must be in [0, 1)");
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> allowed = tok.allowed_ids();
  if (allowed.empty()) throw Error("no usable token ids");
  const int64_t n_special = int64_t(tok.encode("").size());
  const int64_t real_in = std::max<int64_t>(1, o.random_input_len - n_special);
  const double r = o.random_range_ratio;
  std::uniform_int_distribution<int64_t> in_len(std::max<int64_t>(1, int64_t(std::floor(real_in * (1 - r)))),
                                                int64_t(std::ceil(real_in * (1 + r))));
  std::uniform_int_distribution<int64_t> out_len(std::max<int64_t>(1, int64_t(std::floor(o.random_output_len * (1 - r)))),
                                                 std::max<int64_t>(1, int64_t(std::ceil(o.random_output_len * (1 + r)))));
  std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
  std::vector<int32_t> prefix(size_t(std::max<int64_t>(0, o.random_prefix_len)));
  for (auto& id : prefix) id = allowed[pick(rng)];
  std::vector<Prompt> out;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    Prompt p;
    const int64_t target = int64_t(prefix.size()) + in_len(rng);
    p.output_len = out_len(rng);
    const size_t offset = pick(rng);
    std::vector<int32_t> ids = prefix;
    for (int64_t j = int64_t(prefix.size()); j < target; ++j) ids.push_back(allowed[(offset + size_t(i) + size_t(j)) % allowed.size()]);
    // Decoding then re-encoding can merge or split tokens: adjust a few times towards the target.
    for (int iter = 0; iter < 4; ++iter) {
      p.text = tok.decode(ids);
      ids = tok.encode(p.text);
      if (int64_t(ids.size()) == target) break;
      if (int64_t(ids.size()) > target) ids.resize(size_t(target));
      while (int64_t(ids.size()) < target) ids.push_back(allowed[pick(rng)]);
    }
    p.prompt_len = int64_t(ids.size());  // verified length of the final text
    out.push_back(std::move(p));
  }
  return out;
}


namespace {

// Reads a whole dataset file; the error names the flag and the path.
std::string read_dataset_file(const std::string& path) {
  if (path.empty()) throw Error("--dataset-path is required for this --dataset-name");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("--dataset-path: cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Up to n prompts: all of `valid` when it has n or more (its first n), else topped up by drawing
// again among them (vLLM's oversampling), so the run has the requested count.
std::vector<Prompt> take_or_oversample(std::vector<Prompt> valid, int64_t n, std::mt19937_64& rng, const char* what) {
  if (valid.empty()) throw Error(std::string(what) + ": no usable prompt in the dataset");
  if (int64_t(valid.size()) >= n) {
    valid.resize(size_t(n));
    return valid;
  }
  std::uniform_int_distribution<size_t> pick(0, valid.size() - 1);
  const size_t have = valid.size();
  while (int64_t(valid.size()) < n) valid.push_back(valid[pick(rng) % have]);
  return valid;
}

}  // namespace

std::vector<Prompt> sharegpt_dataset(const ServeBenchOptions& o, TokenBackend& tok) {
  json data;
  try {
    data = json::parse(read_dataset_file(o.dataset_path));
  } catch (const json::exception& e) {
    throw Error("--dataset-path " + o.dataset_path + ": not a ShareGPT JSON file: " + e.what());
  }
  if (!data.is_array()) throw Error("--dataset-path " + o.dataset_path + ": a ShareGPT file is a JSON array of conversations");
  std::vector<const json*> convs;
  for (const json& entry : data) {
    if (!entry.is_object()) continue;
    auto c = entry.find("conversations");
    if (c == entry.end() || !c->is_array() || c->size() < 2) continue;
    if (!(*c)[0].contains("value") || !(*c)[1].contains("value") || !(*c)[0]["value"].is_string() ||
        !(*c)[1]["value"].is_string())
      continue;
    convs.push_back(&*c);
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(convs.begin(), convs.end(), rng);
  std::vector<Prompt> out;
  for (const json* c : convs) {
    if (int64_t(out.size()) >= o.num_prompts) break;
    Prompt p;
    p.text = (*c)[0]["value"].get<std::string>();
    p.prompt_len = int64_t(tok.encode(p.text).size());
    const bool fixed = o.sharegpt_output_len > 0;
    p.output_len = fixed ? o.sharegpt_output_len : int64_t(tok.encode((*c)[1]["value"].get<std::string>()).size());
    if (p.prompt_len < 4 || (!fixed && p.output_len < 4)) continue;
    if (p.prompt_len > 1024 || p.prompt_len + p.output_len > 2048) continue;
    out.push_back(std::move(p));
  }
  return take_or_oversample(std::move(out), o.num_prompts, rng, "--dataset-name sharegpt");
}

std::vector<Prompt> custom_dataset(const ServeBenchOptions& o, TokenBackend& tok, bool chat, const Endpoint& ep,
                                   const std::string& model) {
  if (o.custom_output_len < 1) throw Error("--custom-output-len must be at least 1");
  const std::string text = read_dataset_file(o.dataset_path);
  std::vector<std::string> prompts;
  size_t at = 0;
  int64_t line_no = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error("--dataset-path " + o.dataset_path + " line " + std::to_string(line_no) + ": not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw Error("--dataset-path " + o.dataset_path + " line " + std::to_string(line_no) +
                  ": expected an object with a string \"prompt\"");
    prompts.push_back(j["prompt"].get<std::string>());
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(prompts.begin(), prompts.end(), rng);
  std::vector<Prompt> out;
  for (const std::string& s : prompts) {
    if (int64_t(out.size()) >= o.num_prompts) break;
    Prompt p;
    p.text = s;
    p.output_len = o.custom_output_len;
    if (!chat && !o.custom_skip_chat_template) {
      p.ids = chat_prompt_ids(ep, model, s);
      p.prompt_len = int64_t(p.ids.size());
    } else {
      p.prompt_len = int64_t(tok.encode(s).size());
    }
    out.push_back(std::move(p));
  }
  return take_or_oversample(std::move(out), o.num_prompts, rng, "--dataset-name custom");
}

}  // namespace m3::bench
