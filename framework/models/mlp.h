// A multilayer perceptron of qforge Linear layers for 28x28 images (Fashion-MNIST):
// flatten -> [fc_i -> ReLU]* -> fc_last. Parameters: fc1.weight, fc1.bias, fc2.*, ...
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "framework/nn/linear.h"

namespace qforge::models {

struct MlpOptions {
  int64_t in_features = 28 * 28;
  std::vector<int64_t> hidden = {256, 128};
  int64_t num_classes = 10;
};

class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  explicit MlpImpl(MlpOptions options = {});
  void reset() override;
  // x: [N, ...] flattened to [N, in_features]; returns logits [N, num_classes].
  at::Tensor forward(const at::Tensor& x);

  MlpOptions options;
  std::vector<nn::Linear> layers;
};
TORCH_MODULE(Mlp);

}  // namespace qforge::models
