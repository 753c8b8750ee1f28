// Convolutions: fake-quant forward through LibTorch's own forward with the weight swapped; after
// freeze the integer convolution (kernels/cpu/conv_s8.h) or the dequantizing fallback.
#include "framework/nn/conv.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {

void ConvQuantState::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  if (scheme.weights) {
    const QSpec& s = scheme.weights->spec;
    QF_REQUIRE(s.granularity != Granularity::kPerGroup, path_, " (", layer_type(),
               "): per-group weights are for Linear/Embedding; use per_channel for convolutions");
    QF_REQUIRE(s.granularity != Granularity::kPerChannel || s.axis == 0, path_, " (", layer_type(),
               "): per-channel weight quantization is along the output channels (axis 0), got axis ", s.axis);
  }
  QF_REQUIRE(scheme.activations != ActivationMode::kDynamicPerToken, path_, " (", layer_type(),
             "): dynamic per-token activations are for Linear; use static activations for convolutions");
}

namespace {
// int8 weights on AVX-512 VNNI: oneDNN's int8 convolution (exact int32 sums, qforge's epilogue)
// from kOneDnnConvMinRows output pixels (batch x OH x OW) on, where it beats im2col + GEMM at
// the SmallCnn's shapes (qbench conv_s8_cnn, model_cnn_b128); below, its per-call set-up costs
// more than it saves (model_cnn_b1), so im2col runs.
constexpr int64_t kOneDnnConvMinRows = 4096;
// What plan() appends to the im2col kernel when oneDNN serves the large inputs.
std::string onednn_suffix() {
  return detail::str_cat(" | conv_s8s8s32_onednn+dequantize_s32_f32 from ", kOneDnnConvMinRows, " output pixels");
}
// The kernels' geometry of a convolution of this shape on a [batch, C, in_h, in_w] input.
kernels::ConvGeometry conv_geometry(const ConvQuantState::ConvShape& s, int64_t batch, int64_t in_h, int64_t in_w) {
  kernels::ConvGeometry g;
  g.batch = batch;
  g.in_channels = s.in_channels;
  g.in_h = in_h;
  g.in_w = in_w;
  g.out_channels = s.out_channels;
  g.kernel_h = s.kernel[0];
  g.kernel_w = s.kernel[1];
  g.stride_h = s.stride[0];
  g.stride_w = s.stride[1];
  g.pad_h = s.padding[0];
  g.pad_w = s.padding[1];
  g.dilation_h = s.dilation[0];
  g.dilation_w = s.dilation[1];
  return g;
}
// int8 weights with static int8 activations on AVX-512 VNNI: oneDNN's convolution is planned.
bool onednn_planned(const KernelPlan& p) { return p.path == LinearPath::kS8Static && usable_isa() >= Isa::kAvx512Vnni; }
}  // namespace

KernelPlan ConvQuantState::plan() const {
  KernelPlan p;
  p.kernel = "dequantize+at::conv";
  if (!scheme_.weights) {
    p.kernel = "at::conv";
    p.fallback = "float weights";
    return p;
  }
  const char* per_call = ": the packed weight is dequantized per call";
  const ConvShape s = conv_shape();
  if (scheme_.activations != ActivationMode::kStatic) {
    p.fallback = detail::str_cat("no weight-only integer convolution kernel (float activations)", per_call,
                                 "; static int8 activations run the integer convolution");
    return p;
  }
  if (s.groups != 1) {
    p.fallback = detail::str_cat("no integer kernel for grouped convolution (groups=", s.groups, ")", per_call);
    return p;
  }
  if (!s.zeros_padding) {
    p.fallback = detail::str_cat("no integer kernel for a padding_mode other than zeros", per_call);
    return p;
  }
  if (!s.explicit_padding) {
    p.fallback = detail::str_cat("no integer kernel for padding 'same' (give the sizes)", per_call);
    return p;
  }
  const int64_t K = s.in_channels * s.kernel[0] * s.kernel[1];
  if (K > kernels::kMaxInFeaturesS8) {
    p.fallback = detail::str_cat("C*kh*kw = ", K, " taps could overflow the int32 accumulator (at most ",
                                 kernels::kMaxInFeaturesS8, ")", per_call);
    return p;
  }
  const QSpec& ws = scheme_.weights->spec;
  // int4 weights are packed with K rounded up to 8 (zero columns), the VNNI kernels' group unit.
  const KernelPlan lp = plan_linear(ws, scheme_.activations, scheme_.activation.spec,
                                    nibble_packed(ws.qtype) ? kernels::round_up(K, kernels::kS4BlockK) : K);
  if (lp.path != LinearPath::kS8Static && lp.path != LinearPath::kS4Static) {
    p.fallback = detail::str_cat("no integer convolution kernel: ", lp.fallback, per_call);
    return p;
  }
  p.path = lp.path;
  // A convolution has M = batch * output pixels rows: the int4 VNNI dispatcher takes its panel
  // GEMM from 4 rows on.
  std::string gemm = lp.kernel;
  if (gemm == "gemv_s8s4f32_n16k8_avx512vnni") gemm = "gemm_s8s4f32_n16k8_avx512vnni";
  p.kernel = "im2col_s8+" + gemm;
  p.fallback = lp.fallback;
  if (onednn_planned(p)) p.kernel += onednn_suffix();
  return p;
}

void ConvQuantState::install_conv(QuantizedTensor fw, at::Tensor& weight,
                                  torch::OrderedDict<std::string, at::Tensor>& params) {
  QF_REQUIRE(!frozen_, path_, " (", layer_type(), "): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (", layer_type(),
             "): install_frozen needs the saved scheme attached and a packed weight");
  if (weight.defined()) {
    QF_REQUIRE(at::IntArrayRef(fw.shape) == weight.sizes(), path_, " (", layer_type(), "): frozen weight has shape ",
               at::IntArrayRef(fw.shape), ", layer expects ", weight.sizes());
  }
  const KernelPlan p = plan();
  std::shared_ptr<kernels::PackedLinearS8> s8;
  std::shared_ptr<kernels::PackedLinearS4> s4;
  std::shared_ptr<const kernels::detail::OneDnnConvS8> onednn;
  std::string onednn_status;
  float act_scale = 0;
  if (p.path == LinearPath::kS8Static || p.path == LinearPath::kS4Static) {
    const QParams qp = fw.qparams();
    const ConvShape s = conv_shape();
    const int64_t N = s.out_channels, C = s.in_channels, KH = s.kernel[0], KW = s.kernel[1], K = C * KH * KW;
    QF_REQUIRE(!fw.shape.empty() && fw.shape[0] == N && fw.numel() == N * K, path_, " (", layer_type(),
               "): frozen weight has shape ", at::IntArrayRef(fw.shape), ", expected ", N, " x ", C, " x kernel ", KH,
               "x", KW);
    QF_REQUIRE(input_q_, path_, " (", layer_type(), "): static activations need the input quantizer");
    // [N, C, kh, kw] -> [N, kh, kw, C]: the K order of the channels-last im2col rows.
    const at::Tensor codes =
        fw.int_values().reshape({N, C, KH, KW}).permute({0, 2, 3, 1}).reshape({N, K}).to(at::kChar).contiguous();
    const int64_t rows = qp.scale.numel() == 1 ? 1 : N;
    const at::Tensor scale_n = qp.scale.to(at::kCPU, at::kFloat).reshape({rows, 1}).expand({N, 1}).contiguous();
    if (p.path == LinearPath::kS8Static) {
      QF_REQUIRE(at::eq(qp.zero_point, 0).all().item<bool>(), path_, " (", layer_type(),
                 "): symmetric int8 weights must have zero points 0 (the file or scheme disagrees)");
      kernels::PackOptions opts;
      opts.onednn = false;
      s8 = std::make_shared<kernels::PackedLinearS8>(codes, scale_n.reshape({N}), at::Tensor(), opts);
      if (onednn_planned(p)) {
        // Reordered for a nominal input (batch 32, 16x16 or the dilated kernel's extent); other
        // input sizes get their own primitive with the same weight format.
        const kernels::ConvGeometry nominal = conv_geometry(s, 32, std::max<int64_t>(16, s.dilation[0] * (KH - 1) + 1),
                                                            std::max<int64_t>(16, s.dilation[1] * (KW - 1) + 1));
        const at::Tensor oihw = fw.int_values().reshape({N, C, KH, KW}).to(at::kChar).contiguous();
        onednn = kernels::detail::onednn_conv_s8(oihw.data_ptr<int8_t>(), nominal, &onednn_status);
        if (onednn != nullptr && kernels::detail::onednn_impl(*onednn).rfind("ref", 0) == 0) {
          onednn_status = "oneDNN offers only its reference implementation (" + kernels::detail::onednn_impl(*onednn) + ")";
          onednn = nullptr;
        }
      }
    } else {
      const int64_t Kp = kernels::round_up(K, kernels::kS4BlockK);
      at::Tensor zero_n;
      if (!at::eq(qp.zero_point, 0).all().item<bool>())
        zero_n = qp.zero_point.to(at::kCPU, at::kInt).reshape({rows, 1}).expand({N, 1}).contiguous();
      // Zero columns up to Kp: the matching im2col columns are 0 too, so they add nothing (and
      // 0 lies on every 4-bit grid).
      const at::Tensor padded = Kp == K ? codes : at::constant_pad_nd(codes, {0, Kp - K}, 0).contiguous();
      s4 = std::make_shared<kernels::PackedLinearS4>(padded, scale_n, zero_n, Kp, at::Tensor(), qp.spec.qtype);
    }
    act_scale = input_q_->qparams().scale.item<float>();
  }
  s8_ = std::move(s8);
  s4_ = std::move(s4);
  onednn_ = std::move(onednn);
  static_act_scale_ = act_scale;
  if (s8_ || s4_) fw.data = at::Tensor();  // the kernel object holds the codes; frozen_weight() rebuilds them
  fweight_ = std::move(fw);
  if (params.contains("weight")) params.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  mark_frozen();
  if (onednn_planned(p) && onednn_ == nullptr) {
    // The plan wanted oneDNN's convolution for large inputs but it could not be built here:
    // im2col at every size, with the reason.
    kernel_ = p.kernel.substr(0, p.kernel.size() - onednn_suffix().size());
    fallback_ = detail::str_cat(p.fallback, p.fallback.empty() ? "" : "; ", "conv_s8s8s32_onednn: ",
                                onednn_status.empty() ? "unavailable" : onednn_status);
  }
}

at::Tensor ConvQuantState::integer_forward(const at::Tensor& x, const at::Tensor& bias, bool relu,
                                           const QParams* requant) const {
  const ConvShape s = conv_shape();
  QF_REQUIRE(x.dim() == 4 && x.size(1) == s.in_channels, path_, " (", layer_type(), "): input has shape ", x.sizes(),
             ", expected [batch, ", s.in_channels, ", ...]");
  const kernels::ConvGeometry g = conv_geometry(s, x.size(0), x.size(2), x.size(3));
  QF_REQUIRE(g.in_h > 0 && g.in_w > 0 && g.out_h() >= 1 && g.out_w() >= 1, path_, " (", layer_type(),
             "): input of shape ", x.sizes(), " is smaller than the (dilated, padded) kernel");
  // The fake-quant formula of the static input quantizer, as int8 codes, channels last (no copy
  // of the float input when it is channels last already, as the previous integer conv leaves it).
  // int8 input: codes of this quantizer already (a requantized output), channels last.
  const at::Tensor q = x.scalar_type() == at::kChar
                           ? x.permute({0, 2, 3, 1}).contiguous()
                           : quantize_to_int8(x.to(at::kFloat).permute({0, 2, 3, 1}), input_q_->qparams());
  const at::Tensor b = bias.defined() ? bias.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  // oneDNN for large inputs when it was built and has a primitive for this size, else im2col: the
  // same values.
  const bool try_onednn = s8_ && onednn_ != nullptr && g.gemm_m() >= kOneDnnConvMinRows;
  if (requant != nullptr) {
    at::Tensor codes = at::empty({g.batch, g.out_h(), g.out_w(), g.out_channels}, at::kChar);
    kernels::RequantOut out;
    out.q = codes.data_ptr<int8_t>();
    out.inv = 1.0f / requant->scale.to(at::kFloat).item<float>();  // quantize_to_int8's reciprocal
    out.qmin = static_cast<int>(requant->spec.quant_min());
    out.qmax = static_cast<int>(requant->spec.quant_max());
    if (s8_) {
      if (!try_onednn || !kernels::conv2d_s8s8s8_onednn(*onednn_, q.data_ptr<int8_t>(), static_act_scale_,
                                         s8_->w_scale().data_ptr<float>(), bp, g, out, relu)) {
        kernels::conv2d_s8s8s8(q.data_ptr<int8_t>(), static_act_scale_, s8_->view(), s8_->w_scale().data_ptr<float>(),
                               bp, g, out, relu);
      }
    } else {
      kernels::conv2d_s8s4s8(q.data_ptr<int8_t>(), static_act_scale_, s4_->view(), bp, g, out, relu);
    }
    return codes.permute({0, 3, 1, 2});
  }
  at::Tensor y = at::empty({g.batch, g.out_h(), g.out_w(), g.out_channels}, at::kFloat);
  if (s8_) {
    if (!try_onednn || !kernels::conv2d_s8s8f32_onednn(*onednn_, q.data_ptr<int8_t>(), static_act_scale_,
                                        s8_->w_scale().data_ptr<float>(), bp, g, y.data_ptr<float>(), relu)) {
      kernels::conv2d_s8s8f32(q.data_ptr<int8_t>(), static_act_scale_, s8_->view(), s8_->w_scale().data_ptr<float>(),
                              bp, g, y.data_ptr<float>(), relu);
    }
  } else {
    kernels::conv2d_s8s4f32(q.data_ptr<int8_t>(), static_act_scale_, s4_->view(), bp, g, y.data_ptr<float>(), relu);
  }
  // NCHW shape, channels-last memory (as LibTorch's quantized conv returns it).
  y = y.permute({0, 3, 1, 2});
  return y;
}

QuantizedTensor ConvQuantState::frozen_weight() const {
  if (!integer_kernel()) return fweight_;
  const ConvShape s = conv_shape();
  const int64_t N = s.out_channels, C = s.in_channels, KH = s.kernel[0], KW = s.kernel[1];
  const at::Tensor packed = s8_ ? s8_->weight() : s4_->weight();  // [N, K or Kp] in (i, j, c) order
  const at::Tensor codes = packed.narrow(1, 0, C * KH * KW)
                               .reshape({N, KH, KW, C})
                               .permute({0, 3, 1, 2})
                               .reshape(at::IntArrayRef(fweight_.shape))
                               .contiguous();
  QuantizedTensor fw = fweight_;
  fw.data = pack_quantized(codes, fw.qparams()).data;
  return fw;
}

at::Tensor ConvQuantState::dequantized_frozen_weight() const { return frozen_weight().dequantize(); }

int64_t ConvQuantState::frozen_storage_bytes() const {
  if (s8_) return s8_->bytes() + (onednn_ ? kernels::detail::onednn_bytes(*onednn_) : 0);
  if (s4_) return s4_->bytes();
  return fweight_.defined() ? fweight_.bytes() : 0;
}


namespace {
// ConvOptions<D> from the ConvNdOptions<D> a convolution keeps.
template <size_t D>
torch::nn::ConvOptions<D> conv_options(const torch::nn::detail::ConvNdOptions<D>& o) {
  return torch::nn::ConvOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias())
      .padding_mode(o.padding_mode());
}
}  // namespace

// A fresh convolution of the same type and options holding copies of the float parameters.
template <class Impl, size_t D>
std::shared_ptr<QuantizableLayer> conv_float_copy(const torch::nn::detail::ConvNdOptions<D>& options,
                                                  const at::Tensor& weight, const at::Tensor& bias) {
  RngStateGuard rng;
  auto c = std::make_shared<Impl>(conv_options<D>(options));
  copy_float_parameters(c->weight, weight, &c->bias, &bias);
  return c;
}

std::shared_ptr<QuantizableLayer> Conv1dImpl::float_copy() const {
  require_not_frozen("float_copy");
  return conv_float_copy<Conv1dImpl, 1>(options, weight, bias);
}

std::shared_ptr<QuantizableLayer> Conv2dImpl::float_copy() const {
  require_not_frozen("float_copy");
  return conv_float_copy<Conv2dImpl, 2>(options, weight, bias);
}

namespace {
// The 2-D view of a convolution's options (Conv1d: height 1).
template <size_t D>
ConvQuantState::ConvShape conv_shape_of(const torch::nn::detail::ConvNdOptions<D>& o) {
  ConvQuantState::ConvShape s;
  s.in_channels = o.in_channels();
  s.out_channels = o.out_channels();
  s.groups = o.groups();
  constexpr size_t first = 2 - D;  // Conv1d fills the width only
  for (size_t d = 0; d < D; ++d) {
    s.kernel[first + d] = (*o.kernel_size())[d];
    s.stride[first + d] = (*o.stride())[d];
    s.dilation[first + d] = (*o.dilation())[d];
  }
  if (const auto* pad = variant_if<torch::ExpandingArray<D>>(&o.padding())) {
    for (size_t d = 0; d < D; ++d) s.padding[first + d] = (**pad)[d];
  } else if (!variant_if<torch::enumtype::kValid>(&o.padding())) {
    s.explicit_padding = false;
  }
  s.zeros_padding = variant_if<torch::enumtype::kZeros>(&o.padding_mode()) != nullptr;
  return s;
}
}  // namespace

ConvQuantState::ConvShape Conv1dImpl::conv_shape() const { return conv_shape_of<1>(options); }
ConvQuantState::ConvShape Conv2dImpl::conv_shape() const { return conv_shape_of<2>(options); }

at::Tensor Conv1dImpl::forward(const at::Tensor& x) {
  note_input(x);
  if (frozen_) {
    if (integer_kernel() && x.is_cpu()) return frozen_integer(x, false);
    // Frozen codes stay on the CPU; on another device the dequantized weight is copied there.
    ScopedTensorSwap swap(weight, dequantized_frozen_weight().to(x.device()));
    return torch::nn::Conv1dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv1dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv1dImpl::forward(quantize_input(x));
}

at::Tensor Conv1dImpl::forward_relu(const at::Tensor& x) {
  if (frozen_ && integer_kernel() && x.is_cpu()) {
    note_input(x);
    return frozen_integer(x, true);
  }
  return at::relu(forward(x));
}

at::Tensor Conv1dImpl::frozen_integer(const at::Tensor& x, bool relu) {
  // [B, C, L] (or unbatched [C, L]) as [B, C, 1, L].
  QF_REQUIRE(x.dim() == 2 || x.dim() == 3, path_, " (Conv1d): input has shape ", x.sizes(),
             ", expected [batch, channels, length]");
  const bool unbatched = x.dim() == 2;
  // Contiguous like at::conv1d's output (the [B, N, 1, L] result is channels last).
  const at::Tensor y = integer_forward((unbatched ? x.unsqueeze(0) : x).unsqueeze(2), bias, relu).squeeze(2).contiguous();
  return unbatched ? y.squeeze(0) : y;
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  if (x.scalar_type() == at::kChar) return frozen_integer(x, false);  // codes (static-activation chains)
  note_input(x);
  if (frozen_) {
    if (integer_kernel() && x.is_cpu()) return frozen_integer(x, false);
    // Frozen codes stay on the CPU; on another device the dequantized weight is copied there.
    ScopedTensorSwap swap(weight, dequantized_frozen_weight().to(x.device()));
    return torch::nn::Conv2dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv2dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv2dImpl::forward(quantize_input(x));
}

at::Tensor Conv2dImpl::forward_relu(const at::Tensor& x) {
  if (x.scalar_type() == at::kChar) return frozen_integer(x, true);
  if (frozen_ && integer_kernel() && x.is_cpu()) {
    note_input(x);
    return frozen_integer(x, true);
  }
  return at::relu(forward(x));
}

bool Conv2dImpl::takes_codes() const {
  return frozen_ && integer_kernel() && scheme_.activations == ActivationMode::kStatic && !input_watched();
}

at::Tensor Conv2dImpl::forward_relu_codes(const at::Tensor& x, const Conv2dImpl& next) {
  QF_REQUIRE(frozen_ && integer_kernel() && x.is_cpu(), path_,
             " (Conv2d): forward_relu_codes needs a layer frozen on the integer path and a CPU input");
  QF_REQUIRE(next.takes_codes(), path_, " (Conv2d): forward_relu_codes: ", next.path_,
             " does not take int8 codes (not frozen on the integer path with static activations, or its inputs are "
             "watched)");
  if (x.scalar_type() != at::kChar) note_input(x);
  const QParams out = next.input_q_->qparams();
  return frozen_integer(x, true, &out);
}

at::Tensor Conv2dImpl::frozen_integer(const at::Tensor& x, bool relu, const QParams* requant) {
  QF_REQUIRE(x.dim() == 3 || x.dim() == 4, path_, " (Conv2d): input has shape ", x.sizes(),
             ", expected [batch, channels, height, width]");
  QF_REQUIRE(x.scalar_type() != at::kChar || (takes_codes() && x.is_cpu()), path_,
             " (Conv2d): int8 input codes need a layer frozen on the integer path with static activations, on the CPU");
  const bool unbatched = x.dim() == 3;
  const at::Tensor y = integer_forward(unbatched ? x.unsqueeze(0) : x, bias, relu, requant);
  return unbatched ? y.squeeze(0) : y;
}

}  // namespace qforge::nn
