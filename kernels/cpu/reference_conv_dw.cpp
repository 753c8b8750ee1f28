// Scalar reference of the depthwise int8 convolution: direct loops over torch's weight layout.
#include <cmath>

#include "kernels/cpu/conv_dw_s8.h"

namespace qforge::kernels {

void conv2d_dw_s8_reference(const int8_t* x, float a_scale, const int8_t* W, const float* w_scale,
                            const float* bias, const ConvGeometry& g, float* y, bool relu) {
  check_conv_dw_geometry(g);
  const int64_t C = g.in_channels, H = g.in_h, Wd = g.in_w;
  const int64_t OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        for (int64_t c = 0; c < C; ++c) {
          int32_t acc = 0;
          for (int64_t i = 0; i < KH; ++i) {
            const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (ih < 0 || ih >= H) continue;
            for (int64_t j = 0; j < KW; ++j) {
              const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
              if (iw < 0 || iw >= Wd) continue;
              acc += int32_t{x[((b * H + ih) * Wd + iw) * C + c]} * int32_t{W[(c * KH + i) * KW + j]};
            }
          }
          const float t = static_cast<float>(acc) * w_scale[c];
          const float v = std::fmaf(t, a_scale, bias != nullptr ? bias[c] : 0.0f);
          y[((b * OH + oh) * OW + ow) * C + c] = relu && v < 0.0f ? 0.0f : v;
        }
      }
    }
  }
}

}  // namespace qforge::kernels
