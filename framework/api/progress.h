// Progress reporting: a redrawn bar on a terminal, plain log lines (every 10%) otherwise, each
// with the time so far and an estimate of the time left.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace qforge {

// "eta 4m30s": the time left if the remaining `total - done` steps take as long on average as the
// `done` ones did (elapsed_s · (total − done) / done); "" before the first step and once done.
std::string format_eta(double elapsed_s, int64_t done, int64_t total);

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  // Advances by n and redraws (terminal) or logs at each new 10% step (pipes, CI).
  void update(int64_t n = 1, const std::string& status = "");
  void finish(const std::string& status = "");

 private:
  std::string label_;
  int64_t total_, done_ = 0;
  int last_decile_ = -1;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace qforge
