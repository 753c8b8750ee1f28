// Launch geometry shared by the grid-stride kernels of kernels/cuda.
#pragma once

#include <cstdint>

namespace qforge::cuda {

constexpr int kGridStrideThreads = 256;
constexpr int64_t kGridStrideMaxBlocks = 4096;  // grid-stride loops cover the rest

inline unsigned grid_stride_blocks(int64_t n) {
  const int64_t b = (n + kGridStrideThreads - 1) / kGridStrideThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b < kGridStrideMaxBlocks ? b : kGridStrideMaxBlocks));
}

}  // namespace qforge::cuda
