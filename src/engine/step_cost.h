// Step cost model: how long a step of the engine takes on this machine, as a function of its prefill
// tokens and its decode rows (a decode token, or an anchor + drafts being verified). The scheduler asks
// it how large a prefill chunk a step that carries decoding requests can take and stay within its
// latency budget (SchedulerConfig::step_latency_factor / max_step_latency_ms); the engine feeds it the
// wall time of every step it runs. An interface, so a scheduler test can inject a fake with exact costs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/decayed_fit.h"

namespace m3 {

class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  // Predicted wall time of a step in milliseconds; negative while the model cannot tell yet (too few
  // steps measured). Non-decreasing in both arguments.
  virtual double predict_ms(int64_t prefill_tokens, int64_t decode_rows) const = 0;
  // Predicted wall time of a step of `decode_rows` decode rows and no prefill (adaptive speculation
  // prices verified rows with it); negative while the model cannot tell. Non-decreasing.
  virtual double predict_decode_ms(int64_t decode_rows) const { return predict_ms(0, decode_rows); }
  // One measured step.
  virtual void observe(int64_t prefill_tokens, int64_t decode_rows, double ms) { (void)prefill_tokens, (void)decode_rows, (void)ms; }
  // Whether the prefill cost is measured well enough to size chunks by (the latency budget waits for it).
  virtual bool prefill_measured() const { return true; }
};

// Online least-squares fit of t = a + b * decode_rows + c * prefill_tokens over the recent steps, each
// older step's weight decaying by `decay` per new one (0.98: about the last 50 steps count), so the
// model follows the machine when its neighbours' load changes. Cheap: a 3x3 solve per step.
//
// Decode-only steps are also kept per row count (a running mean per shape, the last kMaxShapes shapes
// seen): predict_decode_ms reads them, interpolating between the shapes measured. Why: the linear fit
// over the last 50 steps cannot hold two decode shapes when one of them dominates those steps. At
// concurrency 1, after a request's 128 plain one-row steps, the split of the one-row step into a fixed
// part and a part per row was whatever the few prompt steps left it, and the cost of a verified row
// it gave swung between 1.2 and 3.4 ms from request to request (measured: 1.5 ms), which started
// requests without speculation that would have paid 1.2x. Verification's rows also cost what the
// memory-bound one-row step does not: the 4-row step of mid m31 took 2.4x the one-row step.
class FittedStepCost final : public StepCostModel {
 public:
  explicit FittedStepCost(double decay = 0.98) : fit_(decay) {}
  double predict_ms(int64_t prefill_tokens, int64_t decode_rows) const override;
  double predict_decode_ms(int64_t decode_rows) const override;
  void observe(int64_t prefill_tokens, int64_t decode_rows, double ms) override;
  // "a + b/row + c/token" in ms, for logs; "not measured yet" until it predicts.
  bool prefill_measured() const override {
    return predict_ms(0, 0) >= 0 && steps_with_prefill_ >= 2 && steps_with_decode_ >= 2;
  }
  std::string describe() const;

 private:
  // A decode-only shape's measured time: the mean of its first kShapeMean steps, then an EWMA.
  struct Shape {
    int64_t rows = 0;
    double ms = 0;
    int64_t n = 0, last = 0;  // steps measured; the step count when last measured
  };
  static constexpr size_t kMaxShapes = 64;
  static constexpr int64_t kShapeMean = 4;
  void refit();
  DecayedLeastSquares<3> fit_;  // x = (1, decode_rows, prefill_tokens)
  int64_t steps_ = 0, steps_with_prefill_ = 0, steps_with_decode_ = 0;
  bool ready_ = false;
  double coef_[3] = {};  // a, b, c (each >= 0)
  std::vector<Shape> shapes_;  // sorted by rows
};

}  // namespace m3
