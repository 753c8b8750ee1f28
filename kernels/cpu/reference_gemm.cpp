// Reference integer GEMMs (exact int32 accumulation) and the int8 x int4 grouped GEMM.
#include <cmath>

#include "framework/core/error.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/reference_groups.h"

namespace qforge::kernels {

void gemm_s8s8s32_reference(const int8_t* A, const int8_t* W, int32_t* C, int64_t M, int64_t N,
                            int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      int32_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int32_t{A[m * K + k]} * int32_t{W[n * K + k]};
      C[m * N + n] = acc;
    }
  }
}

void gemm_u8s8s32_reference(const uint8_t* A, int32_t a_zero_point, const int8_t* W, int32_t* C,
                            int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      int32_t acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        acc += (int32_t{A[m * K + k]} - a_zero_point) * int32_t{W[n * K + k]};
      }
      C[m * N + n] = acc;
    }
  }
}

int64_t num_groups(int64_t K, int64_t group_size) {
  QF_REQUIRE(group_size > 0, "kernels/cpu: group_size must be positive, got ", group_size);
  return (K + group_size - 1) / group_size;
}

void gemm_s8s4f32_reference(const int8_t* A, const float* a_scale, const int8_t* W,
                            const float* w_scale, const int32_t* w_zero, int64_t group_size,
                            const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t G = num_groups(K, group_size);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float t = detail::fold_groups(n, K, group_size, G, w_scale, w_zero, [&](int64_t k0, int64_t k1, int32_t z) {
        int32_t acc = 0;
        for (int64_t k = k0; k < k1; ++k) acc += int32_t{A[m * K + k]} * (int32_t{W[n * K + k]} - z);
        return static_cast<float>(acc);
      });
      y[m * N + n] = std::fma(t, a_scale[m], bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

}  // namespace qforge::kernels
