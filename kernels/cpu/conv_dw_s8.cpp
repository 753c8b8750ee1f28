// Depthwise int8 convolution: packing, the scalar rows and the dispatcher over output rows.
#include "kernels/cpu/conv_dw_s8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge::kernels {

void check_conv_dw_geometry(const ConvGeometry& g) {
  check_conv_geometry(g);
  QF_REQUIRE(g.out_channels == g.in_channels, "kernels/cpu: depthwise convolution needs as many output channels as ",
             "input channels (one filter each), got ", g.in_channels, " -> ", g.out_channels);
}

void pack_conv_dw_s8(const int8_t* W, int64_t channels, int64_t taps, int16_t* packed) {
  for (int64_t t = 0; t < taps; ++t) {
    for (int64_t c = 0; c < channels; ++c) packed[t * channels + c] = W[c * taps + t];
  }
}

namespace detail {

int64_t dw_pixel_taps(const ConvGeometry& g, int64_t b, int64_t oh, int64_t ow, int64_t* x_off, int64_t* w_off) {
  int64_t n = 0;
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
    if (ih < 0 || ih >= g.in_h) continue;
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
      if (iw < 0 || iw >= g.in_w) continue;
      x_off[n] = ((b * g.in_h + ih) * g.in_w + iw) * g.in_channels;
      w_off[n++] = (i * g.kernel_w + j) * g.in_channels;
    }
  }
  return n;
}

void conv_dw_s8_pixel_scalar(const ConvDwS8Args& a, const int64_t* x_off, const int64_t* w_off, int64_t n,
                             int64_t c_begin, float* y_pixel) {
  for (int64_t c = c_begin; c < a.g.in_channels; ++c) {
    int32_t acc = 0;
    for (int64_t t = 0; t < n; ++t) acc += int32_t{a.x_nhwc[x_off[t] + c]} * int32_t{a.w[w_off[t] + c]};
    const float t = static_cast<float>(acc) * a.w_scale[c];
    const float v = std::fmaf(t, a.a_scale, a.bias != nullptr ? a.bias[c] : 0.0f);
    y_pixel[c] = a.relu && v < 0.0f ? 0.0f : v;
  }
}

void conv_dw_s8_rows_scalar(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps) {
  const int64_t OH = a.out_h, OW = a.out_w, C = a.g.in_channels, kt = a.g.kernel_h * a.g.kernel_w;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t ow = 0; ow < OW; ++ow) {
      const int64_t n = dw_pixel_taps(a.g, r / OH, r % OH, ow, taps, taps + kt);
      conv_dw_s8_pixel_scalar(a, taps, taps + kt, n, 0, y + ((r - row_begin) * OW + ow) * C);
    }
  }
}

}  // namespace detail

void conv2d_dw_s8_run(const ConvS8Problem& p, detail::ConvDwS8RowsFn rows, const char* name) {
  const ConvGeometry& g = p.g;
  check_conv_dw_geometry(g);
  if (p.info != nullptr) *p.info = RunInfo{name, {}};
  if (g.batch == 0) return;  // no output rows
  QF_REQUIRE(p.w_dw != nullptr && p.w_scale != nullptr && (p.y != nullptr || p.rq != nullptr),
             "kernels/cpu: depthwise convolution needs its packed weight, scales and an output");
  detail::ConvDwS8Args a;
  a.x_nhwc = p.x_nhwc;
  a.a_scale = p.a_scale;
  a.w = p.w_dw;
  a.w_scale = p.w_scale;
  a.bias = p.bias;
  a.g = g;
  a.out_h = g.out_h();
  a.out_w = g.out_w();
  a.relu = p.relu;
  const int64_t row_len = g.out_w() * g.out_channels;  // floats of one output row (b, oh)
  const int64_t macs_per_row = row_len * g.kernel_h * g.kernel_w;
  detail::parallel_over_blocks(g.batch * g.out_h(), macs_per_row, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> taps(static_cast<size_t>(2 * g.kernel_h * g.kernel_w));
    if (p.rq == nullptr) return rows(a, r0, r1, p.y + r0 * row_len, taps.data());
    // Requantized output: each row leaves as the next quantizer's codes while in cache.
    std::vector<float> buf(static_cast<size_t>(row_len));
    for (int64_t r = r0; r < r1; ++r) {
      rows(a, r, r + 1, buf.data(), taps.data());
      quantize_static_s8(buf.data(), row_len, p.rq->inv, p.rq->qmin, p.rq->qmax, p.rq->q + r * row_len);
    }
  });
}

}  // namespace qforge::kernels
