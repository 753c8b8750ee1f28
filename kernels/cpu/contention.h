// The OpenMP backend's guard against a stalled barrier (docs/performance.md, "The stall guard on
// the default threads"). at::parallel_for ends in a barrier that waits for every thread of the
// team, so when one of them cannot run (its core taken by another process, or by OpenBLAS's workers
// spinning after a LibTorch GEMM) a 2-thread loop costs a scheduler slice (about 8 ms here)
// whatever its size. Each qforge loop on an OpenMP team (parallel_blocks.h) notes when each
// thread's share ended and how many indices it held; scaled to the fastest share's rate, the
// latest share ended `lag` after its due time, and the first share ended at `first`:
//   stall  <=>  lag >= kStallMicros  and  2 · lag >= first
// A stall starts a back-off: for `period` qforge's loops run on the calling thread alone and
// oneDNN's calls on one thread (SerialOpenMpScope), then the next loop runs on the team again as a
// probe. A probe that stalls doubles the period (kFirstBackoffMillis, at most kMaxBackoffMillis);
// one that does not ends the back-off. oneDNN's own barrier cannot be timed from outside, so each
// oneDNN call is preceded by probe_openmp_team(). Nothing else changes: the thread count
// (at::get_num_threads) is the program's throughout, LibTorch's own ops keep their OpenMP teams,
// and results are bit-identical (every output block is written by one thread under any split).
// Opt-in: set_contention_guard(true) or QFORGE_CONTENTION_GUARD=1 (read once). Measured, it keeps
// a Llama decode (qforge's loops end to end) within 1.15x of one thread under load where plain
// OpenMP takes 1.35-2.0x, but makes models that interleave many LibTorch ops worse (their OpenMP
// worker, idle through the serial stretches, is woken late by each op); docs/performance.md. The
// pool backend (thread_pool.h) never waits for a worker that has not started and does not use it.
#pragma once

#include <array>
#include <cstdint>

namespace qforge::kernels {

inline constexpr int64_t kStallMicros = 1000;
inline constexpr int64_t kFirstBackoffMillis = 100;
inline constexpr int64_t kMaxBackoffMillis = 1600;

// Off by default; QFORGE_CONTENTION_GUARD=1 in the environment turns it on (read once). The guard
// acts only under the OpenMP backend.
bool contention_guard();
void set_contention_guard(bool on);

// True while loops should run on the calling thread alone (a back-off is in force).
bool contention_backoff_active();
// The back-off period last started, in milliseconds (0: none since the last loop without a stall).
int64_t contention_backoff_millis();

// When each thread's share of one team loop ended (ns after the loop's start) and its size; each
// thread writes its own slot (its OpenMP thread number), read after the loop's closing barrier.
struct ShareEnds {
  static constexpr int kMaxThreads = 64;
  std::array<int64_t, kMaxThreads> end_ns{}, size{};
  void note(int thread, int64_t t_ns, int64_t indices) {
    if (thread < 0 || thread >= kMaxThreads) return;
    end_ns[static_cast<size_t>(thread)] = t_ns;
    size[static_cast<size_t>(thread)] = indices;
  }
};
// The stall test above on one loop's shares (those of at least two threads); starts, doubles or
// ends a back-off.
void note_openmp_loop(const ShareEnds& shares);
// The same on the two figures directly: when the first share ended, and the latest share's lag.
void note_openmp_loop(int64_t first_ns, int64_t lag_ns);

// Counts since start (or the last reset): stalls found, loops (and oneDNN calls) run alone during
// back-offs.
struct ContentionStats {
  int64_t stalls = 0;
  int64_t serial_loops = 0;
};
ContentionStats contention_stats();
void note_serial_loop();
// Ends any back-off and clears the counts (a bench switching between idle and loaded timings).
void reset_contention_backoff();

// An OpenMP team of the calling thread's size that only notes when each thread entered it, as a
// loop whose shares are those entries: run before a call whose own barrier the guard cannot time
// (oneDNN's). A few microseconds on an idle machine.
void probe_openmp_team();

// oneDNN's calls on OpenMP: one thread for the scope while a back-off is in force (the calling
// thread's omp_set_num_threads, restored at the end of the scope).
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
