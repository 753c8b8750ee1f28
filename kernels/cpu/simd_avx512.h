// Lane masks shared by the AVX-512 kernels (include only from files compiled with AVX-512 flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace qforge::kernels::detail {

// Internal linkage: ISA files compiled with different -m flags each keep their own copy (ODR).
namespace {

// Lanes of the 16-column block starting at column n0 that hold real columns (n0 < n).
inline __mmask16 column_mask(int64_t n0, int64_t n) {
  const int64_t valid = n - n0;
  return valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
}

}  // namespace
}  // namespace qforge::kernels::detail
