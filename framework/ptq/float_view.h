// FloatView: while alive, every quantizer of a model passes values through unchanged (no
// fake-quant, no observing), so the model computes its float function even before its static
// activations are calibrated. The PTQ transforms check with it that they left that function alone.
#pragma once

#include <torch/nn/module.h>

#include <vector>

#include "framework/api/quantizer.h"

namespace qforge::ptq {

class FloatView {
 public:
  explicit FloatView(const torch::nn::Module& model);
  // Only these quantizers pass values through (AutoRound bypasses the weight quantizers it replaces).
  explicit FloatView(const std::vector<Quantizer>& quantizers);
  ~FloatView();
  FloatView(const FloatView&) = delete;
  FloatView& operator=(const FloatView&) = delete;

 private:
  struct Saved {
    Quantizer q;
    bool fake_quant, observing;
  };
  std::vector<Saved> saved_;
};

}  // namespace qforge::ptq
