// ProgressBar (progress.hpp): a redrawn bar with ETA on a terminal, log lines otherwise.
#include "amplab/report/progress.hpp"

#include <unistd.h>

#include <cstdio>

#include "amplab/infra/log.hpp"

namespace amplab {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  auto total = static_cast<long>(seconds + 0.5);
  char buffer[32];
  if (total >= 3600)
    std::snprintf(buffer, sizeof buffer, "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60, total % 60);
  else
    std::snprintf(buffer, sizeof buffer, "%ld:%02ld", total / 60, total % 60);
  return buffer;
}

bool ProgressBar::interactive() { return ::isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled, bool bar)
    : label_(std::move(label)), total_(total), enabled_(enabled), tty_(enabled && bar && interactive()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::draw(int64_t done) {
  const int width = 24;
  double fraction = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  int filled = static_cast<int>(fraction * width);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  double elapsed = clock_.seconds();
  double eta = done > 0 ? elapsed * static_cast<double>(total_ - done) / static_cast<double>(done) : -1;
  std::fprintf(stderr, "\r%s %lld/%lld [%s] %s ETA %s\x1b[K", label_.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), bar.c_str(), status_.c_str(), format_duration(eta).c_str());
  std::fflush(stderr);
}

void ProgressBar::update(int64_t done, const std::string& status) {
  if (!tty_ || finished_) return;
  if (!status.empty()) status_ = status;
  double now = clock_.seconds();
  if (now - last_draw_ < 0.1 && done < total_) return;
  last_draw_ = now;
  draw(done);
}

void ProgressBar::note(int64_t done, const std::string& status) {
  if (!enabled_ || finished_) return;
  status_ = status;
  if (tty_) {
    draw(done);
  } else {
    log::info(label_ + " " + std::to_string(done) + "/" + std::to_string(total_) + " " + status);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
  }
}

}  // namespace amplab
