// Per-group fold and final epilogue shared by the AVX-512 int4 kernels (include only from files
// compiled with AVX-512 flags). Out of line on purpose: inlined into the k loop, GCC 12 shuffles
// the accumulator arrays through extra moves and spills (measured ~1.5x slower).
#pragma once

#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"

namespace qforge::kernels::detail {
namespace {

// t[r][c] = fma(float(sums[r][c] - z'[n, g] * sum_g(a[m0 + r])), scale[n, g], t[r][c]).
template <int MR, int NR>
__attribute__((noinline)) void s4_fold_group(const GemvS4Args& args, int64_t m0, int64_t nb0,
                                             int64_t g, const int32_t (*sums)[NR][kS4BlockN],
                                             float (*t)[NR][kS4BlockN]) {
  const S4N16K8View& w = args.w;
  for (int c = 0; c < NR; ++c) {
    const int64_t meta = ((nb0 + c) * w.groups + g) * kS4BlockN;
    const __m512i z =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta)));
    // fp16 -> fp32 is exact (VCVTPH2PS, AVX-512F): the same float the reference multiplies by.
    const __m512 s =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + meta)));
    for (int r = 0; r < MR; ++r) {
      const __m512i corr =
          _mm512_mullo_epi32(z, _mm512_set1_epi32(args.a_group_sum[(m0 + r) * w.groups + g]));
      const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums[r][c]), corr));
      _mm512_store_ps(t[r][c], _mm512_fmadd_ps(f, s, _mm512_load_ps(t[r][c])));
    }
  }
}

// y[m0 + r, n] = fma(t[r][c], a_scale[m0 + r], bias[n]) for the valid columns.
template <int MR, int NR>
__attribute__((noinline)) void s4_finish_tile(const GemvS4Args& args, int64_t m0, int64_t nb0,
                                              const float (*t)[NR][kS4BlockN]) {
  for (int c = 0; c < NR; ++c) {
    const int64_t n0 = (nb0 + c) * kS4BlockN;
    const __mmask16 mask = column_mask(n0, args.w.n);
    const __m512 b =
        args.bias != nullptr ? _mm512_maskz_loadu_ps(mask, args.bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      const __m512 y =
          _mm512_fmadd_ps(_mm512_load_ps(t[r][c]), _mm512_set1_ps(args.a_scale[m0 + r]), b);
      _mm512_mask_storeu_ps(args.y + (m0 + r) * args.ldy + n0, mask, y);
    }
  }
}

}  // namespace
}  // namespace qforge::kernels::detail
