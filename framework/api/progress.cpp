// Progress bar / log lines on stderr.
#include "framework/api/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace qforge {

std::string format_eta(double elapsed_s, int64_t done, int64_t total) {
  if (done <= 0 || done >= total || !(elapsed_s >= 0)) return "";
  const double left = elapsed_s * static_cast<double>(total - done) / static_cast<double>(done);
  char buf[48];
  if (left < 10) std::snprintf(buf, sizeof buf, "eta %.1fs", left);
  else if (left < 60) std::snprintf(buf, sizeof buf, "eta %.0fs", left);
  else if (left < 3600) {
    const long s = std::lround(left);
    std::snprintf(buf, sizeof buf, "eta %ldm%02lds", s / 60, s % 60);
  } else {
    const long m = std::lround(left / 60);
    std::snprintf(buf, sizeof buf, "eta %ldh%02ldm", m / 60, m % 60);
  }
  return buf;
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total > 0 ? total : 1), tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() {
  if (!finished_) finish();
}

void Progress::update(int64_t n, const std::string& status) {
  done_ += n;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double frac = static_cast<double>(std::min(done_, total_)) / total_;
  if (tty_) {
    // Redraw at most 20 times a second.
    if (now - last_draw_ < std::chrono::milliseconds(50) && done_ < total_) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%-24s [%s%s] %5.1f%% %6.1fs %-11s %s\033[K", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), 100 * frac, secs,
                 format_eta(secs, done_, total_).c_str(), status.c_str());
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    const std::string eta = format_eta(secs, done_, total_);
    std::fprintf(stderr, "%s: %3d%% (%lld/%lld) %.1fs%s%s %s\n", label_.c_str(), decile * 10,
                 static_cast<long long>(done_), static_cast<long long>(total_), secs, eta.empty() ? "" : " ",
                 eta.c_str(), status.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& status) {
  if (finished_) return;
  finished_ = true;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) std::fprintf(stderr, "\r%-24s done in %.1fs %s\033[K\n", label_.c_str(), secs, status.c_str());
  else std::fprintf(stderr, "%s: done in %.1fs %s\n", label_.c_str(), secs, status.c_str());
  std::fflush(stderr);
}

}  // namespace qforge
