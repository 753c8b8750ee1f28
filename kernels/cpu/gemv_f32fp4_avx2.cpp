// AVX2 MXFP4 / NVFP4 weight-only GEMV: 16 codes from 8 bytes, decoded by VPERMPS over the E2M1
// magnitudes with the sign from bit 3; the float order of linear_f32fp4_reference (fp4_linear.h).
#include <immintrin.h>

#include "framework/core/qtype.h"
#include "kernels/cpu/fp4_layout.h"

namespace qforge::kernels::detail {

namespace {

// E2M1 values of 8 int32 codes (bits above 3 ignored): magnitude by code & 7, sign by code & 8.
inline __m256 decode(__m256i codes, __m256 magnitudes) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
  return _mm256_xor_ps(_mm256_permutevar8x32_ps(magnitudes, codes), _mm256_castsi256_ps(sign));
}

// acc[l] + acc[l + 4], then + 2, then + 1: the reference's pairwise lane sum.
inline float lane_sum(__m256 acc) {
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
  return _mm_cvtss_f32(v);
}

}  // namespace

void gemv_f32fp4_avx2(const Fp4Args& a, int64_t n0, int64_t n1) {
  const __m256 magnitudes = _mm256_loadu_ps(kE2M1Values);  // codes 0..7
  const int64_t blocks = a.k / a.block, chunks = a.block / kFp4Chunk;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = a.packed + n * (a.k / 2);
    const float* s = a.scales + n * blocks;
    for (int64_t m = 0; m < a.m; ++m) {
      const float* x = a.x + m * a.ldx;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        __m256 t = _mm256_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t k0 = b * a.block + c * kFp4Chunk;
          const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k0 / 2)));
          t = _mm256_fmadd_ps(_mm256_loadu_ps(x + k0), decode(bytes, magnitudes), t);
          t = _mm256_fmadd_ps(_mm256_loadu_ps(x + k0 + kFp4Lanes), decode(_mm256_srli_epi32(bytes, 4), magnitudes), t);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(s[b]), t, acc);
      }
      const float r = lane_sum(acc);
      a.y[m * a.ldy + n] = a.bias ? r + a.bias[n] : r;
    }
  }
}

}  // namespace qforge::kernels::detail
