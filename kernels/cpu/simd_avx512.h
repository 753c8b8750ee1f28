// Primitives shared by the AVX-512 tile kernels: lane masks, the n16k8 group metadata, the VNNI
// int8 k-block dot products, register-tile spills and the float store epilogue (include only
// from files compiled with AVX-512 flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

// Internal linkage: ISA files compiled with different -m flags each keep their own copy (ODR).
namespace {

inline constexpr int kAvx512Lanes = 16;  // int32 / float lanes per zmm: one 16-column block

// Lanes of the 16-column block starting at column n0 that hold real columns (n0 < n).
inline __mmask16 column_mask(int64_t n0, int64_t n) {
  const int64_t valid = n - n0;
  return valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
}

// Zero-point codes z' (int32) and fp16 scales widened to float (exact, VCVTPH2PS: the same float
// the reference multiplies by) of column block nb, group g.
// n16b32: the qint4 zero code and block g's scales in the stream.
inline void s4_group_meta(const S4N16K8View& w, int64_t nb, int64_t g, __m512i& z, __m512& scale) {
  if (w.layout == S4Layout::kN16B32) {
    z = _mm512_set1_epi32(kS4B32ZeroCode);
    const uint8_t* scales = w.data + s4_column_block_offset(w, nb) + s4_b32_scale_offset(g);
    scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    return;
  }
  const int64_t meta = (nb * w.groups + g) * kS4BlockN;
  z = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta)));
  scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + meta)));
}

// The same for each of a tile's NR column blocks nb0 + c.
template <int NR>
__attribute__((always_inline)) inline void s4_group_meta(const S4N16K8View& w, int64_t nb0, int64_t g,
                                                         __m512i (&z)[NR], __m512 (&scale)[NR]) {
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) s4_group_meta(w, nb0 + c, g, z[c], scale[c]);
}

// Zero points (int32; 0 when the view has none) and scales as float (fp16 widened exactly, or the
// stored floats) of int8 groups, column block nb, group g.
inline void s8g_group_meta(const S8GroupView& w, int64_t nb, int64_t g, __m512i& z, __m512& scale) {
  const int64_t meta = (nb * w.groups + g) * kS8BlockN;
  z = w.zeros != nullptr ? _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta)))
                         : _mm512_setzero_si512();
  scale = w.scales16 != nullptr
              ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales16 + meta)))
              : _mm512_loadu_ps(w.scales32 + meta);
}

inline void store_zmm(int32_t* p, __m512i v) { _mm512_store_si512(p, v); }
inline void store_zmm(float* p, __m512 v) { _mm512_store_ps(p, v); }

// Stores an MR x NR register tile to 64-byte aligned memory, for an out-of-line epilogue (one
// that takes registers makes GCC 12 shuffle the accumulators inside the k loop).
template <int MR, int NR, typename V, typename T>
__attribute__((always_inline)) inline void spill_tile(const V (&acc)[MR][NR], T (*out)[NR][kAvx512Lanes]) {
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) store_zmm(out[r][c], acc[r][c]);
}

// acc[r][c] = sum over n16k4 blocks [q_begin, q_end) of VPDPBUSD(4 bytes of row r broadcast,
// block c): the weights (wp) are the unsigned operand when kUnsignedWeights, else the activations
// (ap). kAlignedWeights: every block of wp is 64-byte aligned (an unpacked scratch panel), so the
// aligned load is used and a misaligned panel faults instead of running slower. VNNI files only.
template <bool kUnsignedWeights, int MR, int NR, bool kAlignedWeights = false, typename W, typename A>
__attribute__((always_inline)) inline void dpbusd_quads(const W* const* wp, const A* const* ap, int64_t q_begin,
                                                        int64_t q_end, __m512i (&acc)[MR][NR]) {
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_si512();
  for (int64_t kq = q_begin; kq < q_end; ++kq) {
    __m512i av[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) av[r] = _mm512_set1_epi32(load_u32(ap[r] + kq * kS8BlockK));
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      const W* wq = wp[c] + kq * kS8BlockBytes;
      const __m512i wv = kAlignedWeights ? _mm512_load_si512(wq) : _mm512_loadu_si512(wq);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        acc[r][c] = kUnsignedWeights ? _mm512_dpbusd_epi32(acc[r][c], wv, av[r]) : _mm512_dpbusd_epi32(acc[r][c], av[r], wv);
      }
    }
  }
}

// acc[r][c] += (w + 128) * a over n16k4 block kq: 4 bytes of row r (ap) broadcast, block c (wp) made
// unsigned for VPDPBUSD by w ^ 0x80 (VNNI files only).
template <int MR, int NR>
__attribute__((always_inline)) inline void q8_flipped_quad(const int8_t* const* wp, const int8_t* const* ap, int64_t kq,
                                                           __m512i (&acc)[MR][NR]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i av[MR];
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) av[r] = _mm512_set1_epi32(load_u32(ap[r] + kq * kS8BlockK));
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(wp[c] + kq * kS8BlockBytes), flip);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv, av[r]);
  }
}

// Tiles of up to this many accumulators sum in two chains (half the VPDPBUSD dependency); larger
// ones have enough independent sums already, and a second set would not fit the 32 registers.
inline constexpr int kQ8TwoChainMaxAccs = 4;

// The block-32 decode kernels' int8 dot (VNNI files only): acc[r][c] = sum over the n16k4 blocks
// [q0, q1) of (w + 128) * a (q8_flipped_quad), in two chains for tiles of up to
// kQ8TwoChainMaxAccs accumulators (integer sums: the order does not change the result).
template <int MR, int NR>
__attribute__((always_inline)) inline void q8_flipped_dot(const int8_t* const* wp, const int8_t* const* ap, int64_t q0,
                                                          int64_t q1, __m512i (&acc)[MR][NR]) {
  fill_tile(acc, _mm512_setzero_si512());
  if constexpr (MR * NR > kQ8TwoChainMaxAccs) {
    for (int64_t kq = q0; kq < q1; ++kq) q8_flipped_quad<MR, NR>(wp, ap, kq, acc);
  } else {
    __m512i acc1[MR][NR];
    fill_tile(acc1, _mm512_setzero_si512());
    int64_t kq = q0;
    for (; kq + 2 <= q1; kq += 2) {
      q8_flipped_quad<MR, NR>(wp, ap, kq, acc);
      q8_flipped_quad<MR, NR>(wp, ap, kq + 1, acc1);
    }
    if (kq < q1) q8_flipped_quad<MR, NR>(wp, ap, kq, acc);  // an odd number of k quads (a row's last block)
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_add_epi32(acc[r][c], acc1[r][c]);
  }
}

// Block b of a block-32 decode tile folded into u (VNNI files only): per row r and column block c,
//   u[r][c] = fma(float(acc[r][c] - z[c] * s_rb), d_rb, u[r][c])
// with s_rb, d_rb row r's code sum and scale of block b (s, d: [rows][kb]). z[c] holds one offset
// per lane in [0, 32767] (a zero-point code, or 128 + z for flipped int8 weights); the product
// comes from VPDPWSSD on the low 16-bit halves (the high halves are 0), |s| <= 127 * 32 fits int16,
// so i is exact.
template <int MR, int NR>
__attribute__((always_inline)) inline void q8_fold_block(const int32_t* s, const float* d, int64_t kb, int64_t m0,
                                                         int64_t b, const __m512i (&acc)[MR][NR],
                                                         const __m512i (&z)[NR], __m512 (&u)[MR][NR]) {
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const __m512i neg_s = _mm512_set1_epi32(static_cast<uint16_t>(-s[(m0 + r) * kb + b]));
    const __m512 dv = _mm512_set1_ps(d[(m0 + r) * kb + b]);
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      const __m512i i = _mm512_dpwssd_epi32(acc[r][c], z[c], neg_s);
      u[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dv, u[r][c]);
    }
  }
}

// A block-32 decode tile over groups of whole blocks (VNNI files only): per group g,
// meta(g, offset, scale) gives each column block's lane offsets (q8_fold_block's z) and scales,
// dot(b, acc) block b's integer sums; u folds the group's blocks, t = fma(u, scale, t) per group.
template <int MR, int NR, typename Args, typename Meta, typename Dot>
__attribute__((always_inline)) inline void q8_group_tile(const Args& args, int64_t m0,
                                                         int64_t groups, int64_t blocks_per_group, const Meta& meta,
                                                         const Dot& dot, __m512 (&t)[MR][NR]) {
  fill_tile(t, _mm512_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    __m512i offset[NR];
    __m512 sc[NR], u[MR][NR];
    meta(g, offset, sc);
    fill_tile(u, _mm512_setzero_ps());
    const int64_t b_end = chunk_end(g, blocks_per_group, args.kb);
    for (int64_t b = g * blocks_per_group; b < b_end; ++b) {
      __m512i acc[MR][NR];
      dot(b, acc);
      q8_fold_block<MR, NR>(args.s, args.d, args.kb, m0, b, acc, offset, u);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) t[r][c] = _mm512_fmadd_ps(u[r][c], sc[c], t[r][c]);
  }
}

// The float epilogue of an MR x NR tile: y[m0 + r][n0 + lane] = value(r, c, ws, b) for the valid
// columns of block nb0 + c, with ws = col_scale[n0 + lane] (unset when col_scale is null) and
// b = bias[n0 + lane] (0 when bias is null), masked lanes read as 0.
template <int MR, int NR, class Value>
__attribute__((always_inline)) inline void store_columns(float* y, int64_t ldy, int64_t m0,
                                                         int64_t nb0, int64_t n,
                                                         const float* col_scale,
                                                         const float* bias, const Value& value) {
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    const int64_t n0 = (nb0 + c) * kAvx512Lanes;
    const __mmask16 mask = column_mask(n0, n);
    const __m512 ws = col_scale != nullptr ? _mm512_maskz_loadu_ps(mask, col_scale + n0) : _mm512_setzero_ps();
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (m0 + r) * ldy + n0, mask, value(r, c, ws, b));
  }
}

}  // namespace
}  // namespace qforge::kernels::detail
