// Lane masks shared by the AVX2 kernels (include only from files compiled with AVX2 flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace qforge::kernels::detail {

// Internal linkage: ISA files compiled with different -m flags each keep their own copy (ODR).
namespace {

inline constexpr int kAvx2Lanes = 8;  // int32 / float lanes per ymm

// Lanes [0, valid) all-ones, for maskload/maskstore of a partial 8-column half.
inline __m256i lane_mask(int64_t valid) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int v = static_cast<int>(valid < 0 ? 0 : (valid > kAvx2Lanes ? kAvx2Lanes : valid));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), idx);
}

}  // namespace
}  // namespace qforge::kernels::detail
