// One choice's output stream (see choice_state.h).
#include "server/choice_state.h"

#include <algorithm>
#include <utility>

namespace m3::server {

TextOptions choice_text_options(const ChoiceOptions& o) {
  TextOptions t;
  t.skip_special = o.reasoning || o.tool || o.keep_think_tags ? false : o.skip_special;
  t.include_stop_str = o.include_stop_str;
  t.hold_back = true;
  t.stop_token_text = false;
  return t;
}

namespace {
OutputOptions raw_text_options(const ChoiceOptions& o) {
  OutputOptions t;
  static_cast<TextOptions&>(t) = choice_text_options(o);
  t.stop = o.stop;
  return t;
}
}  // namespace

ChoiceState::ChoiceState(const Tokenizer* tok, ChoiceOptions opt)
    : opt_(std::move(opt)),
      tok_(tok),
      filter_specials_(tok_ && opt_.skip_special && !choice_text_options(opt_).skip_special),
      raw_text_(nullptr, raw_text_options(opt_)) {
  if (opt_.keep_think_tags) {
    const auto [open, close] = chat::ReasoningParser::tags(*opt_.keep_think_tags);
    kept_specials_ = {open, close};
    if (opt_.reasoning_start) content_prefix_ = open;
  }
  if (opt_.reasoning) rp_ = std::make_unique<chat::ReasoningParser>(*opt_.reasoning, opt_.reasoning_start);
  if (opt_.tool) {
    chat::ToolParserOptions to;
    to.parallel_tool_calls = opt_.parallel_tool_calls;
    tp_ = std::make_unique<chat::ToolParser>(*opt_.tool, opt_.tools, to);
  }
  if (tp_ && !opt_.forced_tool_text.empty()) forced_deltas_ = tp_->feed(opt_.forced_tool_text).tool_calls;
}

bool ChoiceState::name_allowed(const std::string& name) const {
  return opt_.allowed_tool_names.empty() ||
         std::find(opt_.allowed_tool_names.begin(), opt_.allowed_tool_names.end(), name) !=
             opt_.allowed_tool_names.end();
}

// Drops deltas of calls whose name is not allowed and renumbers the rest densely, so streamed
// indices match the positions in tool_calls().
std::vector<chat::ToolCallDelta> ChoiceState::filter_calls(std::vector<chat::ToolCallDelta> in) {
  std::vector<chat::ToolCallDelta> out;
  for (auto& d : in) {
    auto it = call_index_.find(d.index);
    if (it == call_index_.end()) {
      int next = 0;
      for (auto& [k, v] : call_index_) next += v >= 0;
      const bool ok = !d.name || name_allowed(*d.name);
      it = call_index_.emplace(d.index, ok ? next : -1).first;
    }
    if (it->second < 0) continue;
    d.index = it->second;
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<chat::ToolCall> ChoiceState::tool_calls() const {
  std::vector<chat::ToolCall> out;
  if (!tp_) return out;
  for (auto& c : tp_->calls())
    if (name_allowed(c.name)) out.push_back(c);
  return out;
}

ChoiceDelta ChoiceState::on_output(const RequestOutput& out) {
  prompt_tokens = out.num_prompt_tokens;
  cached_tokens = out.num_cached_tokens;
  tokens.insert(tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
  // The engine kept special tokens for the parsers (choice_text_options); those the client did not
  // ask for are taken out after parsing, once the model has emitted them.
  if (filter_specials_)
    for (int32_t id : out.new_tokens)
      if (tok_->is_special(id)) {
        const std::string& s = tok_->token_bytes(id);
        if (std::find(kept_specials_.begin(), kept_specials_.end(), s) == kept_specials_.end()) {
          content_specials_.add(s);
          reasoning_specials_.add(s);
        }
      }
  if (out.stop_string) stop_reason = *out.stop_string;
  ChoiceDelta d = parse(out.new_text, out.finished, out.finish_reason, out.stop_token);
  d.tokens = out.new_tokens;
  d.logprobs = out.new_logprobs;
  logprobs.insert(logprobs.end(), out.new_logprobs.begin(), out.new_logprobs.end());
  return d;
}

ChoiceDelta ChoiceState::on_text(std::string_view raw, bool fin, FinishReason reason,
                                 std::optional<int32_t> stop_token) {
  std::string feed = raw_text_.push_text(raw, fin);
  if (const std::string* st = raw_text_.stop_string()) stop_reason = *st;
  return parse(std::move(feed), fin, reason, stop_token);
}

ChoiceDelta ChoiceState::parse(std::string feed, bool fin, FinishReason reason, std::optional<int32_t> stop_token) {
  ChoiceDelta d;
  std::string content_piece;
  if (rp_) {
    chat::ReasoningDelta rd = rp_->feed(feed);
    if (fin) {
      chat::ReasoningDelta r2 = rp_->finish();
      rd.reasoning += r2.reasoning;
      rd.content += r2.content;
    }
    d.reasoning = std::move(rd.reasoning);
    content_piece = std::move(rd.content);
  } else {
    content_piece = std::move(feed);
  }
  if (tp_) {
    chat::ToolStreamDelta td = tp_->feed(content_piece);
    if (fin) {
      chat::ToolStreamDelta t2 = tp_->finish();
      td.content += t2.content;
      td.tool_calls.insert(td.tool_calls.end(), t2.tool_calls.begin(), t2.tool_calls.end());
    }
    d.content = std::move(td.content);
    if (!forced_deltas_.empty()) {
      td.tool_calls.insert(td.tool_calls.begin(), forced_deltas_.begin(), forced_deltas_.end());
      forced_deltas_.clear();
    }
    d.tool_calls = filter_calls(std::move(td.tool_calls));
  } else {
    d.content = std::move(content_piece);
  }
  if (content_specials_.active() || fin) {
    d.content = content_specials_.feed(d.content);
    if (fin) d.content += content_specials_.finish();
  }
  if (reasoning_specials_.active() || fin) {
    d.reasoning = reasoning_specials_.feed(d.reasoning);
    if (fin) d.reasoning += reasoning_specials_.finish();
  }
  if (!content_prefix_.empty() && (!d.content.empty() || fin)) d.content = std::exchange(content_prefix_, {}) + d.content;
  content += d.content;
  reasoning += d.reasoning;
  if (fin) {
    finished = d.finished = true;
    switch (reason) {
      case FinishReason::Length: finish_reason = "length"; break;
      case FinishReason::Abort: finish_reason = "abort"; break;
      case FinishReason::Error: finish_reason = "error"; break;
      default:
        finish_reason = !tool_calls().empty() ? "tool_calls" : "stop";
        if (stop_token) stop_reason = *stop_token;
        break;
    }
  }
  return d;
}

}  // namespace m3::server
