// qforge's thread pool: coverage of every index, exceptions, nesting, the cgroup quota parsing,
// and the property the pool exists for: a loop finishes even when no worker can run.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/contention.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/thread_pool.h"

namespace qforge::kernels {
namespace {

// Counts how often each index is visited and checks each range respects the grain.
void expect_each_index_once(ThreadPool& pool, int64_t n, int64_t grain, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int64_t> short_ranges{0};
  pool.parallel_for(n, grain, threads, [&](int64_t b, int64_t e) {
    ASSERT_LE(0, b);
    ASSERT_LT(b, e);
    ASSERT_LE(e, n);
    if (e - b < grain && e != n) short_ranges.fetch_add(1);
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " n " << n << " grain " << grain << " threads " << threads;
  EXPECT_EQ(short_ranges.load(), 0) << "only the last range may be shorter than the grain";
}

// First in the file, before any test switches the backend.
TEST(ParallelBackend, DefaultIsOpenMPUnlessTheEnvironmentSaysOtherwise) {
  const char* env = std::getenv("QFORGE_PARALLEL");
  if (env == nullptr) {
    EXPECT_EQ(parallel_backend(), ParallelBackend::kOpenMP);
  } else if (std::string(env) == "openmp" || std::string(env) == "pool") {
    EXPECT_EQ(parallel_backend(), parse_parallel_backend(env));
  } else {
    try {
      parallel_backend();
      ADD_FAILURE() << "QFORGE_PARALLEL=" << env << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("QFORGE_PARALLEL"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("openmp, pool"), std::string::npos) << e.what();
    }
  }
}

TEST(ParallelBackend, NamesParseAndUnknownNamesListTheValidOnes) {
  EXPECT_EQ(parse_parallel_backend("openmp"), ParallelBackend::kOpenMP);
  EXPECT_EQ(parse_parallel_backend("pool"), ParallelBackend::kPool);
  for (const char* bad : {"", "omp", "Pool", "tbb"}) {
    try {
      parse_parallel_backend(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("openmp, pool"), std::string::npos) << e.what();
    }
  }
}

// parallel_over covers every index once under both backends, and the switch really moves the loop:
// ranges run in an OpenMP region under kOpenMP and as pool tasks under kPool.
TEST(ParallelBackend, SwitchMovesEveryLoopAndCoversEveryIndexOnce) {
  const int threads_before = at::get_num_threads();
  const ParallelBackend before = parallel_backend();
  at::set_num_threads(2);
  // Routing only: the stall guard would send loops to the calling thread on a busy test machine.
  const bool guard_before = contention_guard();
  set_contention_guard(false);
  for (ParallelBackend backend : {ParallelBackend::kOpenMP, ParallelBackend::kPool}) {
    set_parallel_backend(backend);
    ASSERT_EQ(parallel_backend(), backend);
    EXPECT_EQ(parallel_threads(), backend == ParallelBackend::kPool ? usable_threads() : at::get_num_threads());
    for (int64_t n : {0, 1, 7, 64, 1000, 4097})
      for (int64_t grain : {1, 3, 100}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> in_omp{0}, in_pool{0};
        detail::parallel_over(n, grain, [&](int64_t b, int64_t e) {
          in_omp += at::in_parallel_region();
          in_pool += ThreadPool::in_task();
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " grain " << grain;
        const bool pool = backend == ParallelBackend::kPool;
        EXPECT_EQ(pool ? in_omp.load() : in_pool.load(), 0);
        const bool splits = n >= 1000 && grain == 1 && (!pool || usable_threads() > 1);  // big enough for 2 threads
        if (splits) {
          EXPECT_GT(pool ? in_pool.load() : in_omp.load(), 0);
        }
      }
  }
  set_parallel_backend(before);
  set_contention_guard(guard_before);
  at::set_num_threads(threads_before);
}

TEST(ThreadPool, EveryIndexRunsExactlyOnceForManySizesGrainsAndThreadCounts) {
  for (int workers : {0, 1, 3}) {
    ThreadPool pool(workers);
    for (int threads : {1, 2, 4, 8})
      for (int64_t n : {0, 1, 2, 3, 7, 15, 16, 17, 63, 64, 65, 1000, 4097})
        for (int64_t grain : {1, 2, 5, 16, 100, 5000}) expect_each_index_once(pool, n, grain, threads);
  }
}

TEST(ThreadPool, BackToBackLoopsNeverMixChunks) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 2000; ++rep) expect_each_index_once(pool, 1 + rep % 97, 1 + rep % 3, 4);
}

TEST(ThreadPool, SmallLoopsStayOnTheCallingThread) {
  ThreadPool pool(3);
  const auto caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  pool.parallel_for(100, 100, 4, [&](int64_t, int64_t) { elsewhere += std::this_thread::get_id() != caller; });
  pool.parallel_for(100, 1, 1, [&](int64_t, int64_t) { elsewhere += std::this_thread::get_id() != caller; });
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(ThreadPool, ExceptionInATaskReachesTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(3);
  for (int64_t bad : {0, 37, 999}) {
    EXPECT_THROW(pool.parallel_for(1000, 1, 4,
                                   [&](int64_t b, int64_t e) {
                                     if (b <= bad && bad < e) throw std::runtime_error("task failed");
                                   }),
                 std::runtime_error);
  }
  expect_each_index_once(pool, 1000, 1, 4);
}

TEST(ThreadPool, NestedLoopsRunInlineAndCoverEverything) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64 * 64);
  std::atomic<int> nested_off_thread{0};
  pool.parallel_for(64, 1, 4, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(ThreadPool::in_task());
    for (int64_t i = b; i < e; ++i) {
      const auto outer = std::this_thread::get_id();
      pool.parallel_for(64, 1, 4, [&](int64_t jb, int64_t je) {
        nested_off_thread += std::this_thread::get_id() != outer;
        for (int64_t j = jb; j < je; ++j) hits[static_cast<size_t>(i * 64 + j)].fetch_add(1);
      });
    }
  });
  EXPECT_FALSE(ThreadPool::in_task());
  EXPECT_EQ(nested_off_thread.load(), 0);
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, InsideAnATenParallelRegionRunsInline) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(2);  // LibTorch's default may be 1 (physical cores), which runs inline anyway
  ThreadPool pool(3);
  std::atomic<int> off_thread{0}, total{0};
  at::parallel_for(0, 8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto outer = std::this_thread::get_id();
      pool.parallel_for(100, 1, 4, [&](int64_t jb, int64_t je) {
        off_thread += std::this_thread::get_id() != outer;
        total += static_cast<int>(je - jb);
      });
    }
  });
  at::set_num_threads(threads_before);
  EXPECT_EQ(off_thread.load(), 0);
  EXPECT_EQ(total.load(), 800);
}

// A worker that cannot start (held at a gate until the loop is over) must not hold up the loop.
TEST(ThreadPool, LoopCompletesWhileEveryWorkerIsHeldBeforeJoining) {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> held{0};
  ThreadPool pool(2, [&] {
    std::unique_lock<std::mutex> lock(mu);
    held.fetch_add(1);
    cv.wait(lock, [&] { return open; });
  });
  const auto caller = std::this_thread::get_id();
  std::atomic<int> off_thread{0};
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::atomic<int>> hits(5000);
    pool.parallel_for(5000, 1, 3, [&](int64_t b, int64_t e) {
      off_thread += std::this_thread::get_id() != caller;
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  EXPECT_EQ(off_thread.load(), 0) << "held workers ran a chunk";
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
  }
  cv.notify_all();
  // Released late, the workers find only finished loops; the pool still works afterwards.
  expect_each_index_once(pool, 5000, 1, 3);
}

// A second caller finds the workers busy in another thread's loop and runs its own loop alone.
TEST(ThreadPool, LoopCompletesWhileTheWorkersAreBusyInAnotherCall) {
  ThreadPool pool(1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> blocked{0};
  std::thread first([&] {
    pool.parallel_for(2, 1, 2, [&](int64_t, int64_t) {
      blocked.fetch_add(1);
      released.wait();
    });
  });
  while (blocked.load() == 0) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::atomic<int>> hits(3000);
  pool.parallel_for(3000, 1, 2, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  EXPECT_LT(seconds, 5.0);
  release.set_value();
  first.join();
  EXPECT_GE(blocked.load(), 1);
}

TEST(ThreadPool, WorkersTakePartWhenTheyCan) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  std::atomic<int> off_thread{0};
  // Each chunk sleeps, so the worker has time to wake and claim one.
  for (int rep = 0; rep < 20 && off_thread.load() == 0; ++rep) {
    pool.parallel_for(16, 1, 2, [&](int64_t, int64_t) {
      off_thread += std::this_thread::get_id() != caller;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  EXPECT_GT(off_thread.load(), 0);
}

TEST(ThreadPool, ParallelOverBlocksCoversEveryBlockOnce) {
  for (int t : {1, 2, 4}) {
    at::set_num_threads(t);
    for (int64_t nblocks : {1, 5, 16, 257, 4096}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(nblocks));
      detail::parallel_over_blocks(nblocks, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

// The OpenMP backend's stall guard (contention.h): a loop whose worker starts late (here: sleeps
// 5 ms before its share, as a descheduled worker would) makes the next loops run on the calling
// thread alone for the back-off period; a probe that stalls again doubles it, one that does not
// ends it; an uneven split is not a stall; the program's thread count is never touched.
TEST(ContentionGuard, AStalledBarrierSendsTheNextLoopsToTheCallingThread) {
  if (parallel_backend() != ParallelBackend::kOpenMP) GTEST_SKIP() << "the guard is the OpenMP backend's";
  const int saved = at::get_num_threads();
  const bool guard_before = contention_guard();
  set_contention_guard(true);
  at::set_num_threads(2);
  reset_contention_backoff();
  // An ordinary loop covers everything (on a busy test machine it may itself back off: not asserted).
  std::atomic<int64_t> sum{0};
  detail::parallel_over(1000, 10, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 1000);
  // A worker that joins 5 ms late. On a busy machine the calling thread may itself lose its core
  // for as long, and then the two shares end alike (no stall, rightly): up to 5 tries, each from a
  // reset guard; a guard that never sees the late worker fails all of them.
  for (int attempt = 0; attempt < 5; ++attempt) {
    reset_contention_backoff();
    detail::parallel_over(64, 1, [&](int64_t, int64_t) {
      if (at::get_thread_num() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    if (contention_stats().stalls > 0) break;
  }
  EXPECT_EQ(contention_stats().stalls, 1);
  EXPECT_EQ(contention_backoff_millis(), kFirstBackoffMillis);
  EXPECT_EQ(at::get_num_threads(), 2);  // the program's count is left alone
  // While it lasts (100 ms: checked, so a slow machine that passed it skips this part), a loop is
  // one call on the calling thread covering everything.
  if (contention_backoff_active()) {
    std::vector<std::pair<int64_t, int64_t>> calls;
    const auto caller = std::this_thread::get_id();
    bool elsewhere = false;
    detail::parallel_over(1000, 10, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != caller) elsewhere = true;
      calls.emplace_back(b, e);
    });
    EXPECT_FALSE(elsewhere);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{1000}));
    EXPECT_EQ(contention_stats().serial_loops, 1);
  }
  // A probe that stalls again doubles the period; one that does not ends the back-off.
  note_openmp_loop(100000, 5000000);
  EXPECT_EQ(contention_backoff_millis(), 2 * kFirstBackoffMillis);
  EXPECT_TRUE(contention_backoff_active());
  note_openmp_loop(100000, 20000);
  EXPECT_FALSE(contention_backoff_active());
  EXPECT_EQ(contention_backoff_millis(), 0);
  // Shares scaled to the fastest rate: 3 indices ending at 3 ms beside 2 ending at 2 ms are on time;
  // one of two equal shares ending 5 ms after the other is not.
  ShareEnds uneven;
  uneven.note(0, 3000000, 3);
  uneven.note(1, 2000000, 2);
  note_openmp_loop(uneven);
  EXPECT_FALSE(contention_backoff_active());
  ShareEnds late;
  late.note(0, 100000, 4);
  late.note(1, 5100000, 4);
  note_openmp_loop(late);
  EXPECT_TRUE(contention_backoff_active());
  reset_contention_backoff();
  // A long loop whose worker lags by a small part of it is not a stall.
  note_openmp_loop(50000000, 2000000);
  EXPECT_FALSE(contention_backoff_active());
  // Off: nothing starts.
  set_contention_guard(false);
  note_openmp_loop(100000, 5000000);
  EXPECT_FALSE(contention_backoff_active());
  set_contention_guard(guard_before);
  reset_contention_backoff();
  at::set_num_threads(saved);
}

TEST(CpuQuota, CgroupV2CpuMaxLines) {
  EXPECT_FALSE(cgroup_v2_cpu_limit("max 100000").has_value());
  EXPECT_FALSE(cgroup_v2_cpu_limit("max 100000\n").has_value());
  EXPECT_DOUBLE_EQ(cgroup_v2_cpu_limit("150000 100000").value(), 1.5);
  EXPECT_DOUBLE_EQ(cgroup_v2_cpu_limit("200000 100000\n").value(), 2.0);
  EXPECT_DOUBLE_EQ(cgroup_v2_cpu_limit("50000 100000").value(), 0.5);
  for (const char* bad : {"", "max", "abc 100000", "100000 0", "-5 100000", "100000 x"})
    EXPECT_FALSE(cgroup_v2_cpu_limit(bad).has_value()) << bad;
}

TEST(CpuQuota, CgroupV1QuotaAndPeriod) {
  EXPECT_FALSE(cgroup_v1_cpu_limit("-1", "100000").has_value());
  EXPECT_DOUBLE_EQ(cgroup_v1_cpu_limit("300000", "100000").value(), 3.0);
  EXPECT_DOUBLE_EQ(cgroup_v1_cpu_limit("150000\n", "100000\n").value(), 1.5);
  EXPECT_FALSE(cgroup_v1_cpu_limit("", "").has_value());
  EXPECT_FALSE(cgroup_v1_cpu_limit("100000", "0").has_value());
}

TEST(CpuQuota, ThreadsFollowTheLimit) {
  EXPECT_EQ(threads_for_cpu_limit(std::nullopt, 8), 8);
  EXPECT_EQ(threads_for_cpu_limit(1.5, 8), 1);
  EXPECT_EQ(threads_for_cpu_limit(2.0, 8), 2);
  EXPECT_EQ(threads_for_cpu_limit(0.25, 8), 1);
  EXPECT_EQ(threads_for_cpu_limit(cgroup_v2_cpu_limit("400000 100000"), 2), 4);
}

TEST(CpuQuota, UsableThreadsFollowsAtenAndNeverExceedsIt) {
  at::set_num_threads(1);
  EXPECT_EQ(usable_threads(), 1);
  at::set_num_threads(16);
  EXPECT_GE(usable_threads(), 1);
  EXPECT_LE(usable_threads(), static_cast<int>(std::thread::hardware_concurrency()));
  at::set_num_threads(1);
}

}  // namespace
}  // namespace qforge::kernels
