// Wall time since a point of the steady clock, for the tools' timings (qgen, qbench_dist).
#pragma once

#include <chrono>

namespace qforge::apps {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace qforge::apps
