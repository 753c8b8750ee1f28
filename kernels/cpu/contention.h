// The OpenMP backend's guard against a stalled barrier (docs/performance.md, "Threads under load").
// at::parallel_for ends in a barrier that waits for every thread of the team, so when other
// processes hold the cores its workers run on, a 2-thread loop costs a scheduler slice (about
// 8 ms here) whatever its size; so does one whose calling thread loses its core to a third
// runnable thread (another process, or OpenBLAS's workers spinning after a LibTorch GEMM). Each
// qforge loop on OpenMP (parallel_blocks.h) times when each thread's share ended after the loop's
// start, the first at `first`, the last `lag` after it:
//   stall  <=>  lag >= kStallMicros  and  lag >= first / 2
// A stall starts a back-off: for `period` the loops run on the calling thread alone, and the
// thread that found the stall sets its OpenMP thread count to 1 (omp_set_num_threads: LibTorch's
// ops and oneDNN on that thread run on one thread too; other threads' oneDNN calls likewise through
// SerialOpenMpScope); its first qforge loop after the period restores the count (unless the program
// changed it meanwhile) and runs on the team again as a probe. A probe that stalls
// doubles the period (kFirstBackoffMillis, at most kMaxBackoffMillis); one that does not ends the
// back-off. So a machine whose cores are busy pays one stalled loop per period (at most ten a
// second, fewer as the period doubles), and an idle one does not back off (its waits are
// microseconds).
// set_contention_guard(false) or QFORGE_CONTENTION_GUARD=0 (read once) turns it off; the pool
// backend (thread_pool.h) never waits for a worker that has not started and does not use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

namespace qforge::kernels {

inline constexpr int64_t kStallMicros = 1000;
inline constexpr int64_t kFirstBackoffMillis = 100;
inline constexpr int64_t kMaxBackoffMillis = 1600;

// True while loops should run on the calling thread alone (a back-off is in force).
bool contention_backoff_active();
// The back-off period last started, in milliseconds (0: none since the last loop without a stall).
int64_t contention_backoff_millis();
// Called at the start of each qforge loop on OpenMP: ends this thread's one-thread setting once
// the back-off is over.
void contention_before_loop();
// When the shares of one team loop ended (ns after its start), noted by each thread as its share
// ends; note_openmp_loop(first, last - first) once the loop is over.
struct ShareEnds {
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()}, last{0};
  std::atomic<int> shares{0};
  void note(int64_t t) {
    int64_t v = first.load(std::memory_order_relaxed);
    while (t < v && !first.compare_exchange_weak(v, t, std::memory_order_relaxed)) {
    }
    v = last.load(std::memory_order_relaxed);
    while (t > v && !last.compare_exchange_weak(v, t, std::memory_order_relaxed)) {
    }
    shares.fetch_add(1, std::memory_order_relaxed);
  }
};

// One OpenMP loop's times in nanoseconds: when its first share ended, and how much later its last
// did. Starts, doubles or ends a back-off as above.
void note_openmp_loop(int64_t first_ns, int64_t lag_ns);
// Counts since start (or the last reset): stalls found, loops run alone during back-offs.
struct ContentionStats {
  int64_t stalls = 0;
  int64_t serial_loops = 0;
};
ContentionStats contention_stats();
void note_serial_loop();
// Ends any back-off (restoring this thread's count) and clears the counts (a bench switching
// between idle and loaded timings).
void reset_contention_backoff();
// On by default; QFORGE_CONTENTION_GUARD=0 in the environment turns it off (read once).
bool contention_guard();
void set_contention_guard(bool on);

// A team of the calling thread's OpenMP size that only notes when each thread entered it: run
// before a call whose own barrier the guard cannot time (oneDNN's), so a worker that cannot start
// (lost its core) starts a back-off before that call, not after. A few microseconds on an idle
// machine.
void probe_openmp_team();

// oneDNN's calls on OpenMP: one thread for the scope while a back-off is in force (the calling
// thread's omp_set_num_threads, restored at the end), so its own barrier cannot stall either.
class SerialOpenMpScope {
 public:
  SerialOpenMpScope();
  ~SerialOpenMpScope();
  SerialOpenMpScope(const SerialOpenMpScope&) = delete;
  SerialOpenMpScope& operator=(const SerialOpenMpScope&) = delete;

 private:
  int saved_ = 0;  // 0: nothing changed
};

}  // namespace qforge::kernels
