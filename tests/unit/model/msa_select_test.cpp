// MSA block selection against a brute-force statement of the rule (docs/model.md 4.5): forced init and
// local blocks, then the best-scoring other blocks, ties to the lower index, top-k in total.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "model/msa_select.h"

namespace {

std::set<int32_t> brute_force(int64_t pos, const std::vector<float>& S, const m3::MsaParams& p) {
  const int64_t nvis = pos / p.block_size + 1, cq = nvis - 1;
  std::set<int32_t> out;
  const int64_t k = std::min<int64_t>(p.topk, nvis);
  for (int64_t c = 0; c < nvis; ++c)
    if (c < p.init_blocks || c > cq - p.local_blocks) out.insert(int32_t(c));
  while (int64_t(out.size()) < k) {
    int32_t best = -1;
    for (int64_t c = 0; c < nvis; ++c)
      if (!out.count(int32_t(c)) && (best < 0 || S[c] > S[best])) best = int32_t(c);
    out.insert(best);
  }
  return out;
}

TEST(MsaSelect, MatchesBruteForce) {
  std::mt19937 rng(3);
  std::vector<int32_t> scratch;
  for (int iter = 0; iter < 2000; ++iter) {
    m3::MsaParams p;
    p.block_size = 1 << (rng() % 5 + 2);
    p.init_blocks = int(rng() % 2);
    p.local_blocks = int(rng() % 2 + 1);
    p.topk = p.init_blocks + p.local_blocks + int(rng() % 5);
    const int64_t pos = rng() % (p.block_size * 40);
    const int64_t nvis = pos / p.block_size + 1;
    std::vector<float> S(nvis);
    // Coarse values so that exact ties happen often.
    for (auto& s : S) s = float(int(rng() % 9) - 4) * 0.5f;
    std::vector<int32_t> out(p.topk);
    const int n = m3::msa_select_blocks(pos, S.data(), p, out.data(), scratch);
    const auto want = brute_force(pos, S, p);
    ASSERT_EQ(size_t(n), want.size()) << "pos " << pos;
    ASSERT_TRUE(std::is_sorted(out.begin(), out.begin() + n));
    ASSERT_EQ(std::set<int32_t>(out.begin(), out.begin() + n), want) << "pos " << pos << " B " << p.block_size;
  }
}

TEST(MsaSelect, BelowTopkEveryVisibleBlockIsKept) {
  m3::MsaParams p{128, 16, 1, 0};
  std::vector<int32_t> scratch, out(16);
  std::vector<float> S(16, 0.f);
  EXPECT_EQ(m3::msa_select_blocks(2047, S.data(), p, out.data(), scratch), 16);
  EXPECT_TRUE(m3::msa_all_visible(2047, p));
  EXPECT_FALSE(m3::msa_all_visible(2048, p));
}

}  // namespace
