// AVX2 block-32 activation quantization, bit-identical to quantize_rows_q8b32_reference (the
// expressions of quantize_rows_q8b32_avx512.cpp on four 8-lane vectors per block; codes packed
// with VPACKSSDW / VPACKSSWB and put back in order with one VPERMD). Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge::kernels::detail {

namespace {

constexpr int64_t kLanes = 8;
constexpr int kParts = static_cast<int>(kQ8Block / kLanes);

// Loads up to 8 floats (`valid` of them; the rest 0).
inline __m256 load_part(const float* x, int64_t valid) {
  if (valid >= kLanes) return _mm256_loadu_ps(x);
  if (valid <= 0) return _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(x, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), lane));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

bool quantize_row_q8b32_avx2(const float* x, int64_t K, int8_t* q, float* d, int32_t* s) {
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(-static_cast<float>(kActQMax)), hi = _mm256_set1_ps(static_cast<float>(kActQMax));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 nonfinite = _mm256_setzero_ps();  // x - x is 0 for finite x, NaN for Inf / NaN
  for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += kQ8Block) {
    __m256 v[kParts];
    __m256 vmax = _mm256_setzero_ps();
    for (int p = 0; p < kParts; ++p) {
      v[p] = load_part(x + k0 + p * kLanes, K - k0 - p * kLanes);
      nonfinite = _mm256_or_ps(nonfinite, _mm256_sub_ps(v[p], v[p]));
      vmax = _mm256_max_ps(vmax, _mm256_and_ps(v[p], sign_off));
    }
    const float amax = hmax(vmax);
    const float step = amax / static_cast<float>(kActQMax), inv_step = 1.0f / step;
    const bool usable = std::isfinite(inv_step);
    d[b] = usable ? step : 0.0f;
    const __m256 inv = _mm256_set1_ps(usable ? inv_step : 0.0f);
    __m256i r[kParts];
    for (int p = 0; p < kParts; ++p)
      r[p] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[p], inv), lo), hi));
    s[b] = hsum(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
    const __m256i packed =
        _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0), _mm256_permutevar8x32_epi32(packed, order));
  }
  return _mm256_movemask_ps(_mm256_cmp_ps(nonfinite, nonfinite, _CMP_UNORD_Q)) == 0;
}

}  // namespace qforge::kernels::detail
