// The int4 (n16k8) tile primitives shared by the AVX-512 VNNI kernels: the k-block dot products,
// the per-group fold and the final epilogue (include only from files compiled with VNNI flags).
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {
namespace {

// sum[r][c] = sum over n16k8 blocks [o_begin, o_end) of u * a per lane: the codes u of column
// block c (wp[c]) are VPDPBUSD's unsigned operand, row r's activations (ap[r]) its signed one.
template <int MR, int NR>
__attribute__((always_inline)) inline void s4_dot_octs(const uint8_t* const* wp,
                                                       const int8_t* const* ap, int64_t o_begin,
                                                       int64_t o_end, __m512i (&sum)[MR][NR]) {
  const __m512i nibble = _mm512_set1_epi8(kS4NibbleMask);
  __m512i lo_acc[MR][NR], hi_acc[MR][NR];  // two chains halve the VPDPBUSD dependency
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) lo_acc[r][c] = hi_acc[r][c] = _mm512_setzero_si512();
  for (int64_t o = o_begin; o < o_end; ++o) {
    __m512i a_lo[MR], a_hi[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      a_lo[r] = _mm512_set1_epi32(load_u32(ap[r] + o * kS4BlockK));
      a_hi[r] = _mm512_set1_epi32(load_u32(ap[r] + o * kS4BlockK + kS8BlockK));
    }
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      const __m512i v = _mm512_loadu_si512(wp[c] + o * kS4BlockBytes);
      const __m512i lo = _mm512_and_si512(v, nibble);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        lo_acc[r][c] = _mm512_dpbusd_epi32(lo_acc[r][c], lo, a_lo[r]);
        hi_acc[r][c] = _mm512_dpbusd_epi32(hi_acc[r][c], hi, a_hi[r]);
      }
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) sum[r][c] = _mm512_add_epi32(lo_acc[r][c], hi_acc[r][c]);
}

// Out of line on purpose (the two below): inlined into the k loop, GCC 12 shuffles the
// accumulator arrays through extra moves and spills (measured ~1.5x slower).
// t[r][c] = fma(float(sums[r][c] - z'[n, g] * sum_g(a[m0 + r])), scale[n, g], t[r][c]).
template <int MR, int NR>
__attribute__((noinline)) void s4_fold_group(const GemvS4Args& args, int64_t m0, int64_t nb0,
                                             int64_t g, const int32_t (*sums)[NR][kS4BlockN],
                                             float (*t)[NR][kS4BlockN]) {
  const S4N16K8View& w = args.w;
  for (int c = 0; c < NR; ++c) {
    __m512i z;
    __m512 s;
    s4_group_meta(w, nb0 + c, g, z, s);
    for (int r = 0; r < MR; ++r) {
      const __m512i corr =
          _mm512_mullo_epi32(z, _mm512_set1_epi32(args.a_group_sum[(m0 + r) * w.groups + g]));
      const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums[r][c]), corr));
      _mm512_store_ps(t[r][c], _mm512_fmadd_ps(f, s, _mm512_load_ps(t[r][c])));
    }
  }
}

// Group g's int32 sums (registers) folded into t: spilled to `sums`, then s4_fold_group.
template <int MR, int NR>
__attribute__((always_inline)) inline void s4_end_group(const GemvS4Args& args, int64_t m0, int64_t nb0, int64_t g,
                                                        const __m512i (&acc)[MR][NR],
                                                        int32_t (*sums)[NR][kS4BlockN], float (*t)[NR][kS4BlockN]) {
  spill_tile(acc, sums);
  s4_fold_group<MR, NR>(args, m0, nb0, g, sums, t);
}

// y[m0 + r, n] = fma(t[r][c], a_scale[m0 + r], bias[n]) for the valid columns.
template <int MR, int NR>
__attribute__((noinline)) void s4_finish_tile(const GemvS4Args& args, int64_t m0, int64_t nb0,
                                              const float (*t)[NR][kS4BlockN]) {
  store_columns<MR, NR>(args.y, args.ldy, m0, nb0, args.w.n, nullptr, args.bias,
                        [&](int r, int c, __m512, __m512 b) {
                          return _mm512_fmadd_ps(_mm512_load_ps(t[r][c]),
                                                 _mm512_set1_ps(args.a_scale[m0 + r]), b);
                        });
}

// An int4 VNNI tile, groups in order: group_dot(g, acc) gives group g's int32 sums u * a per
// lane, folded into the float accumulators (in L1) with the group's zero point and scale; then
// the epilogue.
template <int MR, int NR, typename GroupDot>
__attribute__((always_inline)) inline void s4_group_tile(const GemvS4Args& args, int64_t m0, int64_t nb0,
                                                         const GroupDot& group_dot) {
  alignas(64) float t[MR][NR][kS4BlockN];
  std::memset(t, 0, sizeof(t));
  alignas(64) int32_t sums[MR][NR][kS4BlockN];
  for (int64_t g = 0; g < args.w.groups; ++g) {
    __m512i acc[MR][NR];
    group_dot(g, acc);
    s4_end_group<MR, NR>(args, m0, nb0, g, acc, sums, t);
  }
  s4_finish_tile<MR, NR>(args, m0, nb0, t);
}

}  // namespace
}  // namespace qforge::kernels::detail
