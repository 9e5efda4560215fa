// Online fit of a step's wall time (see step_cost.h).
#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace m3 {

void FittedStepCost::observe(int64_t prefill_tokens, int64_t decode_rows, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  fit_.observe({1.0, double(decode_rows), double(prefill_tokens)}, ms);
  ++steps_;
  if (prefill_tokens > 0) ++steps_with_prefill_;
  if (decode_rows > 0) ++steps_with_decode_;
  refit();
  if (prefill_tokens > 0 || decode_rows <= 0) return;
  const auto at = [&] {
    return std::lower_bound(shapes_.begin(), shapes_.end(), decode_rows,
                            [](const Shape& s, int64_t r) { return s.rows < r; });
  };
  auto it = at();
  if (it == shapes_.end() || it->rows != decode_rows) {
    if (shapes_.size() >= kMaxShapes) {  // forget the shape measured longest ago
      shapes_.erase(std::min_element(shapes_.begin(), shapes_.end(),
                                     [](const Shape& a, const Shape& b) { return a.last < b.last; }));
      it = at();
    }
    it = shapes_.insert(it, Shape{decode_rows, 0, 0, 0});
  }
  ++it->n;
  it->ms += (ms - it->ms) / double(std::min(it->n, kShapeMean));
  it->last = steps_;
}

// Two decode-only shapes or more, each measured twice, give the answer by the shapes around `rows`
// (linear between them; beyond the measured ones, the slope of the nearest two), the values made
// non-decreasing in rows first (noise can order two close shapes the wrong way). One: that shape's
// time, moved by the linear fit's cost per row. None: the linear fit.
double FittedStepCost::predict_decode_ms(int64_t rows) const {
  const Shape* pts[kMaxShapes];
  double val[kMaxShapes];
  int n = 0;
  double top = 0;
  for (const Shape& s : shapes_)
    if (s.n >= 2) {
      top = std::max(top, s.ms);
      pts[n] = &s;
      val[n++] = top;
    }
  if (n == 0) return predict_ms(0, rows);
  if (n == 1) return ready_ ? std::max(0.0, val[0] + coef_[1] * double(rows - pts[0]->rows)) : val[0];
  int i = 1;  // the segment [i - 1, i] that holds rows, or the nearest end segment
  while (i < n - 1 && pts[i]->rows < rows) ++i;
  const double r0 = double(pts[i - 1]->rows), r1 = double(pts[i]->rows);
  const double slope = (val[i] - val[i - 1]) / (r1 - r0);
  return std::max(0.0, val[i - 1] + slope * (double(rows) - r0));
}

void FittedStepCost::refit() {
  // Three steps suffice to start: a feature not seen yet keeps a zero coefficient (the ridge), so
  // e.g. the prefill cost reads as free until a prefill was measured, which leaves the latency budget
  // unbounded, as without a model.
  ready_ = steps_ >= 3 && fit_.solve(coef_);
}

double FittedStepCost::predict_ms(int64_t prefill_tokens, int64_t decode_rows) const {
  if (!ready_) return -1;
  return coef_[0] + coef_[1] * double(decode_rows) + coef_[2] * double(prefill_tokens);
}

std::string FittedStepCost::describe() const {
  if (!ready_) return "not measured yet";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.2f ms + %.3f ms/decode row + %.3f ms/prefill token", coef_[0], coef_[1], coef_[2]);
  std::string out = buf;
  // The decode-only shapes measured most (up to four, by rows).
  std::vector<const Shape*> most;
  for (const Shape& s : shapes_)
    if (s.n >= 2) most.push_back(&s);
  std::sort(most.begin(), most.end(), [](const Shape* a, const Shape* b) { return a->n > b->n; });
  most.resize(std::min<size_t>(most.size(), 4));
  std::sort(most.begin(), most.end(), [](const Shape* a, const Shape* b) { return a->rows < b->rows; });
  for (size_t i = 0; i < most.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%lld rows %.2f ms", i ? ", " : " (decode-only steps: ", (long long)most[i]->rows,
                  most[i]->ms);
    out += buf;
  }
  if (!most.empty()) out += ")";
  return out;
}

}  // namespace m3
