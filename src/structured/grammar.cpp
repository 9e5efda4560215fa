// Regex expressions, UTF-8 code point classes, and the per-rule determinisation (see grammar.h).
#include "structured/grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace m3::structured {

void CompileClock::check() const {
  if (std::chrono::steady_clock::now() > end_)
    throw StructuredError("structured output: compiling the constraint took longer than the limit of " +
                          std::to_string(seconds_) + " s (simplify the schema, regex or grammar)");
}

// ---------------------------------------------------------------- expressions
ExprPtr e_empty() { return std::make_shared<Expr>(); }

ExprPtr e_bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::Bytes;
  e->ranges = std::move(ranges);
  return e;
}
ExprPtr e_byte(uint8_t b) { return e_bytes({{b, b}}); }

ExprPtr e_lit(std::string_view s) {
  std::vector<ExprPtr> v;
  for (char c : s) v.push_back(e_byte(uint8_t(c)));
  return e_seq(std::move(v));
}

ExprPtr e_seq(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = items.empty() ? Expr::Kind::Empty : Expr::Kind::Seq;
  e->items = std::move(items);
  return e;
}
ExprPtr e_alt(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::Alt;
  e->items = std::move(items);
  return e;
}
ExprPtr e_rep(ExprPtr item, int min, int max) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::Repeat;
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}
ExprPtr e_opt(ExprPtr item) { return e_rep(std::move(item), 0, 1); }
ExprPtr e_star(ExprPtr item) { return e_rep(std::move(item), 0, -1); }
ExprPtr e_plus(ExprPtr item) { return e_rep(std::move(item), 1, -1); }
ExprPtr e_ref(int rule) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::Ref;
  e->rule = rule;
  return e;
}

static std::vector<std::pair<uint32_t, uint32_t>> cp_normalize(std::vector<std::pair<uint32_t, uint32_t>> r) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.push_back({lo, hi});
  }
  // Surrogates are not encodable.
  std::vector<std::pair<uint32_t, uint32_t>> res;
  for (auto [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      res.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) res.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) res.push_back({0xE000, hi});
  }
  return res;
}

std::vector<std::pair<uint32_t, uint32_t>> cp_complement(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  auto r = cp_normalize(std::move(ranges));
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return cp_normalize(out);
}

namespace {
int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }
void utf8_encode(uint32_t c, uint8_t* b) {
  const int n = utf8_len(c);
  if (n == 1) b[0] = uint8_t(c);
  else if (n == 2) { b[0] = uint8_t(0xC0 | (c >> 6)); b[1] = uint8_t(0x80 | (c & 0x3F)); }
  else if (n == 3) { b[0] = uint8_t(0xE0 | (c >> 12)); b[1] = uint8_t(0x80 | ((c >> 6) & 0x3F)); b[2] = uint8_t(0x80 | (c & 0x3F)); }
  else { b[0] = uint8_t(0xF0 | (c >> 18)); b[1] = uint8_t(0x80 | ((c >> 12) & 0x3F)); b[2] = uint8_t(0x80 | ((c >> 6) & 0x3F)); b[3] = uint8_t(0x80 | (c & 0x3F)); }
}
// Code points [lo, hi] of one encoded length -> byte-range sequences (the classic utf8-ranges split).
void utf8_split(uint32_t lo, uint32_t hi, std::vector<ExprPtr>& out) {
  static const uint32_t max_of_len[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int n = 1; n < 4; ++n) {
    const uint32_t m = max_of_len[n - 1];
    if (lo <= m && hi > m) {
      utf8_split(lo, m, out);
      utf8_split(m + 1, hi, out);
      return;
    }
  }
  const int n = utf8_len(lo);
  if (n == 1) {
    out.push_back(e_bytes({{uint8_t(lo), uint8_t(hi)}}));
    return;
  }
  for (int i = 1; i < n; ++i) {
    const uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        utf8_split(lo, lo | mask, out);
        utf8_split((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        utf8_split(lo, (hi & ~mask) - 1, out);
        utf8_split(hi & ~mask, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<ExprPtr> seq;
  for (int i = 0; i < n; ++i) seq.push_back(e_bytes({{a[i], b[i]}}));
  out.push_back(e_seq(std::move(seq)));
}
}  // namespace

ExprPtr e_codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  auto r = cp_normalize(std::move(ranges));
  std::vector<ExprPtr> alts;
  std::vector<std::pair<uint8_t, uint8_t>> ascii;
  for (auto [lo, hi] : r) {
    if (hi < 0x80) {
      ascii.push_back({uint8_t(lo), uint8_t(hi)});
      continue;
    }
    if (lo < 0x80) {
      ascii.push_back({uint8_t(lo), 0x7F});
      lo = 0x80;
    }
    utf8_split(lo, hi, alts);
  }
  if (!ascii.empty()) alts.insert(alts.begin(), e_bytes(ascii));
  if (alts.empty()) return e_bytes({});  // matches nothing
  return e_alt(std::move(alts));
}

// ---------------------------------------------------------------- grammar
int Grammar::add_rule(std::string name) {
  rules_.push_back({std::move(name), e_empty()});
  return int(rules_.size()) - 1;
}
int Grammar::find(const std::string& name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return int(i);
  return -1;
}

// ---------------------------------------------------------------- NFA -> DFA per rule
namespace {

struct Nfa {
  struct Edge {
    int kind;  // 0 eps, 1 bytes, 2 ref
    uint8_t lo, hi;
    int rule;
    int to;
  };
  std::vector<std::vector<Edge>> out;
  size_t limit;
  const std::string* rule_name;
  int new_state() {
    if (out.size() >= limit)
      throw StructuredError("structured output: rule '" + *rule_name + "' needs more than " + std::to_string(limit) +
                            " automaton states (limit max_nfa_states; lower repetition counts or lengths)");
    out.emplace_back();
    return int(out.size()) - 1;
  }
  void eps(int a, int b) { out[size_t(a)].push_back({0, 0, 0, -1, b}); }

  int build(const Expr& e, int from) {
    switch (e.kind) {
      case Expr::Kind::Empty:
        return from;
      case Expr::Kind::Bytes: {
        const int s = new_state();
        for (auto [lo, hi] : e.ranges) out[size_t(from)].push_back({1, lo, hi, -1, s});
        return s;
      }
      case Expr::Kind::Ref: {
        const int s = new_state();
        out[size_t(from)].push_back({2, 0, 0, e.rule, s});
        return s;
      }
      case Expr::Kind::Seq: {
        int cur = from;
        for (auto& it : e.items) cur = build(*it, cur);
        return cur;
      }
      case Expr::Kind::Alt: {
        const int end = new_state();
        for (auto& it : e.items) {
          const int s = new_state();
          eps(from, s);
          eps(build(*it, s), end);
        }
        return end;
      }
      case Expr::Kind::Repeat: {
        int cur = from;
        for (int i = 0; i < e.min; ++i) {
          const int s = new_state();
          eps(cur, s);
          cur = build(*e.items[0], s);
        }
        if (e.max < 0) {
          const int s = new_state();
          eps(cur, s);
          eps(build(*e.items[0], s), s);
          return s;
        }
        const int fin = new_state();
        eps(cur, fin);
        for (int i = e.min; i < e.max; ++i) {
          const int s = new_state();
          eps(cur, s);
          cur = build(*e.items[0], s);
          eps(cur, fin);
        }
        return fin;
      }
    }
    return from;
  }
};

void closure(const Nfa& n, std::vector<int>& set, std::vector<uint32_t>& mark, uint32_t stamp) {
  for (int s : set) mark[size_t(s)] = stamp;
  for (size_t i = 0; i < set.size(); ++i)
    for (const auto& e : n.out[size_t(set[i])])
      if (e.kind == 0 && mark[size_t(e.to)] != stamp) {
        mark[size_t(e.to)] = stamp;
        set.push_back(e.to);
      }
  std::sort(set.begin(), set.end());
}

struct VecHash {
  size_t operator()(const std::vector<int>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int x : v) h = (h ^ uint64_t(uint32_t(x))) * 1099511628211ull;
    return size_t(h);
  }
};

}  // namespace

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, const Limits& limits) {
  const auto t0 = std::chrono::steady_clock::now();
  CompileClock clock(limits.max_compile_seconds);
  if (g.size() > limits.max_rules)
    throw StructuredError("structured output: the grammar has " + std::to_string(g.size()) + " rules, over the limit of " +
                          std::to_string(limits.max_rules));
  auto cg = std::make_shared<CompiledGrammar>();
  cg->root_rule = g.root;
  for (int r = 0; r < g.size(); ++r) cg->rule_names.push_back(g.name(r));
  cg->rule_start.resize(size_t(g.size()));
  for (int r = 0; r < g.size(); ++r) {
    clock.check();
    Nfa n;
    n.limit = size_t(limits.max_nfa_states);
    n.rule_name = &g.name(r);
    const int start = n.new_state();
    const int fin = n.build(*g.body(r), start);
    std::vector<uint32_t> mark(n.out.size(), 0);
    uint32_t stamp = 0;
    std::unordered_map<std::vector<int>, int32_t, VecHash> ids;
    std::vector<std::vector<int>> sets;
    auto intern = [&](std::vector<int> set) -> int32_t {
      closure(n, set, mark, ++stamp);
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      const int32_t id = int32_t(cg->states.size());
      if (id >= limits.max_dfa_states)
        throw StructuredError("structured output: the constraint needs more than " + std::to_string(limits.max_dfa_states) +
                              " automaton states (limit max_dfa_states; rule '" + g.name(r) + "')");
      ids.emplace(set, id);
      sets.push_back(set);
      cg->states.emplace_back();
      cg->states.back().accepting = std::binary_search(set.begin(), set.end(), fin);
      return id;
    };
    const int32_t base = int32_t(cg->states.size());
    cg->rule_start[size_t(r)] = intern({start});
    for (size_t k = 0; k < sets.size(); ++k) {
      if ((k & 255) == 0) clock.check();
      const std::vector<int> set = sets[k];
      const int32_t sid = base + int32_t(k);
      // Byte transitions: split into elementary intervals.
      std::vector<int> bounds;
      std::map<int, std::vector<int>> by_rule;
      for (int s : set)
        for (const auto& e : n.out[size_t(s)]) {
          if (e.kind == 1) {
            bounds.push_back(e.lo);
            bounds.push_back(int(e.hi) + 1);
          } else if (e.kind == 2) {
            by_rule[e.rule].push_back(e.to);
          }
        }
      std::sort(bounds.begin(), bounds.end());
      bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
      std::vector<CompiledGrammar::Range> rs;
      for (size_t i = 0; i + 1 < bounds.size(); ++i) {
        const int lo = bounds[i], hi = bounds[i + 1] - 1;
        std::vector<int> to;
        for (int s : set)
          for (const auto& e : n.out[size_t(s)])
            if (e.kind == 1 && e.lo <= lo && hi <= e.hi) to.push_back(e.to);
        if (to.empty()) continue;
        std::sort(to.begin(), to.end());
        to.erase(std::unique(to.begin(), to.end()), to.end());
        const int32_t t = intern(std::move(to));
        if (!rs.empty() && rs.back().to == t && rs.back().hi + 1 == lo) rs.back().hi = uint8_t(hi);
        else rs.push_back({uint8_t(lo), uint8_t(hi), t});
      }
      std::vector<std::pair<int32_t, int32_t>> refs;
      for (auto& [rule, to] : by_rule) refs.push_back({rule, intern(to)});
      CompiledGrammar::State& st = cg->states[size_t(sid)];
      st.range_begin = uint32_t(cg->ranges.size());
      cg->ranges.insert(cg->ranges.end(), rs.begin(), rs.end());
      st.range_end = uint32_t(cg->ranges.size());
      st.ref_begin = uint32_t(cg->refs.size());
      cg->refs.insert(cg->refs.end(), refs.begin(), refs.end());
      st.ref_end = uint32_t(cg->refs.size());
    }
  }

  // Nullable rules, then left recursion (a rule reachable from its own start without a byte).
  const int R = g.size();
  std::vector<char> nullable(size_t(R), 0);
  auto start_reach = [&](int r, auto&& on_state) {
    std::vector<int32_t> todo{cg->rule_start[size_t(r)]};
    std::vector<char> seen;
    std::unordered_map<int32_t, char> vis;
    vis[todo[0]] = 1;
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      on_state(s);
      const auto& st = cg->states[size_t(s)];
      for (uint32_t i = st.ref_begin; i < st.ref_end; ++i)
        if (nullable[size_t(cg->refs[i].first)] && !vis.count(cg->refs[i].second)) {
          vis[cg->refs[i].second] = 1;
          todo.push_back(cg->refs[i].second);
        }
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < R; ++r) {
      if (nullable[size_t(r)]) continue;
      bool acc = false;
      start_reach(r, [&](int32_t s) { acc = acc || cg->states[size_t(s)].accepting; });
      if (acc) nullable[size_t(r)] = changed = 1;
    }
  }
  std::vector<std::vector<int>> left(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    start_reach(r, [&](int32_t s) {
      const auto& st = cg->states[size_t(s)];
      for (uint32_t i = st.ref_begin; i < st.ref_end; ++i) left[size_t(r)].push_back(cg->refs[i].first);
    });
  std::vector<int> color(size_t(R), 0);
  std::vector<int> path;
  auto dfs = [&](int r, auto&& self) -> void {
    color[size_t(r)] = 1;
    path.push_back(r);
    for (int c : left[size_t(r)]) {
      if (color[size_t(c)] == 1) {
        std::string cyc;
        auto it = std::find(path.begin(), path.end(), c);
        for (; it != path.end(); ++it) cyc += g.name(*it) + " -> ";
        throw StructuredError("structured output: left recursion (" + cyc + g.name(c) +
                              ") is not supported; rewrite the rule so it consumes text before recursing");
      }
      if (color[size_t(c)] == 0) self(c, self);
    }
    path.pop_back();
    color[size_t(r)] = 2;
  };
  for (int r = 0; r < R; ++r)
    if (color[size_t(r)] == 0) dfs(r, dfs);
  cg->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cg;
}

}  // namespace m3::structured
