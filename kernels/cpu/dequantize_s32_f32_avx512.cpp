// AVX-512 dequantizing epilogue: y = fmaf(float(acc) * w_scale[n], a_scale[m], bias[n]), the
// same two roundings as dequantize_s32_f32_reference. Compiled with -mavx512f (and friends).
#include <immintrin.h>

#include "kernels/cpu/dequantize_s32_f32.h"

namespace qforge::kernels::detail {

void dequantize_s32_f32_avx512(const int32_t* acc, const float* a_scale, const float* w_scale,
                               const float* bias, float* y, int64_t N, int64_t m_begin,
                               int64_t m_end) {
  constexpr int64_t kLanes = 16;
  for (int64_t m = m_begin; m < m_end; ++m) {
    const __m512 as = _mm512_set1_ps(a_scale[m]);
    for (int64_t n = 0; n < N; n += kLanes) {
      const int64_t valid = N - n;
      const __mmask16 mask =
          valid >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
      const __m512 f = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(mask, acc + m * N + n));
      const __m512 ws = _mm512_maskz_loadu_ps(mask, w_scale + n);
      const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + m * N + n, mask, _mm512_fmadd_ps(_mm512_mul_ps(f, ws), as, b));
    }
  }
}

}  // namespace qforge::kernels::detail
