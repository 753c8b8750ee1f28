// Integer 2-D convolution (Conv1d is the H = 1 case): int8 activations (static per-tensor scale,
// zero point 0) x int8 or int4 weights with per-channel scales, int32 accumulation, float out
// with the bias in the epilogue. The fast path quantizes nothing itself: it takes the int8 codes
// in channels-last order (NHWC), gathers each output pixel's receptive field into a row
// (im2col_nhwc_s8, row = (i, j, c) so every tap is C contiguous bytes) and runs the Linear GEMM
// kernels (gemv_s8s8f32 / gemv_s8s4f32) over row chunks spread across ATen's intra-op threads,
// writing float channels last (NHWC: the GEMM's [pixels, N] rows, no transpose). conv2d_s8_reference (direct loops) defines the results; the fast path
// equals it bit for bit (docs/kernels.md, "Integer convolution").
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

namespace detail {
class OneDnnConvS8;  // gemm_s8s8s32_onednn.h
}

// Fewest rows (output pixels) of an im2col chunk: the GEMM each chunk runs sees at least this
// many rows whenever the input has that many output pixels.
inline constexpr int64_t kMinConvChunkRows = 64;

// int8 weights on AVX-512 VNNI: oneDNN's int8 convolution from this many output pixels (batch x
// OH x OW) on, where it beats im2col + GEMM at the SmallCnn's shapes (qbench conv_s8_cnn,
// model_cnn_b128); below, its per-call set-up costs more than it saves (model_cnn_b1).
inline constexpr int64_t kOneDnnConvMinRows = 4096;

// Shape of one convolution; padding is zeros (code 0, the symmetric grid's zero), groups = 1.
struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, in_h = 0, in_w = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  // Grouped convolution: output channel n reads input channels [g * C / groups, (g + 1) * C / groups)
  // with g = n / (N / groups); the weight is [N, C / groups, kh, kw]. Served by oneDNN (and the
  // reference); im2col and the depthwise kernel take groups 1 (depthwise: their own flag).
  int64_t groups = 1;

  int64_t out_h() const { return (in_h + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1; }
  // GEMM view: M output pixels, K = C / groups * kh * kw taps per pixel, N output channels.
  int64_t gemm_m() const { return batch * out_h() * out_w(); }
  int64_t gemm_k() const { return in_channels / groups * kernel_h * kernel_w; }
};

// Throws qforge::Error unless every size is positive (batch may be 0), padding non-negative,
// groups dividing both channel counts and the output at least 1 x 1.
void check_conv_geometry(const ConvGeometry& g);

// Direct convolution, the definition of the results. x: int8 NCHW codes; W: int8 [N, C / groups,
// kh, kw] grid values; w_scale [N]; w_zero [N] zero points or nullptr (0); bias [N] or nullptr.
//   acc[b, n, oh, ow] = sum_{c < C / groups, i, j} x[b, c0(n) + c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] * (W[n, c, i, j] - z[n])
//                       (c0(n) = (n / (N / groups)) * C / groups: the input channels of n's group)
//                       (taps outside the input are 0; exact int32)
//   v                 = fmaf(float(acc) * w_scale[n], a_scale, bias ? bias[n] : 0.0f)
//   y[b, n, oh, ow]   = relu ? (v < 0 ? 0 : v) : v      (NaN stays NaN, as at::relu)
// (dequantize_s32_f32_reference's epilogue, which gemm_s8s4f32_reference with one group equals).
void conv2d_s8_reference(const int8_t* x, float a_scale, const int8_t* W, const float* w_scale,
                         const int32_t* w_zero, const float* bias, const ConvGeometry& g, float* y,
                         bool relu = false);

// Rows [row_begin, row_end) of the im2col matrix of channels-last codes x [B, H, W, C]: row
// r = (b * OH + oh) * OW + ow holds the kh * kw taps in (i, j) order, each C bytes (0 outside
// the input). cols is [row_end - row_begin, ldc] (ldc 0: K; columns [K, ldc) are set to 0).
void im2col_nhwc_s8(const int8_t* x_nhwc, const ConvGeometry& g, int64_t row_begin, int64_t row_end, int8_t* cols,
                    int64_t ldc = 0);

// The fast convolutions. x_nhwc: codes in [-127, 127], channels last; the packed weight holds
// W permuted to [N, kh, kw, C] (so its K order matches im2col_nhwc_s8's rows); y: float NHWC
// [B, OH, OW, N] (the reference's NCHW values, channels last).
// info receives the GEMM kernel that ran (prefixed "im2col_s8+"). The int4 weight may be packed
// with K rounded up to a multiple of 8 (zero columns; its one group is then the whole padded row),
// so the VNNI kernels, which need groups of 8, run for any C * kh * kw. relu: the reference's ReLU
// in the epilogue (applied to each row chunk right after its GEMM, while it is in cache).
// residual (a residual connection, optional): float [B, OH, OW, N] channels last, added to each
// output before the ReLU, in the same pass: y = relu((conv + bias) + residual), the values of
// at::relu(at::add(conv_output, residual)) bit for bit. It may not overlap y.
void conv2d_s8s8f32(const int8_t* x_nhwc, float a_scale, const S8N16K4View& w, const float* w_scale,
                    const float* bias, const ConvGeometry& g, float* y, bool relu = false,
                    RunInfo* info = nullptr, const float* residual = nullptr);
void conv2d_s8s4f32(const int8_t* x_nhwc, float a_scale, const S4N16K8View& w, const float* bias,
                    const ConvGeometry& g, float* y, bool relu = false, RunInfo* info = nullptr,
                    const float* residual = nullptr);

// Requantized output (static-activation chains): int8 codes for the next layer's static
// per-tensor symmetric input quantizer instead of floats, q = clamp(nearbyint(y * inv), qmin,
// qmax) of the float result y (ReLU included), inv = 1.0f / the next scale:
// quantize_static_s8_reference over the float path's output, bit for bit. Each chunk of rows is
// requantized while in cache; no float output is written. q is channels last, like y.
struct RequantOut {
  int8_t* q = nullptr;
  float inv = 0.0f;
  int qmin = -127, qmax = 127;
};
void conv2d_s8s8s8(const int8_t* x_nhwc, float a_scale, const S8N16K4View& w, const float* w_scale, const float* bias,
                   const ConvGeometry& g, const RequantOut& out, bool relu = false, RunInfo* info = nullptr);
void conv2d_s8s4s8(const int8_t* x_nhwc, float a_scale, const S4N16K8View& w, const float* bias,
                   const ConvGeometry& g, const RequantOut& out, bool relu = false, RunInfo* info = nullptr);

// oneDNN's int8 convolution (exact int32 sums, detail::onednn_conv_s8s8s32) followed by
// dequantize_s32_f32's epilogue and the ReLU: conv2d_s8_reference (w_zero 0) bit for bit, the same
// values as conv2d_s8s8f32. info->kernel is "conv_s8s8s32_onednn+<epilogue kernel>". Returns false,
// writing nothing, when oneDNN has no primitive for this input size (info->fallback says why);
// the caller then runs conv2d_s8s8f32.
bool conv2d_s8s8f32_onednn(const detail::OneDnnConvS8& w, const int8_t* x_nhwc, float a_scale, const float* w_scale,
                           const float* bias, const ConvGeometry& g, float* y, bool relu = false,
                           RunInfo* info = nullptr, const float* residual = nullptr);

bool conv2d_s8s8s8_onednn(const detail::OneDnnConvS8& w, const int8_t* x_nhwc, float a_scale, const float* w_scale,
                          const float* bias, const ConvGeometry& g, const RequantOut& out, bool relu = false,
                          RunInfo* info = nullptr);
// Both run oneDNN on sub-batches of this many whole images (the fewest calls whose int32 sums fit
// the thread's retained workspace, detail::kWorkspaceRetainBytes, balanced; the whole batch when
// one image's do not fit), so the sums are not allocated, and page-faulted in, on every call. Every sub-batch size is checked
// before any runs; where oneDNN offers only its reference for one, the whole batch runs in one call.
int64_t onednn_conv_images_per_call(const ConvGeometry& g);

// One call of the frozen integer convolution as its kernel table sees it (x null when planning:
// the entries then answer for the shape, and a oneDNN copy is assumed built for int8 weights,
// as freeze() builds one wherever this table plans it).
struct ConvS8Problem {
  const int8_t* x_nhwc = nullptr;
  float a_scale = 0.0f;
  ConvGeometry g;
  int64_t m = 0;          // output pixels (g.gemm_m(); set alone when planning)
  bool int4 = false;      // which weight: w4 (int4) or w8 with w_scale (int8)
  bool depthwise = false;  // groups == C == N: w_dw with w_scale (conv_dw_s8.h), no im2col
  const int16_t* w_dw = nullptr;  // pack_conv_dw_s8's [kh * kw, C]
  S8N16K4View w8;
  const float* w_scale = nullptr;
  S4N16K8View w4;
  const float* bias = nullptr;
  float* y = nullptr;                 // float output, or
  const RequantOut* rq = nullptr;     // int8 codes of the next quantizer
  bool relu = false;
  const float* residual = nullptr;    // float output only: [M, N] rows added before the ReLU (conv2d_s8s8f32)
  const detail::OneDnnConvS8* onednn = nullptr;  // int8 weights: oneDNN's convolution, if built
  RunInfo* info = nullptr;            // the kernel chain that ran (im2col's GEMM, oneDNN's epilogue)
};

// The ordered table: depthwise problems run conv_dw_s8 (AVX-512, AVX2, scalar rows); the others
// oneDNN's int8 convolution for large inputs, else im2col + the Linear GEMM tables
// (gemv_s8_kernels(), gemv_s4_kernels()) over row chunks.
const KernelTable<ConvS8Problem>& conv_s8_kernels();

// What an entry of conv_s8_kernels() runs, kept beside the entries (a plan's chain and whether
// freeze() must build the oneDNN copy); throws qforge::Error for an entry it does not know.
enum class ConvEntryKind : uint8_t { kIm2col, kOneDnn, kDepthwise };
ConvEntryKind conv_entry_kind(const KernelEntry<ConvS8Problem>& e);

// Runs the table's choice for p (a frozen layer's integer convolution); the oneDNN entry runs
// im2col when oneDNN has no primitive for the input size (p.info says why).
void conv2d_s8(const ConvS8Problem& p);

}  // namespace qforge::kernels
