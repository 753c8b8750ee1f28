// Splits a range of 16-column weight blocks (or any index range) across ATen's intra-op threads
// (at::parallel_for, the default) or qforge's thread pool (opt-in: kernels/cpu/thread_pool.h).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "kernels/cpu/contention.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/thread_pool.h"

namespace qforge::kernels::detail {

// Minimum multiply-adds per task, so small problems run on the calling thread.
inline constexpr int64_t kMinMacsPerTask = int64_t{1} << 18;

// f(begin, end) over disjoint ranges of at least `grain` indices covering [0, n), on parallel_backend().
// Under OpenMP, with the opt-in stall guard on (contention.h), each loop that runs on a team notes
// when each thread's share ended, and while a back-off is in force the loop runs on the calling
// thread alone.
template <typename F>
void parallel_over(int64_t n, int64_t grain, const F& f) {
  if (parallel_backend() == ParallelBackend::kPool) {
    ThreadPool::global().parallel_for(n, grain, usable_threads(), f);
    return;
  }
  const bool guard = contention_guard() && n > grain && at::get_num_threads() > 1 && !at::in_parallel_region();
  if (!guard) {
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { f(begin, end); });
    return;
  }
  if (contention_backoff_active()) {
    note_serial_loop();
    f(0, n);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  ShareEnds ends;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    f(begin, end);
    ends.note(at::get_thread_num(),
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count() + 1,
              end - begin);
  });
  note_openmp_loop(ends);
}

// f(begin, end) over disjoint block ranges covering [0, nblocks); each block is written by
// exactly one call, so results do not depend on the thread count.
template <typename F>
void parallel_over_blocks(int64_t nblocks, int64_t macs_per_block, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, macs_per_block));
  parallel_over(nblocks, grain, f);
}

// Float weight rows of whole 16-row column blocks, the blocks split across the threads: one
// pass over the packed bytes, each block's bytes cache-resident while its rows are written.
template <typename F>
void for_each_weight_row(int64_t n, int64_t row_elems, const F& fill_row) {
  parallel_over_blocks(round_up(n, kS8BlockN) / kS8BlockN, kS8BlockN * row_elems, [&](int64_t b, int64_t e) {
    for (int64_t row = b * kS8BlockN; row < std::min(n, e * kS8BlockN); ++row) fill_row(row);
  });
}

}  // namespace qforge::kernels::detail
