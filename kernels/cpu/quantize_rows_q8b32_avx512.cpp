// AVX-512 block-32 activation quantization, bit-identical to quantize_rows_q8b32_reference: the
// same float amax (max is exact in any order), the scalar step / inverse expressions, x * inv
// clamped to [-127, 127] then VCVTPS2DQ under the default MXCSR mode (round half to even, as
// nearbyint; clamping first equals clamping after, the bounds being integers), exact int32 sums.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge::kernels::detail {

namespace {

constexpr int64_t kLanes = 16;

inline __mmask16 lanes_mask(int64_t valid) {
  if (valid <= 0) return 0;
  return valid >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
}

}  // namespace

bool quantize_row_q8b32_avx512(const float* x, int64_t K, int8_t* q, float* d, int32_t* s) {
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 lo = _mm512_set1_ps(-static_cast<float>(kActQMax)), hi = _mm512_set1_ps(static_cast<float>(kActQMax));
  __m512i nonfinite = _mm512_setzero_si512();  // x - x is 0 for finite x, NaN for Inf / NaN
  for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += kQ8Block) {
    // Lanes past K load as 0: they add nothing to amax and quantize to the reference's zero padding.
    const __m512 v0 = _mm512_maskz_loadu_ps(lanes_mask(K - k0), x + k0);
    const __m512 v1 = _mm512_maskz_loadu_ps(lanes_mask(K - k0 - kLanes), x + k0 + kLanes);
    nonfinite = _mm512_or_si512(nonfinite, _mm512_castps_si512(_mm512_sub_ps(v0, v0)));
    nonfinite = _mm512_or_si512(nonfinite, _mm512_castps_si512(_mm512_sub_ps(v1, v1)));
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign_off), _mm512_and_ps(v1, sign_off)));
    const float step = amax / static_cast<float>(kActQMax), inv_step = 1.0f / step;
    const bool usable = std::isfinite(inv_step);
    d[b] = usable ? step : 0.0f;
    const __m512 inv = _mm512_set1_ps(usable ? inv_step : 0.0f);
    const __m512i r0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, inv), lo), hi));
    const __m512i r1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, inv), lo), hi));
    s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0), _mm512_cvtepi32_epi8(r0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k0 + kLanes), _mm512_cvtepi32_epi8(r1));
  }
  return _mm512_test_epi32_mask(nonfinite, nonfinite) == 0;
}

}  // namespace qforge::kernels::detail
