// Fashion-MNIST MLP of qforge layers.
#include "framework/models/mlp.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::models {

MlpImpl::MlpImpl(MlpOptions opts) : options(std::move(opts)) { reset(); }

void MlpImpl::reset() {
  QF_REQUIRE(options.in_features > 0 && options.num_classes > 0, "models/mlp: in_features and num_classes must be > 0");
  layers.clear();
  int64_t in = options.in_features;
  std::vector<int64_t> widths = options.hidden;
  widths.push_back(options.num_classes);
  for (size_t i = 0; i < widths.size(); ++i) {
    layers.push_back(register_module("fc" + std::to_string(i + 1), nn::Linear(in, widths[i])));
    in = widths[i];
  }
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  at::Tensor h = x.reshape({x.size(0), -1});
  for (size_t i = 0; i < layers.size(); ++i) {
    h = layers[i]->forward(h);
    if (i + 1 < layers.size()) h = at::relu(h);
  }
  return h;
}

}  // namespace qforge::models
