// qforge::nn::Conv1d / Conv2d: LibTorch's convolutions (same options, names, initialisation and
// float forward) with weight and input quantizers. After freeze(), int8 or int4 weights with
// static symmetric int8 activations run the integer convolution (kernels/cpu/conv_s8.h: the input
// quantized to int8 codes, channels-last im2col, the Linear GEMM kernels, bias in the epilogue);
// int8 depthwise convolutions (groups == in == out channels) run kernels/cpu/conv_dw_s8.h;
// other schemes (weight-only, other grouped, non-zero padding modes, 'same' padding) keep the
// weight packed and dequantize it per call, and describe() says why.
#pragma once

#include <torch/nn/modules/conv.h>

#include <memory>

#include "framework/api/quantized_tensor.h"
#include "framework/nn/packed_weight.h"
#include "framework/nn/quantizable.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

// Shared freeze/forward logic of the convolutions.
class ConvQuantState : public QuantizableLayer {
 public:
  void check_scheme(const LayerScheme& scheme) const override;
  KernelPlan plan() const override;
  using ConvShape = nn::ConvShape;

 protected:
  virtual ConvShape conv_shape() const = 0;
  // plan(), and whether an entry it plans needs freeze() to build the oneDNN copy (*onednn_copy).
  KernelPlan plan_conv(bool* onednn_copy) const;
  void install_conv(QuantizedTensor fw, at::Tensor& weight, torch::OrderedDict<std::string, at::Tensor>& params);
  // The integer convolution of a frozen layer on the CPU: x [B, C, H, W] (Conv1d passes [B, C, 1, L]);
  // relu: at::relu of the result, in the kernel's epilogue. The result has the NCHW shape in
  // channels-last memory (the GEMM's rows), which the next integer conv reads without a copy.
  // x may also be int8 codes of this layer's static input quantizer (a previous layer's
  // requantized output); with requant the result is int8 codes of that (static per-tensor
  // symmetric int8) quantizer, requantized in the epilogue, in the same shape and memory order.
  // residual (float output only): added before the ReLU (FrozenInput::residual).
  at::Tensor integer_forward(const at::Tensor& x, const at::Tensor& bias, bool relu,
                             const QParams* requant = nullptr, const at::Tensor* residual = nullptr,
                             bool in_place = false) const;
  // True when freeze() packed the weight for the integer kernels.
  bool integer_kernel() const;
  // The frozen weight dequantized (the non-integer path runs LibTorch's convolution on it).
  at::Tensor dequantized_frozen_weight() const { return packed_->weight().dequantize(); }
  int64_t frozen_storage_bytes() const override { return packed_ ? packed_->bytes() : 0; }
  QuantizedTensor frozen_weight() const override { return packed_ ? packed_->weight() : QuantizedTensor{}; }
  // The frozen weight: in im2col order for the integer convolution, else packed as the checkpoint
  // stores it (null until frozen).
  PackedWeightPtr packed_;
};

// The 2-D view of a convolution's options (Conv1d: height 1); defined for D = 1 and 2.
template <size_t D>
ConvShape conv_shape_of(const torch::nn::detail::ConvNdOptions<D>& options);

// The construction options of a convolution from the options it keeps (LibTorch's Conv1d/2d and
// the qforge twins alike): a copy, a converted or a folded layer gets the same geometry.
template <size_t D>
torch::nn::ConvOptions<D> conv_options_of(const torch::nn::detail::ConvNdOptions<D>& o) {
  return torch::nn::ConvOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias())
      .padding_mode(o.padding_mode());
}

// What Conv1d and Conv2d share over their LibTorch twin (Twin, D spatial dimensions).
template <class Twin, size_t D>
class ConvLayerImpl : QFORGE_TWIN_BASE(Twin), public ConvQuantState {
 public:
  // Private base: a torch::nn::Conv2dImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  ConvLayerImpl(int64_t in_channels, int64_t out_channels, torch::ExpandingArray<D> kernel_size)
      : Twin(in_channels, out_channels, kernel_size) {}
  explicit ConvLayerImpl(torch::nn::ConvOptions<D> options) : Twin(std::move(options)) {}
  using Twin::options;
  using Twin::weight;
  using Twin::bias;
  using Twin::reset;
  using Twin::reset_parameters;
  using Twin::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  torch::nn::Module& module() override { return *this; }
  void load(torch::serialize::InputArchive& archive) override {
    refuse_torch_load_if_quantized();
    torch::nn::Module::load(archive);
  }
  const torch::nn::Module& module() const override { return *this; }
  void install_frozen(QuantizedTensor fw) override { install_conv(std::move(fw), this->weight, this->parameters_); }
  QuantizedTensor frozen_weight() const override { return ConvQuantState::frozen_weight(); }
  at::Tensor frozen_bias() const override { return this->options.bias() ? this->bias : at::Tensor(); }

 protected:
  at::Tensor float_weight() const override { return this->weight; }
  ConvShape conv_shape() const override { return conv_shape_of<D>(this->options); }
  // LibTorch's float convolution (the private twin's forward).
  at::Tensor twin_forward(const at::Tensor& x) { return Twin::forward(x); }
  // forward(x) (relu: at::relu(forward(x))) of a float input: frozen on the integer kernel and x
  // on the CPU, integer(x, relu) (the ReLU in its epilogue); else the twin's float convolution of
  // the quantized input and weight. Defined in conv.cpp, its only user.
  template <class Integer>
  at::Tensor float_input_forward(const at::Tensor& x, bool relu, const Integer& integer);
};

class Conv1dImpl : public ConvLayerImpl<torch::nn::Conv1dImpl, 1> {
 public:
  using ConvLayerImpl::ConvLayerImpl;
  at::Tensor forward(const at::Tensor& x);
  // at::relu(forward(x)); after freeze on the integer kernel the ReLU runs in its epilogue.
  at::Tensor forward_relu(const at::Tensor& x);
  const char* layer_type() const override { return "Conv1d"; }
  std::shared_ptr<QuantizableLayer> float_copy() const override;

 private:
  at::Tensor frozen_integer(const at::Tensor& x, bool relu);
};
TORCH_MODULE(Conv1d);

class Conv2dImpl : public ConvLayerImpl<torch::nn::Conv2dImpl, 2> {
 public:
  using ConvLayerImpl::ConvLayerImpl;
  // After freeze on the integer path with static activations, x may also be int8 codes of this
  // layer's input quantizer (see forward_relu_codes).
  at::Tensor forward(const at::Tensor& x);
  // at::relu(forward(x)); after freeze on the integer kernel the ReLU runs in its epilogue.
  at::Tensor forward_relu(const at::Tensor& x);
  // Static-activation chains. takes_codes(): frozen on the integer path (static int8 inputs) and
  // nothing watching its inputs, so forward / forward_relu accept int8 codes of its input
  // quantizer in place of floats. forward_relu_codes(x, next): at::relu(forward(x)) as the int8
  // codes next's input quantizer makes of it (next.takes_codes()), requantized chunk by chunk in
  // the epilogue with no float output; NCHW shape, channels-last memory. Code for code what next
  // would compute from forward_relu(x) (kernels::conv2d_s8s8s8 and its tests); x is float or this
  // layer's own input codes.
  bool takes_codes() const;
  bool integer_frozen() const { return frozen_ && integer_kernel(); }
  at::Tensor forward_relu_codes(const at::Tensor& x, const Conv2dImpl& next);
  // Residual connections: forward(x) + residual (in_place: forward(x).add_(residual), which keeps
  // the output's type and shape), through at::relu when relu. Frozen on the integer path (x float
  // on the CPU or this layer's codes), the addition and the ReLU run in the kernel's epilogue, bit
  // for bit the ATen ops (a residual of another shape, type or layout is added after; one that
  // needs a gradient takes ATen's add); otherwise exactly those ATen ops.
  at::Tensor forward_add(const at::Tensor& x, const at::Tensor& residual, bool relu, bool in_place = false);
  const char* layer_type() const override { return "Conv2d"; }
  std::shared_ptr<QuantizableLayer> float_copy() const override;

 private:
  at::Tensor frozen_integer(const at::Tensor& x, bool relu, const QParams* requant = nullptr,
                            const at::Tensor* residual = nullptr, bool in_place = false);
};
TORCH_MODULE(Conv2d);

}  // namespace qforge::nn
