// Step cost model: how long a step of the engine takes on this machine, as a function of its prefill
// tokens and its decode rows (a decode token, or an anchor + drafts being verified). The scheduler asks
// it how large a prefill chunk a step that carries decoding requests can take and stay within its
// latency budget (SchedulerConfig::step_latency_factor / max_step_latency_ms); the engine feeds it the
// wall time of every step it runs. An interface, so a scheduler test can inject a fake with exact costs.
#pragma once
#include <cstdint>
#include <string>

namespace m3 {

class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  // Predicted wall time of a step in milliseconds; negative while the model cannot tell yet (too few
  // steps measured). Non-decreasing in both arguments.
  virtual double predict_ms(int64_t prefill_tokens, int64_t decode_rows) const = 0;
  // One measured step.
  virtual void observe(int64_t prefill_tokens, int64_t decode_rows, double ms) { (void)prefill_tokens, (void)decode_rows, (void)ms; }
  // Whether the prefill cost is measured well enough to size chunks by (the latency budget waits for it).
  virtual bool prefill_measured() const { return true; }
};

// Online least-squares fit of t = a + b * decode_rows + c * prefill_tokens over the recent steps, each
// older step's weight decaying by `decay` per new one (0.98: about the last 50 steps count), so the
// model follows the machine when its neighbours' load changes. Cheap: a 3x3 solve per prediction.
class FittedStepCost final : public StepCostModel {
 public:
  explicit FittedStepCost(double decay = 0.98) : decay_(decay) {}
  double predict_ms(int64_t prefill_tokens, int64_t decode_rows) const override;
  void observe(int64_t prefill_tokens, int64_t decode_rows, double ms) override;
  // "a + b/row + c/token" in ms, for logs; "not measured yet" until it predicts.
  bool prefill_measured() const override {
    return predict_ms(0, 0) >= 0 && steps_with_prefill_ >= 2 && steps_with_decode_ >= 2;
  }
  std::string describe() const;

 private:
  void refit();
  double decay_;
  double xtx_[3][3] = {};  // decayed sums of x x^T, x = (1, decode_rows, prefill_tokens)
  double xty_[3] = {};
  int64_t steps_ = 0, steps_with_prefill_ = 0, steps_with_decode_ = 0;
  bool ready_ = false;
  double coef_[3] = {};  // a, b, c (each >= 0)
};

}  // namespace m3
