// Reference of the codebook (look-up-table) weight-only Linear: plain loops in the lane / plane
// order of the VPERMPS kernels, which it defines bit for bit (formula in kernels/cpu/reference.h).
#include <algorithm>
#include <cmath>

#include "framework/core/error.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

void linear_f32_lut_reference(const float* x, int64_t M, const uint8_t* idx, const float* codebook,
                              int64_t N, int64_t K, int64_t group_size, int bits, const float* bias,
                              float* y) {
  QF_REQUIRE(bits == 2 || bits == 3 || bits == 4,
             "kernels/cpu: linear_f32_lut_reference takes 2-, 3- or 4-bit indices, got ", bits);
  QF_REQUIRE(K > 0 && group_size > 0 && K % group_size == 0, "kernels/cpu: linear_f32_lut_reference: group_size ",
             group_size, " does not divide K = ", K);
  const int64_t L = int64_t{1} << bits, B = lut_block(bits), P = B / kLutEntries, G = K / group_size;
  const int64_t kp = (K + B - 1) / B * B;
  for (int64_t i = 0; i < N * K; ++i) {
    QF_REQUIRE(idx[i] < L, "kernels/cpu: linear_f32_lut_reference: index ", static_cast<int>(idx[i]), " at [",
               i / K, ", ", i % K, "] is not below 2^", bits, " = ", L);
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc[kLutMaxPlanes][kLutEntries] = {};
      for (int64_t b = 0; b < kp / B; ++b) {
        for (int64_t a = 0; a < P; ++a) {
          for (int64_t l = 0; l < kLutEntries; ++l) {
            const int64_t k = b * B + a * kLutEntries + l;
            // Beyond K: x = 0 and index 0 of the last group (as the packed kernels read it).
            const float xv = k < K ? x[m * K + k] : 0.0f;
            const int64_t g = std::min(k / group_size, G - 1);
            const float w = codebook[(n * G + g) * L + (k < K ? idx[n * K + k] : 0)];
            acc[a][l] = std::fmaf(xv, w, acc[a][l]);
          }
        }
      }
      float t[kLutEntries];
      for (int64_t l = 0; l < kLutEntries; ++l) {
        t[l] = acc[0][l];
        for (int64_t a = 1; a < P; ++a) t[l] = t[l] + acc[a][l];
      }
      for (int64_t w = kLutEntries / 2; w >= 1; w /= 2) {
        for (int64_t l = 0; l < w; ++l) t[l] = t[l] + t[l + w];
      }
      y[m * N + n] = bias != nullptr ? t[0] + bias[n] : t[0];
    }
  }
}

}  // namespace qforge::kernels
