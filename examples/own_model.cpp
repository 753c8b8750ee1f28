// README's "Your own model": a model written with plain LibTorch layers, as a PyTorch user moving
// to C++ writes it, made quantizable by qforge::nn::convert (its Sequentials' Linear / Conv /
// Embedding / LayerNorm layers become qforge twins, conv + BatchNorm pairs are folded), then
// quantized, calibrated and frozen like a model of qforge layers.
#include <qforge/qforge.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>

int main() {
  at::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1).bias(false)),
                              torch::nn::BatchNorm2d(8), torch::nn::ReLU(), torch::nn::Flatten(),
                              torch::nn::Linear(8 * 12 * 12, 32), torch::nn::ReLU(), torch::nn::Linear(32, 10));
  model->eval();  // BatchNorm folds with its running statistics
  const at::Tensor x = at::randn({4, 1, 12, 12});
  at::NoGradGuard no_grad;
  const at::Tensor y_float = model->forward(x);

  const qforge::nn::ConvertReport converted = qforge::nn::convert(model);
  std::printf("%s", converted.to_string().c_str());
  const double fold_change = (model->forward(x) - y_float).abs().max().item<double>();

  qforge::Scheme scheme(qforge::qint8);
  scheme.activations = qforge::ActivationMode::kStatic;
  qforge::quantize(*model, scheme);
  {
    qforge::Calibration calibration(*model);
    for (int i = 0; i < 4; ++i) model->forward(at::randn({32, 1, 12, 12}));
  }
  const int64_t float_bytes = qforge::model_size(*model).total_bytes;
  qforge::freeze(*model);
  std::printf("%s", qforge::describe(*model).c_str());
  const int64_t frozen_bytes = qforge::model_size(*model).total_bytes;
  const double to_float = (model->forward(x) - y_float).abs().max().item<double>();
  std::printf("folding changed the float output by %.2e; frozen: %lld of %lld bytes, max |frozen - float| = %.4f\n",
              fold_change, static_cast<long long>(frozen_bytes), static_cast<long long>(float_bytes), to_float);
  const bool ok = converted.kept.empty() && fold_change < 1e-4 && frozen_bytes * 3 < float_bytes;
  std::printf("%s\n", ok ? "own model converted, quantized and frozen" : "FAILED");
  return ok ? 0 : 1;
}
