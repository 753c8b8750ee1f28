// Blocked weight layouts of the fast GEMV kernels (byte-by-byte description in docs/kernels.md).
// Both put 16 output channels in the 16 int32 lanes of one 512-bit register, so a kernel keeps
// one accumulator per 16 columns and never reduces horizontally.
#pragma once

#include <cstdint>

namespace qforge::kernels {

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// --- s8 "n16k4": int8 weights for VPDPBUSD / VPMADDUBSW ------------------------------------
// Block = 16 columns x 4 consecutive k = 64 bytes; byte (j * 4 + i) of block (nb, kb) is
// W[nb * 16 + j, kb * 4 + i]. Blocks of one column block are contiguous along k:
// offset(nb, kb) = (nb * Kp / 4 + kb) * 64. Padding (n >= N or k >= K) is 0.
inline constexpr int64_t kS8BlockN = 16;
inline constexpr int64_t kS8BlockK = 4;
inline constexpr int64_t kS8BlockBytes = 64;
static_assert(kS8BlockN * kS8BlockK * sizeof(int8_t) == kS8BlockBytes, "n16k4 block size");
static_assert(kS8BlockBytes == 512 / 8, "an n16k4 block is exactly one zmm register");
static_assert(kS8BlockK * 8 == 32, "4 int8 k-values form one int32 lane (VPDPBUSD group)");

// --- s4 "n16k8": int4 weights (as unsigned codes u = w - qmin in [0, 15]) -------------------
// Block = 16 columns x 8 consecutive k = 64 bytes; byte (j * 4 + i) of block (nb, kb) holds
// u[nb * 16 + j, kb * 8 + i] in its low nibble and u[nb * 16 + j, kb * 8 + 4 + i] in its high
// nibble, so "& 0x0F" and ">> 4" each yield one n16k4 block. offset(nb, kb) = (nb * Kp / 8 + kb)
// * 64. Padding codes are 0 (padded activations are 0, so they never contribute).
inline constexpr int64_t kS4BlockN = 16;
inline constexpr int64_t kS4BlockK = 8;
inline constexpr int64_t kS4BlockBytes = 64;
inline constexpr int kS4NibbleBits = 4;
inline constexpr int kS4NibbleMask = 0x0F;  // the low nibble of a byte
static_assert(kS4BlockN * kS4BlockK * kS4NibbleBits / 8 == kS4BlockBytes, "n16k8 block size");
static_assert(kS4BlockBytes == 512 / 8, "an n16k8 block is exactly one zmm register");
static_assert(kS4BlockK == 2 * kS8BlockK, "one n16k8 block unpacks into two n16k4 blocks");

// Per-group metadata of n16k8, blocked like the weights: [Np / 16][G][16] entries each.
// Scales are IEEE binary16 bit patterns (the packer accepts only fp16-exact float scales, so
// converting back with VCVTPH2PS gives the original float exactly); zero points are int8 codes.
// 4 + (16 + 8) / 128 = 4.1875 bits per weight at group size 128 (fp32 scales: 4.25).
using Fp16Bits = uint16_t;
inline constexpr int64_t kS4ScaleBytes = 2;  // one fp16 scale per column and group
inline constexpr int64_t kS4ZeroBytes = 1;   // one zero-point code per column and group
inline constexpr int64_t kS4GroupMetaBytes = kS4ScaleBytes + kS4ZeroBytes;
static_assert(sizeof(Fp16Bits) == kS4ScaleBytes, "group scales are stored as IEEE float16");
static_assert(kS4BlockN * kS4ScaleBytes * 8 == 256,
              "16 fp16 scales of one column block are one ymm, widened by one VCVTPH2PS to a zmm");
static_assert(sizeof(int8_t) == kS4ZeroBytes, "zero-point codes are int8");

// --- s4 "n16b32": n16k8 codes with their fp16 block scales in the same stream ----------------
// For symmetric int4 groups of 32 (GGUF's Q4_0): per column block nb, the 32-value blocks b in
// pairs of 576 bytes: the 16 fp16 scales of block 2p (32 bytes, lane j = column nb * 16 + j), those
// of block 2p + 1, then block 2p's four n16k8 blocks (256 bytes, k = b * 32 + 8 * o + i as in n16k8)
// and block 2p + 1's, so every 64-byte code load is cache-line aligned. Pairs of one column block
// are contiguous along k; a column block holds ceil(Kb / 2) pairs, Kb = ceil(K / 32). The zero
// point is the qint4 grid's 0 (code 8); padding codes and scales are 0 (an odd Kb pads one block).
// 18 bytes per 32 weights (4.5 bits), Q4_0's block_q4_0 size, in one stream read front to back.
enum class S4Layout : uint8_t { kN16K8, kN16B32 };
inline constexpr int64_t kS4B32K = 32;
inline constexpr int64_t kS4B32Octs = kS4B32K / kS4BlockK;
inline constexpr int64_t kS4B32ScaleBytes = kS4BlockN * kS4ScaleBytes;
inline constexpr int64_t kS4B32CodeBytes = kS4B32Octs * kS4BlockBytes;
inline constexpr int64_t kS4B32PairBytes = 2 * (kS4B32ScaleBytes + kS4B32CodeBytes);
inline constexpr int kS4B32ZeroCode = 8;  // qint4's 0 as a code u = w - qmin
static_assert(kS4B32ScaleBytes == 32, "16 fp16 scales: one ymm, widened by one VCVTPH2PS");
static_assert(kS4B32PairBytes == 576 && kS4B32PairBytes % 64 == 0, "a pair is 9 whole cache lines");
static_assert(2 * kS4B32ScaleBytes % 64 == 0 && kS4B32CodeBytes % 64 == 0, "code loads stay line-aligned");
static_assert(kS4B32PairBytes * 32 == 18 * kS4BlockN * 2 * kS4B32K, "18 bytes per 32 weights, as block_q4_0");

// Byte offsets of block b's 16 scales and of its first oct from its column block's first byte,
// and the bytes of one column block of kb blocks.
constexpr int64_t s4_b32_scale_offset(int64_t b) { return b / 2 * kS4B32PairBytes + b % 2 * kS4B32ScaleBytes; }
constexpr int64_t s4_b32_code_offset(int64_t b) {
  return b / 2 * kS4B32PairBytes + 2 * kS4B32ScaleBytes + b % 2 * kS4B32CodeBytes;
}
constexpr int64_t s4_b32_column_bytes(int64_t kb) { return (kb + 1) / 2 * kS4B32PairBytes; }

// Alignment of every packed buffer (one cache line, the unit of aligned zmm loads).
inline constexpr int64_t kPackedAlignment = 64;

// Read-only views the ISA kernels receive (no ownership; PackedLinearS8/S4 own the bytes).
struct S8N16K4View {
  const int8_t* data = nullptr;    // round_up(N, 16) * Kp bytes
  const int32_t* colsum = nullptr; // [round_up(N, 16)]: sum_k W[n, k] (0 for padding)
  int64_t n = 0, k = 0, kp = 0;    // kp = round_up(K, 4)
};

struct S4N16K8View {
  const uint8_t* data = nullptr;   // round_up(N, 16) * Kp / 2 bytes (n16b32: Np / 16 * ceil(G / 2) * 576)
  const Fp16Bits* scales = nullptr; // [N / 16 blocks][G][16] fp16 bits (0 for padding); n16b32: null
  const int8_t* zeros = nullptr;   // [N / 16 blocks][G][16]: z - qmin, the zero point as a code; n16b32: null
  int64_t n = 0, k = 0, kp = 0;    // kp = round_up(K, 8)
  int64_t group_size = 0, groups = 0;  // n16b32: 32 and ceil(K / 32)
  S4Layout layout = S4Layout::kN16K8;
};

// Byte offset of oct o (k = 8 o .. 8 o + 7) from its column block's first byte, per layout.
template <S4Layout L>
constexpr int64_t s4_oct_offset(int64_t o) {
  if constexpr (L == S4Layout::kN16B32) {
    return s4_b32_code_offset(o / kS4B32Octs) + o % kS4B32Octs * kS4BlockBytes;
  } else {
    return o * kS4BlockBytes;
  }
}

// Byte offset of column block nb's first oct (n16k8) or pair (n16b32) in S4N16K8View::data.
inline int64_t s4_column_block_offset(const S4N16K8View& w, int64_t nb) {
  return w.layout == S4Layout::kN16B32 ? nb * s4_b32_column_bytes(w.groups) : nb * (w.kp / kS4BlockK) * kS4BlockBytes;
}

// int8 weights with a scale per column and group of K (GGUF's Q8_0 blocks: groups of 32): the
// codes in n16k4 (data, as S8N16K4View), the group metadata blocked like n16k8's, [Np / 16][G][16]
// entries: scales as fp16 bits when every one is exactly a float16 (files' block scales), else as
// float; zero points as int8, or none when all are 0. 8 + 16 / 32 = 8.5 bits per weight at groups
// of 32 with fp16 scales, Q8_0's size.
struct S8GroupView {
  const int8_t* data = nullptr;          // round_up(N, 16) * Kp bytes, n16k4
  const Fp16Bits* scales16 = nullptr;    // [Np / 16][G][16] fp16 bits (0 for padding), or null
  const float* scales32 = nullptr;       // the same as float where scales16 is null
  const int8_t* zeros = nullptr;         // [Np / 16][G][16] zero points, or null when all are 0
  int64_t n = 0, k = 0, kp = 0;          // kp = round_up(K, 4)
  int64_t group_size = 0, groups = 0;
};

// Scalar packers and unpackers that define the two layouts (reference_pack.cpp).
// pack_s8_n16k4_reference writes round_up(N,16) * round_up(K,4) bytes and round_up(N,16) sums.
void pack_s8_n16k4_reference(const int8_t* W, int64_t N, int64_t K, int8_t* packed,
                             int32_t* colsum);
void unpack_s8_n16k4_reference(const int8_t* packed, int64_t N, int64_t K, int8_t* W);
// W holds grid values in [qmin, qmin + 15]; stored as codes W - qmin.
void pack_s4_n16k8_reference(const int8_t* W, int64_t N, int64_t K, int qmin, uint8_t* packed);
void unpack_s4_n16k8_reference(const uint8_t* packed, int64_t N, int64_t K, int qmin, int8_t* W);
// n16b32 from n16k8 codes (pack_s4_n16k8_reference, qint4: qmin -8) and their blocked fp16 group
// scales of groups of 32 ([Np / 16][Kb][16], pack_s4_group_meta's); writes Np / 16 * ceil(Kb / 2) * 576
// bytes.
void pack_s4_n16b32_reference(const uint8_t* n16k8, const Fp16Bits* scales, int64_t N, int64_t K, uint8_t* packed);
// The inverse: n16k8 codes (round_up(N, 16) * round_up(K, 8) / 2 bytes) and blocked scales.
void unpack_s4_n16b32_reference(const uint8_t* packed, int64_t N, int64_t K, uint8_t* n16k8, Fp16Bits* scales);

}  // namespace qforge::kernels
