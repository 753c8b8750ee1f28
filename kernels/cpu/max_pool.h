// Max pooling over float channels-last activations (the pooling between integer convolutions,
// whose outputs are channels last): ATen's max_pool2d values bit for bit. Each output is the
// running max over its window's taps in row-major order, a tap taken when it is greater than the
// running max or NaN (so NaN propagates), starting from -infinity; padding taps are skipped.
// max_pool2d_nhwc_f32_reference defines the result; the AVX-512 rows equal it bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"

namespace qforge::kernels {

struct PoolGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool ceil_mode = false;
  // ATen's pooling_output_shape: floor (or ceil) of the dilated window's positions; in ceil mode
  // a last window starting in the right padding is dropped.
  int64_t out_h() const;
  int64_t out_w() const;
};

// Throws qforge::Error naming the field when g is not a valid pooling (ATen's checks: positive
// kernel, stride, dilation; padding at most half the kernel; an output of at least 1 x 1).
void check_pool_geometry(const PoolGeometry& g);

// x [B, H, W, C] -> y [B, OH, OW, C], both dense channels last.
void max_pool2d_nhwc_f32_reference(const float* x, const PoolGeometry& g, float* y);

struct MaxPoolProblem {
  const float* x = nullptr;
  PoolGeometry g;
  float* y = nullptr;
};
// max_pool_f32_avx512 -> max_pool_f32_reference.
const KernelTable<MaxPoolProblem>& max_pool_kernels();
// The table's choice, output pixels split over the intra-op threads.
void max_pool2d_nhwc_f32(const float* x, const PoolGeometry& g, float* y, RunInfo* info = nullptr);

namespace detail {
// Output pixels [p0, p1) (p = (b * OH + oh) * OW + ow), every channel.
void max_pool_rows_scalar(const float* x, const PoolGeometry& g, float* y, int64_t p0, int64_t p1);
void max_pool_rows_avx512(const float* x, const PoolGeometry& g, float* y, int64_t p0, int64_t p1);
// Output pixel p's image b and window: input rows [h0, h1) and columns [w0, w1), stepping by the
// dilation (ATen's clipping: the first tap inside the input, the end clipped to it).
struct PoolWindow {
  int64_t b = 0, h0 = 0, h1 = 0, w0 = 0, w1 = 0;
};
inline PoolWindow pool_window(const PoolGeometry& g, int64_t OH, int64_t OW, int64_t p) {
  const auto axis = [](int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t dilation, int64_t size,
                       int64_t* begin, int64_t* end) {
    int64_t first = o * stride - pad;
    *end = first + (kernel - 1) * dilation + 1 < size ? first + (kernel - 1) * dilation + 1 : size;
    while (first < 0) first += dilation;
    *begin = first;
  };
  PoolWindow w;
  w.b = p / (OH * OW);
  axis(p / OW % OH, g.stride_h, g.pad_h, g.kernel_h, g.dilation_h, g.in_h, &w.h0, &w.h1);
  axis(p % OW, g.stride_w, g.pad_w, g.kernel_w, g.dilation_w, g.in_w, &w.w0, &w.w1);
  return w;
}
}  // namespace detail

}  // namespace qforge::kernels
