// Packed layout of the MXFP4 / NVFP4 weight-only Linear, without ATen: the raw-pointer arguments
// of the ISA kernels (gemv_f32fp4_*.cpp, own -m flags) and the scalar reference. Formula, layout
// and float order are in kernels/cpu/fp4_linear.h.
#pragma once

#include <cstdint>

namespace qforge::kernels {

// Values per packed chunk: 8 bytes, the low nibbles the first 8 values, the high ones the next 8.
inline constexpr int64_t kFp4Chunk = 16;
inline constexpr int64_t kFp4ChunkBytes = kFp4Chunk / 2;
// Float lanes of the accumulators (one AVX2 register), the width the float order is defined for.
inline constexpr int64_t kFp4Lanes = 8;
static_assert(kFp4Chunk == 2 * kFp4Lanes && kFp4ChunkBytes * 2 == kFp4Chunk);

// The E2M1 code of value k in a packed row (chunk k / 16, byte k % 8, low nibble for the first 8).
inline int fp4_packed_code(const uint8_t* row, int64_t k) {
  const uint8_t byte = row[k / kFp4Chunk * kFp4ChunkBytes + k % kFp4Lanes];
  return (k % kFp4Chunk < kFp4Lanes ? byte : byte >> 4) & 15;
}

namespace detail {
// What the ISA files compute: rows [n0, n1) of y for every x row.
struct Fp4Args {
  const float* x = nullptr;  // [m, ldx], k values a row
  int64_t m = 0, ldx = 0;
  const uint8_t* packed = nullptr;  // [n, k / 2]
  const float* scales = nullptr;    // [n, k / block]
  int64_t n = 0, k = 0, block = 32;
  const float* bias = nullptr;  // [n] or null
  float* y = nullptr;
  int64_t ldy = 0;
};
void gemv_f32fp4_avx2(const Fp4Args& a, int64_t n0, int64_t n1);
}  // namespace detail

// The scalar reference (defines the result): codes unpacked uint8 [N, K] (E2M1 codes < 16), scales
// float [N, K / block], x dense [M, K], y dense [M, N]; bias [N] or null.
void linear_f32fp4_reference(const float* x, int64_t M, const uint8_t* codes, const float* scales, int64_t N,
                             int64_t K, int64_t block, const float* bias, float* y);
// The same on the packed layout (packed uint8 [N, K / 2]), unpacked in the loop: no allocation.
void linear_f32fp4_reference_packed(const float* x, int64_t M, const uint8_t* packed, const float* scales,
                                    int64_t N, int64_t K, int64_t block, const float* bias, float* y);

}  // namespace qforge::kernels
