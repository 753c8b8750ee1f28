// Depthwise int8 convolution rows, AVX2: 8 channels per vector, the AVX-512 file's scheme (int8
// inputs sign-extended, int16 weights zero-extended, VPMADDWD: exact x * w per lane).
#include <immintrin.h>

#include "kernels/cpu/conv_dw_s8_rows.h"

namespace qforge::kernels::detail {
namespace {

struct Avx2 {
  static constexpr int64_t kLanes = 8;
  using Acc = __m256i;
  static Acc zero() { return _mm256_setzero_si256(); }
  static Acc mac(Acc acc, const int8_t* x, const int16_t* w) {
    const __m256i xv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x)));
    const __m256i wv = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(xv, wv));
  }
  // fmaf(float(acc) * w_scale, a_scale, bias), then max(0, v) (NaN and -0 kept).
  static void store(const ConvDwS8Args& a, Acc acc, int64_t c, float* yp) {
    const __m256 z = _mm256_setzero_ps();
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(a.w_scale + c));
    __m256 v = _mm256_fmadd_ps(t, _mm256_set1_ps(a.a_scale), a.bias != nullptr ? _mm256_loadu_ps(a.bias + c) : z);
    if (a.relu) v = _mm256_max_ps(z, v);
    _mm256_storeu_ps(yp + c, v);
  }
};

}  // namespace

void conv_dw_s8_rows_avx2(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps) {
  conv_dw_s8_rows<Avx2>(a, row_begin, row_end, y, taps);
}

}  // namespace qforge::kernels::detail
