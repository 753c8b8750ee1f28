// Depthwise int8 convolution (groups == C == N: one kh x kw filter per channel, MobileNet's 3x3
// blocks): int8 channels-last codes x int8 per-channel weights, exact int32 sums per channel,
// the Linear epilogue (fmaf(float(acc) * w_scale, a_scale, bias)) and float channels-last out.
// No im2col: each output pixel reads its kh * kw taps as C contiguous bytes and every channel
// lane accumulates its own filter. conv2d_dw_s8_reference defines the results; the AVX-512 and
// AVX2 row kernels equal it bit for bit (docs/kernels.md, "Depthwise convolution"). No ATen here:
// the ISA files include this header.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv_s8.h"

namespace qforge::kernels {

// Throws qforge::Error unless g is a depthwise geometry (out_channels == in_channels) that
// check_conv_geometry accepts.
void check_conv_dw_geometry(const ConvGeometry& g);

// The definition of the results. x: int8 codes [B, H, W, C] (channels last); W: int8 [C, kh, kw]
// (torch's [C, 1, kh, kw] depthwise weight); w_scale [C]; bias [C] or nullptr; y float [B, OH, OW, C].
//   acc[b, oh, ow, c] = sum_{i, j} x[b, oh*sh - ph + i*dh, ow*sw - pw + j*dw, c] * W[c, i, j]
//                       (taps outside the input are 0; exact int32)
//   v                 = fmaf(float(acc) * w_scale[c], a_scale, bias ? bias[c] : 0.0f)
//   y                 = relu ? (v < 0 ? 0 : v) : v      (NaN stays NaN, as at::relu)
// conv2d_s8_reference's formula with each output channel reading only its own input channel.
void conv2d_dw_s8_reference(const int8_t* x_nhwc, float a_scale, const int8_t* W, const float* w_scale,
                            const float* bias, const ConvGeometry& g, float* y_nhwc, bool relu = false);

// The packed weight of the fast kernels: W as int16 [kh * kw, C] (tap-major, each tap's channels
// contiguous), so a tap's filter values load beside its C input bytes.
void pack_conv_dw_s8(const int8_t* W, int64_t channels, int64_t taps, int16_t* packed);

namespace detail {

// One call of the row kernels: output rows (b, oh) r in [row_begin, row_end) go to
// y + (r - row_begin) * OW * C (so a caller may hand a per-chunk buffer); taps: scratch of
// 2 * kh * kw entries for dw_pixel_taps (allocated by the caller: no std containers in ISA files).
struct ConvDwS8Args {
  const int8_t* x_nhwc = nullptr;
  float a_scale = 0.0f;
  const int16_t* w = nullptr;      // pack_conv_dw_s8's layout
  const float* w_scale = nullptr;  // [C]
  const float* bias = nullptr;     // [C] or nullptr
  ConvGeometry g;
  int64_t out_h = 0, out_w = 0;  // g.out_h(), g.out_w(): the ISA files call no inline code of ConvGeometry
  bool relu = false;
};
using ConvDwS8RowsFn = void (*)(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps);

// Channel lanes: 16 (AVX-512) or 8 (AVX2) at a time, the remainder through the scalar rows.
void conv_dw_s8_rows_scalar(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps);
void conv_dw_s8_rows_avx512(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps);
void conv_dw_s8_rows_avx2(const ConvDwS8Args& a, int64_t row_begin, int64_t row_end, float* y, int64_t* taps);

// The taps of output pixel (b, oh, ow) that fall inside the input: x_off[t] the offset of its C
// input bytes in x_nhwc, w_off[t] of its C weights in the packed weight; returns how many
// (arrays of kh * kw entries). Compiled for the baseline ISA (conv_dw_s8.cpp), so no ISA file
// defines an inline copy the linker could hand to baseline callers.
int64_t dw_pixel_taps(const ConvGeometry& g, int64_t b, int64_t oh, int64_t ow, int64_t* x_off, int64_t* w_off);

// Channels [c_begin, C) of one output pixel from its n taps (dw_pixel_taps): the scalar formula,
// for the scalar rows and the SIMD files' channel tails.
void conv_dw_s8_pixel_scalar(const ConvDwS8Args& a, const int64_t* x_off, const int64_t* w_off, int64_t n,
                             int64_t c_begin, float* y_pixel);

}  // namespace detail

// Runs `rows` over every output row of the problem p (p.depthwise set: p.w_dw, p.w_scale,
// p.bias, p.y or p.rq), rows spread over the intra-op threads; the table's depthwise entries.
// p.info (when given) receives `name`.
void conv2d_dw_s8_run(const ConvS8Problem& p, detail::ConvDwS8RowsFn rows, const char* name);

}  // namespace qforge::kernels
