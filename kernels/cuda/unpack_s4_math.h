// Dequantization of frozen int4 weights as host/device functions. Layout: dense row-major nibbles
// over the whole [N, K] tensor (value i = n * K + k in byte i / 2, low nibble first), exactly
// pack_s4_reference / pack_u4_reference (kernels/cpu/reference.h). Per-group scales (fp16-exact
// floats) and optional int zero points are [N, G], G = ceil(K / group_size):
//   w[n, k] = float(q[n, k] - z[n, g]) * s[n, g]      g = k / group_size, z = 0 when absent
// tests/kernels/cuda_math_test.cpp checks these against unpack_{s4,u4}_reference + the formula.
#pragma once

#include <cstdint>

#include "framework/core/host_device.h"

namespace qforge::cuda {

constexpr int kS4PerByte = 2;
constexpr int kS4FieldBits = 4;
constexpr int kS4FieldMask = 0x0F;
constexpr int kS4SignBit = 0x08;

// The 4-bit field of value i (low nibble first).
QF_HOST_DEVICE int s4_field_at(const uint8_t* packed, int64_t i) {
  return (packed[i / kS4PerByte] >> ((i % kS4PerByte) * kS4FieldBits)) & kS4FieldMask;
}

// qint4 codes sign-extend ([-8, 7]); quint4 codes zero-extend ([0, 15]).
QF_HOST_DEVICE int s4_value_at(const uint8_t* packed, int64_t i, bool is_signed) {
  const int f = s4_field_at(packed, i);
  return is_signed ? (f ^ kS4SignBit) - kS4SignBit : f;
}

// w = float(q - z) * s: q - z is a small integer (exact in float), the product rounds once.
QF_HOST_DEVICE float dequantize_s4_value(int q, int32_t zero_point, float scale) {
  return qf_mul_rn(static_cast<float>(q - zero_point), scale);
}

// w[n, k] of a packed [N, K] int4 weight; scale / zero (nullable) are [N, G].
QF_HOST_DEVICE float dequantize_s4_at(const uint8_t* packed, int64_t n, int64_t k, int64_t K,
                                      bool is_signed, const float* scale, const int32_t* zero,
                                      int64_t group_size, int64_t G) {
  const int64_t idx = n * G + k / group_size;
  return dequantize_s4_value(s4_value_at(packed, n * K + k, is_signed),
                             zero != nullptr ? zero[idx] : 0, scale[idx]);
}

}  // namespace qforge::cuda
