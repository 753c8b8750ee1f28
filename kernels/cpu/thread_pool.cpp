// qforge's intra-op thread pool (thread_pool.h): chunked loops the caller can finish alone,
// workers that spin briefly then sleep, and a thread count that follows the cgroup CPU quota.
#include "kernels/cpu/thread_pool.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <cstdlib>
#include <sstream>

#include "framework/core/error.h"

namespace qforge::kernels {

namespace {

thread_local bool t_in_task = false;

// Index of `next` meaning "no chunk to claim" while a loop's fields are being written.
constexpr uint64_t kClosed = 0xFFFFFFFFu;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::optional<double> positive_number(const std::string& s) {
  std::istringstream in(s);
  double v = 0;
  if (!(in >> v) || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

std::optional<double> min_limit(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// cgroup v2: the tightest cpu.max from this process's cgroup up to the root of the mount.
std::optional<double> v2_limit(std::string path) {
  std::optional<double> limit;
  for (;;) {
    const std::string dir = "/sys/fs/cgroup" + path;
    limit = min_limit(limit, cgroup_v2_cpu_limit(read_first_line(dir + "/cpu.max")));
    if (path.empty() || path == "/") break;
    path = path.substr(0, path.find_last_of('/'));
  }
  return limit;
}

std::optional<double> v1_limit(const std::string& path) {
  std::optional<double> limit;
  for (const char* mount : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {
    for (const std::string& dir : {std::string(mount) + path, std::string(mount)}) {
      limit = min_limit(limit, cgroup_v1_cpu_limit(read_first_line(dir + "/cpu.cfs_quota_us"),
                                                   read_first_line(dir + "/cpu.cfs_period_us")));
    }
  }
  return limit;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

std::optional<double> cgroup_v2_cpu_limit(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota, period;
  if (!(in >> quota >> period) || quota == "max") return std::nullopt;
  const auto q = positive_number(quota), p = positive_number(period);
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

std::optional<double> cgroup_v1_cpu_limit(const std::string& quota_us, const std::string& period_us) {
  const auto q = positive_number(quota_us), p = positive_number(period_us);  // quota -1: no limit
  if (!q || !p) return std::nullopt;
  return *q / *p;
}

int threads_for_cpu_limit(std::optional<double> limit, int fallback) {
  if (!limit) return fallback;
  return std::max(1, static_cast<int>(std::floor(*limit)));
}

std::optional<double> process_cpu_limit() {
  static const std::optional<double> limit = [] {
    std::ifstream in("/proc/self/cgroup");
    std::optional<double> found;
    for (std::string line; std::getline(in, line);) {
      const auto a = line.find(':'), b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      if (line.compare(0, a, "0") == 0 && controllers.empty()) found = min_limit(found, v2_limit(path));
      std::istringstream names(controllers);
      for (std::string c; std::getline(names, c, ',');)
        if (c == "cpu") found = min_limit(found, v1_limit(path));
    }
    return found;
  }();
  return limit;
}

int usable_threads() {
  static const int cap = std::min(threads_for_cpu_limit(process_cpu_limit(), affinity_cpus()), affinity_cpus());
  return std::max(1, std::min(at::get_num_threads(), cap));
}

ParallelBackend parse_parallel_backend(const std::string& name) {
  if (name == "openmp") return ParallelBackend::kOpenMP;
  if (name == "pool") return ParallelBackend::kPool;
  throw Error("kernels/cpu: unknown parallel backend '" + name + "' (valid: openmp, pool)");
}

namespace {
constexpr int kBackendUnset = -1;
std::atomic<int> g_backend{kBackendUnset};
}  // namespace

ParallelBackend parallel_backend() {
  int b = g_backend.load(std::memory_order_acquire);
  if (b == kBackendUnset) {
    const char* env = std::getenv("QFORGE_PARALLEL");
    ParallelBackend from_env = ParallelBackend::kOpenMP;
    if (env != nullptr) {
      try {
        from_env = parse_parallel_backend(env);
      } catch (const Error& e) {
        throw Error(std::string("QFORGE_PARALLEL: ") + e.what());
      }
    }
    int expected = kBackendUnset;
    g_backend.compare_exchange_strong(expected, static_cast<int>(from_env));
    b = g_backend.load(std::memory_order_acquire);
  }
  return static_cast<ParallelBackend>(b);
}

void set_parallel_backend(ParallelBackend backend) { g_backend.store(static_cast<int>(backend)); }

int parallel_threads() {
  return parallel_backend() == ParallelBackend::kPool ? usable_threads() : at::get_num_threads();
}

ThreadPool::ThreadPool(int workers, JoinHook before_join) : before_join_(std::move(before_join)) {
  grow(workers);
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_.notify_all();
  }
  for (std::thread& t : threads_) t.join();
}

ThreadPool& ThreadPool::global() {
  // Never destroyed: kernels may run from other static destructors at exit.
  static ThreadPool* pool = [] {
    auto* p = new ThreadPool(0);
    p->growable_ = true;
    return p;
  }();
  return *pool;
}

bool ThreadPool::in_task() { return t_in_task; }

void ThreadPool::grow(int workers) {
  while (static_cast<int>(threads_.size()) < workers) threads_.emplace_back([this] { worker_main(); });
}

void ThreadPool::run(int64_t n, int64_t grain, int threads, RangeFn f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  std::unique_lock<std::mutex> call;
  if (threads > 1 && max_chunks > 1 && !t_in_task && !at::in_parallel_region())
    call = std::unique_lock<std::mutex>(call_mu_, std::try_to_lock);
  if (call.owns_lock() && growable_) grow(threads - 1);
  const int helpers = call.owns_lock() ? std::min(threads - 1, workers()) : 0;
  if (helpers <= 0) {
    f.call(f.obj, 0, n);
    return;
  }
  const int64_t target_chunks = std::min(max_chunks, (helpers + 1) * kChunksPerThread);
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  const int64_t nchunks = (n + chunk - 1) / chunk;
  // Publish: close the counter, write the loop, reopen it under the new id, then wake workers.
  const uint32_t id = loop_id_.load(std::memory_order_relaxed) + 1;
  loop_.next.store(uint64_t{id} << 32 | kClosed);
  loop_.obj.store(f.obj, std::memory_order_relaxed);
  loop_.call.store(f.call, std::memory_order_relaxed);
  loop_.n.store(n, std::memory_order_relaxed);
  loop_.chunk.store(chunk, std::memory_order_relaxed);
  loop_.nchunks.store(nchunks, std::memory_order_relaxed);
  loop_.done.store(0, std::memory_order_relaxed);
  loop_.helper_slots.store(helpers, std::memory_order_relaxed);
  loop_.next.store(uint64_t{id} << 32, std::memory_order_release);
  loop_id_.store(id);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_.notify_all();
  }
  run_chunks(id);
  wait_done(nchunks);
  std::exception_ptr error;
  if (loop_.failed.load()) {
    std::lock_guard<std::mutex> lock(loop_.error_mu);
    std::swap(error, loop_.error);
    loop_.failed.store(false);
  }
  call.unlock();
  if (error) std::rethrow_exception(error);
}

bool ThreadPool::claim(uint64_t id, int64_t& chunk_index) {
  uint64_t v = loop_.next.load(std::memory_order_acquire);
  for (;;) {
    if ((v >> 32) != (id & 0xFFFFFFFFu)) return false;
    const int64_t index = static_cast<int64_t>(v & 0xFFFFFFFFu);
    if (index >= loop_.nchunks.load(std::memory_order_relaxed)) return false;
    if (loop_.next.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      chunk_index = index;
      return true;
    }
  }
}

void ThreadPool::run_chunks(uint64_t id) {
  int64_t index = 0;
  while (claim(id, index)) {
    // A successful claim keeps the loop (and its caller) alive until `done` counts this chunk.
    const int64_t chunk = loop_.chunk.load(std::memory_order_relaxed);
    const int64_t begin = index * chunk, end = std::min(loop_.n.load(std::memory_order_relaxed), begin + chunk);
    if (!loop_.failed.load(std::memory_order_relaxed)) {
      t_in_task = true;
      try {
        loop_.call.load(std::memory_order_relaxed)(loop_.obj.load(std::memory_order_relaxed), begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(loop_.error_mu);
        if (!loop_.error) loop_.error = std::current_exception();
        loop_.failed.store(true);
      }
      t_in_task = false;
    }
    const int64_t nchunks = loop_.nchunks.load(std::memory_order_relaxed);
    if (loop_.done.fetch_add(1) + 1 == nchunks && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      finished_.notify_all();
    }
  }
}

void ThreadPool::wait_done(int64_t nchunks) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int spin = 0; loop_.done.load(std::memory_order_acquire) < nchunks; ++spin) {
    cpu_relax();
    if (spin % 64 == 63 && std::chrono::steady_clock::now() > until) {
      // A worker holding a chunk was descheduled: sleep so it can have this CPU.
      caller_sleeping_.store(true);
      std::unique_lock<std::mutex> lock(sleep_mu_);
      finished_.wait(lock, [&] { return loop_.done.load() >= nchunks; });
      caller_sleeping_.store(false);
      break;
    }
  }
}

void ThreadPool::worker_main() {
  uint32_t seen = loop_id_.load();
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int spin = 0; loop_id_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed); ++spin) {
      cpu_relax();
      if (spin % 64 == 63 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lock(sleep_mu_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return loop_id_.load() != seen || stop_.load(); });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    if (stop_.load()) return;
    seen = loop_id_.load(std::memory_order_acquire);
    if (before_join_) before_join_();
    if (loop_.helper_slots.fetch_sub(1) > 0) run_chunks(seen);
  }
}

}  // namespace qforge::kernels
