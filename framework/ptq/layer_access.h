// The PTQ solvers' view of a weighted layer: its weight as an [N, K] matrix and its input as
// [rows, K] (a Linear's tokens, a convolution's im2col patches), so GPTQ, AdaRound, bias
// correction and equalisation treat Linear, Conv1d and Conv2d alike. Internal to framework/ptq.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "framework/nn/quantizable.h"

namespace qforge::ptq {

struct LayerAccess {
  enum class Kind : uint8_t { kLinear, kConv1d, kConv2d };
  QuantizableLayer* layer = nullptr;
  Kind kind = Kind::kLinear;
  at::Tensor weight;  // the layer's parameter: [N, K] or [O, C, (kh,) kw]
  at::Tensor bias;    // undefined when the layer has none
  std::vector<int64_t> kernel, stride, padding, dilation;  // convolutions, as 2-D (Conv1d: height 1)

  // The weight viewed as [N, K] (a view of the parameter).
  at::Tensor w2d() const { return weight.reshape({weight.size(0), -1}); }
  // The input x as the rows the [N, K] weight multiplies: [rows, K].
  at::Tensor rows(const at::Tensor& x) const;
  // Writes an [N, K] matrix into the parameter (no autograd).
  void set_w2d(const at::Tensor& w) const;
};

// Empty when the solvers can take the layer; otherwise why not ("an Embedding has no input
// activations to solve against", "grouped convolution", ...).
std::string solvable(const std::string& path, const QuantizableLayer& layer);

// The view of a layer solvable() accepts (throws qforge::Error otherwise).
LayerAccess access(QuantizableLayer& layer);

// Thrown by an input tap to end a capture pass's forward once its layers have their inputs; not a
// std::exception, so nothing between the tap and the pass catches it by accident.
struct StopForward {};

// Sets `tap` as the input tap of `layers` for its lifetime and removes them on exit, exceptions
// included (a tap capturing a solver's locals must not outlive them).
class ScopedInputTaps {
 public:
  ScopedInputTaps(std::vector<QuantizableLayer*> layers, const QuantizableLayer::InputTap& tap);
  ~ScopedInputTaps();
  ScopedInputTaps(const ScopedInputTaps&) = delete;
  ScopedInputTaps& operator=(const ScopedInputTaps&) = delete;

 private:
  std::vector<QuantizableLayer*> layers_;
};

}  // namespace qforge::ptq
