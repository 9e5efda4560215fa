// Structured outputs, part 2: the per-request matcher and the shared vocabulary trie.
//
// TokenVocab: every ordinary token's bytes in a byte prefix tree, laid out in preorder (a node's
// subtree is the index range after it), built once per tokenizer and shared by all requests.
// Matcher: the state of one request's grammar (grammar.h) as an id into a per-request table of
// "configurations" (a hash-consed set of stack tops of the pushdown automaton), so fork, save and
// restore copy one integer. Configurations form a lazily built DFA: the byte transitions of each
// configuration are cached in a 256-entry row, filled on first use. The allowed-token mask of a
// configuration is computed by walking the trie in preorder with one configuration per depth
// (a shared prefix is stepped once; a dead prefix skips its whole subtree) and is cached per
// configuration: inside a string, after a comma, in a number, the configuration recurs and the
// mask is a lookup. Special tokens are never text; the end tokens (eos, stop ids) are allowed
// exactly when the grammar accepts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace m3 {
class Tokenizer;
}

namespace m3::structured {

class TokenVocab {
 public:
  // `vocab_size`: the model's vocabulary (the mask's length; ids the tokenizer lacks are never
  // allowed). Special added tokens are kept out of the trie.
  static std::shared_ptr<const TokenVocab> build(const Tokenizer& tok, int64_t vocab_size);
  // build() once per (tokenizer, vocab_size) for the life of the process (thread-safe).
  static std::shared_ptr<const TokenVocab> shared(const Tokenizer& tok, int64_t vocab_size);
  // From explicit byte strings (tests); `special[i]` keeps token i out of the trie.
  static std::shared_ptr<const TokenVocab> from_tokens(const std::vector<std::string>& bytes,
                                                       const std::vector<bool>& special, int32_t eos);

  int64_t size() const { return vocab_size_; }
  int64_t mask_words() const { return (vocab_size_ + 63) / 64; }
  int32_t eos() const { return eos_; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool is_special(int32_t id) const { return special_[size_t(id)]; }
  int64_t trie_nodes() const { return int64_t(byte_.size()); }

  // Preorder trie (node 0 is the root, depth 0).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> end_;      // one past the node's subtree
  std::vector<uint32_t> tok_off_;  // tokens ending at node i: toks_[tok_off_[i], tok_off_[i+1])
  std::vector<int32_t> toks_;
  int max_depth_ = 0;

 private:
  void build_trie();
  int64_t vocab_size_ = 0;
  int32_t eos_ = -1;
  std::vector<std::string> bytes_;
  std::vector<char> special_;  // also set for ids the tokenizer lacks
};

// What a request asks for; shared (immutable) by the matchers made from it (n > 1 choices).
struct ConstraintSpec {
  // Null: no grammar, only the reasoning budget below (nothing is constrained once start_after has come).
  std::shared_ptr<const CompiledGrammar> grammar;
  std::shared_ptr<const TokenVocab> vocab;
  // Allowed exactly when the grammar accepts (eos is added when the vocabulary knows it).
  std::vector<int32_t> end_tokens;
  // Special tokens that the grammar may spell as text (the tool-call namespace token).
  std::vector<int32_t> text_specials;
  // Non-empty: no constraint until this text has been generated (the reasoning end tag, e.g.
  // "</mm:think>" for the minimax_m3 reasoning parser); the grammar applies to what follows it.
  std::string start_after;
  // A reasoning budget (thinking_token_budget): at most this many tokens may come before start_after;
  // at the budget only start_after_token (start_after as one token) is allowed, which ends the
  // reasoning. -1: no budget.
  int64_t start_after_budget = -1;
  int32_t start_after_token = -1;
  std::string description;  // for messages ("json_schema", "regex", ...)
  // Per-request memory bounds of the matcher (all its forks share them; see Matcher::check_limits).
  // Masks: the cached allowed-token bitsets (vocab/8 bytes each, 25 KB at 200K tokens); past the
  // bound the cache is emptied and refilled as configurations recur.
  int64_t max_mask_cache_bytes = kDefaultMaxMaskCacheBytes;
  // Automaton: configurations, stack nodes and their 1 KB byte-transition rows. Past the bound the
  // rows (a cache) are dropped; if configurations and nodes alone are over it (a grammar whose
  // stacks keep growing, e.g. ever deeper nesting), the request ends with an error naming it.
  int64_t max_state_bytes = kDefaultMaxStateBytes;
  static constexpr int64_t kDefaultMaxMaskCacheBytes = int64_t(4) << 20;  // 4 MiB
  static constexpr int64_t kDefaultMaxStateBytes = int64_t(64) << 20;     // 64 MiB
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const ConstraintSpec> spec);

  // The allowed tokens as a bitset of vocab().mask_words() words (bit i of word i/64), or nullptr
  // while the constraint is not active yet (before `start_after`). Valid until the next call.
  const uint64_t* mask();
  bool active() const { return st_.active; }
  // Whether `token` may come next (no mask needed: walks its bytes).
  bool accepts(int32_t token);
  // Takes `token`; returns false (and changes nothing) when it is not allowed.
  bool advance(int32_t token);
  // Byte-level access (tests, the brute-force check): feeds raw bytes; false when rejected.
  bool advance_bytes(std::string_view bytes);
  bool accepts_bytes(std::string_view bytes) const;
  // The grammar is complete here (an end token is allowed).
  bool accepting() const;
  // Complete and nothing more may follow.
  bool terminated() const;
  // An end token was taken.
  bool finished() const { return st_.finished; }

  // The whole state, for preemption and speculative rollback (cheap: no allocation for the grammar).
  struct State {
    int32_t config = -1;
    bool active = true;
    bool finished = false;
    std::string tail;     // last bytes generated while waiting for start_after
    int64_t waited = 0;   // tokens generated while waiting for start_after (the reasoning budget)
  };
  State save() const { return st_; }
  void restore(const State& s) { st_ = s; }
  // An independent matcher at the same state sharing the caches (speculation: advance the fork
  // through the drafts, throw it away).
  Matcher fork() const { return *this; }

  const ConstraintSpec& spec() const { return *spec_; }
  // Enforces ConstraintSpec::max_state_bytes between steps (the engine calls it after each token it
  // takes; nothing is evicted inside a call): drops the transition rows when over the bound, and
  // returns an error message (empty when fine) when configurations and nodes alone are over it.
  std::string check_limits();
  // Statistics: configurations built, masks computed (cache misses), trie nodes stepped; bytes
  // held now (automaton state, transition rows, cached masks) and how often caches were emptied.
  struct Stats {
    int64_t configs = 0, masks_computed = 0, mask_hits = 0, trie_steps = 0;
    int64_t state_bytes = 0, row_bytes = 0, mask_bytes = 0;
    int64_t mask_evictions = 0, row_evictions = 0;
  };
  Stats stats() const;

  struct Runtime;

 private:
  bool is_end(int32_t t) const;
  // The reasoning budget is spent: only start_after_token may come.
  bool must_close() const {
    return !st_.active && spec_->start_after_budget >= 0 && st_.waited >= spec_->start_after_budget;
  }
  std::shared_ptr<const ConstraintSpec> spec_;
  std::shared_ptr<Runtime> rt_;  // null without a grammar
  std::shared_ptr<const std::vector<uint64_t>> close_mask_;  // start_after_token alone (with a budget)
  State st_;
};

}  // namespace m3::structured
