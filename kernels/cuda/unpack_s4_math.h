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

// The tiled layout the tensor-core GEMV reads (gemv_f32s4_mma_cuda with tiled = true), into which
// frozen int4 weights on a GPU are repacked once (repack_s4_tiles_cuda): K a multiple of 128, the
// rows padded with zero codes to a multiple of 16. Per tile T of 16 rows and block kb of 128 k,
// 1024 bytes as 64 16-byte words, word 32h + 4g + t holding codes 128kb + 32t .. 128kb + 32t + 31
// of row 16T + g + 8h (two a byte, low nibble first). A warp's two loads of one block then read
// 512 contiguous bytes each, where the dense layout gives 64-byte pieces of 16 rows.
constexpr int64_t kS4TileRows = 16;
constexpr int64_t kS4TileK = 128;

// Bytes of the tiled form of an [N, K] weight.
QF_HOST_DEVICE int64_t s4_tiled_bytes(int64_t N, int64_t K) {
  return (N + kS4TileRows - 1) / kS4TileRows * kS4TileRows * K / kS4PerByte;
}

// The value index (nibble) of code (n, k) in the tiled layout: s4_field_at(tiled, index).
QF_HOST_DEVICE int64_t s4_tiled_index(int64_t n, int64_t k, int64_t K) {
  const int64_t tile = n / kS4TileRows, r = n % kS4TileRows, kb = k / kS4TileK, kk = k % kS4TileK;
  const int64_t word = (tile * (K / kS4TileK) + kb) * 64 + (r / 8) * 32 + (r % 8) * 4 + kk / 32;
  return word * 32 + kk % 32;
}

// The inverse: the row and column of tiled value index i (a row >= N is padding).
QF_HOST_DEVICE void s4_tiled_coords(int64_t i, int64_t K, int64_t* n, int64_t* k) {
  const int64_t word = i / 32, blocks = K / kS4TileK;
  const int64_t lane_word = word % 64, kb = (word / 64) % blocks, tile = word / 64 / blocks;
  *n = tile * kS4TileRows + (lane_word / 32) * 8 + (lane_word % 32) / 4;
  *k = kb * kS4TileK + (lane_word % 4) * 32 + i % 32;
}

}  // namespace qforge::cuda
