// qforge's intra-op thread pool: the parallel loop under every CPU kernel (parallel_blocks.h).
// It never waits for a worker that has not started. The calling thread takes part and work is
// claimed in small chunks through one atomic counter, so when the workers are descheduled (a busy
// machine, a CPU quota) the caller finishes the loop itself instead of stalling a scheduler slice
// at a barrier, as OpenMP's `at::parallel_for` does. See docs/performance.md, "Threads under load".
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace qforge::kernels {

// CPUs a cgroup v2 `cpu.max` line grants ("max 100000" -> nullopt, "150000 100000" -> 1.5).
std::optional<double> cgroup_v2_cpu_limit(const std::string& cpu_max);
// The same from cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us ("-1" quota -> nullopt).
std::optional<double> cgroup_v1_cpu_limit(const std::string& quota_us, const std::string& period_us);
// Threads a CPU limit supports: floor(limit), at least 1 (a thread per whole CPU, so none is
// throttled at the end of each period); nullopt (no limit) -> `fallback`.
int threads_for_cpu_limit(std::optional<double> limit, int fallback);
// This process's cgroup CPU limit (v2 via /proc/self/cgroup, then v1), read once.
std::optional<double> process_cpu_limit();
// Threads the pool uses: min(at::get_num_threads(), the cgroup quota, CPUs in the affinity mask).
int usable_threads();

// The parallel loop under qforge's CPU kernels (parallel_blocks.h). kOpenMP, the default, is
// at::parallel_for; kPool is ThreadPool below, opt-in because OpenMP's spinning idle workers (after
// LibTorch ops) starve its workers (docs/performance.md, "Threads under load").
enum class ParallelBackend { kOpenMP, kPool };
// "openmp" -> kOpenMP, "pool" -> kPool; anything else throws an Error naming both.
ParallelBackend parse_parallel_backend(const std::string& name);
// set_parallel_backend's choice, else the environment's QFORGE_PARALLEL (read once), else kOpenMP.
ParallelBackend parallel_backend();
void set_parallel_backend(ParallelBackend backend);
// Threads a kernel loop runs on: at::get_num_threads() under kOpenMP, usable_threads() under kPool.
int parallel_threads();

class ThreadPool {
 public:
  // Workers wait this long (spinning with pause) for the next loop before they sleep.
  static constexpr int kSpinMicros = 50;
  // Chunks per participating thread: small enough that a descheduled worker strands little work.
  static constexpr int64_t kChunksPerThread = 8;

  // Test hook run by each worker after it wakes and before it joins a loop (delays joining).
  using JoinHook = std::function<void()>;

  explicit ThreadPool(int workers, JoinHook before_join = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process's pool, with usable_threads() - 1 workers, grown when that rises.
  static ThreadPool& global();

  int workers() const { return static_cast<int>(threads_.size()); }

  // Calls f(begin, end) on disjoint ranges covering [0, n), each of at least `grain` indices
  // (the last may be shorter), on up to `threads` threads including the caller. Runs f(0, n) on the
  // caller when n <= grain, threads <= 1, inside another pool task or an at::parallel_for worker,
  // or while another thread's loop holds the pool. The first exception a range throws is rethrown
  // here after every claimed range has finished.
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, int threads, const F& f) {
    run(n, grain, threads, RangeFn{&f, [](const void* p, int64_t b, int64_t e) { (*static_cast<const F*>(p))(b, e); }});
  }

  // True while this thread runs a range of some pool's loop.
  static bool in_task();

 private:
  struct RangeFn {
    const void* obj;
    void (*call)(const void*, int64_t, int64_t);
  };
  // One loop at a time; `next` packs (loop id << 32 | next chunk) so a worker that wakes late
  // cannot claim a chunk of a later loop.
  struct Loop {
    std::atomic<const void*> obj{nullptr};
    std::atomic<void (*)(const void*, int64_t, int64_t)> call{nullptr};
    std::atomic<int64_t> n{0};
    std::atomic<int64_t> chunk{1};
    std::atomic<int64_t> nchunks{0};
    std::atomic<uint64_t> next{0};
    std::atomic<int64_t> done{0};
    std::atomic<int> helper_slots{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;  // guarded by error_mu
    std::mutex error_mu;
  };

  void run(int64_t n, int64_t grain, int threads, RangeFn f);
  void run_chunks(uint64_t id);
  bool claim(uint64_t id, int64_t& chunk_index);
  void worker_main();
  void wait_done(int64_t nchunks);

  void grow(int workers);

  std::vector<std::thread> threads_;
  JoinHook before_join_;
  bool growable_ = false;            // global(): workers follow usable_threads()
  Loop loop_;
  std::mutex call_mu_;               // held by the caller of the running loop
  std::atomic<uint32_t> loop_id_{0};  // bumped when a loop is published
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::mutex sleep_mu_;
  std::condition_variable wake_;     // workers: a new loop or stop
  std::condition_variable finished_; // caller: the last claimed chunk finished
};

}  // namespace qforge::kernels
