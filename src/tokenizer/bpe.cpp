// BPE merge loop (see bpe.h): a doubly linked list of symbols plus a min-heap of candidate merges,
// so long pieces (e.g. whitespace runs) stay O(n log n).
#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

namespace m3::tok {

void Bpe::add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  merges_.try_emplace(key(left, right), Merge{rank, merged});
}

void Bpe::encode(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;  // indices, -1 at the ends
  };
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  if (syms.size() == 1) {
    out.push_back(syms[0].id);
    return;
  }

  struct Cand {
    int32_t rank, pos, left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = syms[pos].next;
    if (nx < 0) return;
    if (const Merge* m = find(syms[pos].id, syms[nx].id)) heap.push({m->rank, pos, syms[pos].id, syms[nx].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);

  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[c.pos];
    // Stale candidate: the symbol was merged away or its neighbour changed since it was queued.
    if (l.id != c.left_id || l.next < 0 || syms[l.next].id != c.right_id) continue;
    const Merge* m = find(l.id, syms[l.next].id);
    const int32_t r = l.next;
    l.id = m->merged;
    l.next = syms[r].next;
    if (l.next >= 0) syms[l.next].prev = c.pos;
    syms[r].id = -1;  // dead
    consider(l.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace m3::tok
