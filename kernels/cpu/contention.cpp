// The OpenMP backend's stall guard (contention.h).
#include "kernels/cpu/contention.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace qforge::kernels {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// 0: no back-off; otherwise the steady-clock time (ns) it ends at.
std::atomic<int64_t> g_backoff_until{0};
std::atomic<int64_t> g_backoff_ms{0};  // the period in force (0: none started)
std::atomic<int64_t> g_stalls{0}, g_serial{0};
// The calling thread's OpenMP thread count before it found a stall (0: it holds none back): while
// the back-off lasts its every OpenMP region (LibTorch's ops and oneDNN's too) runs on one thread.
thread_local int t_saved_threads = 0;

void restore_threads() {
  // Left alone when the program set another count meanwhile.
  if (t_saved_threads > 0 && omp_get_max_threads() == 1) omp_set_num_threads(t_saved_threads);
  t_saved_threads = 0;
}

std::atomic<int>& guard_flag() {
  static std::atomic<int> flag{[] {
    const char* v = std::getenv("QFORGE_CONTENTION_GUARD");
    return v != nullptr && std::strcmp(v, "0") == 0 ? 0 : 1;
  }()};
  return flag;
}

}  // namespace

bool contention_guard() { return guard_flag().load(std::memory_order_relaxed) != 0; }
void set_contention_guard(bool on) {
  guard_flag().store(on ? 1 : 0, std::memory_order_relaxed);
  if (!on) {
    g_backoff_until.store(0, std::memory_order_relaxed);
    g_backoff_ms.store(0, std::memory_order_relaxed);
    restore_threads();
  }
}

bool contention_backoff_active() {
  const int64_t until = g_backoff_until.load(std::memory_order_relaxed);
  return until != 0 && contention_guard() && now_ns() < until;
}

int64_t contention_backoff_millis() { return g_backoff_ms.load(std::memory_order_relaxed); }

void contention_before_loop() {
  if (t_saved_threads > 0 && !contention_backoff_active()) restore_threads();
}

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
  if (t_saved_threads == 0 && omp_get_max_threads() > 1) {
    t_saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
  }
}

void note_serial_loop() { g_serial.fetch_add(1, std::memory_order_relaxed); }

ContentionStats contention_stats() {
  return ContentionStats{g_stalls.load(std::memory_order_relaxed), g_serial.load(std::memory_order_relaxed)};
}

void reset_contention_backoff() {
  restore_threads();
  g_backoff_until.store(0, std::memory_order_relaxed);
  g_backoff_ms.store(0, std::memory_order_relaxed);
  g_stalls.store(0, std::memory_order_relaxed);
  g_serial.store(0, std::memory_order_relaxed);
}

void probe_openmp_team() {
  if (!contention_guard() || omp_in_parallel() || omp_get_max_threads() <= 1) return;
  contention_before_loop();
  if (contention_backoff_active() || omp_get_max_threads() <= 1) return;
  const int64_t start = now_ns();
  ShareEnds entered;  // here: when each thread entered the region
#pragma omp parallel
  entered.note(now_ns() - start);
  if (entered.shares.load() > 1) note_openmp_loop(entered.first.load(), entered.last.load() - entered.first.load());
}

SerialOpenMpScope::SerialOpenMpScope() {
  if (!contention_backoff_active()) return;
  saved_ = omp_get_max_threads();
  if (saved_ > 1) {
    omp_set_num_threads(1);
    note_serial_loop();
  } else {
    saved_ = 0;
  }
}

SerialOpenMpScope::~SerialOpenMpScope() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

}  // namespace qforge::kernels
