// Quantized types: the grids values are rounded to. Small constexpr values, quanto-style
// (`qforge::qint8`), shared by observers, fake_quant, kernels and the framework.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

// kCodebook: values are indices into per-channel (or per-group) float16 codebooks learned by
// k-means (non-uniform grids); quant_min / quant_max are the index range [0, 2^bits - 1].
// kMicroscaling: 4-bit float (E2M1) elements in fixed-size blocks along the last dimension, one
// scale per block taken from the block's own values (OCP MX, NVIDIA NVFP4; docs/formats.md).
enum class QKind : uint8_t { kInteger, kFloat8, kCodebook, kMicroscaling };

struct QType {
  const char* name;
  int bits;
  bool is_signed;
  QKind kind;
  // Integer grids: the full representable range. Float8 grids: unused (0).
  int64_t quant_min;
  int64_t quant_max;
  // Float8 and microscaling grids: the element's exponent/mantissa bits, exponent bias and
  // largest finite value.
  int exponent_bits;
  int mantissa_bits;
  int exponent_bias;
  double max_finite;
  // Microscaling grids: elements per scale block, fixed by the format (0 elsewhere).
  int block_size = 0;

  constexpr bool is_float() const { return kind == QKind::kFloat8; }
  constexpr bool is_integer() const { return kind == QKind::kInteger; }
  constexpr bool is_codebook() const { return kind == QKind::kCodebook; }
  constexpr bool is_microscaling() const { return kind == QKind::kMicroscaling; }
  constexpr int64_t levels() const { return quant_max - quant_min + 1; }
  friend constexpr bool operator==(const QType& a, const QType& b) {
    return a.bits == b.bits && a.is_signed == b.is_signed && a.kind == b.kind &&
           a.exponent_bits == b.exponent_bits && a.block_size == b.block_size;
  }
  friend constexpr bool operator!=(const QType& a, const QType& b) { return !(a == b); }
};

inline constexpr QType qint8{"qint8", 8, true, QKind::kInteger, -128, 127, 0, 0, 0, 0.0};
inline constexpr QType quint8{"quint8", 8, false, QKind::kInteger, 0, 255, 0, 0, 0, 0.0};
inline constexpr QType qint4{"qint4", 4, true, QKind::kInteger, -8, 7, 0, 0, 0, 0.0};
inline constexpr QType quint4{"quint4", 4, false, QKind::kInteger, 0, 15, 0, 0, 0, 0.0};
// qint3 has no 3-bit packing: it is stored and computed like qint4 (nibbles, the int4 kernels).
inline constexpr QType qint3{"qint3", 3, true, QKind::kInteger, -4, 3, 0, 0, 0, 0.0};
inline constexpr QType qint2{"qint2", 2, true, QKind::kInteger, -2, 1, 0, 0, 0, 0.0};
// OCP FP8: e4m3fn has no infinities and one NaN pattern, max 448; e5m2 is IEEE-like, max 57344.
inline constexpr QType qfloat8_e4m3fn{"qfloat8_e4m3fn", 8, true, QKind::kFloat8, 0, 0, 4, 3, 7, 448.0};
inline constexpr QType qfloat8_e5m2{"qfloat8_e5m2", 8, true, QKind::kFloat8, 0, 0, 5, 2, 15, 57344.0};
// k-means (non-uniform) weights: 2^bits float16 centroids per channel (or group), b-bit indices.
// Stored as nibbles (4 and 3 bits) or 2-bit fields; run by the look-up-table kernels after freeze.
inline constexpr QType qkmeans4{"qkmeans4", 4, false, QKind::kCodebook, 0, 15, 0, 0, 0, 0.0};
inline constexpr QType qkmeans3{"qkmeans3", 3, false, QKind::kCodebook, 0, 7, 0, 0, 0, 0.0};
inline constexpr QType qkmeans2{"qkmeans2", 2, false, QKind::kCodebook, 0, 3, 0, 0, 0, 0.0};
// 4-bit floats (E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) with block scales. OCP MX:
// one E8M0 (power-of-two) scale per 32 elements. NVIDIA NVFP4: one E4M3 scale per 16 elements,
// times one float32 scale per tensor. Weight-only in this tree.
inline constexpr QType qmxfp4{"mxfp4", 4, true, QKind::kMicroscaling, 0, 0, 2, 1, 1, 6.0, 32};
inline constexpr QType qnvfp4{"nvfp4", 4, true, QKind::kMicroscaling, 0, 0, 2, 1, 1, 6.0, 16};
// The E2M1 element's values by code (bit 3 the sign, bits 2..1 the exponent, bit 0 the mantissa).
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Integer grids stored two codes per byte (4-bit nibbles) and run by the int4 kernels, whose
// packed layout keeps float16 scales: qint4, quint4 and qint3.
constexpr bool nibble_packed(const QType& q) {
  return q.kind == QKind::kInteger && (q.bits == 4 || (q.bits == 3 && q.is_signed));
}

// Bits per stored code of a codebook qtype: 4 (nibbles) for qkmeans4 and qkmeans3, 2 for qkmeans2.
constexpr int codebook_storage_bits(const QType& q) { return q.bits == 2 ? 2 : 4; }

// All qtypes, in the order documentation lists them.
const std::vector<QType>& all_qtypes();

// Looks a qtype up by name ("qint8", "int8", "fp8_e4m3", ...); throws qforge::Error naming the
// closest valid name when there is none.
QType qtype_from_name(std::string_view name);

}  // namespace qforge
