// AVX-512 activation quantization. Dynamic: bit-identical to quantize_rows_s8_reference:
// the same float amax, scale = amax / qmax (127 unless narrower), inv = 1 / scale (scalar), product
// x * inv, VCVTPS2DQ under the default MXCSR mode (round half to even, as nearbyint), clamp to
// [-qmax, qmax] (clipped rows go through quantize_clamp_avx512, clamped before the conversion).
// Static (quantize_clamp_avx512): bit-identical to quantize_static_s8_reference.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge::kernels::detail {

namespace {

constexpr int64_t kLanes = 16;

inline __mmask16 tail_mask(int64_t valid) {
  return valid >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
}

}  // namespace

bool row_amax_avx512(const float* x, int64_t K, float* amax) {
  const __m512 sign_off = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  __m512 vmax = _mm512_setzero_ps();
  __m512i nonfinite = _mm512_setzero_si512();  // x - x is 0 for finite x, NaN for Inf / NaN
  for (int64_t k = 0; k < K; k += kLanes) {
    const __m512 v = _mm512_maskz_loadu_ps(tail_mask(K - k), x + k);
    vmax = _mm512_max_ps(vmax, _mm512_and_ps(v, sign_off));
    nonfinite = _mm512_or_si512(nonfinite, _mm512_castps_si512(_mm512_sub_ps(v, v)));
  }
  *amax = _mm512_reduce_max_ps(vmax);
  return _mm512_test_epi32_mask(nonfinite, nonfinite) == 0;
}

void quantize_row_avx512(const float* x, int64_t K, float inv, int8_t* q, int64_t ldq, int qmax) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-qmax), hi = _mm512_set1_epi32(qmax);
  for (int64_t k = 0; k < K; k += kLanes) {
    const __mmask16 mask = tail_mask(K - k);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + k);
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));
    r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
    _mm512_mask_cvtepi32_storeu_epi8(q + k, mask, r);
  }
  if (ldq > K) std::memset(q + K, 0, static_cast<size_t>(ldq - K));
}

bool quantize_clamp_avx512(const float* x, int64_t n, float inv, int qmin, int qmax, int8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 lo = _mm512_set1_ps(static_cast<float>(qmin)), hi = _mm512_set1_ps(static_cast<float>(qmax));
  __m512i nonfinite = _mm512_setzero_si512();
  for (int64_t k = 0; k < n; k += kLanes) {
    const __mmask16 mask = tail_mask(n - k);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + k);
    nonfinite = _mm512_or_si512(nonfinite, _mm512_castps_si512(_mm512_sub_ps(v, v)));
    // Clamping before rounding equals the reference's clamp after it (the bounds are integers,
    // rounding is monotonic) and keeps VCVTPS2DQ in range (it returns INT_MIN beyond 2^31).
    const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, vinv), lo), hi);
    _mm512_mask_cvtepi32_storeu_epi8(q + k, mask, _mm512_cvtps_epi32(c));
  }
  return _mm512_test_epi32_mask(nonfinite, nonfinite) == 0;
}

}  // namespace qforge::kernels::detail
