// A download progress bar on stderr: redrawn in place on a terminal, one line per finished file
// otherwise (a log file gets no carriage-return noise).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace m3::hub {

class Progress {
 public:
  // `total` < 0: unknown size. `done` is what an earlier, interrupted download already holds.
  Progress(std::string name, int64_t total, int64_t done, bool enabled);
  void add(int64_t bytes);
  // The server sent the whole file again (it ignored the Range): count from zero.
  void restart() { done_ = start_done_ = 0; }
  // Ends the bar with the outcome ("done", or why it stopped).
  void finish(const std::string& outcome);

 private:
  void draw(bool final_line);
  std::string name_;
  int64_t total_, done_, start_done_;
  bool enabled_, tty_;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

}  // namespace m3::hub
