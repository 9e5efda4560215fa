// Comparison of logits against the golden reference files: max-abs overall and on positions whose
// routing / block-selection margins are not tiny, top-1 agreement, and the worst positions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3test {

struct Margins {
  std::vector<double> route, block;  // per position (inf when no choice was made)
};

Margins read_margins(const std::string& tsv);
std::vector<float> read_f32(const std::string& path);
std::vector<int32_t> read_tokens(const std::string& path);

struct CompareReport {
  double max_abs_all = 0, mean_abs_all = 0;
  double max_abs_safe = 0;  // positions with route >= route_min and block >= block_min
  int64_t safe_positions = 0, top1_disagree_safe = 0;
  std::string worst;  // text: worst positions with their margins
};

CompareReport compare_logits(const float* got, const float* ref, int64_t n, int64_t vocab, const Margins& m,
                             double route_min, double block_min, double tol);

// Directory of a golden model inside the test data (m3-tiny-topk2 is assembled from m3-tiny).
std::string golden_model_dir(const std::string& name);

}  // namespace m3test
