// Time-budgeted steps (SchedulerConfig::step_latency_factor / max_step_latency_ms): with a FAKE step cost
// model of exactly known costs, the prefill chunk of a step that carries decode rows is the largest that
// keeps the step within its budget (the factor times the decode-only step of the batch the decoding and
// the joining requests form), never below min_prefill_chunk, the full token budget when nothing
// decodes, and the token-budget flags stay upper bounds. Also the fitted cost model on exact data, and
// the engine: the budget changes how prompts are chunked, never a greedy output.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <random>

#include "engine/block_pool.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/step_cost.h"
#include "engine_test_util.h"
#include "golden_compare.h"
#include "model/model.h"

namespace {

// t = 10 ms + 1 ms per decode row + 2 ms per prefill token; the measured decode-only shapes read
// `shapes_below` ms less than that (0: the same).
struct FakeCost : m3::StepCostModel {
  bool ready = true;
  double shapes_below = 0;
  double predict_ms(int64_t p, int64_t d) const override { return ready ? 10.0 + 1.0 * double(d) + 2.0 * double(p) : -1; }
  double predict_decode_ms(int64_t d) const override { return ready ? predict_ms(0, d) - shapes_below : -1; }
};

struct Fixture {
  m3::BlockPool pool;
  std::vector<std::unique_ptr<m3::Sequence>> seqs;
  std::unique_ptr<m3::Scheduler> sched;
  FakeCost cost;

  explicit Fixture(m3::SchedulerConfig c, int pages = 256) : pool(pages, 16, false) {
    c.block_size = 16;
    sched = std::make_unique<m3::Scheduler>(c, pool);
    sched->set_cost_model(&cost);
  }
  m3::Sequence* add(int prompt_len) {
    auto s = std::make_unique<m3::Sequence>();
    s->id = seqs.size();
    s->prompt.assign(size_t(prompt_len), 5);
    s->params.max_tokens = 100;
    sched->add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // `n` requests with short prompts, prefilled and holding one generated token: each brings one
  // decode row to the next step.
  void decoding(int n) {
    std::vector<m3::Sequence*> d;
    for (int i = 0; i < n; ++i) d.push_back(add(3));
    auto plan = sched->schedule();
    ASSERT_EQ(plan.size(), size_t(n));
    sched->commit(plan);
    for (auto* s : d) s->output.push_back(7);
  }
  // Prefill tokens of a plan (chunks of more than one token, or not sampling) and its decode rows.
  static std::pair<int64_t, int64_t> shape(const std::vector<m3::ScheduledChunk>& plan) {
    int64_t p = 0, d = 0;
    for (const auto& c : plan) (c.n == 1 && c.sample ? d : p) += c.n + c.spec;
    return {p, d};
  }
};

m3::SchedulerConfig config(double factor, double max_ms = 0) {
  m3::SchedulerConfig c;
  c.max_num_batched_tokens = 512;
  c.step_latency_factor = factor;
  c.max_step_latency_ms = max_ms;
  c.min_prefill_chunk = 8;
  return c;
}

TEST(SchedulerBudget, ChunkIsTheLargestWithinTheBudget) {
  Fixture f(config(4));
  f.decoding(4);
  f.add(1000);
  // The 4 rows and the prompt's request make a batch of 5: its decode-only step is 15 ms, the budget
  // 4 x 15 = 60 ms; a step of the 4 rows and P prompt tokens: 14 + 2 P <= 60 -> P = 23.
  EXPECT_EQ(f.sched->prefill_allowance(), 23);
  const auto plan = f.sched->schedule();
  ASSERT_EQ(plan.size(), 5u);
  EXPECT_EQ(plan.back().n, 23);
  EXPECT_FALSE(plan.back().sample);
  const auto [p, d] = Fixture::shape(plan);
  EXPECT_EQ(d, 4);
  EXPECT_LE(f.cost.predict_ms(p, d), 4 * f.cost.predict_ms(0, d + 1));
  EXPECT_GT(f.cost.predict_ms(p + 1, d), 4 * f.cost.predict_ms(0, d + 1));
  // The unfinished prompt continues with the next allowance while the others keep decoding.
  f.sched->commit(plan);
  for (size_t i = 0; i < 4; ++i) plan[i].seq->output.push_back(7);
  const auto next = f.sched->schedule();
  ASSERT_EQ(next.size(), 5u);
  EXPECT_EQ(next.back().start, 23);
  EXPECT_EQ(next.back().n, 23);
}

TEST(SchedulerBudget, PromptsShareTheAllowanceInOrder) {
  Fixture f(config(4));
  f.decoding(4);
  f.add(15);
  f.add(1000);
  f.add(30);
  const auto plan = f.sched->schedule();
  // A batch of 4 + 3: 17 ms, 68 ms of budget, 27 tokens: all 15 of the first prompt, 12 of the
  // second, none left to admit the third.
  ASSERT_EQ(plan.size(), 6u);
  EXPECT_EQ(plan[4].n, 15);
  EXPECT_TRUE(plan[4].sample);
  EXPECT_EQ(plan[5].n, 12);
  EXPECT_EQ(f.sched->num_waiting(), 1u);
}

TEST(SchedulerBudget, MinimumChunkKeepsPrefillProgressing) {
  Fixture f(config(1));  // the budget is a decode-only step: no room for prefill at all
  f.decoding(4);
  f.add(1000);
  EXPECT_EQ(f.sched->prefill_allowance(), 8);
  const auto plan = f.sched->schedule();
  ASSERT_EQ(plan.size(), 5u);
  EXPECT_EQ(plan.back().n, 8);
}

TEST(SchedulerBudget, NoDecodeRowsTakesTheFullChunk) {
  Fixture f(config(1));
  f.add(1000);
  EXPECT_EQ(f.sched->prefill_allowance(), std::numeric_limits<int64_t>::max());
  const auto plan = f.sched->schedule();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].n, 512);
}

TEST(SchedulerBudget, TokenBudgetFlagsStayUpperBounds) {
  {
    Fixture f(config(100));  // 1400 ms: room for 693 tokens, but the step's token budget is 512
    f.decoding(4);
    f.add(1000);
    const auto plan = f.sched->schedule();
    EXPECT_EQ(plan.back().n, 512 - 4);
  }
  {
    auto c = config(100);
    c.long_prefill_token_threshold = 100;
    Fixture f(c);
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 100);
  }
  {
    auto c = config(4);
    c.long_prefill_token_threshold = 10;  // below the time budget's 23: the threshold wins
    Fixture f(c);
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 10);
  }
}

TEST(SchedulerBudget, MillisecondCapAndFactorBothBound) {
  {
    Fixture f(config(0, 40));  // 14 + 2 P <= 40 -> 13
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 13);
  }
  {
    Fixture f(config(4, 1000));  // the factor's 60 ms is the tighter bound
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 23);
  }
}

TEST(SchedulerBudget, OffOrUnmeasuredMeansTokenBudgetsOnly) {
  {
    Fixture f(config(0, 0));
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 512 - 4);
  }
  {
    Fixture f(config(4));
    f.cost.ready = false;  // the engine has not measured both kinds of step yet
    f.decoding(4);
    f.add(1000);
    EXPECT_EQ(f.sched->schedule().back().n, 512 - 4);
  }
}

TEST(SchedulerBudget, SpeculativeRowsCountAsDecodeRows) {
  auto c = config(4);
  c.num_speculative_tokens = 3;
  Fixture f(c);
  f.decoding(2);
  f.add(1000);
  // 2 rows x (anchor + 3 drafts) = 8 rows, and the prompt's request: a batch of 9, 19 ms; 76 ms
  // budget; 18 + 2 P <= 76 -> 29.
  const auto plan = f.sched->schedule();
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].spec, 3);
  EXPECT_EQ(plan.back().n, 29);
}

TEST(SchedulerBudget, ReferenceIsTheBatchTheWaitingRequestsJoin) {
  // 4 decoding requests and two waiting 1000-token prompts (63 pages each); the allowance of the step.
  auto allowance = [](m3::SchedulerConfig c, int pages, double shapes_below, int prompts) {
    Fixture f(c, pages);
    f.cost.shapes_below = shapes_below;
    f.decoding(4);
    for (int i = 0; i < prompts; ++i) f.add(1000);
    return f.sched->prefill_allowance();
  };
  // Both prompts fit the pool: a batch of 6, 16 ms, 64 ms of budget, 14 + 2 P <= 64 -> 25.
  EXPECT_EQ(allowance(config(4), 256, 0, 2), 25);
  // --max-num-seqs 5: one of them can join.
  auto c = config(4);
  c.max_num_seqs = 5;
  EXPECT_EQ(allowance(c, 256, 0, 2), 23);
  // 100 pages: after the 4 decoding requests' 4 pages, one prompt's 63 pages fit, not two.
  EXPECT_EQ(allowance(config(4), 100, 0, 2), 23);
  // Measured decode-only shapes below the fit (5 ms less): the lower reference, 10 ms at a batch
  // of 5, 40 ms of budget, 14 + 2 P <= 40 -> 13.
  EXPECT_EQ(allowance(config(4), 256, 5, 1), 13);
}

// The tail share: a step may read prompts past the factor's allowance while the decoding requests it
// holds up, with those held up among the last 1024 decoding requests, stay within the share of them.
TEST(SchedulerBudget, TailShareLetsFewDecodingRequestsWait) {
  // A scheduler with `decoding` requests that have decoded `steps` steps together, then a prompt of
  // `prompt` tokens waiting.
  auto history = [](m3::SchedulerConfig cfg, int decoding, int steps, int prompt, int pages = 256) {
    auto f = std::make_unique<Fixture>(cfg, pages);
    f->decoding(decoding);  // their prompts' step carried no decoding request
    for (int i = 0; i < steps; ++i) {
      const auto plan = f->sched->schedule();
      EXPECT_EQ(Fixture::shape(plan).first, 0);
      f->sched->commit(plan);
      for (const auto& c : plan) c.seq->output.push_back(7);
    }
    f->add(prompt);
    return f;
  };
  // Prefill tokens of the next step.
  auto next_prefill = [](Fixture& f) {
    const auto plan = f.sched->schedule();
    f.sched->commit(plan);
    for (const auto& c : plan)
      if (c.sample) c.seq->output.push_back(7);
    return Fixture::shape(plan).first;
  };
  auto c = config(4);
  c.step_latency_tail_share = 0.01;
  // Nothing measured yet: 1 held up of 1 is over 1%, so the factor's chunk (a batch of 2: 12 ms, 48 ms
  // of budget, 11 + 2 P <= 48 -> 18).
  EXPECT_EQ(next_prefill(*history(c, 1, 0, 1000)), 18);
  {
    // After 199 steps of one decoding request: holding it up is 1 of 200, 1%: the whole token
    // budget (512 minus the decode row); then 2 of 201 (the share allows 2.01), the next 511 tokens
    // at once too; then 3 of 202 is over: the factor's chunks again (18, as above).
    auto f = history(c, 1, 199, 2000);
    EXPECT_EQ(next_prefill(*f), 511);
    EXPECT_EQ(next_prefill(*f), 511);
    EXPECT_EQ(next_prefill(*f), 18);
    EXPECT_EQ(f->sched->stats().tail_steps, 2);
    EXPECT_EQ(f->sched->stats().tail_held, 2);
  }
  // Four decoding requests after 50 steps: holding them up is 4 of 204, over 2%: the factor's chunk (a
  // batch of 5, as in ChunkIsTheLargestWithinTheBudget).
  EXPECT_EQ(next_prefill(*history(c, 4, 50, 1000)), 23);
  {
    // The window is the last 1024 decoding requests, not the whole history: after 1000 steps of four
    // (4000), the share allows 10.24 held up, so two steps of four, then the factor's chunk.
    auto f = history(c, 4, 1000, 5000, 1024);
    EXPECT_EQ(next_prefill(*f), 508);
    EXPECT_EQ(next_prefill(*f), 508);
    EXPECT_EQ(next_prefill(*f), 23);
  }
  // The share 0: every step within the factor, however long the history.
  auto z = c;
  z.step_latency_tail_share = 0;
  EXPECT_EQ(next_prefill(*history(z, 1, 300, 1000)), 18);
  // --max-step-latency-ms stays a hard cap: past the factor only up to it (11 + 2 P <= 200 -> 94).
  auto m = c;
  m.max_step_latency_ms = 200;
  EXPECT_EQ(next_prefill(*history(m, 1, 199, 1000)), 94);
}

TEST(FittedStepCost, RecoversALinearCostAndStaysNonNegative) {
  m3::FittedStepCost m(0.98);
  EXPECT_LT(m.predict_ms(10, 1), 0);
  EXPECT_EQ(m.describe(), "not measured yet");
  const int shapes[][2] = {{512, 0}, {0, 1}, {0, 8}, {32, 8}, {64, 3}, {0, 4}, {128, 0}, {16, 2}};
  for (int r = 0; r < 5; ++r)
    for (const auto& s : shapes) m.observe(s[0], s[1], 8.0 + 0.5 * s[1] + 1.5 * s[0]);
  EXPECT_NEAR(m.predict_ms(0, 1), 8.5, 1e-3);
  EXPECT_NEAR(m.predict_ms(100, 8), 8.0 + 4.0 + 150.0, 1e-2);
  // Decode rows that cost nothing more (their noise made the slope negative): clamped to 0, refitted.
  m3::FittedStepCost flat(0.98);
  for (int r = 0; r < 5; ++r)
    for (const auto& s : shapes) flat.observe(s[0], s[1], 10.0 - 0.01 * s[1] + 2.0 * s[0]);
  EXPECT_GE(flat.predict_ms(0, 100), flat.predict_ms(0, 1));
  EXPECT_NEAR(flat.predict_ms(64, 1), 10.0 + 128.0, 0.5);
}

// Decode-only steps are kept per row count: after 200 one-row steps the 4-row shape measured before
// them is still known (the linear fit alone, its last 50 steps all one-row, had lost it), shapes in
// between are interpolated, shapes beyond extrapolated with the last two shapes' slope, and two close
// shapes measured in the wrong order (noise) still predict a non-decreasing cost.
TEST(FittedStepCost, DecodeShapesKeptApartFromTheFit) {
  m3::FittedStepCost m(0.98);
  for (int r = 0; r < 4; ++r) {
    m.observe(100, 0, 150.0);
    m.observe(0, 1, 6.0);
    m.observe(0, 4, 15.0);
  }
  for (int r = 0; r < 200; ++r) m.observe(0, 1, 6.0);
  EXPECT_NEAR(m.predict_decode_ms(1), 6.0, 1e-9);
  EXPECT_NEAR(m.predict_decode_ms(4), 15.0, 1e-9);
  EXPECT_NEAR(m.predict_decode_ms(2), 9.0, 1e-9);
  EXPECT_NEAR(m.predict_decode_ms(6), 21.0, 1e-9);
  // A mixed step is still the linear fit's.
  EXPECT_NEAR(m.predict_ms(0, 1), 6.0, 0.05);
  // A shape measured once does not count yet; twice, it does (running mean).
  m.observe(0, 8, 40.0);
  EXPECT_NEAR(m.predict_decode_ms(8), 27.0, 1e-9);
  m.observe(0, 8, 30.0);
  EXPECT_NEAR(m.predict_decode_ms(8), 35.0, 1e-9);
  // 5 rows measured above 8 rows: 8 reads as 5's cost, and nothing between them falls.
  for (int r = 0; r < 2; ++r) m.observe(0, 5, 50.0);
  EXPECT_NEAR(m.predict_decode_ms(5), 50.0, 1e-9);
  EXPECT_NEAR(m.predict_decode_ms(8), 50.0, 1e-9);
  EXPECT_GE(m.predict_decode_ms(7), m.predict_decode_ms(6));
  // The summary names the shapes measured most.
  EXPECT_NE(m.describe().find("decode-only steps: 1 rows 6.00 ms"), std::string::npos) << m.describe();
}

// The engine with the budget forced tight (every step that decodes takes 7 prompt tokens) against the
// budget off: the prompts are chunked differently, the greedy outputs are the same.
TEST(EngineStepBudget, GreedyOutputUnchangedByTheBudget) {
  static m3::Model model(m3test::golden_model_dir("m31-tiny"));
  std::mt19937 rng(11);
  const auto a = m3test::random_tokens(rng, 50, 420), b = m3test::random_tokens(rng, 60, 420);
  const auto c = m3test::random_tokens(rng, 600, 420), d = m3test::random_tokens(rng, 400, 420);
  auto run = [&](bool budget, int64_t* steps) {
    m3::EngineConfig cfg;
    cfg.num_pages = 40;
    cfg.max_num_batched_tokens = 2048;
    cfg.step_latency_factor = 0;
    cfg.max_step_latency_ms = budget ? 1e-6 : 0;  // nothing fits: the minimum chunk every step
    cfg.min_prefill_chunk = 7;
    m3::Engine e(model, nullptr, cfg);
    std::map<std::string, m3test::Finished> out;
    auto step = [&] {
      for (auto& o : e.step()) {
        auto& f = out[o.request_id];
        f.tokens.insert(f.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      }
    };
    // Staggered arrivals, so that the cost model has seen steps with prefill and with decode rows
    // before the long prompts come.
    e.add_request("a", a, m3test::greedy(120));
    for (int i = 0; i < 3; ++i) step();
    e.add_request("b", b, m3test::greedy(100));
    for (int i = 0; i < 3; ++i) step();
    e.add_request("c", c, m3test::greedy(6));
    e.add_request("d", d, m3test::greedy(6));
    while (e.has_work()) step();
    *steps = e.stats().steps;
    if (budget) {
      EXPECT_NE(e.step_cost_summary(), "not measured yet");
    }
    return out;
  };
  int64_t steps_on = 0, steps_off = 0;
  const auto on = run(true, &steps_on), off = run(false, &steps_off);
  for (const char* id : {"a", "b", "c", "d"}) EXPECT_EQ(on.at(id).tokens, off.at(id).tokens) << id;
  EXPECT_EQ(on.at("a").tokens.size(), 120u);
  // 1000 prompt tokens 7 at a time while a and b decode: far more steps than a and b's outputs alone.
  EXPECT_GT(steps_on, 125);
  EXPECT_LT(steps_off, 125);
}

// A share outside [0, 1) is refused by the flag's name; the bounds are taken.
TEST(EngineStepBudget, TailShareOutOfRangeIsRefusedByName) {
  static m3::Model model(m3test::golden_model_dir("m31-tiny"));
  for (double bad : {-0.1, 1.0, 2.0}) {
    m3::EngineConfig cfg;
    cfg.num_pages = 8;
    cfg.step_latency_tail_share = bad;
    try {
      m3::Engine e(model, nullptr, cfg);
      ADD_FAILURE() << bad << " accepted";
    } catch (const m3::Error& err) {
      EXPECT_NE(std::string(err.what()).find("--step-latency-tail-share"), std::string::npos) << err.what();
    }
  }
  for (double good : {0.0, 0.005, 0.5}) {
    m3::EngineConfig cfg;
    cfg.num_pages = 8;
    cfg.step_latency_tail_share = good;
    EXPECT_NO_THROW(m3::Engine(model, nullptr, cfg)) << good;
  }
}

}  // namespace
