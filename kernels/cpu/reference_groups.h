// The per-group scale fold the grouped int4 references share (reference_gemm.cpp,
// reference_linear.cpp): t = 0; for g = 0..G-1: t = fmaf(dot_g, w_scale[n, g], t).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace qforge::kernels::detail {

// dot(k_begin, k_end, z) is group g's float sum over k in [g * group_size, min(K, (g + 1) *
// group_size)) with zero point z = w_zero[n, g] (0 when w_zero is null); groups in order.
template <typename GroupDot>
float fold_groups(int64_t n, int64_t K, int64_t group_size, int64_t G, const float* w_scale,
                  const int32_t* w_zero, const GroupDot& dot) {
  float t = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    const int32_t z = w_zero != nullptr ? w_zero[n * G + g] : 0;
    t = std::fma(dot(g * group_size, std::min(K, (g + 1) * group_size), z), w_scale[n * G + g], t);
  }
  return t;
}

}  // namespace qforge::kernels::detail
