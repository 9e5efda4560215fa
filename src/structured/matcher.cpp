// The vocabulary trie and the matcher (see matcher.h).
#include "structured/matcher.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "tokenizer/tokenizer.h"

namespace m3::structured {

// ---------------------------------------------------------------- vocabulary
std::shared_ptr<const TokenVocab> TokenVocab::build(const Tokenizer& tok, int64_t vocab_size) {
  auto v = std::make_shared<TokenVocab>();
  v->vocab_size_ = vocab_size;
  v->eos_ = tok.eos_id();
  v->bytes_.resize(size_t(vocab_size));
  v->special_.assign(size_t(vocab_size), 1);
  const int32_t n = std::min<int64_t>(vocab_size, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (!tok.is_valid(id)) continue;
    v->bytes_[size_t(id)] = tok.token_bytes(id);
    v->special_[size_t(id)] = tok.is_special(id) ? 1 : 0;
  }
  v->build_trie();
  return v;
}

std::shared_ptr<const TokenVocab> TokenVocab::shared(const Tokenizer& tok, int64_t vocab_size) {
  static std::mutex mu;
  static std::map<std::pair<const Tokenizer*, int64_t>, std::shared_ptr<const TokenVocab>> built;
  std::lock_guard lk(mu);
  auto& v = built[{&tok, vocab_size}];
  if (!v) v = build(tok, vocab_size);
  return v;
}

std::shared_ptr<const TokenVocab> TokenVocab::from_tokens(const std::vector<std::string>& bytes,
                                                          const std::vector<bool>& special, int32_t eos) {
  auto v = std::make_shared<TokenVocab>();
  v->vocab_size_ = int64_t(bytes.size());
  v->eos_ = eos;
  v->bytes_ = bytes;
  v->special_.resize(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) v->special_[i] = (i < special.size() && special[i]) ? 1 : 0;
  v->build_trie();
  return v;
}

void TokenVocab::build_trie() {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < int32_t(vocab_size_); ++i)
    if (!special_[size_t(i)] && !bytes_[size_t(i)].empty()) ids.push_back(i);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  byte_ = {0};
  depth_ = {0};
  end_ = {0};
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  std::vector<std::pair<uint32_t, int32_t>> attach;
  std::string cur;  // bytes of the path
  auto close_to = [&](size_t len) {
    while (path.size() > len + 1) {
      end_[path.back()] = uint32_t(byte_.size());
      path.pop_back();
    }
    cur.resize(len);
  };
  for (int32_t id : ids) {
    const std::string& s = bytes_[size_t(id)];
    if (s.size() > 65000) continue;
    size_t common = 0;
    while (common < cur.size() && common < s.size() && cur[common] == s[common]) ++common;
    close_to(common);
    for (size_t k = common; k < s.size(); ++k) {
      byte_.push_back(uint8_t(s[k]));
      depth_.push_back(uint16_t(k + 1));
      end_.push_back(0);
      path.push_back(uint32_t(byte_.size() - 1));
      cur.push_back(s[k]);
    }
    attach.push_back({path.back(), id});
    max_depth_ = std::max(max_depth_, int(s.size()));
  }
  close_to(0);
  end_[0] = uint32_t(byte_.size());
  tok_off_.assign(byte_.size() + 1, 0);
  for (auto& [node, id] : attach) ++tok_off_[node + 1];
  for (size_t i = 1; i < tok_off_.size(); ++i) tok_off_[i] += tok_off_[i - 1];
  toks_.resize(attach.size());
  std::vector<uint32_t> fill(tok_off_.begin(), tok_off_.end() - 1);
  for (auto& [node, id] : attach) toks_[fill[node]++] = id;
}

// ---------------------------------------------------------------- runtime
struct Matcher::Runtime {
  const CompiledGrammar& g;
  const TokenVocab& v;
  std::vector<int32_t> node_state, node_parent;
  std::unordered_map<uint64_t, int32_t> node_id;
  struct Config {
    std::vector<int32_t> tops;
    bool accepting = false;
    std::unique_ptr<int32_t[]> trans;  // 256 entries, -2 = not computed, -1 = dead
    std::shared_ptr<std::vector<uint64_t>> mask;
  };
  std::vector<Config> configs;
  std::unordered_map<std::string, int32_t> config_id;
  std::vector<uint32_t> mark;
  uint32_t stamp = 0;
  int32_t initial = -1;
  std::shared_ptr<std::vector<uint64_t>> uncached;
  std::vector<uint64_t> ends;  // end tokens as a bitset
  Stats stats;
  std::vector<int32_t> raw, work;
  // Approximate bytes held (see ConstraintSpec's bounds): nodes + configurations, rows, masks.
  static constexpr int64_t kNodeBytes = 48, kConfigBytes = 160, kRowBytes = 256 * sizeof(int32_t);

  Runtime(const CompiledGrammar& cg, const TokenVocab& tv) : g(cg), v(tv) {}

  int32_t node(int32_t state, int32_t parent) {
    const uint64_t key = (uint64_t(uint32_t(state)) << 32) | uint32_t(parent);
    auto it = node_id.find(key);
    if (it != node_id.end()) return it->second;
    const int32_t id = int32_t(node_state.size());
    node_state.push_back(state);
    node_parent.push_back(parent);
    mark.push_back(0);
    node_id.emplace(key, id);
    stats.state_bytes += kNodeBytes;
    return id;
  }

  // Closure of raw stack tops: pops accepting frames, pushes called rules; keeps frames that can
  // read a byte. -1 when nothing is left.
  int32_t expand(const std::vector<int32_t>& in) {
    ++stamp;
    work.clear();
    std::vector<int32_t> tops;
    bool acc = false;
    for (int32_t n : in)
      if (mark[size_t(n)] != stamp) {
        mark[size_t(n)] = stamp;
        work.push_back(n);
      }
    size_t guard = 0;
    while (!work.empty()) {
      const int32_t n = work.back();
      work.pop_back();
      if (++guard > 1000000)
        throw StructuredError("structured output: the grammar expands without reading text (more than 10^6 stack frames)");
      const auto& st = g.states[size_t(node_state[size_t(n)])];
      if (st.range_end > st.range_begin) tops.push_back(n);
      const int32_t parent = node_parent[size_t(n)];
      if (st.accepting) {
        if (parent < 0) acc = true;
        else if (mark[size_t(parent)] != stamp) {
          mark[size_t(parent)] = stamp;
          work.push_back(parent);
        }
      }
      for (uint32_t i = st.ref_begin; i < st.ref_end; ++i) {
        const int32_t cont = node(g.refs[i].second, parent);
        const int32_t child = node(g.rule_start[size_t(g.refs[i].first)], cont);
        if (mark.size() < node_state.size()) mark.resize(node_state.size(), 0);
        if (mark[size_t(child)] != stamp) {
          mark[size_t(child)] = stamp;
          work.push_back(child);
        }
      }
    }
    if (tops.empty() && !acc) return -1;
    std::sort(tops.begin(), tops.end());
    std::string key(reinterpret_cast<const char*>(tops.data()), tops.size() * 4);
    key.push_back(acc ? 1 : 0);
    auto it = config_id.find(key);
    if (it != config_id.end()) return it->second;
    const int32_t id = int32_t(configs.size());
    configs.emplace_back();
    configs.back().tops = std::move(tops);
    configs.back().accepting = acc;
    stats.state_bytes += kConfigBytes + 2 * int64_t(key.size());
    config_id.emplace(std::move(key), id);
    ++stats.configs;
    return id;
  }

  int32_t* row(int32_t c) {
    Config& cf = configs[size_t(c)];
    if (!cf.trans) {
      cf.trans.reset(new int32_t[256]);
      std::fill(cf.trans.get(), cf.trans.get() + 256, -2);
      stats.row_bytes += kRowBytes;
    }
    return cf.trans.get();
  }

  int32_t step_slow(int32_t c, uint8_t b) {
    raw.clear();
    for (int32_t n : configs[size_t(c)].tops) {
      const int32_t t = g.step(node_state[size_t(n)], b);
      if (t >= 0) raw.push_back(node(t, node_parent[size_t(n)]));
    }
    std::vector<int32_t> in;
    in.swap(raw);
    const int32_t r = in.empty() ? -1 : expand(in);
    raw.swap(in);
    return r;
  }

  int32_t step(int32_t c, uint8_t b) {
    int32_t* r = row(c);
    if (r[b] == -2) {
      const int32_t n = step_slow(c, b);
      row(c)[b] = n;
      return n;
    }
    return r[b];
  }

  int32_t walk(int32_t c, std::string_view bytes) {
    for (char ch : bytes) {
      if (c < 0) return -1;
      c = step(c, uint8_t(ch));
    }
    return c;
  }

  std::shared_ptr<std::vector<uint64_t>> compute_mask(int32_t c, const ConstraintSpec& spec) {
    ++stats.masks_computed;
    auto m = std::make_shared<std::vector<uint64_t>>(size_t(v.mask_words()), 0);
    uint64_t* bits = m->data();
    std::vector<int32_t> at(size_t(v.max_depth_) + 1, -1);
    at[0] = c;
    const uint32_t N = uint32_t(v.byte_.size());
    int64_t steps = 0;
    for (uint32_t i = 1; i < N;) {
      const int d = v.depth_[i];
      const int32_t prev = at[size_t(d - 1)];
      int32_t* r = configs[size_t(prev)].trans.get();
      if (!r) r = row(prev);
      int32_t nx = r[v.byte_[i]];
      if (nx == -2) nx = step(prev, v.byte_[i]);
      ++steps;
      if (nx < 0) {
        i = v.end_[i];
        continue;
      }
      at[size_t(d)] = nx;
      for (uint32_t k = v.tok_off_[i]; k < v.tok_off_[i + 1]; ++k) {
        const int32_t t = v.toks_[k];
        bits[t >> 6] |= uint64_t(1) << (t & 63);
      }
      ++i;
    }
    stats.trie_steps += steps;
    for (int32_t t : spec.text_specials)
      if (t >= 0 && t < v.size() && walk(c, v.bytes(t)) >= 0) bits[t >> 6] |= uint64_t(1) << (t & 63);
    bool any = false;
    for (size_t w = 0; w < m->size() && !any; ++w) any = bits[w] != 0;
    if (configs[size_t(c)].accepting || !any)  // a dead end (no token spells a way on) ends the output
      for (size_t w = 0; w < m->size(); ++w) bits[w] |= ends[w];
    return m;
  }
};

Matcher::Matcher(std::shared_ptr<const ConstraintSpec> spec) : spec_(std::move(spec)) {
  if (!spec_ || !spec_->vocab) throw Error("structured output: a constraint needs a vocabulary");
  const TokenVocab& v = *spec_->vocab;
  if (spec_->start_after_budget >= 0) {
    const int32_t t = spec_->start_after_token;
    if (spec_->start_after.empty() || t < 0 || t >= v.size())
      throw Error("structured output: a reasoning budget needs the reasoning end tag as one token");
    auto m = std::make_shared<std::vector<uint64_t>>(size_t(v.mask_words()), 0);
    (*m)[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    close_mask_ = std::move(m);
  }
  if (!spec_->grammar) {  // the budget alone
    if (spec_->start_after_budget < 0) throw Error("structured output: a constraint needs a grammar or a reasoning budget");
    st_.active = false;
    return;
  }
  rt_ = std::make_shared<Runtime>(*spec_->grammar, v);
  rt_->ends.assign(size_t(v.mask_words()), 0);
  auto set_end = [&](int32_t t) {
    if (t >= 0 && t < v.size()) rt_->ends[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
  };
  set_end(v.eos());
  for (int32_t t : spec_->end_tokens) set_end(t);
  const int32_t root = rt_->node(spec_->grammar->rule_start[size_t(spec_->grammar->root_rule)], -1);
  rt_->initial = rt_->expand({root});
  if (rt_->initial < 0) throw StructuredError("structured output: the " + spec_->description + " constraint matches nothing");
  st_.config = rt_->initial;
  st_.active = spec_->start_after.empty();
}

bool Matcher::is_end(int32_t t) const {
  return t >= 0 && t < spec_->vocab->size() && ((rt_->ends[size_t(t) >> 6] >> (t & 63)) & 1);
}

const uint64_t* Matcher::mask() {
  if (!st_.active) return must_close() ? close_mask_->data() : nullptr;
  if (!rt_) return nullptr;
  if (st_.finished) return rt_->ends.data();
  auto& cf = rt_->configs[size_t(st_.config)];
  if (cf.mask) {
    ++rt_->stats.mask_hits;
    return cf.mask->data();
  }
  auto m = rt_->compute_mask(st_.config, *spec_);
  // Cached masks are bounded (max_mask_cache_bytes): past the bound the cache starts over (the
  // configurations in use recur and are cached again). A mask is not referenced by anyone after
  // the caller's step, so emptying the cache here is safe.
  const int64_t bytes = int64_t(m->size() * sizeof(uint64_t));
  if (rt_->stats.mask_bytes + bytes > spec_->max_mask_cache_bytes && rt_->stats.mask_bytes > 0) {
    for (auto& c : rt_->configs) c.mask.reset();
    rt_->stats.mask_bytes = 0;
    ++rt_->stats.mask_evictions;
  }
  if (bytes <= spec_->max_mask_cache_bytes) {
    rt_->configs[size_t(st_.config)].mask = m;
    rt_->stats.mask_bytes += bytes;
    return m->data();
  }
  rt_->uncached = std::move(m);  // one mask over the bound: kept until the next call only
  return rt_->uncached->data();
}

bool Matcher::accepts(int32_t t) {
  if (!st_.active) return !must_close() || t == spec_->start_after_token;
  if (!rt_) return true;
  if (t < 0 || t >= spec_->vocab->size()) return false;
  if (st_.finished) return is_end(t);
  if (is_end(t)) {
    if (accepting()) return true;
    // A dead end allows the end tokens too (see compute_mask).
    const uint64_t* m = mask();
    return (m[size_t(t) >> 6] >> (t & 63)) & 1;
  }
  const TokenVocab& v = *spec_->vocab;
  if (v.is_special(t) && std::find(spec_->text_specials.begin(), spec_->text_specials.end(), t) == spec_->text_specials.end())
    return false;
  if (v.bytes(t).empty()) return false;
  return rt_->walk(st_.config, v.bytes(t)) >= 0;
}

bool Matcher::advance(int32_t t) {
  const TokenVocab& v = *spec_->vocab;
  if (!st_.active) {
    if (must_close() && t != spec_->start_after_token) return false;
    ++st_.waited;
    if (t < 0 || t >= v.size()) return true;
    const std::string& want = spec_->start_after;
    st_.tail += v.bytes(t);
    const size_t at = st_.tail.find(want);
    if (at == std::string::npos) {
      if (st_.tail.size() > want.size()) st_.tail.erase(0, st_.tail.size() - want.size());
      return true;
    }
    std::string rest = st_.tail.substr(at + want.size());
    st_.tail.clear();
    st_.active = true;
    if (!rt_) return true;
    // Text after the tag in the same token goes to the grammar when it fits (best effort: the
    // token is already taken).
    const int32_t c = rt_->walk(st_.config, rest);
    if (c >= 0) st_.config = c;
    return true;
  }
  if (!rt_) return true;
  if (!accepts(t)) return false;
  if (st_.finished || is_end(t)) {
    st_.finished = true;
    return true;
  }
  st_.config = rt_->walk(st_.config, v.bytes(t));
  return true;
}

bool Matcher::advance_bytes(std::string_view bytes) {
  if (!rt_) return true;
  const int32_t c = rt_->walk(st_.config, bytes);
  if (c < 0) return false;
  st_.config = c;
  return true;
}

bool Matcher::accepts_bytes(std::string_view bytes) const { return !rt_ || rt_->walk(st_.config, bytes) >= 0; }

bool Matcher::accepting() const { return !rt_ || (st_.config >= 0 && rt_->configs[size_t(st_.config)].accepting); }

bool Matcher::terminated() const { return rt_ && accepting() && rt_->configs[size_t(st_.config)].tops.empty(); }

Matcher::Stats Matcher::stats() const { return rt_ ? rt_->stats : Stats{}; }

std::string Matcher::check_limits() {
  if (!rt_) return {};
  Stats& st = rt_->stats;
  const int64_t limit = spec_->max_state_bytes;
  if (st.state_bytes + st.row_bytes <= limit) return {};
  if (st.row_bytes > 0) {  // rows are a cache: refilled from the configurations on use
    for (auto& c : rt_->configs) c.trans.reset();
    st.row_bytes = 0;
    ++st.row_evictions;
  }
  if (st.state_bytes <= limit) return {};
  return "structured output: the " + spec_->description + " constraint's automaton state grew to " +
         std::to_string(st.state_bytes) + " bytes (" + std::to_string(st.configs) +
         " configurations), over the per-request limit max_state_bytes of " + std::to_string(limit) +
         " bytes (the output keeps opening new nesting levels)";
}

}  // namespace m3::structured
