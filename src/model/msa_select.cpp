// MSA top-k block selection (see msa_select.h).
#include "model/msa_select.h"

#include <algorithm>

namespace m3 {

int msa_select_blocks(int64_t pos, const float* S, const MsaParams& p, int32_t* out, std::vector<int32_t>& cand) {
  const int64_t nvis = msa_visible_blocks(pos, p.block_size);
  const int64_t cq = nvis - 1;
  if (nvis <= p.topk) {
    for (int64_t c = 0; c < nvis; ++c) out[c] = int32_t(c);
    return int(nvis);
  }
  // Forced: init blocks [0, init) and local blocks [cq - local + 1, cq]; both visible here.
  const int64_t local_lo = std::max<int64_t>(0, cq - p.local_blocks + 1);
  const int64_t init_hi = std::min<int64_t>(p.init_blocks, nvis);
  auto forced = [&](int64_t c) { return c < init_hi || c >= local_lo; };
  int n = 0;
  cand.clear();
  for (int64_t c = 0; c < nvis; ++c) {
    if (forced(c)) {
      out[n++] = int32_t(c);
    } else {
      cand.push_back(int32_t(c));
    }
  }
  const int64_t want = std::min<int64_t>(p.topk - n, int64_t(cand.size()));
  if (want > 0) {
    auto better = [&](int32_t a, int32_t b) { return S[a] > S[b] || (S[a] == S[b] && a < b); };
    std::partial_sort(cand.begin(), cand.begin() + want, cand.end(), better);
    for (int64_t i = 0; i < want; ++i) out[n++] = cand[i];
  }
  std::sort(out, out + n);
  return n;
}

}  // namespace m3
