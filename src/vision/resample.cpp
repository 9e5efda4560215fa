// Pillow-equal bicubic resize (rules in resample.h).
#include "vision/resample.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace m3::vision {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double cubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Fixed-point taps of one axis: for output i, first source index lo[i], count n[i], weights
// k[i * ksize + j].
struct Taps {
  int ksize = 0;
  std::vector<int> lo, n;
  std::vector<int32_t> k;
};

Taps make_taps(int in_size, int out_size) {
  Taps t;
  const double scale = double(float(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 2.0 * filterscale;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.lo.resize(size_t(out_size));
  t.n.resize(size_t(out_size));
  t.k.assign(size_t(out_size) * size_t(t.ksize), 0);
  std::vector<double> w(size_t(t.ksize));
  for (int i = 0; i < out_size; ++i) {
    const double center = 0.0 + (i + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[size_t(x)] = cubic((x + xmin - center + 0.5) * ss);
      ww += w[size_t(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
      t.k[size_t(i) * t.ksize + x] =
          v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    t.lo[size_t(i)] = xmin;
    t.n[size_t(i)] = xmax;
  }
  return t;
}

inline uint8_t clip8(int32_t acc) {
  int v = acc >> kPrecisionBits;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& in, int out_w, int out_h) {
  if (in.width <= 0 || in.height <= 0 || out_w <= 0 || out_h <= 0)
    throw Error("resize: sizes must be positive (" + std::to_string(in.width) + "x" + std::to_string(in.height) +
                " -> " + std::to_string(out_w) + "x" + std::to_string(out_h) + ")");
  const bool need_h = out_w != in.width, need_v = out_h != in.height;
  const Taps tv = make_taps(in.height, out_h);
  const int y_first = tv.lo[0];
  const int y_last = tv.lo[size_t(out_h) - 1] + tv.n[size_t(out_h) - 1];

  // Horizontal pass over source rows [y_first, y_last) only (Pillow's ybox).
  RgbImage tmp;
  const RgbImage* src = &in;
  int row_off = 0;  // source row of src's row 0
  if (need_h) {
    const Taps th = make_taps(in.width, out_w);
    tmp.width = out_w;
    tmp.height = y_last - y_first;
    tmp.rgb.resize(size_t(tmp.width) * size_t(tmp.height) * 3);
    for (int y = 0; y < tmp.height; ++y) {
      const uint8_t* s = in.row(y + y_first);
      uint8_t* o = tmp.rgb.data() + size_t(y) * size_t(out_w) * 3;
      for (int x = 0; x < out_w; ++x) {
        const int32_t* k = th.k.data() + size_t(x) * th.ksize;
        const uint8_t* p = s + size_t(th.lo[size_t(x)]) * 3;
        int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
        for (int j = 0; j < th.n[size_t(x)]; ++j) {
          a0 += int32_t(p[3 * j]) * k[j];
          a1 += int32_t(p[3 * j + 1]) * k[j];
          a2 += int32_t(p[3 * j + 2]) * k[j];
        }
        o[3 * x] = clip8(a0);
        o[3 * x + 1] = clip8(a1);
        o[3 * x + 2] = clip8(a2);
      }
    }
    src = &tmp;
    row_off = y_first;
  }
  if (!need_v) {
    if (need_h) return tmp;
    return in;
  }
  RgbImage out;
  out.width = src->width;
  out.height = out_h;
  out.rgb.resize(size_t(out.width) * size_t(out_h) * 3);
  const size_t rs = size_t(src->width) * 3;
  for (int y = 0; y < out_h; ++y) {
    const int32_t* k = tv.k.data() + size_t(y) * tv.ksize;
    const uint8_t* base = src->rgb.data() + size_t(tv.lo[size_t(y)] - row_off) * rs;
    uint8_t* o = out.rgb.data() + size_t(y) * rs;
    for (size_t x = 0; x < rs; ++x) {
      int32_t a = 1 << (kPrecisionBits - 1);
      for (int j = 0; j < tv.n[size_t(y)]; ++j) a += int32_t(base[size_t(j) * rs + x]) * k[j];
      o[x] = clip8(a);
    }
  }
  return out;
}

}  // namespace m3::vision
