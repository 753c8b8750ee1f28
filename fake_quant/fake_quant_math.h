// The scalar formulas of fake quantisation, shared by the CPU reference kernels, the vectorised
// kernels' tails and the CUDA kernels (QF_HOST_DEVICE), so every backend computes the same thing.
// Formulas are documented in docs/numerics.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "framework/core/host_device.h"

namespace qforge::fq {

// Affine integer grid for one scale: PyTorch multiplies by a float32 reciprocal, never divides,
// so inv_scale is 1.0f / scale computed in float.
struct AffineGrid {
  float scale;
  float inv_scale;
  float zero_point;
  float quant_min;
  float quant_max;
};

QF_HOST_DEVICE AffineGrid make_grid(float scale, float zero_point, float qmin, float qmax) {
  return AffineGrid{scale, 1.0f / scale, zero_point, qmin, qmax};
}

// q = rint(x / s) + z (half to even, as std::nearbyint in the default rounding mode).
QF_HOST_DEVICE float quantize_unclamped(float x, const AffineGrid& g) {
  return qf_nearbyint(x * g.inv_scale) + g.zero_point;
}

// Clamp written as max-then-min with the NaN operand first, so NaN maps to quant_min as in
// PyTorch's kernel (where the float-to-int64 cast of NaN saturates low).
QF_HOST_DEVICE float clamp_q(float q, const AffineGrid& g) {
  const float lo = (q > g.quant_min) ? q : g.quant_min;
  return (lo < g.quant_max) ? lo : g.quant_max;
}

// y = (clamp(q) - z) * s; the STE mask is taken on the unclamped q.
QF_HOST_DEVICE float fake_quantize_value(float x, const AffineGrid& g, bool* in_range) {
  const float q = quantize_unclamped(x, g);
  if (in_range) *in_range = (q >= g.quant_min) && (q <= g.quant_max);
  return (clamp_q(q, g) - g.zero_point) * g.scale;
}

// ---- float8 grids (OCP e4m3fn / e5m2), emulated on float32 ----

struct Float8Format {
  int mantissa_bits;
  int min_exponent;   // exponent of the smallest normal (1 - bias)
  float max_finite;
};

inline constexpr Float8Format kE4M3 {3, -6, 448.0f};
inline constexpr Float8Format kE5M2 {2, -14, 57344.0f};

QF_HOST_DEVICE float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

QF_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

// Rounds v to the nearest float8 value, ties to even, saturating to ±max_finite (the "satfinite"
// conversion); NaN stays NaN. The quantum 2^(e - mantissa_bits) with e = max(exponent(v),
// min_exponent) covers normals and subnormals alike, and scaling by a power of two is exact.
QF_HOST_DEVICE float round_to_float8(float v, const Float8Format& f) {
  if (v != v) return v;
  const int e_raw = static_cast<int>((float_to_bits(v) >> 23) & 0xffu) - 127;
  const int e = e_raw > f.min_exponent ? e_raw : f.min_exponent;
  const int qexp = e - f.mantissa_bits;  // always a normal float32 exponent
  const float quantum = bits_to_float(static_cast<uint32_t>(qexp + 127) << 23);
  const float inv_quantum = bits_to_float(static_cast<uint32_t>(127 - qexp) << 23);
  const float r = qf_nearbyint(v * inv_quantum) * quantum;
  return r > f.max_finite ? f.max_finite : (r < -f.max_finite ? -f.max_finite : r);
}

// y = round_to_float8(x / s) * s; STE passes the gradient where |x / s| <= max_finite.
QF_HOST_DEVICE float fake_quantize_float8_value(float x, float scale, const Float8Format& f,
                                                bool* in_range) {
  const float v = x / scale;
  if (in_range) *in_range = qf_fabs(v) <= f.max_finite;
  return round_to_float8(v, f) * scale;
}

// Encodes a value already on the float8 grid (a round_to_float8 result) into its byte.
QF_HOST_DEVICE uint8_t encode_float8(float v, const Float8Format& f) {
  const int exp_bits = (f.mantissa_bits == 3) ? 4 : 5;
  const int bias = 1 - f.min_exponent;
  const uint32_t b = float_to_bits(v);
  const uint8_t sign = static_cast<uint8_t>((b >> 31) << 7);
  if (v != v) return static_cast<uint8_t>(sign | (exp_bits == 4 ? 0x7f : 0x7e));
  const float a = qf_fabs(v);
  if (a == 0.0f) return sign;
  const int e_raw = static_cast<int>((b >> 23) & 0xffu) - 127;
  if (e_raw < f.min_exponent) {  // subnormal: mantissa counts quanta of 2^(min_exponent - mbits)
    const float quanta = a * bits_to_float(static_cast<uint32_t>(127 - (f.min_exponent - f.mantissa_bits)) << 23);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(quanta));
  }
  const uint32_t mant = (b >> (23 - f.mantissa_bits)) & ((1u << f.mantissa_bits) - 1u);
  return static_cast<uint8_t>(sign | ((e_raw + bias) << f.mantissa_bits) | mant);
}

QF_HOST_DEVICE float decode_float8(uint8_t code, const Float8Format& f) {
  const int exp_bits = (f.mantissa_bits == 3) ? 4 : 5;
  const int bias = 1 - f.min_exponent;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int e = (code >> f.mantissa_bits) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << f.mantissa_bits) - 1);
  if (exp_bits == 4 && e == 15 && m == 7) return NAN;          // e4m3fn: the only NaN
  if (exp_bits == 5 && e == 31) return m ? NAN : sign * INFINITY;  // e5m2: IEEE specials
  if (e == 0) return sign * qf_ldexp(static_cast<float>(m), f.min_exponent - f.mantissa_bits);
  return sign * qf_ldexp(1.0f + static_cast<float>(m) / (1 << f.mantissa_bits), e - bias);
}

}  // namespace qforge::fq
