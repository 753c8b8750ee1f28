// Packed layout of the codebook (look-up-table) Linear, without ATen: the block constants, and
// the raw-pointer arguments of the ISA kernels (gemv_f32lut_*.cpp, compiled with their own -m
// flags). The layout itself and the float order are described in kernels/cpu/lut_linear.h.
#pragma once

#include <cstdint>

namespace qforge::kernels {

// Entries of a look-up table and lanes of a block: the 16 float lanes of one VPERMPS.
inline constexpr int64_t kLutEntries = 16;
// Bytes of packed indices per block: one byte per lane, holding every plane's index.
inline constexpr int64_t kLutBlockBytes = kLutEntries;
// Most planes per byte (2-bit indices) and the widest block.
inline constexpr int64_t kLutMaxPlanes = 4;
// Output rows that share each x load in the kernels; the threads split whole row blocks.
inline constexpr int64_t kLutRowBlock = 4;

// Stored bits per index (4 for bits 3 and 4, 2 for bits 2) and the values one 16-byte block
// covers (32 or 64).
constexpr int lut_storage_bits(int bits) { return bits == 2 ? 2 : 4; }
constexpr int64_t lut_planes(int bits) { return 8 / lut_storage_bits(bits); }
constexpr int64_t lut_block(int bits) { return kLutEntries * lut_planes(bits); }
static_assert(lut_block(4) == 32 && lut_block(3) == 32 && lut_block(2) == 64);
static_assert(lut_planes(2) == kLutMaxPlanes && kLutBlockBytes * 8 / lut_storage_bits(4) == lut_block(4));
// A 4-bit index addresses exactly the 16 entries of a table (VPERMPS reads the low 4 bits).
static_assert(kLutEntries == int64_t{1} << lut_storage_bits(4));

namespace detail {
// What the ISA files compute: rows [n0, n1) of y for every x row (x padded with 0 to kp).
struct LutArgs {
  const float* x = nullptr;
  int64_t m = 0, ldx = 0;
  const uint8_t* packed = nullptr;  // [n, kp / block * 16]
  const float* tables = nullptr;    // [n, groups, 16]
  int64_t n = 0, kp = 0, groups = 1, group_size = 0;
  int storage_bits = 4;
  const float* bias = nullptr;  // [n] or null
  float* y = nullptr;
  int64_t ldy = 0;
};
void gemv_f32lut_avx512(const LutArgs& a, int64_t n0, int64_t n1);
void gemv_f32lut_avx2(const LutArgs& a, int64_t n0, int64_t n1);
}  // namespace detail

}  // namespace qforge::kernels
