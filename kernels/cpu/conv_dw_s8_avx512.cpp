// Depthwise int8 convolution rows, AVX-512: 16 channels per vector. A tap's 16 int8 inputs are
// sign-extended to int32 and its int16 weights zero-extended, so VPMADDWD's pair sum is x * w + 0
// (the high halves meet a zero weight half): exact int32 products.
#include <immintrin.h>

#include "kernels/cpu/conv_dw_s8_rows.h"

namespace qforge::kernels::detail {
namespace {

struct Avx512 {
  static constexpr int64_t kLanes = 16;
  using Acc = __m512i;
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc mac(Acc acc, const int8_t* x, const int16_t* w) {
    const __m512i xv = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    const __m512i wv = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(xv, wv));
  }
  // One rounding for the product, one fused multiply-add; max(0, v) keeps NaN and -0 as
  // v < 0 ? 0 : v does.
  static void store(const ConvDwS8Args& a, Acc acc, int64_t c, float* yp) {
    const __m512 z = _mm512_setzero_ps();
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(a.w_scale + c));
    __m512 v = _mm512_fmadd_ps(t, _mm512_set1_ps(a.a_scale), a.bias != nullptr ? _mm512_loadu_ps(a.bias + c) : z);
    if (a.relu) v = _mm512_max_ps(z, v);
    _mm512_storeu_ps(yp + c, v);
  }
};

}  // namespace

void conv_dw_s8_rows_avx512(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps) {
  conv_dw_s8_rows<Avx512>(a, row_begin, row_end, y, taps);
}

}  // namespace qforge::kernels::detail
