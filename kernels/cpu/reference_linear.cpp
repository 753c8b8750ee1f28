// Reference weight-only linears: float activations times dequantized int8 / int4 weights.
#include <cmath>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/reference_groups.h"

namespace qforge::kernels {

void linear_f32_s8_reference(const float* x, const int8_t* W, const float* w_scale,
                             const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float t = 0.0f;
      for (int64_t k = 0; k < K; ++k) t = std::fma(x[m * K + k], static_cast<float>(W[n * K + k]), t);
      const float scaled = t * w_scale[n];
      y[m * N + n] = scaled + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

void linear_f32_s4_reference(const float* x, const int8_t* W, const float* w_scale,
                             const int32_t* w_zero, int64_t group_size, const float* bias, float* y,
                             int64_t M, int64_t N, int64_t K) {
  const int64_t G = num_groups(K, group_size);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float t = detail::fold_groups(n, K, group_size, G, w_scale, w_zero, [&](int64_t k0, int64_t k1, int32_t z) {
        float s = 0.0f;
        for (int64_t k = k0; k < k1; ++k) s = std::fma(x[m * K + k], static_cast<float>(int32_t{W[n * K + k]} - z), s);
        return s;
      });
      y[m * N + n] = t + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

}  // namespace qforge::kernels
