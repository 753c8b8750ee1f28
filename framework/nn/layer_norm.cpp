// LayerNorm with an output quantizer.
#include "framework/nn/layer_norm.h"

namespace qforge::nn {

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor y = torch::nn::LayerNormImpl::forward(x);
  return input_q_ ? input_q_->forward(y) : y;
}

}  // namespace qforge::nn
