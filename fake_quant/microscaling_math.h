// The scalar formulas of the 4-bit microscaling formats: OCP Microscaling (MX) v1.0 MXFP4 and
// NVIDIA NVFP4. Both store E2M1 elements; MXFP4 scales each block of 32 by a power of two (E8M0),
// NVFP4 each block of 16 by an E4M3 value times one float32 scale per tensor. Shared by the
// reference kernels, the packed weights and the tests; formulas in docs/formats.md.
#pragma once

#include <cmath>
#include <cstdint>

#include "fake_quant/fake_quant_math.h"
#include "framework/core/error.h"
#include "framework/core/qtype.h"

namespace qforge::fq {

// E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no infinities, no NaN; largest value 6.
inline constexpr Float8Format kE2M1{1, 0, 6.0f};
inline constexpr float kE2M1Max = 6.0f;
inline constexpr int kE2M1MaxExponent = 2;  // emax_elem of the MX spec: 6 = 1.5 * 2^2
inline constexpr uint8_t kE2M1SignBit = 0x8;

// E8M0: an unsigned biased exponent, X = 2^(code - 127); code 255 is NaN (no zero, no sign).
inline constexpr int kE8M0Bias = 127;
inline constexpr int kE8M0MinExponent = -127;
inline constexpr int kE8M0MaxExponent = 127;
inline constexpr uint8_t kE8M0Nan = 0xff;

inline constexpr int kMxfp4Block = 32;
inline constexpr int kNvfp4Block = 16;
inline constexpr float kE4M3Max = 448.0f;
// Smallest positive E4M3 value (a subnormal, 2^-9): the floor of an NVFP4 block scale, so an
// all-zero block still has a positive scale (its elements encode as zeros).
inline constexpr float kE4M3MinSubnormal = 0.001953125f;
// Smallest normal float32: the floor of the NVFP4 tensor scale, so a block scale never divides by 0.
inline constexpr float kMinNormalF32 = 1.17549435e-38f;

// Rounds v to the nearest E2M1 value, ties to even (the code whose mantissa bit is 0), saturating
// to ±6 (infinities included); NaN stays NaN.
inline float round_to_e2m1(float v) {
  if (v != v) return v;
  if (v > kE2M1Max) return kE2M1Max;
  if (v < -kE2M1Max) return -kE2M1Max;
  return round_to_float8(v, kE2M1);
}

// Code (sign in bit 3) of a value already on the E2M1 grid (a round_to_e2m1 result, not NaN).
inline uint8_t encode_e2m1(float v) {
  const uint8_t sign = std::signbit(v) ? kE2M1SignBit : 0;
  const float a = std::fabs(v);
  uint8_t m = 0;
  while (m < 8 && kE2M1Values[m] != a) ++m;  // the magnitudes are codes 0..7
  QF_REQUIRE(m < 8, "encode_e2m1: ", v, " is not an E2M1 value (±0, 0.5, 1, 1.5, 2, 3, 4, 6); round it first");
  return static_cast<uint8_t>(sign | m);
}

inline float decode_e2m1(uint8_t code) { return kE2M1Values[code & 15]; }

// MX shared exponent of a block whose largest magnitude is amax (finite, >= 0):
// floor(log2(amax)) - emax_elem, clamped to E8M0's [-127, 127]; an all-zero block takes -127.
inline int mx_shared_exponent(float amax) {
  if (!(amax > 0.0f)) return kE8M0MinExponent;
  const int e = std::ilogb(amax) - kE2M1MaxExponent;  // ilogb: exact floor(log2), subnormals too
  return e < kE8M0MinExponent ? kE8M0MinExponent : (e > kE8M0MaxExponent ? kE8M0MaxExponent : e);
}

inline uint8_t encode_e8m0(int exponent) { return static_cast<uint8_t>(exponent + kE8M0Bias); }
inline float decode_e8m0(uint8_t code) {
  return code == kE8M0Nan ? NAN : std::ldexp(1.0f, static_cast<int>(code) - kE8M0Bias);
}

// NVFP4 per-tensor scale g = amax / (6 * 448), so the largest block scale lands on E4M3's 448;
// floored at the smallest normal float32 (an all-zero tensor gets that floor).
inline float nvfp4_tensor_scale(float amax) {
  const float g = amax / (kE2M1Max * kE4M3Max);
  return g > kMinNormalF32 ? g : kMinNormalF32;
}

// NVFP4 block scale (an E4M3 value) of a block with largest magnitude amax under tensor scale g:
// e4m3(clamp((amax / 6) / g, 2^-9, 448)), rounded to nearest even; the element scale is this * g.
inline float nvfp4_block_scale(float amax, float g) {
  float b = (amax / kE2M1Max) / g;
  b = b < kE4M3MinSubnormal ? kE4M3MinSubnormal : (b > kE4M3Max ? kE4M3Max : b);
  return round_to_float8(b, kE4M3);
}

// One element: y = round_to_e2m1(x / s) * s; the straight-through mask is |x / s| <= 6.
inline float fake_quantize_e2m1_value(float x, float s, bool* in_range) {
  const float v = x / s;
  if (in_range) *in_range = std::fabs(v) <= kE2M1Max;
  return round_to_e2m1(v) * s;
}

}  // namespace qforge::fq
