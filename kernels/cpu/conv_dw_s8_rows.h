// The row loop of the depthwise int8 kernels, shared by the ISA files (each instantiates it with
// its own vector type, compiled with its own flags). V: kLanes channels per vector, Acc, zero(),
// mac(acc, x bytes, int16 weights) (exact int32 x * w per lane), store(args, acc, c, y_pixel)
// (the reference's epilogue). Four vectors per step where C allows, then one, then the scalar tail.
#pragma once

#include "kernels/cpu/conv_dw_s8.h"

namespace qforge::kernels::detail {

template <class V>
void conv_dw_s8_rows(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps) {
  constexpr int64_t L = V::kLanes;
  const ConvGeometry& g = a.g;
  const int64_t C = g.in_channels, OH = a.out_h, OW = a.out_w;
  int64_t* x_off = taps;
  int64_t* w_off = taps + g.kernel_h * g.kernel_w;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t b = r / OH, oh = r % OH;
    for (int64_t ow = 0; ow < OW; ++ow) {
      const int64_t n = dw_pixel_taps(g, b, oh, ow, x_off, w_off);
      float* yp = y + ((r - row_begin) * OW + ow) * C;
      int64_t c = 0;
      for (; c + 4 * L <= C; c += 4 * L) {
        typename V::Acc acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
        for (int64_t t = 0; t < n; ++t) {
          for (int k = 0; k < 4; ++k) acc[k] = V::mac(acc[k], a.x_nhwc + x_off[t] + c + L * k, a.w + w_off[t] + c + L * k);
        }
        for (int k = 0; k < 4; ++k) V::store(a, acc[k], c + L * k, yp);
      }
      for (; c + L <= C; c += L) {
        typename V::Acc acc = V::zero();
        for (int64_t t = 0; t < n; ++t) acc = V::mac(acc, a.x_nhwc + x_off[t] + c, a.w + w_off[t] + c);
        V::store(a, acc, c, yp);
      }
      if (c < C) conv_dw_s8_pixel_scalar(a, x_off, w_off, n, c, yp);
    }
  }
}

}  // namespace qforge::kernels::detail
