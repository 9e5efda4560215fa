// Reasoning split for MiniMax models. Tags are matched on text (the detokeniser keeps special
// tokens), so any suffix that could be the start of a tag is held back: a tag can arrive split
// across pieces. Stray or duplicated tags and the end-of-turn token never reach either channel.
#include "chat/reasoning_parser.h"

#include "chat/text_scan.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "base/error.h"

namespace m3::chat {
namespace {

const char* kEndOfTurn = "[e~[";

// `prompt` ends with `tag`, trailing whitespace aside.
bool ends_with_tag(std::string_view prompt, std::string_view tag) {
  while (!prompt.empty() && is_ws(prompt.back())) prompt.remove_suffix(1);
  return prompt.size() >= tag.size() && prompt.substr(prompt.size() - tag.size()) == tag;
}

}  // namespace

ReasoningFormat reasoning_format_from_name(const std::string& name) {
  if (name == "minimax_m3") return ReasoningFormat::MiniMaxM3;
  if (name == "minimax_m2") return ReasoningFormat::MiniMaxM2;
  if (name == "minimax_m2_append_think") return ReasoningFormat::MiniMaxM2AppendThink;
  throw Error("unknown reasoning parser '" + name + "' (expected minimax_m3, minimax_m2 or minimax_m2_append_think)");
}

std::pair<std::string, std::string> ReasoningParser::tags(ReasoningFormat fmt) {
  if (fmt == ReasoningFormat::MiniMaxM3) return {"<mm:think>", "</mm:think>"};
  return {"<think>", "</think>"};
}

ReasoningParser::ReasoningParser(ReasoningFormat fmt, bool start_in_reasoning) : fmt_(fmt) {
  std::tie(open_, close_) = tags(fmt);
  state_ = start_in_reasoning ? State::ReasoningStart : State::ContentStart;
}

bool ReasoningParser::prompt_starts_reasoning(ReasoningFormat fmt, std::string_view prompt) {
  return ends_with_tag(prompt, tags(fmt).first);
}

bool ReasoningParser::prompt_ends_reasoning(ReasoningFormat fmt, std::string_view prompt) {
  return ends_with_tag(prompt, tags(fmt).second);
}

ReasoningDelta ReasoningParser::feed(std::string_view delta) {
  buf_.append(delta);
  return process(false);
}

ReasoningDelta ReasoningParser::finish() { return process(true); }

ReasoningDelta ReasoningParser::process(bool final) {
  ReasoningDelta out;
  if (fmt_ == ReasoningFormat::MiniMaxM2AppendThink) {
    // No split: the reasoning stays in content, with the prefilled open tag put back in front.
    std::vector<std::string> pats{kEndOfTurn};
    size_t p;
    while ((p = buf_.find(kEndOfTurn)) != std::string::npos) buf_.erase(p, std::string(kEndOfTurn).size());
    size_t hold = final ? 0 : partial_suffix(buf_, pats);
    std::string emit = buf_.substr(0, buf_.size() - hold);
    buf_.erase(0, buf_.size() - hold);
    if (!emit.empty() && !prefix_sent_) {
      emit = open_ + emit;
      prefix_sent_ = true;
    }
    out.content = std::move(emit);
    return out;
  }
  const std::vector<std::string> pats{open_, close_, kEndOfTurn};
  auto emit = [&](std::string_view text) {
    if (text.empty()) return;
    if (state_ == State::Reasoning || state_ == State::ReasoningStart) {
      out.reasoning.append(text);
      state_ = State::Reasoning;
    } else {
      out.content.append(text);
      state_ = State::Content;
    }
  };
  while (!buf_.empty()) {
    // At the start of a channel, leading whitespace is held so that "\n<mm:think>" or a duplicated
    // "</mm:think>" after it is still recognised as a tag.
    bool at_start = state_ == State::ContentStart || state_ == State::ReasoningStart ||
                    state_ == State::ContentAfterReasoning;
    size_t ws = 0;
    if (at_start)
      while (ws < buf_.size() && is_ws(buf_[ws])) ++ws;
    if (at_start && ws == buf_.size() && !final) break;
    size_t best = std::string::npos, which = 0;
    for (size_t i = 0; i < pats.size(); ++i) {
      size_t p = buf_.find(pats[i]);
      if (p < best) best = p, which = i;
    }
    if (best == std::string::npos) {
      size_t hold = final ? 0 : partial_suffix(buf_, pats);
      if (at_start && hold > 0 && ws + hold == buf_.size()) break;  // only whitespace + partial tag so far
      emit(std::string_view(buf_).substr(0, buf_.size() - hold));
      buf_.erase(0, buf_.size() - hold);
      break;
    }
    const std::string& tag = pats[which];
    bool leading = at_start && best == ws;  // the tag is the first non-blank thing in its channel
    if (leading && which != 2) {
      buf_.erase(0, best + tag.size());  // the held whitespace belongs to the tag
      if (which == 0 && state_ == State::ContentStart) state_ = State::ReasoningStart;   // adaptive: model chose to think
      else if (which == 1 && state_ == State::ReasoningStart) state_ = State::ContentAfterReasoning;  // empty reasoning
      // otherwise a duplicated open tag, or a stray "</mm:think>" that history rendering taught: dropped
      continue;
    }
    emit(std::string_view(buf_).substr(0, best));
    buf_.erase(0, best + tag.size());
    if (which == 1 && state_ == State::Reasoning) state_ = State::ContentAfterReasoning;
    // Any other tag in the middle of a channel is stray markup: dropped.
  }
  if (final) buf_.clear();
  return out;
}

ReasoningResult ReasoningParser::parse(ReasoningFormat fmt, bool start_in_reasoning, std::string_view text) {
  ReasoningParser p(fmt, start_in_reasoning);
  ReasoningDelta a = p.feed(text), b = p.finish();
  ReasoningResult r;
  std::string reasoning = a.reasoning + b.reasoning, content = a.content + b.content;
  if (!reasoning.empty()) r.reasoning = std::move(reasoning);
  if (!content.empty()) r.content = std::move(content);
  return r;
}

}  // namespace m3::chat
