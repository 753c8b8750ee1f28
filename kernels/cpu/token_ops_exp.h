// exp_nonpositive, the exponential of the fused softmax (token_ops.h), in scalar form: the
// reference calls it and the AVX-512 twin computes the same operations lane by lane.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace qforge::kernels::detail {

// Below it the result is 0 (exp(−87) ≈ 1.6e−38, under float epsilon of any softmax sum >= 1).
inline constexpr float kExpLowest = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
// Cephes' expf: ln 2 split in two (C1 exact in few bits) and the polynomial's coefficients.
inline constexpr float kExpC1 = 0.693359375f, kExpC2 = -2.12194440e-4f;
inline constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                   4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(t) for t <= 0 (t above 0 is not a softmax input): within 2 ulp of the exact value.
inline float exp_nonpositive(float t) {
  if (!(t >= kExpLowest)) return 0.0f;
  const float n = std::floor(t * kLog2e + 0.5f);
  float f = std::fmaf(n, -kExpC1, t);
  f = std::fmaf(n, -kExpC2, f);
  float y = kExpP[0];
  for (int i = 1; i < 6; ++i) y = std::fmaf(y, f, kExpP[i]);
  y = std::fmaf(y, f * f, f) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

}  // namespace qforge::kernels::detail
