// Convolutions: fake-quant forward through LibTorch's own forward with the weight swapped; after
// freeze the integer convolution (kernels/cpu/conv_s8.h) or the dequantizing fallback.
#include "framework/nn/conv.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/packed_layout.h"
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
// The plan's kernel text: the small-input chain, then oneDNN's from its row count when planned.
std::string conv_kernel_text(const KernelPlan& p) {
  if (p.large_m == 0) return p.kernel;
  return detail::str_cat(p.kernel, " | ", p.large_m_kernel, " from ", p.large_m, " output pixels");
}
}  // namespace

KernelPlan ConvQuantState::plan() const { return plan_conv(nullptr); }

KernelPlan ConvQuantState::plan_conv(bool* onednn_copy) const {
  if (onednn_copy != nullptr) *onednn_copy = false;
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
  if (!s.zeros_padding) {
    p.fallback = detail::str_cat("no integer kernel for a padding_mode other than zeros", per_call);
    return p;
  }
  if (!s.explicit_padding) {
    p.fallback = detail::str_cat("no integer kernel for padding 'same' (give the sizes)", per_call);
    return p;
  }
  // Grouped convolutions run one GEMM per group over its C / groups input channels.
  const int64_t K = (s.depthwise() ? 1 : s.in_channels / s.groups) * s.kernel[0] * s.kernel[1];
  if (K > kernels::kMaxInFeaturesS8) {
    p.fallback = detail::str_cat("C*kh*kw = ", K, " taps could overflow the int32 accumulator (at most ",
                                 kernels::kMaxInFeaturesS8, ")", per_call);
    return p;
  }
  const QSpec& ws = scheme_.weights->spec;
  if (s.depthwise() && nibble_packed(ws.qtype)) {
    p.fallback = detail::str_cat("no int4 depthwise convolution kernel (int8 weights run conv_dw_s8)", per_call);
    return p;
  }
  // int4 weights are packed with K rounded up to 8 (zero columns), the VNNI kernels' group unit.
  const int64_t k = nibble_packed(ws.qtype) ? kernels::round_up(K, kernels::kS4BlockK) : K;
  const KernelPlan lp = plan_linear(ws, scheme_.activations, scheme_.activation.spec, k);
  if (lp.path != LinearPath::kS8Static && lp.path != LinearPath::kS4Static) {
    p.fallback = detail::str_cat("no integer convolution kernel: ", lp.fallback, per_call);
    return p;
  }
  p.path = lp.path;
  // The convolution's kernel table: im2col chunks through the GEMM, oneDNN for large inputs.
  const kernels::ConvChoice c =
      kernels::choose_conv_kernel(p.path == LinearPath::kS4Static, usable_isa(), k, s.depthwise(), s.groups);
  if (onednn_copy != nullptr) *onednn_copy = c.needs_onednn_copy;
  p.large_m = c.large_rows;
  p.large_m_kernel = c.large_kernel.kernel;
  p.kernel = c.kernel.kernel;
  p.fallback = c.kernel.fallback;
  p.kernel = conv_kernel_text(p);
  return p;
}

void ConvQuantState::install_conv(QuantizedTensor fw, at::Tensor& weight,
                                  torch::OrderedDict<std::string, at::Tensor>& params) {
  const std::string who = path_ + " (" + layer_type() + ")";
  QF_REQUIRE(!frozen_, who, ": already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, who, ": install_frozen needs the saved scheme attached and a packed weight");
  if (weight.defined()) {
    QF_REQUIRE(at::IntArrayRef(fw.shape) == weight.sizes(), who, ": frozen weight has shape ", at::IntArrayRef(fw.shape),
               ", layer expects ", weight.sizes());
  }
  bool onednn = false;  // the plan runs oneDNN's convolution for some inputs
  const KernelPlan p = plan_conv(&onednn);
  float act_scale = 0;
  if (p.path == LinearPath::kS8Static || p.path == LinearPath::kS4Static) {
    QF_REQUIRE(input_q_, who, ": static activations need the input quantizer");
    act_scale = input_q_->qparams().scale.item<float>();
  }
  std::string onednn_missing;
  packed_ = pack_conv(std::move(fw), p.path, conv_shape(), act_scale, onednn, who, &onednn_missing);
  if (params.contains("weight")) params.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  mark_frozen();
  if (!onednn_missing.empty()) {
    // The plan wanted oneDNN's convolution for large inputs but it could not be built here:
    // im2col at every size, with the reason.
    kernel_ = p.kernel.substr(0, p.kernel.find(" | "));  // conv_kernel_text's small-input chain
    const ConvShape s = conv_shape();
    if (s.groups > 1 && !s.depthwise()) {
      // The grouped plan was oneDNN's one call: what runs is one convolution per group.
      const QSpec& ws = scheme_.weights->spec;
      const int64_t k = s.in_channels / s.groups * s.kernel[0] * s.kernel[1];
      kernel_ = detail::str_cat(kernels::choose_conv_kernel(nibble_packed(ws.qtype), usable_isa(),
                                                            nibble_packed(ws.qtype) ? kernels::round_up(k, kernels::kS4BlockK) : k,
                                                            false, 1)
                                    .kernel.kernel,
                                " per group (", s.groups, " groups)");
    }
    fallback_ = detail::str_cat(p.fallback, p.fallback.empty() ? "" : "; ", "conv_s8s8s32_onednn: ", onednn_missing);
  }
}

bool ConvQuantState::integer_kernel() const {
  return packed_ && (packed_->path() == LinearPath::kS8Static || packed_->path() == LinearPath::kS4Static);
}

at::Tensor ConvQuantState::integer_forward(const at::Tensor& x, const at::Tensor& bias, bool relu,
                                           const QParams* requant, const at::Tensor* residual, bool in_place) const {
  FrozenInput in;
  in.quantizer = input_q_;
  in.layer_bias = bias;
  in.relu = relu;
  in.requant = requant;
  in.residual = residual;
  in.residual_in_place = in_place;
  return packed_->forward(x, in);
}

// A fresh convolution of the same type and options holding copies of the float parameters.
template <class Impl, size_t D>
std::shared_ptr<QuantizableLayer> conv_float_copy(const torch::nn::detail::ConvNdOptions<D>& options,
                                                  const at::Tensor& weight, const at::Tensor& bias) {
  RngStateGuard rng;
  auto c = std::make_shared<Impl>(conv_options_of<D>(options));
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

template <size_t D>
ConvShape conv_shape_of(const torch::nn::detail::ConvNdOptions<D>& o) {
  ConvShape s;
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
template ConvShape conv_shape_of<1>(const torch::nn::detail::ConvNdOptions<1>&);
template ConvShape conv_shape_of<2>(const torch::nn::detail::ConvNdOptions<2>&);

template <class Twin, size_t D>
template <class Integer>
at::Tensor ConvLayerImpl<Twin, D>::float_input_forward(const at::Tensor& x, bool relu, const Integer& integer) {
  const bool integer_path = frozen_ && integer_kernel() && x.is_cpu();
  if (relu && !integer_path) return at::relu(float_input_forward(x, false, integer));
  note_input(x);
  if (integer_path) return integer(x, relu);
  if (frozen_) {
    // Frozen codes stay on the CPU; on another device the dequantized weight is copied there.
    ScopedTensorSwap swap(this->weight, dequantized_frozen_weight().to(x.device()));
    return twin_forward(quantize_input(x));
  }
  if (!quantized()) return twin_forward(x);
  ScopedTensorSwap swap(this->weight, quantize_weight(this->weight));
  return twin_forward(quantize_input(x));
}

at::Tensor Conv1dImpl::forward(const at::Tensor& x) {
  return float_input_forward(x, false, [this](const at::Tensor& in, bool relu) { return frozen_integer(in, relu); });
}

at::Tensor Conv1dImpl::forward_relu(const at::Tensor& x) {
  return float_input_forward(x, true, [this](const at::Tensor& in, bool relu) { return frozen_integer(in, relu); });
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
  return float_input_forward(x, false, [this](const at::Tensor& in, bool relu) { return frozen_integer(in, relu); });
}

at::Tensor Conv2dImpl::forward_relu(const at::Tensor& x) {
  if (x.scalar_type() == at::kChar) return frozen_integer(x, true);
  return float_input_forward(x, true, [this](const at::Tensor& in, bool relu) { return frozen_integer(in, relu); });
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

at::Tensor Conv2dImpl::forward_add(const at::Tensor& x, const at::Tensor& residual, bool relu, bool in_place) {
  const bool integer = x.scalar_type() == at::kChar || (frozen_ && integer_kernel() && x.is_cpu());
  // The epilogue's sum records no gradient: a residual that needs one takes ATen's add.
  if (integer && !(residual.requires_grad() && at::GradMode::is_enabled())) {
    if (x.scalar_type() != at::kChar) note_input(x);
    return frozen_integer(x, relu, nullptr, &residual, in_place);
  }
  return add_residual(forward(x), residual, relu, in_place);
}

at::Tensor Conv2dImpl::frozen_integer(const at::Tensor& x, bool relu, const QParams* requant, const at::Tensor* residual,
                                      bool in_place) {
  QF_REQUIRE(x.dim() == 3 || x.dim() == 4, path_, " (Conv2d): input has shape ", x.sizes(),
             ", expected [batch, channels, height, width]");
  QF_REQUIRE(x.scalar_type() != at::kChar || (takes_codes() && x.is_cpu()), path_,
             " (Conv2d): int8 input codes need a layer frozen on the integer path with static activations, on the CPU");
  const bool unbatched = x.dim() == 3;
  const at::Tensor r = residual != nullptr && unbatched ? residual->unsqueeze(0) : at::Tensor();
  const at::Tensor y = integer_forward(unbatched ? x.unsqueeze(0) : x, bias, relu, requant,
                                       residual != nullptr && unbatched ? &r : residual, in_place);
  return unbatched ? y.squeeze(0) : y;
}

}  // namespace qforge::nn
