// What a client sees of special tokens and what it may send back: skip_special_tokens applied after
// the reasoning and tool-call parsers (only to special tokens the model emitted), "separate_reasoning":
// false keeping the think tags, an assistant turn's `reasoning` field rendered like
// `reasoning_content`, malformed history tool calls and tool schemas refused naming the field, and
// the request fields logit_bias, stop_token_ids, echo + logprobs and stream_options checked as vLLM does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/special_text_filter.h"
#include "engine/sampler.h"
#include "server/errors.h"
#include "server/messages_api.h"
#include "server/openai_protocol.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

using namespace m3;
using namespace m3::server;

namespace {

// The demo model's tokenizer: the M3 special tokens (think tags, the tool-call namespace token, role
// markers) on a small vocabulary.
Tokenizer& tiny_tok() {
  static Tokenizer tok = Tokenizer::from_dir(std::string(M3_TEST_DATA) + "/../../models/demo");
  return tok;
}

ServerContext tiny_ctx() {
  std::ifstream f(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja");
  std::stringstream ss;
  ss << f.rdbuf();
  ServerContext ctx;
  ctx.served_names = {"m"};
  ctx.tok = &tiny_tok();
  ctx.vocab = tiny_tok().vocab_size();
  ctx.chat_template = std::make_shared<chat::ChatTemplate>(ss.str());
  ctx.bos_token = "]~b]";
  ctx.eos_token = "[e~[";
  ctx.reasoning = chat::ReasoningFormat::MiniMaxM3;
  ctx.tool = chat::ToolFormat::MiniMaxM3;
  ctx.enable_auto_tool_choice = true;
  return ctx;
}

// An engine output of `text`, tokenised with special tokens parsed (as the model would emit them).
RequestOutput output_of(const std::string& text, bool finished) {
  RequestOutput o;
  o.new_tokens = tiny_tok().encode(text, true);
  o.new_text = text;
  o.finished = finished;
  o.finish_reason = finished ? FinishReason::Stop : FinishReason::None;
  return o;
}

struct Seen {
  std::string content, reasoning;
};
// Feeds `pieces` as consecutive engine outputs (the last one finishes) and collects the deltas.
Seen run(ChoiceState& s, const std::vector<std::string>& pieces) {
  Seen r;
  for (size_t i = 0; i < pieces.size(); ++i) {
    ChoiceDelta d = s.on_output(output_of(pieces[i], i + 1 == pieces.size()));
    r.content += d.content;
    r.reasoning += d.reasoning;
  }
  EXPECT_EQ(r.content, s.content);
  EXPECT_EQ(r.reasoning, s.reasoning);
  return r;
}

ChoiceOptions parsers(bool skip_special) {
  ChoiceOptions o;
  o.skip_special = skip_special;
  o.reasoning = chat::ReasoningFormat::MiniMaxM3;
  o.reasoning_start = true;
  return o;
}

std::pair<int, std::string> refusal(const ojson& body, const ServerContext& ctx, bool chat = true) {
  try {
    if (chat) parse_chat_request(body, ctx);
    else parse_completion_request(body, ctx);
  } catch (const ApiError& e) {
    return {e.status, e.param + ": " + e.what()};
  }
  return {0, ""};
}

}  // namespace

TEST(SpecialTextFilter, RemovesAddedStringsAcrossPieces) {
  chat::SpecialTextFilter f;
  EXPECT_EQ(f.feed("plain ]~b] text"), "plain ]~b] text");  // nothing added yet: passes as it is
  f.add("]~b]");
  f.add("]<]minimax[>[");
  f.add("]~b]");  // repeats are ignored
  EXPECT_EQ(f.feed("a]~b]b"), "ab");
  // A marker split over three pieces is held back until it is decided.
  EXPECT_EQ(f.feed("x]<]mini"), "x");
  EXPECT_EQ(f.feed("max[>"), "");
  EXPECT_EQ(f.feed("[y"), "y");
  // A held prefix that turns out to be text is released as text.
  EXPECT_EQ(f.feed("]~"), "");
  EXPECT_EQ(f.feed("q"), "]~q");
  EXPECT_EQ(f.feed("end ]<]min"), "end ");
  EXPECT_EQ(f.finish(), "]<]min");
}

TEST(SpecialTokensInReplies, SkippedAfterTheParsersUnlessAsked) {
  const std::vector<std::string> pieces = {"Think ]~b]", "ing.</mm:think>Hi", " ]~b]there", "]<]minimax[>["};
  {
    ChoiceState s(&tiny_tok(), parsers(true));
    const Seen r = run(s, pieces);
    EXPECT_EQ(r.reasoning, "Think ing.");
    EXPECT_EQ(r.content, "Hi there");
  }
  {
    ChoiceState s(&tiny_tok(), parsers(false));  // skip_special_tokens: false keeps them
    const Seen r = run(s, pieces);
    EXPECT_EQ(r.reasoning, "Think ]~b]ing.");
    EXPECT_EQ(r.content, "Hi ]~b]there]<]minimax[>[");
  }
  // Text the model wrote with ordinary tokens stays, even where it spells a special token.
  {
    ChoiceState s(&tiny_tok(), parsers(true));
    RequestOutput o;
    o.new_text = "ok</mm:think>write ]~b] here";
    o.new_tokens = tiny_tok().encode("ok", true);
    const std::vector<int32_t> close = tiny_tok().encode("</mm:think>", true);
    o.new_tokens.insert(o.new_tokens.end(), close.begin(), close.end());
    const std::vector<int32_t> rest = tiny_tok().encode("write ]~b] here", false);  // "]~b]" as text
    o.new_tokens.insert(o.new_tokens.end(), rest.begin(), rest.end());
    o.finished = true;
    o.finish_reason = FinishReason::Stop;
    s.on_output(o);
    EXPECT_EQ(s.content, "write ]~b] here");
  }
}

TEST(SpecialTokensInReplies, SeparateReasoningFalseKeepsTheThinkTags) {
  ChoiceOptions o;
  o.keep_think_tags = chat::ReasoningFormat::MiniMaxM3;
  o.reasoning_start = true;  // the prompt opened the block: its tag is put back first
  EXPECT_FALSE(choice_text_options(o).skip_special);
  ChoiceState s(&tiny_tok(), o);
  const Seen r = run(s, {"The user greets]~b] me.", "</mm:think>Hello!"});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "<mm:think>The user greets me.</mm:think>Hello!");
}

TEST(SpecialTokensInReplies, SeparateReasoningFalseFromTheRequest) {
  const ServerContext ctx = tiny_ctx();
  ParsedRequest r = parse_chat_request(
      ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],"separate_reasoning":false})"), ctx);
  EXPECT_FALSE(r.choice.reasoning);
  ASSERT_TRUE(r.choice.keep_think_tags);
  EXPECT_FALSE(r.choice.reasoning_start);  // adaptive (the default): the model opens the block itself
  r = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],"separate_reasoning":false,
    "chat_template_kwargs":{"thinking_mode":"enabled"}})"), ctx);
  EXPECT_TRUE(r.choice.reasoning_start);  // the template opened it: its tag is put back in content
  r = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"hi"}]})"), ctx);
  EXPECT_TRUE(r.choice.reasoning);
  EXPECT_FALSE(r.choice.keep_think_tags);
}

TEST(ChatHistory, ReasoningFieldRendersAsReasoningContent) {
  const ServerContext ctx = tiny_ctx();
  auto prompt = [&](const char* field) {
    ojson body = ojson::parse(R"({"messages":[{"role":"user","content":"Hi"},
      {"role":"assistant","content":"Hello!"},{"role":"user","content":"Again"}]})");
    body["messages"][1][field] = "The user greets me.";
    return parse_chat_request(body, ctx).prompt_texts.at(0);
  };
  const std::string a = prompt("reasoning"), b = prompt("reasoning_content");
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("<mm:think>The user greets me.</mm:think>Hello!"), std::string::npos) << a;
  // Both present: reasoning_content is what the template reads.
  ojson both = ojson::parse(R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!",
    "reasoning":"A","reasoning_content":"B"},{"role":"user","content":"Again"}]})");
  EXPECT_NE(parse_chat_request(both, ctx).prompt_texts.at(0).find("<mm:think>B</mm:think>"), std::string::npos);
  ojson bad = both;
  bad["messages"][1]["reasoning"] = 5;
  EXPECT_EQ(refusal(bad, ctx).first, 400);
  EXPECT_NE(refusal(bad, ctx).second.find("messages[1].reasoning must be a string"), std::string::npos);
}

TEST(ChatHistory, MalformedToolCallsAreRefusedNamingTheField) {
  const ServerContext ctx = tiny_ctx();
  auto with_calls = [](const char* calls) {
    ojson b = ojson::parse(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null},
      {"role":"tool","tool_call_id":"c1","content":"x"}],"max_tokens":5})");
    b["messages"][1]["tool_calls"] = ojson::parse(calls);
    return b;
  };
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"id":"c1","type":"function","function":{"name":"f","arguments":"not json"}}])",
       "messages[1].tool_calls[0].function.arguments must be a JSON object or a string holding one"},
      {R"([{"id":"c1","type":"function","function":{"name":"f","arguments":"[1]"}}])",
       "messages[1].tool_calls[0].function.arguments must be a JSON object"},
      {R"([{"id":"c1","type":"function","function":{"name":"f","arguments":7}}])",
       "(got number)"},
      {R"("bad")", "messages[1].tool_calls must be a list"},
      {R"([{"id":"c1","type":"function","function":{"arguments":"{}"}}])", "messages[1].tool_calls[0] needs 'function'"},
      {R"([{"id":"c1","type":"function","function":{"name":"","arguments":"{}"}}])",
       "messages[1].tool_calls[0].function.name must be a non-empty string"},
      {R"([3])", "messages[1].tool_calls[0] must be an object"},
      {R"([{"id":"c1","type":"function","function":{"name":"f"}}])",
       "messages[1].tool_calls[0].function.arguments is required"},
  };
  for (const auto& [calls, text] : cases) {
    const auto [status, msg] = refusal(with_calls(calls), ctx);
    EXPECT_EQ(status, 400) << calls;
    EXPECT_NE(msg.find(text), std::string::npos) << calls << " -> " << msg;
    EXPECT_EQ(msg.rfind("messages: ", 0), 0u) << msg;  // param
  }
  // Well-formed: arguments as a string or as an object; the flat form the template also takes.
  for (const char* ok : {R"([{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}])",
                         R"([{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}])",
                         R"([{"id":"c1","name":"f","arguments":"{\"a\": 1}"}])"})
    EXPECT_EQ(refusal(with_calls(ok), ctx).first, 0) << ok << " " << refusal(with_calls(ok), ctx).second;
}

TEST(ChatHistory, ToolParametersMustBeAnObject) {
  const ServerContext ctx = tiny_ctx();
  ojson b = ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":"notobj"}}]})");
  const auto [status, msg] = refusal(b, ctx);
  EXPECT_EQ(status, 400);
  EXPECT_NE(msg.find("tools[0].function.parameters must be a JSON Schema object (got string)"), std::string::npos) << msg;
  b["tools"][0]["function"]["parameters"] = nullptr;
  EXPECT_EQ(refusal(b, ctx).first, 0);
}

TEST(RequestFields, LogitBiasIsReadAndChecked) {
  const ServerContext ctx = tiny_ctx();
  ParsedRequest r = parse_completion_request(ojson::parse(R"({"prompt":"x","logit_bias":{"12":5.5,"7":-100}})"), ctx);
  EXPECT_EQ(r.params.logit_bias, (std::vector<std::pair<int32_t, float>>{{12, 5.5f}, {7, -100.0f}}));
  r = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{}})"), ctx);
  EXPECT_TRUE(r.params.logit_bias.empty());
  const std::string past = std::to_string(ctx.vocab);
  const std::pair<std::string, std::string> bad[] = {
      {R"({"prompt":"x","logit_bias":{"12":101}})", "logit_bias: 'logit_bias' for token 12 must be in [-100, 100]"},
      {R"({"prompt":"x","logit_bias":{"abc":1}})", "logit_bias: 'logit_bias' keys must be token ids (got \"abc\")"},
      {R"({"prompt":"x","logit_bias":{"-3":1}})", "keys must be token ids"},
      {R"({"prompt":"x","logit_bias":{"12":"high"}})", "must be an object mapping token ids to numbers"},
      {R"({"prompt":"x","logit_bias":[1]})", "must be an object mapping token ids to numbers"},
      {R"({"prompt":"x","logit_bias":{")" + past + R"(":1}})",
       "logit_bias: token id " + past + " is outside the vocabulary"},
      {R"({"prompt":"x","stop_token_ids":[)" + past + R"(]})",
       "stop_token_ids: token id " + past + " is outside the vocabulary"},
  };
  for (const auto& [body, text] : bad) {
    const auto [status, msg] = refusal(ojson::parse(body), ctx, false);
    EXPECT_EQ(status, 400) << body;
    EXPECT_NE(msg.find(text), std::string::npos) << body << " -> " << msg;
  }
}

TEST(RequestFields, EchoWithLogprobsSeedRangeAndContinuousUsage) {
  const ServerContext ctx = tiny_ctx();
  const auto echo = refusal(ojson::parse(R"({"prompt":"x","echo":true,"logprobs":1})"), ctx, false);
  EXPECT_EQ(echo.first, 400);
  EXPECT_EQ(echo.second.rfind("echo: ", 0), 0u) << echo.second;
  EXPECT_EQ(refusal(ojson::parse(R"({"prompt":"x","echo":true})"), ctx, false).first, 0);
  const auto seed = refusal(ojson::parse(R"({"prompt":"x","seed":18446744073709551616})"), ctx, false);
  EXPECT_EQ(seed, std::make_pair(400, std::string("seed: 'seed' is out of range")));
  // continuous_usage_stats counts only together with include_usage (vLLM).
  ParsedRequest r = parse_completion_request(
      ojson::parse(R"({"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}})"), ctx);
  EXPECT_FALSE(r.continuous_usage);
  r = parse_completion_request(ojson::parse(
      R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}})"), ctx);
  EXPECT_TRUE(r.continuous_usage);
}

TEST(Sampler, LogitBiasMovesTheChoiceBeforeThePenalties) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  const std::vector<int32_t> none;
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, none, none), 1);
  p.logit_bias = {{1, -100.0f}};  // bans the argmax
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, none, none), 2);
  p.logit_bias = {{3, 3.0f}};  // 0.5 + 3 = 3.5 > 3
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, none, none), 3);
  // Bias first, then the repetition penalty (vLLM's order): token 3 seen before, (0.5 + 3) / 2 = 1.75
  // < 3 (the other order would give 0.5 / 2 + 3 = 3.25 and pick it).
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, none, std::vector<int32_t>{3}), 1);
  // The distribution speculative verification uses carries the bias too.
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.logit_bias = {{0, -100.0f}};
  std::vector<float> probs(4);
  Sampler(p).distribution(logits.data(), 4, none, none, probs.data());
  EXPECT_LT(probs[0], 1e-30f);
  double sum = 0;
  for (float x : probs) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // Log-probabilities stay the raw model's.
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.logprobs = 0;
  p.logit_bias = {{3, 50.0f}};
  TokenLogprob lp;
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, none, none, &lp), 3);
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  EXPECT_NEAR(lp.logprob, 0.5 - std::log(z), 1e-5);
  p.logit_bias = {{3, 100.5f}};
  EXPECT_THROW(p.validate(), Error);
}

TEST(TokenizerStrings, TokenStringIsTheTokenizerJsonForm) {
  const Tokenizer& tok = tiny_tok();
  const std::vector<int32_t> ids = tok.encode("Hello world]~b]", true);
  std::vector<std::string> strs;
  for (int32_t id : ids) strs.push_back(tok.token_string(id));
  ASSERT_GE(strs.size(), 3u);
  EXPECT_EQ(strs.back(), "]~b]");
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(tok.token_to_id(strs[i]), ids[i]) << strs[i];
  // The space before "world" in its byte-level form.
  EXPECT_TRUE(std::any_of(strs.begin(), strs.end(), [](const std::string& t) { return t.rfind("Ġ", 0) == 0; }));
  EXPECT_THROW(tok.token_string(-1), Error);
}

TEST(RequestFields, ThinkingTokenBudgetBecomesAConstraint) {
  const ServerContext ctx = tiny_ctx();
  auto chat = [](const char* extra) {
    return ojson::parse(std::string(R"({"messages":[{"role":"user","content":"hi"}])") + extra + "}");
  };
  ParsedRequest r = parse_chat_request(
      chat(R"(,"chat_template_kwargs":{"thinking_mode":"enabled"},"thinking_token_budget":5)"), ctx);
  ASSERT_TRUE(r.params.constraint);
  EXPECT_EQ(r.params.constraint->grammar, nullptr);
  EXPECT_EQ(r.params.constraint->start_after, "</mm:think>");
  EXPECT_EQ(r.params.constraint->start_after_budget, 5);
  EXPECT_EQ(r.params.constraint->start_after_token, *tiny_tok().token_to_id("</mm:think>"));
  // With a response_format: the grammar after the tag, the budget before it.
  r = parse_chat_request(chat(R"(,"chat_template_kwargs":{"thinking_mode":"enabled"},"thinking_token_budget":0,
    "response_format":{"type":"json_object"})"),
                         ctx);
  ASSERT_TRUE(r.params.constraint);
  EXPECT_NE(r.params.constraint->grammar, nullptr);
  EXPECT_EQ(r.params.constraint->start_after_budget, 0);
  // Thinking disabled: no reasoning to bound. A forced tool call closes the block too.
  r = parse_chat_request(chat(R"(,"chat_template_kwargs":{"thinking_mode":"disabled"},"thinking_token_budget":5)"), ctx);
  EXPECT_FALSE(r.params.constraint);
  // Adaptive (the default): the model's own block cannot be counted, so the field is refused.
  auto [status, msg] = refusal(chat(R"(,"thinking_token_budget":5)"), ctx);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(msg.rfind("thinking_token_budget: ", 0), 0u) << msg;
  EXPECT_EQ(refusal(chat(R"(,"chat_template_kwargs":{"thinking_mode":"enabled"},"thinking_token_budget":-1)"), ctx).first,
            400);
  ServerContext no_parser = ctx;
  no_parser.reasoning.reset();
  EXPECT_NE(refusal(chat(R"(,"chat_template_kwargs":{"thinking_mode":"enabled"},"thinking_token_budget":5)"), no_parser)
                .second.find("needs a reasoning parser"),
            std::string::npos);
  // The Messages API's thinking.budget_tokens maps onto it.
  const ojson c = messages_to_chat(ojson::parse(R"({"max_tokens":9,"messages":[{"role":"user","content":"hi"}],
    "thinking":{"type":"enabled","budget_tokens":7}})"),
                                   false, nullptr);
  EXPECT_EQ(c["thinking_token_budget"], 7);
  EXPECT_EQ(c["chat_template_kwargs"]["thinking_mode"], "enabled");
  // A budget with adaptive thinking cannot be honoured: refused by name, in Messages as in chat; and
  // completions have no think block to bound.
  EXPECT_THROW(messages_to_chat(ojson::parse(R"({"max_tokens":70,"messages":[{"role":"user","content":"hi"}],
    "thinking":{"type":"adaptive","budget_tokens":3}})"),
                                false, nullptr),
               ApiError);
  EXPECT_EQ(refusal(ojson::parse(R"({"prompt":"x","thinking_token_budget":5})"), ctx, false).first, 400);
  // As the Messages API: the budget must leave room for the answer.
  EXPECT_THROW(messages_to_chat(ojson::parse(R"({"max_tokens":7,"messages":[{"role":"user","content":"hi"}],
    "thinking":{"type":"enabled","budget_tokens":7}})"),
                                false, nullptr),
               ApiError);
}

// tool_choice required with the M3 tokenizer: the block's own tags are special tokens the grammar lets the
// model emit as such (spelling them letter by letter, it could not close the block and ran to max_tokens).
TEST(RequestFields, ForcedToolGrammarTakesTheTagTokens) {
  const ServerContext ctx = tiny_ctx();
  const ParsedRequest r = parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"weather?"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}}}}}],"tool_choice":"required"})"),
                                             ctx);
  ASSERT_TRUE(r.params.constraint);
  const auto& sp = r.params.constraint->text_specials;
  for (const char* tag : {"]<]minimax[>[", "<tool_call>", "</tool_call>"})
    EXPECT_NE(std::find(sp.begin(), sp.end(), *tiny_tok().token_to_id(tag)), sp.end()) << tag;
  structured::Matcher m(r.params.constraint);
  const std::string call = "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>Paris"
                           "]<]minimax[>[</city>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>";
  const std::vector<int32_t> ids = tiny_tok().encode(call, true);
  EXPECT_NE(std::find(ids.begin(), ids.end(), *tiny_tok().token_to_id("</tool_call>")), ids.end());
  for (int32_t t : ids) ASSERT_TRUE(m.advance(t)) << tiny_tok().token_string(t);
  EXPECT_TRUE(m.terminated());
}

// Completions logprobs (OpenAI / vLLM): the sampled token is always in its top_logprobs dict, with its own
// value, even where its text collides with a better-ranked token's or logprobs is 0.
TEST(RequestFields, CompletionTopLogprobsHoldTheSampledToken) {
  const Tokenizer& tok = tiny_tok();
  const int32_t a = tok.encode("Hello", false).at(0), b = tok.encode(" world", false).at(0);
  std::vector<TokenLogprob> lps(2);
  lps[0].token = b;
  lps[0].logprob = -3.5f;
  lps[0].top = {{a, -0.1f}};  // logprobs 1, the sampled token not among them
  lps[1].token = a;
  lps[1].logprob = -0.2f;     // logprobs 0
  const ojson j = completion_logprobs_json(tok, lps, 0);
  EXPECT_EQ(j["top_logprobs"][0].size(), 2u) << j.dump();
  EXPECT_FLOAT_EQ(j["top_logprobs"][0][tok.decode({b})].get<float>(), -3.5f);
  EXPECT_FLOAT_EQ(j["top_logprobs"][0][tok.decode({a})].get<float>(), -0.1f);
  EXPECT_EQ(j["top_logprobs"][1].size(), 1u);
  EXPECT_FLOAT_EQ(j["top_logprobs"][1][tok.decode({a})].get<float>(), -0.2f);
}
