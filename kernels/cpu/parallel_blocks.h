// Splits a range of 16-column weight blocks across ATen's intra-op threads (at::set_num_threads).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace qforge::kernels::detail {

// Minimum multiply-adds per task, so small problems run on the calling thread.
inline constexpr int64_t kMinMacsPerTask = int64_t{1} << 18;

template <typename F>
void parallel_over_blocks(int64_t nblocks, int64_t macs_per_block, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, macs_per_block));
  at::parallel_for(0, nblocks, grain, [&](int64_t begin, int64_t end) { f(begin, end); });
}

}  // namespace qforge::kernels::detail
