// Helpers for the golden-logit tests (see golden_compare.h).
#include "golden_compare.h"

#include <gtest/gtest.h>

#include "test_tmp.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace m3test {

namespace fs = std::filesystem;

Margins read_margins(const std::string& tsv) {
  std::ifstream in(tsv);
  Margins m;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string pos, r, b;
    ls >> pos >> r >> b;
    auto parse = [](const std::string& s) { return s == "inf" ? std::numeric_limits<double>::infinity() : std::stod(s); };
    m.route.push_back(parse(r));
    m.block.push_back(parse(b));
  }
  return m;
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::vector<int32_t> read_tokens(const std::string& path) {
  std::ifstream in(path);
  std::vector<int32_t> ids;
  int32_t v;
  while (in >> v) ids.push_back(v);
  return ids;
}

CompareReport compare_logits(const float* got, const float* ref, int64_t n, int64_t V, const Margins& m,
                             double route_min, double block_min, double tol) {
  CompareReport r;
  std::vector<std::pair<double, int64_t>> rows;
  double sum = 0;
  for (int64_t p = 0; p < n; ++p) {
    double row = 0;
    int64_t ag = 0, ar = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = std::fabs(double(got[p * V + v]) - double(ref[p * V + v]));
      row = std::max(row, d);
      sum += d;
      if (got[p * V + v] > got[p * V + ag]) ag = v;
      if (ref[p * V + v] > ref[p * V + ar]) ar = v;
    }
    rows.push_back({row, p});
    r.max_abs_all = std::max(r.max_abs_all, row);
    const bool safe = size_t(p) < m.route.size() && m.route[p] >= route_min && m.block[p] >= block_min;
    if (safe) {
      ++r.safe_positions;
      r.max_abs_safe = std::max(r.max_abs_safe, row);
      // A different argmax counts as agreement when the two reference logits are within tolerance.
      if (ag != ar && std::fabs(ref[p * V + ag] - ref[p * V + ar]) > tol) ++r.top1_disagree_safe;
    }
  }
  r.mean_abs_all = sum / double(n * V);
  std::sort(rows.rbegin(), rows.rend());
  std::ostringstream o;
  for (size_t i = 0; i < std::min<size_t>(5, rows.size()); ++i) {
    const int64_t p = rows[i].second;
    o << "  pos " << p << " max-abs " << rows[i].first;
    if (size_t(p) < m.route.size()) o << " route_margin " << m.route[p] << " block_margin " << m.block[p];
    o << "\n";
  }
  r.worst = o.str();
  return r;
}

std::string golden_model_dir(const std::string& name) {
  const std::string base = std::string(M3_TEST_DATA) + "/golden/";
  if (name != "m3-tiny-topk2") return base + name + "/hf";
  // Same weights and tokenizer as m3-tiny; only config.json differs.
  const fs::path dir = fs::path(::m3test::test_tmp_dir()) / "m3-tiny-topk2-hf";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(base + "m3-tiny/hf")) {
    const fs::path dst = dir / e.path().filename();
    if (e.path().filename() == "config.json") continue;
    if (!fs::exists(dst)) fs::create_symlink(e.path(), dst);
  }
  fs::copy_file(base + "m3-tiny-topk2/hf/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  return dir.string();
}

}  // namespace m3test
