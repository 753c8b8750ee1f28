// The OpenMP backend's stall guard (contention.h).
#include "kernels/cpu/contention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/cpu/thread_pool.h"

namespace qforge::kernels {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// 0: no back-off; otherwise the steady-clock time (ns) it ends at.
std::atomic<int64_t> g_backoff_until{0};
std::atomic<int64_t> g_backoff_ms{0};  // the period last started (0: none)
std::atomic<int64_t> g_stalls{0}, g_serial{0};

std::atomic<int>& guard_flag() {
  static std::atomic<int> flag{[] {
    const char* v = std::getenv("QFORGE_CONTENTION_GUARD");
    return v != nullptr && std::strcmp(v, "1") == 0 ? 1 : 0;
  }()};
  return flag;
}

// The guard acts under the OpenMP backend only.
bool acting() { return contention_guard() && parallel_backend() == ParallelBackend::kOpenMP; }

}  // namespace

bool contention_guard() { return guard_flag().load(std::memory_order_relaxed) != 0; }
void set_contention_guard(bool on) {
  guard_flag().store(on ? 1 : 0, std::memory_order_relaxed);
  if (!on) {
    g_backoff_until.store(0, std::memory_order_relaxed);
    g_backoff_ms.store(0, std::memory_order_relaxed);
  }
}

bool contention_backoff_active() {
  const int64_t until = g_backoff_until.load(std::memory_order_relaxed);
  return until != 0 && acting() && now_ns() < until;
}

int64_t contention_backoff_millis() { return g_backoff_ms.load(std::memory_order_relaxed); }

void note_openmp_loop(int64_t first_ns, int64_t lag_ns) {
  if (!contention_guard()) return;
  const bool stall = lag_ns >= kStallMicros * 1000 && 2 * lag_ns >= first_ns;
  if (!stall) {
    // A loop on the team that did not stall ends any back-off (the probe succeeded).
    if (g_backoff_ms.load(std::memory_order_relaxed) != 0) {
      g_backoff_ms.store(0, std::memory_order_relaxed);
      g_backoff_until.store(0, std::memory_order_relaxed);
    }
    return;
  }
  g_stalls.fetch_add(1, std::memory_order_relaxed);
  const int64_t last = g_backoff_ms.load(std::memory_order_relaxed);
  const int64_t period = last == 0 ? kFirstBackoffMillis : std::min<int64_t>(2 * last, kMaxBackoffMillis);
  g_backoff_ms.store(period, std::memory_order_relaxed);
  g_backoff_until.store(now_ns() + period * 1000000, std::memory_order_relaxed);
}

void note_openmp_loop(const ShareEnds& s) {
  // The fastest rate (ns per index) of the shares; each share is due at that rate times its size,
  // so an uneven split (3 indices against 2) is not a lag.
  double rate = std::numeric_limits<double>::infinity();
  int64_t first = std::numeric_limits<int64_t>::max();
  int shares = 0;
  for (int t = 0; t < ShareEnds::kMaxThreads; ++t) {
    const int64_t n = s.size[static_cast<size_t>(t)];
    if (n <= 0) continue;
    ++shares;
    const int64_t e = s.end_ns[static_cast<size_t>(t)];
    rate = std::min(rate, static_cast<double>(e) / static_cast<double>(n));
    first = std::min(first, e);
  }
  if (shares < 2) return;
  int64_t lag = 0;
  for (int t = 0; t < ShareEnds::kMaxThreads; ++t) {
    const int64_t n = s.size[static_cast<size_t>(t)];
    if (n <= 0) continue;
    lag = std::max(lag, s.end_ns[static_cast<size_t>(t)] - static_cast<int64_t>(rate * static_cast<double>(n)));
  }
  note_openmp_loop(first, lag);
}

void note_serial_loop() { g_serial.fetch_add(1, std::memory_order_relaxed); }

ContentionStats contention_stats() {
  return ContentionStats{g_stalls.load(std::memory_order_relaxed), g_serial.load(std::memory_order_relaxed)};
}

void reset_contention_backoff() {
  g_backoff_until.store(0, std::memory_order_relaxed);
  g_backoff_ms.store(0, std::memory_order_relaxed);
  g_stalls.store(0, std::memory_order_relaxed);
  g_serial.store(0, std::memory_order_relaxed);
}

void probe_openmp_team() {
  if (!acting() || omp_in_parallel() || omp_get_max_threads() <= 1 || contention_backoff_active()) return;
  const int64_t start = now_ns();
  ShareEnds entered;  // one index per thread: when it entered the region
#pragma omp parallel
  entered.note(omp_get_thread_num(), now_ns() - start + 1, 1);
  note_openmp_loop(entered);
}

SerialOpenMpScope::SerialOpenMpScope() {
  if (!contention_backoff_active() || omp_in_parallel()) return;
  const int threads = omp_get_max_threads();
  if (threads <= 1) return;
  saved_ = threads;
  omp_set_num_threads(1);
  note_serial_loop();
}

SerialOpenMpScope::~SerialOpenMpScope() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

}  // namespace qforge::kernels
