// Progress of a long loop: a redrawn bar with ETA on an interactive terminal, plain log lines
// otherwise (CI logs and files should not fill up with carriage returns).
#pragma once

#include <cstdint>
#include <string>

#include "amplab/measure/timing.hpp"

namespace amplab {

class ProgressBar {
 public:
  // `enabled` false prints nothing (e.g. ranks other than 0); `bar` false prints only the plain
  // lines of note() (as does a non-terminal).
  ProgressBar(std::string label, int64_t total, bool enabled = true, bool bar = true);
  ~ProgressBar();
  // Redraws on a terminal (at most ~10 times a second); `status` is appended ("loss 0.41").
  void update(int64_t done, const std::string& status = "");
  // Plain line (non-terminal) or a bar redraw with the status kept.
  void note(int64_t done, const std::string& status);
  void finish();
  static bool interactive();  // stderr is a terminal

 private:
  void draw(int64_t done);
  std::string label_;
  int64_t total_;
  bool enabled_, tty_, finished_ = false;
  Stopwatch clock_;
  double last_draw_ = -1;
  std::string status_;
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace amplab
