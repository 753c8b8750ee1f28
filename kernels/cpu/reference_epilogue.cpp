// Reference dequantizing epilogue: int32 accumulators -> float outputs.
#include <cmath>

#include "kernels/cpu/reference.h"

namespace qforge::kernels {

void dequantize_s32_f32_reference(const int32_t* acc, const float* a_scale, const float* w_scale,
                                  const float* bias, float* y, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float scaled = static_cast<float>(acc[m * N + n]) * w_scale[n];
      y[m * N + n] = std::fma(scaled, a_scale[m], bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

}  // namespace qforge::kernels
