// Max pooling rows, AVX-512: 16 channels per vector, the reference's rule per lane (a tap is taken
// when greater than the running max or NaN), so the result equals it bit for bit.
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/max_pool.h"

namespace qforge::kernels::detail {

void max_pool_rows_avx512(const float* x, const PoolGeometry& g, float* y, int64_t p0, int64_t p1) {
  const int64_t C = g.channels, OH = g.out_h(), OW = g.out_w();
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t p = p0; p < p1; ++p) {
    const PoolWindow w = pool_window(g, OH, OW, p);
    float* out = y + p * C;
    for (int64_t c = 0; c < C; c += 16) {
      const __mmask16 lanes = C - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (C - c)) - 1);
      __m512 m = lowest;
      for (int64_t ih = w.h0; ih < w.h1; ih += g.dilation_h) {
        for (int64_t iw = w.w0; iw < w.w1; iw += g.dilation_w) {
          const __m512 v = _mm512_maskz_loadu_ps(lanes, x + ((w.b * g.in_h + ih) * g.in_w + iw) * C + c);
          const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          m = _mm512_mask_mov_ps(m, take, v);
        }
      }
      _mm512_mask_storeu_ps(out + c, lanes, m);
    }
  }
}

}  // namespace qforge::kernels::detail
