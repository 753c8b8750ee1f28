// Integer convolution: the direct reference, channels-last im2col, and the chunked fast path
// over the Linear GEMM kernels.
#include "kernels/cpu/conv_s8.h"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/conv_dw_s8.h"
#include "kernels/cpu/dequantize_s32_f32.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

void check_conv_geometry(const ConvGeometry& g) {
  QF_REQUIRE(g.batch >= 0 && g.in_channels > 0 && g.in_h > 0 && g.in_w > 0 && g.out_channels > 0 &&
                 g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 && g.stride_w > 0 && g.dilation_h > 0 &&
                 g.dilation_w > 0 && g.pad_h >= 0 && g.pad_w >= 0,
             "kernels/cpu: convolution geometry has a non-positive size (batch ", g.batch, ", C ", g.in_channels,
             ", H ", g.in_h, ", W ", g.in_w, ", N ", g.out_channels, ", kernel ", g.kernel_h, "x", g.kernel_w,
             ", stride ", g.stride_h, "x", g.stride_w, ", dilation ", g.dilation_h, "x", g.dilation_w,
             ") or negative padding");
  QF_REQUIRE(g.groups >= 1 && g.in_channels % g.groups == 0 && g.out_channels % g.groups == 0,
             "kernels/cpu: convolution groups ", g.groups, " must divide the input and output channels (", g.in_channels,
             ", ", g.out_channels, ")");
  QF_REQUIRE(g.out_h() >= 1 && g.out_w() >= 1, "kernels/cpu: convolution input ", g.in_h, "x", g.in_w,
             " (padded by ", g.pad_h, "x", g.pad_w, ") is smaller than the dilated kernel");
}

void conv2d_s8_reference(const int8_t* x, float a_scale, const int8_t* W, const float* w_scale,
                         const int32_t* w_zero, const float* bias, const ConvGeometry& g, float* y,
                         bool relu) {
  check_conv_geometry(g);
  const int64_t C = g.in_channels, H = g.in_h, Wd = g.in_w, N = g.out_channels;
  const int64_t OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int64_t Cg = C / g.groups, Ng = N / g.groups;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const int32_t z = w_zero != nullptr ? w_zero[n] : 0;
      const int64_t c0 = n / Ng * Cg;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          int32_t acc = 0;
          for (int64_t c = 0; c < Cg; ++c) {
            for (int64_t i = 0; i < KH; ++i) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
              if (ih < 0 || ih >= H) continue;
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
                if (iw < 0 || iw >= Wd) continue;
                const int32_t a = x[((b * C + c0 + c) * H + ih) * Wd + iw];
                const int32_t w = W[((n * Cg + c) * KH + i) * KW + j];
                acc += a * (w - z);
              }
            }
          }
          const float t = static_cast<float>(acc) * w_scale[n];
          const float v = std::fmaf(t, a_scale, bias != nullptr ? bias[n] : 0.0f);
          y[((b * N + n) * OH + oh) * OW + ow] = relu && v < 0.0f ? 0.0f : v;
        }
      }
    }
  }
}

void im2col_nhwc_s8(const int8_t* x, const ConvGeometry& g, int64_t row_begin, int64_t row_end, int8_t* cols,
                    int64_t ldc) {
  const int64_t C = g.in_channels, H = g.in_h, Wd = g.in_w;
  const int64_t OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int64_t K = C * KH * KW;
  if (ldc == 0) ldc = K;
  QF_REQUIRE(ldc >= K, "kernels/cpu: im2col_nhwc_s8 row stride ", ldc, " < K ", K);
  const size_t tap = static_cast<size_t>(C);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t b = r / (OH * OW), p = r % (OH * OW), oh = p / OW, ow = p % OW;
    int8_t* dst = cols + (r - row_begin) * ldc;
    if (ldc > K) std::memset(dst + K, 0, static_cast<size_t>(ldc - K));
    const int64_t iw0 = ow * g.stride_w - g.pad_w;
    const bool row_inside = iw0 >= 0 && iw0 + (KW - 1) * g.dilation_w < Wd;
    for (int64_t i = 0; i < KH; ++i, dst += KW * C) {
      const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
      if (ih < 0 || ih >= H) {
        std::memset(dst, 0, tap * static_cast<size_t>(KW));
        continue;
      }
      const int8_t* src_row = x + (b * H + ih) * Wd * C;
      if (row_inside && g.dilation_w == 1) {
        // The kw taps are adjacent pixels: kw * C contiguous bytes.
        std::memcpy(dst, src_row + iw0 * C, tap * static_cast<size_t>(KW));
        continue;
      }
      for (int64_t j = 0; j < KW; ++j) {
        const int64_t iw = iw0 + j * g.dilation_w;
        if (iw < 0 || iw >= Wd) {
          std::memset(dst + j * C, 0, tap);
        } else {
          std::memcpy(dst + j * C, src_row + iw * C, tap);
        }
      }
    }
  }
}

namespace {

// The reference's ReLU, v < 0 ? 0 : v (NaN stays NaN, as at::relu). An unconditional store: a
// select the compiler vectorises (a branch per element mispredicts on half the outputs).
void relu_in_place(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
}

// A chunk's epilogue after its float rows: + residual (at::add's a + b), the ReLU, the codes.
void finish_rows(float* out, int64_t n, const float* residual, bool relu, const RequantOut* rq, int8_t* q) {
  if (residual != nullptr)
    for (int64_t i = 0; i < n; ++i) out[i] += residual[i];
  if (relu) relu_in_place(out, n);  // the chunk is still in cache
  if (rq != nullptr) quantize_static_s8(out, n, rq->inv, rq->qmin, rq->qmax, q);
}

// Rows per chunk: about 256 KiB of im2col bytes (in L2 with its output), yet at least 4 chunks
// per intra-op thread when M allows, so threads finish together; never below kMinConvChunkRows.
int64_t chunk_rows(int64_t K, int64_t M) {
  const int64_t by_cache = (int64_t{256} << 10) / std::max<int64_t>(1, K);
  const int64_t by_threads = (M + 4 * parallel_threads() - 1) / (4 * parallel_threads());
  return std::max<int64_t>(kMinConvChunkRows, std::min(by_cache, by_threads));
}

// im2col + gemm(chunk) (+ ReLU) for every chunk, chunks spread over the intra-op threads.
// K: the packed weight's row length (the geometry's K, or more: zero columns).
// With rq: each chunk's float rows go to a per-thread buffer and leave as rq's int8 codes.
// With residual (float output only): its rows are added before the ReLU.
template <class Gemm>
void conv_chunks(const int8_t* x_nhwc, float a_scale, const ConvGeometry& g, int64_t N, int64_t K, float* y,
                 bool relu, RunInfo* info, const Gemm& gemm, const RequantOut* rq = nullptr,
                 const float* residual = nullptr) {
  QF_CHECK(rq == nullptr || residual == nullptr, "conv_chunks: a residual needs float output");
  check_conv_geometry(g);
  const int64_t M = g.gemm_m();
  const int64_t rows = chunk_rows(K, M);
  const int64_t chunks = (M + rows - 1) / rows;
  RunInfo first;  // chunk 0's: every chunk runs the same kernel chain on the same weight
  detail::parallel_over(chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<int8_t> cols(static_cast<size_t>(rows * K));
    const std::vector<float> scale(static_cast<size_t>(rows), a_scale);
    std::vector<float> buf(rq != nullptr ? static_cast<size_t>(rows * N) : 0);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * rows, r1 = std::min(M, r0 + rows);
      im2col_nhwc_s8(x_nhwc, g, r0, r1, cols.data(), K);
      RunInfo ri;
      // Row r of the GEMM is output pixel r: [M, N] row-major is y in channels-last order.
      float* out = rq != nullptr ? buf.data() : y + r0 * N;
      gemm(cols.data(), r1 - r0, scale.data(), out, &ri);
      finish_rows(out, (r1 - r0) * N, residual != nullptr ? residual + r0 * N : nullptr, relu, rq,
                  rq != nullptr ? rq->q + r0 * N : nullptr);
      if (c == 0) first = std::move(ri);
    }
  });
  if (info != nullptr) {
    *info = first;
    info->kernel = "im2col_s8+" + (chunks > 0 ? first.kernel : std::string("none (empty batch)"));
  }
}

// The packed weight is [N, K'] with K' = C * kh * kw, or (round_up_to) K rounded up with zero
// columns.
void check_weight(int64_t n, int64_t k, const ConvGeometry& g, int64_t round_up_to) {
  QF_REQUIRE(g.groups == 1, "kernels/cpu: im2col convolutions take groups 1 (got ", g.groups,
             "): a grouped convolution runs oneDNN's grouped primitive or one call per group");
  const int64_t K = g.gemm_k();
  QF_REQUIRE(n == g.out_channels && (k == K || k == round_up(K, round_up_to)), "kernels/cpu: convolution packed weight is [",
             n, ", ", k, "], the geometry needs [", g.out_channels, ", ", K, "] (C * kh * kw",
             round_up_to > 1 ? ", or K rounded up to a multiple of " + std::to_string(round_up_to) : std::string(),
             ")");
}

}  // namespace

void conv2d_s8s8f32(const int8_t* x_nhwc, float a_scale, const S8N16K4View& w, const float* w_scale,
                    const float* bias, const ConvGeometry& g, float* y, bool relu, RunInfo* info,
                    const float* residual) {
  check_weight(w.n, w.k, g, 1);
  conv_chunks(
      x_nhwc, a_scale, g, w.n, w.k, y, relu, info,
      [&](const int8_t* a, int64_t m, const float* s, float* out, RunInfo* ri) {
        gemv_s8s8f32(a, m, s, w, w_scale, bias, out, ri);
      },
      nullptr, residual);
}

void conv2d_s8s4f32(const int8_t* x_nhwc, float a_scale, const S4N16K8View& w, const float* bias,
                    const ConvGeometry& g, float* y, bool relu, RunInfo* info, const float* residual) {
  check_weight(w.n, w.k, g, kS4BlockK);
  conv_chunks(
      x_nhwc, a_scale, g, w.n, w.k, y, relu, info,
      [&](const int8_t* a, int64_t m, const float* s, float* out, RunInfo* ri) {
        gemv_s8s4f32(a, m, s, w, bias, out, ri);
      },
      nullptr, residual);
}

namespace {
void check_requant(const RequantOut& rq) {
  QF_REQUIRE(rq.q != nullptr && -128 <= rq.qmin && rq.qmin <= rq.qmax && rq.qmax <= 127 && std::isfinite(rq.inv) &&
                 rq.inv > 0.0f,
             "kernels/cpu: requantized convolution output needs codes, a finite positive 1/scale and a grid within "
             "int8, got [", rq.qmin, ", ", rq.qmax, "] and 1/scale ", rq.inv);
}
}  // namespace

void conv2d_s8s8s8(const int8_t* x_nhwc, float a_scale, const S8N16K4View& w, const float* w_scale, const float* bias,
                   const ConvGeometry& g, const RequantOut& out, bool relu, RunInfo* info) {
  check_weight(w.n, w.k, g, 1);
  check_requant(out);
  conv_chunks(x_nhwc, a_scale, g, w.n, w.k, nullptr, relu, info,
              [&](const int8_t* a, int64_t m, const float* s, float* o, RunInfo* ri) {
                gemv_s8s8f32(a, m, s, w, w_scale, bias, o, ri);
              },
              &out);
}

void conv2d_s8s4s8(const int8_t* x_nhwc, float a_scale, const S4N16K8View& w, const float* bias,
                   const ConvGeometry& g, const RequantOut& out, bool relu, RunInfo* info) {
  check_weight(w.n, w.k, g, kS4BlockK);
  check_requant(out);
  conv_chunks(x_nhwc, a_scale, g, w.n, w.k, nullptr, relu, info,
              [&](const int8_t* a, int64_t m, const float* s, float* o, RunInfo* ri) {
                gemv_s8s4f32(a, m, s, w, bias, o, ri);
              },
              &out);
}

// A fresh allocation of a call's int32 sums is returned to the system after the call and
// page-faulted in again by the next, which costs more than the convolution (MobileNetV2 at batch
// 32; ResNet-18 on 224 x 224 inputs at batch 8: 12 500 faults and 290 ms per forward, 58 ms once
// the sums fit the retained buffer).
int64_t onednn_conv_images_per_call(const ConvGeometry& g) {
  const int64_t batch = std::max<int64_t>(1, g.batch);
  const int64_t image_bytes = g.out_h() * g.out_w() * g.out_channels * static_cast<int64_t>(sizeof(int32_t));
  // One image above the retained size: no sub-batch fits, and smaller calls only add set-up.
  if (image_bytes > static_cast<int64_t>(detail::kWorkspaceRetainBytes)) return batch;
  const int64_t fit = std::clamp<int64_t>(
      static_cast<int64_t>(detail::kWorkspaceRetainBytes) / std::max<int64_t>(1, image_bytes), 1, batch);
  const int64_t calls = (batch + fit - 1) / fit;
  return (batch + calls - 1) / calls;  // the same number of calls, balanced: 128 at 83 a call -> 64 + 64
}

namespace {
// oneDNN's s32 sums, a sub-batch of images at a time (onednn_conv_images_per_call), then per chunk of
// rows: the epilogue, the ReLU and, with rq, the codes. A refusal writes nothing.
bool onednn_conv(const detail::OneDnnConvS8& w, const int8_t* x_nhwc, float a_scale, const float* w_scale,
                 const float* bias, const ConvGeometry& g, float* y, const RequantOut* rq, bool relu, RunInfo* info,
                 const float* residual = nullptr) {
  check_conv_geometry(g);
  if (rq != nullptr) check_requant(*rq);
  QF_CHECK(rq == nullptr || residual == nullptr, "onednn_conv: a residual needs float output");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  const int64_t M = g.gemm_m(), N = g.out_channels;
  if (M == 0) {
    ri.kernel = "conv_s8s8s32_onednn";
    return true;
  }
  // Every sub-batch size's primitive is found (and held) before any runs. oneDNN may offer only
  // its reference for a sub-batch size (with the packed weight format) and a real kernel for the
  // whole batch: then the whole batch runs in one call, its sums allocated for the call.
  using Primitive = std::shared_ptr<const detail::OneDnnConvPrimitive>;
  std::string why, sub_why;
  Primitive full, last;  // a call's, the last call's
  const auto find = [&](int64_t images, std::string* reason) {
    ConvGeometry sub = g;
    sub.batch = images;
    full = detail::onednn_conv_primitive(w, sub, reason);
    sub.batch = g.batch - (g.batch - 1) / images * images;
    last = full == nullptr || sub.batch == images ? full : detail::onednn_conv_primitive(w, sub, reason);
    return full != nullptr && last != nullptr;
  };
  int64_t images = onednn_conv_images_per_call(g);
  if (!find(images, &sub_why)) {
    if (images == g.batch || !find(g.batch, &why)) {
      ri.skip("conv_s8s8s32_onednn", why.empty() ? sub_why : why);
      return false;
    }
    images = g.batch;
  }
  const int64_t image_rows = g.out_h() * g.out_w(), image_in = g.in_h * g.in_w * g.in_channels;
  constexpr int64_t kRows = 256;
  const std::vector<float> a(static_cast<size_t>(kRows), a_scale);
  RunInfo epilogue;
  for (int64_t b0 = 0; b0 < g.batch; b0 += images) {
    ConvGeometry sub = g;
    sub.batch = std::min(images, g.batch - b0);
    const int64_t rows = sub.gemm_m(), row0 = b0 * image_rows;
    // Uninitialised (oneDNN writes every element): the thread's retained buffer where it fits.
    const detail::ScratchArray<int32_t> acc(detail::Scratch::kAccumulators, rows * N);
    detail::onednn_conv_run(w, sub.batch == images ? *full : *last, x_nhwc + b0 * image_in, acc.data());
    detail::parallel_over((rows + kRows - 1) / kRows, 1, [&](int64_t c0, int64_t c1) {
      std::vector<float> buf(rq != nullptr ? static_cast<size_t>(kRows * N) : 0);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t r0 = c * kRows, n = std::min(rows, r0 + kRows) - r0;
        float* out = rq != nullptr ? buf.data() : y + (row0 + r0) * N;
        RunInfo e;
        dequantize_s32_f32(acc.data() + r0 * N, a.data(), w_scale, bias, out, n, N, &e);
        finish_rows(out, n * N, residual != nullptr ? residual + (row0 + r0) * N : nullptr, relu, rq,
                    rq != nullptr ? rq->q + (row0 + r0) * N : nullptr);
        if (b0 == 0 && c == 0) epilogue = std::move(e);
      }
    });
  }
  ri.kernel = "conv_s8s8s32_onednn+" + epilogue.kernel;
  ri.fallback = epilogue.fallback;
  if (images == g.batch && !sub_why.empty())
    ri.fallback = "one call for the whole batch (sub-batches: " + sub_why + ")" +
                  (ri.fallback.empty() ? "" : "; " + ri.fallback);
  return true;
}
}  // namespace

bool conv2d_s8s8f32_onednn(const detail::OneDnnConvS8& w, const int8_t* x_nhwc, float a_scale, const float* w_scale,
                           const float* bias, const ConvGeometry& g, float* y, bool relu, RunInfo* info,
                           const float* residual) {
  return onednn_conv(w, x_nhwc, a_scale, w_scale, bias, g, y, nullptr, relu, info, residual);
}

bool conv2d_s8s8s8_onednn(const detail::OneDnnConvS8& w, const int8_t* x_nhwc, float a_scale, const float* w_scale,
                          const float* bias, const ConvGeometry& g, const RequantOut& out, bool relu, RunInfo* info) {
  return onednn_conv(w, x_nhwc, a_scale, w_scale, bias, g, nullptr, &out, relu, info);
}

namespace {

void run_im2col(const ConvS8Problem& p) {
  if (p.int4) {
    if (p.rq != nullptr) return conv2d_s8s4s8(p.x_nhwc, p.a_scale, p.w4, p.bias, p.g, *p.rq, p.relu, p.info);
    return conv2d_s8s4f32(p.x_nhwc, p.a_scale, p.w4, p.bias, p.g, p.y, p.relu, p.info, p.residual);
  }
  if (p.rq != nullptr) return conv2d_s8s8s8(p.x_nhwc, p.a_scale, p.w8, p.w_scale, p.bias, p.g, *p.rq, p.relu, p.info);
  conv2d_s8s8f32(p.x_nhwc, p.a_scale, p.w8, p.w_scale, p.bias, p.g, p.y, p.relu, p.info, p.residual);
}

// oneDNN's convolution is for int8 weights and large inputs; smaller ones run im2col, not as a
// fallback but by design (its per-call set-up outweighs the gain there).
// Grouped convolutions (groups > 1, not depthwise) have no im2col entry: oneDNN serves them at
// every size (the framework runs one im2col convolution per group where it cannot).
bool onednn_conv_serves(const ConvS8Problem& p) {
  return !p.int4 && !p.depthwise && (p.g.groups > 1 || p.m >= kOneDnnConvMinRows);
}

bool im2col_serves(const ConvS8Problem& p) { return !p.depthwise && p.g.groups == 1; }
bool depthwise_serves(const ConvS8Problem& p) { return p.depthwise && !p.int4; }  // int8 weights only

void run_dw_scalar(const ConvS8Problem& p) { conv2d_dw_s8_run(p, detail::conv_dw_s8_rows_scalar, "conv_dw_s8"); }
#ifdef QFORGE_KERNELS_AVX512
void run_dw_avx512(const ConvS8Problem& p) { conv2d_dw_s8_run(p, detail::conv_dw_s8_rows_avx512, "conv_dw_s8_avx512"); }
#endif
#ifdef QFORGE_KERNELS_AVX2
void run_dw_avx2(const ConvS8Problem& p) { conv2d_dw_s8_run(p, detail::conv_dw_s8_rows_avx2, "conv_dw_s8_avx2"); }
#endif

// A running call needs the layer's oneDNN copy; a plan assumes freeze() builds it.
bool onednn_conv_applies(const ConvS8Problem& p, std::string* why) {
  if (p.x_nhwc == nullptr || p.onednn != nullptr) return true;
  *why = "no oneDNN copy of the weight";
  return false;
}

void run_onednn_conv(const ConvS8Problem& p) {
  RunInfo local;
  RunInfo& ri = p.info != nullptr ? *p.info : local;
  if (onednn_conv(*p.onednn, p.x_nhwc, p.a_scale, p.w_scale, p.bias, p.g, p.y, p.rq, p.relu, &ri, p.residual)) return;
  // No primitive for this input size: im2col, the same values, with oneDNN's reason kept.
  QF_REQUIRE(p.g.groups == 1, "kernels/cpu: a grouped convolution (groups ", p.g.groups,
             ") has no oneDNN primitive for this input size and no im2col entry: ", ri.fallback,
             " (check onednn_conv_primitive before running it)");
  const RunInfo why = ri;
  ConvS8Problem q = p;
  q.info = &ri;
  run_im2col(q);
  ri.fallback = why.fallback + (ri.fallback.empty() ? "" : "; ") + ri.fallback;
}

}  // namespace

const KernelTable<ConvS8Problem>& conv_s8_kernels() {
  static const KernelTable<ConvS8Problem> table{
      {"conv_dw_s8_avx512", Isa::kAvx512, depthwise_serves, nullptr, QF_KERNEL_AVX512(run_dw_avx512)},
      {"conv_dw_s8_avx2", Isa::kAvx2, depthwise_serves, nullptr, QF_KERNEL_AVX2(run_dw_avx2)},
      {"conv_dw_s8", Isa::kReference, depthwise_serves, nullptr, run_dw_scalar},
      {"conv_s8s8s32_onednn", Isa::kAvx512Vnni, onednn_conv_serves, onednn_conv_applies, run_onednn_conv},
      {"im2col_s8", Isa::kReference, im2col_serves, nullptr, run_im2col},
  };
  return table;
}

ConvEntryKind conv_entry_kind(const KernelEntry<ConvS8Problem>& e) {
  if (e.run == run_im2col) return ConvEntryKind::kIm2col;
  if (e.serves == depthwise_serves) return ConvEntryKind::kDepthwise;
  QF_CHECK(e.run == run_onednn_conv, "conv_s8_kernels: entry ", e.name, " has no ConvEntryKind");
  return ConvEntryKind::kOneDnn;
}

void conv2d_s8(const ConvS8Problem& p) {
  QF_REQUIRE(p.residual == nullptr || (p.rq == nullptr && p.y != nullptr),
             "kernels/cpu: conv2d_s8: a residual is added to float outputs only");
  RunInfo chosen;
  const KernelEntry<ConvS8Problem>& e =
      select_kernel(conv_s8_kernels(), p, IsaGate::machine(), p.info != nullptr ? &chosen : nullptr);
  if (p.residual != nullptr && conv_entry_kind(e) == ConvEntryKind::kDepthwise) {
    // The depthwise rows have no residual epilogue: their float output, then one pass over it.
    ConvS8Problem q = p;
    q.relu = false;
    q.residual = nullptr;
    e.run(q);
    const int64_t n = p.g.gemm_m() * p.g.out_channels;
    detail::parallel_over((n + 16383) / 16384, 1, [&](int64_t c0, int64_t c1) {
      const int64_t b = c0 * 16384, e1 = std::min(n, c1 * 16384);
      finish_rows(p.y + b, e1 - b, p.residual + b, p.relu, nullptr, nullptr);
    });
  } else {
    e.run(p);
  }
  // The entry's own record names the chain; the table's names what it passed over first.
  if (p.info != nullptr && !chosen.fallback.empty()) {
    p.info->fallback = chosen.fallback + (p.info->fallback.empty() ? "" : "; ") + p.info->fallback;
  }
}

}  // namespace qforge::kernels
