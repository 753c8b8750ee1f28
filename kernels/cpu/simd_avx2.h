// Primitives shared by the AVX2 tile kernels: lane masks, the int8 / int4 k-block dot products,
// the n16k8 group metadata and the float store epilogue (include only from files compiled with
// -mavx2 -mfma -mf16c). A 16-column block is two ymm halves (columns 0-7, 8-15).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

// Internal linkage: ISA files compiled with different -m flags each keep their own copy (ODR).
namespace {

inline constexpr int kAvx2Lanes = 8;  // int32 / float lanes per ymm

// Lanes [0, valid) all-ones, for maskload/maskstore of a partial 8-column half.
inline __m256i lane_mask(int64_t valid) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int v = static_cast<int>(valid < 0 ? 0 : (valid > kAvx2Lanes ? kAvx2Lanes : valid));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), idx);
}

// acc[r][c][h] = sum over n16k4 blocks [q_begin, q_end) of a * w per int32 lane, exact:
// VPMADDUBSW(|w|, a * sign(w)) with |w| <= 128 (|-128| = 0x80 reads as 128) and |a| <= 127 sums a
// pair to at most 2 * 128 * 127 = 32512 < 32767 (no int16 saturation); VPMADDWD with ones widens.
template <int MR, int NR>
__attribute__((always_inline)) inline void s8_dot_quads(const int8_t* const* wp,
                                                        const int8_t* const* ap, int64_t q_begin,
                                                        int64_t q_end, __m256i (&acc)[MR][NR][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_si256();
  for (int64_t kq = q_begin; kq < q_end; ++kq) {
    __m256i av[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) av[r] = _mm256_set1_epi32(load_u32(ap[r] + kq * kS8BlockK));
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[c] + kq * kS8BlockBytes + h * 32));
        const __m256i abs_v = _mm256_abs_epi8(v);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i p16 = _mm256_maddubs_epi16(abs_v, _mm256_sign_epi8(av[r], v));
          acc[r][c][h] = _mm256_add_epi32(acc[r][c][h], _mm256_madd_epi16(p16, ones));
        }
      }
    }
  }
}

// acc[r][h] = sum over n16k8 blocks [o_begin, o_end) of u * a per int32 lane, exact:
// VPMADDUBSW(u, a) with codes u in [0, 15] and |a| <= 127 sums the low plus high nibble pairs
// (4 products) to at most 7620 < 32767; VPMADDWD with ones widens.
template <int MR>
__attribute__((always_inline)) inline void s4_dot_octs(const uint8_t* wp, const int8_t* const* ap,
                                                       int64_t o_begin, int64_t o_end,
                                                       __m256i (&acc)[MR][2]) {
  const __m256i nibble = _mm256_set1_epi8(kS4NibbleMask);
  const __m256i ones = _mm256_set1_epi16(1);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t o = o_begin; o < o_end; ++o) {
    __m256i a_lo[MR], a_hi[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      a_lo[r] = _mm256_set1_epi32(load_u32(ap[r] + o * kS4BlockK));
      a_hi[r] = _mm256_set1_epi32(load_u32(ap[r] + o * kS4BlockK + kS8BlockK));
    }
    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + o * kS4BlockBytes + h * 32));
      const __m256i lo = _mm256_and_si256(v, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, kS4NibbleBits), nibble);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo[r]), _mm256_maddubs_epi16(hi, a_hi[r]));
        acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(p16, ones));
      }
    }
  }
}

// Zero-point codes z' (int32) and fp16 scales widened to float (exact, VCVTPH2PS: the same float
// the reference multiplies by) of half h of column block nb, group g.
// n16b32: the qint4 zero code and block g's scales in the stream.
inline void s4_group_meta(const S4N16K8View& w, int64_t nb, int64_t g, int h, __m256i& z, __m256& scale) {
  if (w.layout == S4Layout::kN16B32) {
    z = _mm256_set1_epi32(kS4B32ZeroCode);
    const uint8_t* scales = w.data + s4_column_block_offset(w, nb) + s4_b32_scale_offset(g) + h * kAvx2Lanes * kS4ScaleBytes;
    scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    return;
  }
  const int64_t meta = (nb * w.groups + g) * kS4BlockN + h * kAvx2Lanes;
  z = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + meta)));
  scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + meta)));
}

// Zero points (int32; 0 when the view has none) and scales as float (fp16 widened exactly, or the
// stored floats) of half h of int8 groups' column block nb, group g.
inline void s8g_group_meta(const S8GroupView& w, int64_t nb, int64_t g, int h, __m256i& z, __m256& scale) {
  const int64_t meta = (nb * w.groups + g) * kS8BlockN + h * kAvx2Lanes;
  z = w.zeros != nullptr ? _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + meta)))
                         : _mm256_setzero_si256();
  scale = w.scales16 != nullptr
              ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales16 + meta)))
              : _mm256_loadu_ps(w.scales32 + meta);
}

// A block-32 decode tile of one column block (two halves) over groups of whole blocks: per group
// g, meta(g, h, z, scale) gives half h's lane offsets z (zero-point codes, |z| <= 128) and scales,
// dot(b, acc) block b's integer sums; per row r with code sum s_rb and scale d_rb of block b,
//   u[r][h] = fma(float(acc[r][h] - z[h] * s_rb), d_rb, u[r][h])   (|z * s| <= 128 * 127 * 32: exact)
// and t[r][h] = fma(u[r][h], scale[h], t[r][h]) per group: linear_q8b32_s4_reference's order.
template <int MR, typename Args, typename Meta, typename Dot>
__attribute__((always_inline)) inline void q8_group_tile(const Args& args, int64_t m0, int64_t groups,
                                                         int64_t blocks_per_group, const Meta& meta, const Dot& dot,
                                                         __m256 (&t)[MR][2]) {
  fill_tile(t, _mm256_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    __m256i z[2];
    __m256 sc[2], u[MR][2];
    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) meta(g, h, z[h], sc[h]);
    fill_tile(u, _mm256_setzero_ps());
    const int64_t b_end = chunk_end(g, blocks_per_group, args.kb);
    for (int64_t b = g * blocks_per_group; b < b_end; ++b) {
      __m256i acc[MR][2];
      dot(b, acc);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256i s = _mm256_set1_epi32(args.s[(m0 + r) * args.kb + b]);
        const __m256 d = _mm256_set1_ps(args.d[(m0 + r) * args.kb + b]);
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const __m256i i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(z[h], s));
          u[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), d, u[r][h]);
        }
      }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) t[r][h] = _mm256_fmadd_ps(u[r][h], sc[h], t[r][h]);
  }
}

// The float epilogue of an MR x NR tile: y[m0 + r][n0 + lane] = value(r, c, h, ws, b) for the
// valid columns of half h of block nb0 + c, with ws = col_scale[n0 + lane] (unset when col_scale
// is null) and b = bias[n0 + lane] (0 when bias is null), masked lanes read as 0.
template <int MR, int NR, class Value>
__attribute__((always_inline)) inline void store_halves(float* y, int64_t ldy, int64_t m0,
                                                        int64_t nb0, int64_t n,
                                                        const float* col_scale, const float* bias,
                                                        const Value& value) {
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = (nb0 + c) * 2 * kAvx2Lanes + h * kAvx2Lanes;
      const __m256i mask = lane_mask(n - n0);
      const __m256 ws = col_scale != nullptr ? _mm256_maskload_ps(col_scale + n0, mask) : _mm256_setzero_ps();
      const __m256 b = bias != nullptr ? _mm256_maskload_ps(bias + n0, mask) : _mm256_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) _mm256_maskstore_ps(y + (m0 + r) * ldy + n0, mask, value(r, c, h, ws, b));
    }
  }
}

}  // namespace
}  // namespace qforge::kernels::detail
