// Download progress bar (see progress.h).
#include "hub/progress.h"

#include <unistd.h>

#include <cstdio>

namespace m3::hub {

Progress::Progress(std::string name, int64_t total, int64_t done, bool enabled)
    : name_(std::move(name)), total_(total), done_(done), start_done_(done), enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0), t0_(std::chrono::steady_clock::now()), last_draw_(t0_) {
  if (enabled_ && tty_) draw(false);
}

void Progress::add(int64_t bytes) {
  done_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  // Redrawn at most 10 times a second: a fast local download would otherwise spend its time printing.
  if (enabled_ && tty_ && now - last_draw_ > std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish(const std::string& outcome) {
  if (!enabled_) return;
  draw(true);
  std::fprintf(stderr, " %s\n", outcome.c_str());
}

void Progress::draw(bool final_line) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double mbs = s > 0 ? double(done_ - start_done_) / 1e6 / s : 0.0;
  char bar[34] = "[                              ]";
  if (total_ > 0) {
    const int fill = int(30 * double(done_) / double(total_));
    for (int i = 0; i < fill && i < 30; ++i) bar[1 + i] = '#';
  }
  const char* lead = tty_ ? "\r" : "";
  if (total_ > 0)
    std::fprintf(stderr, "%s[m3serve] %-40s %s %5.1f%% %.1f/%.1f MB %.1f MB/s", lead, name_.c_str(), bar,
                 100.0 * double(done_) / double(total_), double(done_) / 1e6, double(total_) / 1e6, mbs);
  else
    std::fprintf(stderr, "%s[m3serve] %-40s %.1f MB %.1f MB/s", lead, name_.c_str(), double(done_) / 1e6, mbs);
  if (!final_line) std::fflush(stderr);
}

}  // namespace m3::hub
