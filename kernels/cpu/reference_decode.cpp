// Reference block-32 activation quantization and the decode linears over it (reference.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "framework/core/error.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {

constexpr uint32_t kExponentBits = 0x7F800000u;  // IEEE binary32 exponent field

// Throws naming the first non-finite element of row m (called only once a row is known to hold one).
void refuse_non_finite(const float* x, int64_t K, int64_t m) {
  for (int64_t k = 0; k < K; ++k) {
    QF_REQUIRE(std::isfinite(x[k]), "kernels/cpu: activation row ", m, " column ", k, " is not finite (", x[k],
               "); block-32 activation quantization needs finite inputs");
  }
}

// Block b (n values) of one row: its scale, codes and code sum.
void quantize_block(const float* x, int64_t n, int8_t* q, float* d, int32_t* s) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  // amax = 0 or below ~3.7e-37: 1 / d overflows (0 * inf would be NaN), so the block is all zeros.
  const float step = amax / static_cast<float>(kActQMax), inv_step = 1.0f / step;
  const bool usable = std::isfinite(inv_step);
  *d = usable ? step : 0.0f;
  const float inv = usable ? inv_step : 0.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * inv);
    q[i] = static_cast<int8_t>(std::min(std::max(r, -static_cast<float>(kActQMax)), static_cast<float>(kActQMax)));
    sum += q[i];
  }
  std::fill(q + n, q + kQ8Block, int8_t{0});
  *s = sum;
}

// sum_{k in [k0, k1)} q[k] * (W[k] - z), exact.
int32_t block_dot(const int8_t* q, const int8_t* W, int32_t z, int64_t k0, int64_t k1) {
  int32_t acc = 0;
  for (int64_t k = k0; k < k1; ++k) acc += static_cast<int32_t>(q[k]) * (static_cast<int32_t>(W[k]) - z);
  return acc;
}

}  // namespace

void quantize_rows_q8b32_reference(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* d,
                                   int32_t* s) {
  const int64_t kb = q8_block_count(K);
  QF_REQUIRE(M >= 0 && K > 0 && ldq >= kb * kQ8Block, "kernels/cpu: quantize_rows_q8b32 got M=", M, " K=", K,
             " ldq=", ldq);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    // NaN and +-Inf have an all-ones exponent: an integer pass that vectorizes, the search only on failure.
    uint32_t bad = 0;
    for (int64_t k = 0; k < K; ++k) {
      uint32_t bits;
      std::memcpy(&bits, row + k, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & kExponentBits) == kExponentBits);
    }
    if (bad != 0) refuse_non_finite(row, K, m);
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t k0 = b * kQ8Block;
      quantize_block(row + k0, std::min(kQ8Block, K - k0), q + m * ldq + k0, d + m * kb + b, s + m * kb + b);
    }
    std::fill(q + m * ldq + kb * kQ8Block, q + (m + 1) * ldq, int8_t{0});
  }
}

void linear_q8b32_s8_reference(const int8_t* q, const float* d, int64_t ldq, const int8_t* W, const float* w_scale,
                               const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t kb = q8_block_count(K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float u = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const int32_t i = block_dot(q + m * ldq, W + n * K, 0, b * kQ8Block, std::min(K, (b + 1) * kQ8Block));
        u = std::fmaf(static_cast<float>(i), d[m * kb + b], u);
      }
      const float p = u * w_scale[n];
      y[m * N + n] = p + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

void linear_q8b32_s4_reference(const int8_t* q, const float* d, int64_t ldq, const int8_t* W, const float* w_scale,
                               const int32_t* w_zero, int64_t group_size, const float* bias, float* y, int64_t M,
                               int64_t N, int64_t K) {
  const int64_t G = num_groups(K, group_size), kb = q8_block_count(K);
  QF_REQUIRE(G == 1 || group_size % kQ8Block == 0, "kernels/cpu: block-32 activations need int4 groups of a "
             "multiple of 32 (or one group per row); got group_size=", group_size, " for K=", K);
  const int64_t blocks_per_group = G == 1 ? kb : group_size / kQ8Block;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float t = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        const int32_t z = w_zero != nullptr ? w_zero[n * G + g] : 0;
        float u = 0.0f;
        for (int64_t b = g * blocks_per_group; b < std::min(kb, (g + 1) * blocks_per_group); ++b) {
          const int32_t i = block_dot(q + m * ldq, W + n * K, z, b * kQ8Block, std::min(K, (b + 1) * kQ8Block));
          u = std::fmaf(static_cast<float>(i), d[m * kb + b], u);
        }
        t = std::fmaf(u, w_scale[n * G + g], t);
      }
      y[m * N + n] = t + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

}  // namespace qforge::kernels
