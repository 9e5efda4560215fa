// SVG histograms of the latency metrics (see plot.h): four panels in a 2x2 grid, no dependencies.
#include "bench/plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "base/error.h"

namespace m3::bench {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

// One histogram panel with its top-left corner at (x0, y0), values in milliseconds.
std::string panel(double x0, double y0, double w, double h, const std::string& name, const std::vector<double>& ms) {
  std::string o;
  const double L = 50, R = 15, T = 28, B = 36;  // margins
  const double pw = w - L - R, ph = h - T - B;
  o += fmt::format("<g transform=\"translate({:.1f},{:.1f})\">\n", x0, y0);
  o += fmt::format("<rect x=\"0\" y=\"0\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#fff\" stroke=\"#ccc\"/>\n", w, h);
  const LatencyStats st = latency_stats([&] {
    std::vector<double> s;
    for (double v : ms) s.push_back(v / 1000.0);
    return s;
  }());
  o += fmt::format("<text x=\"{:.1f}\" y=\"18\" font-size=\"13\" text-anchor=\"middle\" font-weight=\"bold\">{} (ms), n={}</text>\n",
                   w / 2, esc(name), ms.size());
  if (ms.empty()) {
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">no data</text>\n</g>\n", w / 2, h / 2);
    return o;
  }
  double lo = st.min, hi = st.max;
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const int nb = int(std::clamp<size_t>(size_t(std::sqrt(double(ms.size())) * 2), 5, 40));
  std::vector<int> bins(size_t(nb), 0);
  for (double v : ms) bins[size_t(std::clamp(int((v - lo) / (hi - lo) * nb), 0, nb - 1))]++;
  const int top = *std::max_element(bins.begin(), bins.end());
  const double bw = pw / nb;
  for (int b = 0; b < nb; ++b) {
    const double bh = ph * bins[size_t(b)] / std::max(1, top);
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#4c78a8\"/>\n", L + b * bw + 0.5,
                     T + ph - bh, std::max(0.5, bw - 1), bh);
  }
  // Axes and labels.
  o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#333\"/>\n", L, T + ph, L + pw);
  o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>\n", L, T, T + ph);
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4, x = L + pw * i / 4;
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{:.4g}</text>\n", x, T + ph + 14, v);
  }
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n", L - 4, T + 8, top);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">0</text>\n", L - 4, T + ph);
  const std::tuple<const char*, double, const char*> marks[] = {
      {"mean", st.mean, "#e45756"}, {"p90", st.p90, "#f58518"}, {"p99", st.p99, "#54a24b"}};
  int k = 0;
  for (auto& [label, v, color] : marks) {
    const double x = L + pw * (v - lo) / (hi - lo);
    o += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" stroke-dasharray=\"4,3\"/>\n",
                     x, T, T + ph, color);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"{}\" text-anchor=\"end\">{} {:.4g}</text>\n",
                     L + pw, T + 12 + 12 * k++, color, label, v);
  }
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">milliseconds</text>\n", L + pw / 2,
                   h - 6);
  o += "</g>\n";
  return o;
}

}  // namespace

std::string latency_svg(const std::vector<RequestTrace>& traces, const std::string& title) {
  std::vector<double> ttft, tpot, itl, e2el;
  for (const auto& t : traces) {
    if (!t.success) continue;
    ttft.push_back(t.ttft * 1000);
    e2el.push_back(t.latency * 1000);
    for (double g : t.itl) itl.push_back(g * 1000);
  }
  for (double v : tpot_values(traces)) tpot.push_back(v * 1000);
  const double W = 900, H = 640, pw = 440, ph = 290;
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"#f7f7f7\"/>\n",
      W, H);
  o += fmt::format("<text x=\"{:.1f}\" y=\"30\" font-size=\"16\" text-anchor=\"middle\">m3serve bench serve: {}</text>\n", W / 2,
                   esc(title));
  o += panel(5, 45, pw, ph, "TTFT", ttft);
  o += panel(455, 45, pw, ph, "TPOT", tpot);
  o += panel(5, 345, pw, ph, "ITL", itl);
  o += panel(455, 345, pw, ph, "E2EL", e2el);
  o += "</svg>\n";
  return o;
}

void write_latency_svg(const std::string& path, const std::vector<RequestTrace>& traces, const std::string& title) {
  std::ofstream f(path);
  if (!f) throw Error("cannot write " + path);
  f << latency_svg(traces, title);
}

}  // namespace m3::bench
