// Splits a range of 16-column weight blocks (or any index range) across qforge's thread pool (kernels/cpu/thread_pool.h),
// whose thread count follows at::set_num_threads, the cgroup CPU quota and the affinity mask.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace qforge::kernels::detail {

// Minimum multiply-adds per task, so small problems run on the calling thread.
inline constexpr int64_t kMinMacsPerTask = int64_t{1} << 18;

// f(begin, end) over disjoint ranges of at least `grain` indices covering [0, n), on the pool.
template <typename F>
void parallel_over(int64_t n, int64_t grain, const F& f) {
  ThreadPool::global().parallel_for(n, grain, usable_threads(), f);
}

// f(begin, end) over disjoint block ranges covering [0, nblocks); each block is written by
// exactly one call, so results do not depend on the thread count.
template <typename F>
void parallel_over_blocks(int64_t nblocks, int64_t macs_per_block, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, macs_per_block));
  parallel_over(nblocks, grain, f);
}

}  // namespace qforge::kernels::detail
